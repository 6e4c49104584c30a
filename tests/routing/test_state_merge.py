"""`merge`: a worker's routing state, kept while Redis was out, folded into the shared one."""

from __future__ import annotations

from routing.state import ComboState, _frozen, merge

A, B, C = "pa/ma", "pb/mb", "pc/mc"


def st(**kw: object) -> ComboState:
    for name in ("cooldowns", "probes", "current_weights", "success_counts"):
        if name in kw:
            kw[name] = _frozen(kw[name])  # type: ignore[arg-type]
    return ComboState(**kw)  # type: ignore[arg-type]


def test_later_cooldown_end_wins_per_target() -> None:
    shared = st(cooldowns={A: 1_000, B: 5_000}, spec="s", revision=3)
    local = st(cooldowns={A: 2_000, B: 4_000, C: 3_000}, spec="s", revision=3)
    out = merge(shared, local)
    assert dict(out.cooldowns) == {A: 2_000, B: 5_000, C: 3_000}
    assert (out.spec, out.revision) == ("s", 3)


def test_shared_rotation_and_probes_are_kept() -> None:
    shared = st(
        current_weights={A: 1, B: -1}, active_key=B, successes=2, probes={C: 9_000}, spec="s"
    )
    local = st(
        cooldowns={A: 7_000},
        current_weights={A: -5, B: 5},
        active_key=A,
        probes={B: 8_000},
        spec="s",
    )
    out = merge(shared, local)
    assert dict(out.current_weights) == {A: 1, B: -1}
    assert (out.active_key, out.successes) == (B, 2)
    assert dict(out.probes) == {C: 9_000}
    assert dict(out.cooldowns) == {A: 7_000}


def test_empty_shared_state_takes_the_local_one_without_its_leases() -> None:
    local = st(
        cooldowns={A: 7_000}, current_weights={A: 2}, probes={B: 8_000}, spec="s", revision=4
    )
    out = merge(ComboState(), local)
    assert out == st(cooldowns={A: 7_000}, current_weights={A: 2}, spec="s", revision=4)


def test_different_definitions_are_not_mixed_the_newer_version_wins() -> None:
    old = st(cooldowns={A: 7_000}, spec="old", revision=2)
    new = st(cooldowns={B: 1_000}, spec="new", revision=5)
    assert merge(old, new) == new
    assert merge(new, old) == new


def test_empty_local_state_changes_nothing() -> None:
    shared = st(cooldowns={A: 7_000}, current_weights={A: 1}, spec="s", revision=1)
    assert merge(shared, ComboState()) == shared
