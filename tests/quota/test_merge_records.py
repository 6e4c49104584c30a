"""`merge_records`: a worker's quota record from a Redis outage folded into the shared one."""

from __future__ import annotations

from quota import windows as qw
from quota.tracker import Record, merge_records

PAIR = ("codex", "fp1")


def window(name: str, used: float, observed: int) -> qw.Window:
    return qw.Window(
        name=name,  # type: ignore[arg-type]
        used_percent=used,
        window_minutes=300,
        resets_at_ms=observed + 1_000_000,
        observed_at_ms=observed,
        source="codex",
        limit_id="codex",
    )


def record(status: str, at: int | None, hold: int | None = None, *ws: qw.Window) -> dict:
    transition = None if at is None else qw.Transition("available", status, "test", at)  # type: ignore[arg-type]
    state = qw.CredentialQuota(
        provider=PAIR[0],
        credential=PAIR[1],
        status=status,  # type: ignore[arg-type]
        hold_until_ms=hold,
        probe_lease_until_ms=None if status != "probing" else 99,
        last_transition=transition,
    )
    return Record(state, tuple(ws)).to_json()


def test_a_limit_seen_locally_during_the_outage_wins() -> None:
    shared = record("available", None, None, window("five_hour", 40, 1_000))
    local = record("limited", 5_000, 9_000, window("five_hour", 100, 5_000))
    out = Record.from_json(merge_records(shared, local) or {})
    assert out.state.status == "limited"
    assert out.state.hold_until_ms == 9_000
    assert [w.used_percent for w in out.windows] == [100]


def test_a_later_shared_transition_wins_but_newer_local_windows_are_kept() -> None:
    shared = record("available", 8_000, None, window("five_hour", 10, 8_000))
    local = record(
        "limited", 5_000, 9_000, window("five_hour", 100, 5_000), window("weekly", 3, 6_000)
    )
    out = Record.from_json(merge_records(shared, local) or {})
    assert out.state.status == "available"
    assert sorted((w.name, w.used_percent) for w in out.windows) == [
        ("five_hour", 10),
        ("weekly", 3),
    ]


def test_absent_shared_record_takes_the_local_one_without_its_probe_lease() -> None:
    local = record("probing", 5_000, 9_000)
    out = Record.from_json(merge_records(None, local) or {})
    assert out.state.status == "probing"
    assert out.state.probe_lease_until_ms is None


def test_nothing_local_keeps_the_shared_record() -> None:
    shared = record("limited", 5_000, 9_000)
    assert merge_records(shared, None) == shared
    assert merge_records(None, None) is None
