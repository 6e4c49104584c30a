from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing import state as state_module
from routing.state import (
    ComboState,
    MemoryStateStore,
    clear,
    note_abort,
    note_failure,
    note_success,
    retain,
    stamped,
)
from routing.types import ComboSpec, TargetSpec
from tests.routing.conftest import sync

A, B, C = "pa/ma", "pb/mb", "pc/mc"


def combo(
    *keys: str, sticky: int = 1, cid: str = "main", strategy: str = "round-robin"
) -> ComboSpec:
    targets = tuple(TargetSpec(k.split("/")[0], k.split("/")[1]) for k in keys)
    return ComboSpec(id=cid, targets=targets, strategy=strategy, sticky_limit=sticky)


ABC = combo(A, B, C)
LEAST = combo(A, B, C, strategy="least-used")


def st_of(**kw: object) -> ComboState:
    return ComboState(**kw)  # type: ignore[arg-type]


def test_module_imports_no_framework() -> None:
    tree = ast.parse(Path(state_module.__file__).read_text())
    names = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    ]
    assert not [m for m in names if m and m.split(".")[0] in {"django", "ninja", "channels"}]


@pytest.mark.parametrize(
    ("now", "cooling", "half_open"),
    [(0, 60_000, False), (59_999, 60_000, False), (60_000, None, True), (999_999, None, True)],
)
def test_cooldown_boundary(now: int, cooling: int | None, half_open: bool) -> None:
    s = st_of(cooldowns={A: 60_000})
    assert s.cooling_until(A, now) == cooling
    assert s.is_half_open(A, now) is half_open
    assert s.cooling_until(B, now) is None and not s.is_half_open(B, now)


@pytest.mark.parametrize(("now", "held"), [(0, True), (9_999, True), (10_000, False)])
def test_probe_lease_boundary(now: int, held: bool) -> None:
    assert st_of(probes={A: 10_000}).probe_held(A, now) is held


@pytest.mark.parametrize(
    ("existing", "new", "expected"),
    [
        (None, 5_000, 5_000),
        (9_000, 5_000, 9_000),  # never shortened
        (5_000, 9_000, 9_000),  # lengthened
        (500, 5_000, 5_000),  # expired (half-open) entry replaced
        (9_000, None, 9_000),  # no cooldown leaves the entry alone
    ],
)
def test_note_failure_never_shortens(existing: int | None, new: int | None, expected: int) -> None:
    s = st_of(cooldowns={A: existing} if existing is not None else {})
    out = note_failure(s, ABC, A, new, now=1_000)
    assert out.cooldowns.get(A) == expected


def test_note_failure_releases_sticky_without_counting() -> None:
    s = st_of(active_key=A, successes=1, success_counts={A: 4})
    out = note_failure(s, combo(A, B, C, sticky=3), A, 70_000, now=10_000)
    assert out.active_key is None and out.successes == 0
    assert out.success_counts == {A: 4}
    assert out.cooldowns == {A: 70_000}


def test_note_failure_of_other_target_keeps_sticky() -> None:
    s = st_of(active_key=A, successes=1)
    out = note_failure(s, combo(A, B, C, sticky=3), B, 70_000, now=10_000)
    assert out.active_key == A and out.successes == 1


def test_note_failure_releases_probe_lease_and_drops_expired_leases() -> None:
    s = st_of(cooldowns={A: 100, C: 50}, probes={A: 90_000, B: 5_000, C: 95_000})
    out = note_failure(s, ABC, A, None, now=10_000)
    assert out.probes == {C: 95_000}
    assert out.cooldowns == {A: 100, C: 50}  # A stays half-open for the next prober


@pytest.mark.parametrize(
    ("sticky", "successes_before", "active_after", "successes_after"),
    [(1, 0, None, 0), (2, 0, A, 1), (2, 1, None, 0), (3, 1, A, 2)],
)
def test_note_success_stickiness(
    sticky: int, successes_before: int, active_after: str | None, successes_after: int
) -> None:
    s = st_of(active_key=A, successes=successes_before)
    out = note_success(s, combo(A, B, sticky=sticky), A)
    assert (out.active_key, out.successes) == (active_after, successes_after)
    assert out.success_counts == {}  # only least-used reads the counts


def test_note_success_of_non_sticky_target_keeps_the_batch() -> None:
    s = st_of(active_key=A, successes=1, success_counts={B: 2})
    out = note_success(s, combo(A, B, sticky=3), B)
    assert (out.active_key, out.successes) == (A, 1)
    assert out.success_counts == {B: 2}


@pytest.mark.parametrize("strategy", ["failover", "round-robin", "random", "reset-window"])
def test_only_least_used_counts_successes(strategy: str) -> None:
    s = st_of(success_counts={B: 2})
    assert note_success(s, LEAST, B).success_counts == {B: 3}
    assert note_success(s, LEAST, A).success_counts == {A: 1, B: 2}
    other = combo(A, B, C, strategy=strategy)
    assert note_success(s, other, B) == s


def test_note_success_heals_half_open_target() -> None:
    s = st_of(cooldowns={A: 100, B: 99_000}, probes={A: 70_000})
    out = note_success(s, ABC, A)
    assert out.cooldowns == {B: 99_000} and out.probes == {}


def test_note_abort_changes_nothing() -> None:
    s = st_of(cooldowns={A: 100}, probes={A: 70_000}, active_key=A, successes=1)
    assert note_abort(s, ABC, A) is s
    released = note_abort(s, ABC, A, probe=True)
    assert released == st_of(cooldowns={A: 100}, active_key=A, successes=1)


@pytest.mark.parametrize("fn", ["success", "failure", "abort"])
def test_unknown_key_is_ignored(fn: str) -> None:
    s = st_of(active_key=A, successes=1, current_weights={A: -2, B: 1})
    removed = "gone/x"
    if fn == "success":
        out = note_success(s, ABC, removed)
    elif fn == "failure":
        out = note_failure(s, ABC, removed, 99_000, now=0)
    else:
        out = note_abort(s, ABC, removed, probe=True)
    assert out is s


def test_retain_drops_removed_targets() -> None:
    s = st_of(
        cooldowns={A: 1, B: 2},
        probes={B: 3},
        current_weights={A: 1, B: -1},
        active_key=B,
        successes=1,
        success_counts={A: 1, B: 5},
    )
    out = retain(s, combo(A, C))
    assert out == st_of(cooldowns={A: 1}, current_weights={A: 1}, success_counts={A: 1})
    assert retain(out, combo(A, C)) is out


def test_clear_is_empty() -> None:
    assert clear(st_of(cooldowns={A: 1}, active_key=A)) == ComboState()


def test_json_round_trip_exact() -> None:
    s = st_of(
        cooldowns={A: 1},
        probes={B: 2},
        current_weights={A: -1, B: 1},
        active_key=A,
        successes=1,
        success_counts={C: 7},
    )
    text = s.to_json()
    assert json.loads(text) == {
        "active_key": A,
        "cooldowns": {A: 1},
        "current_weights": {A: -1, B: 1},
        "probes": {B: 2},
        "success_counts": {C: 7},
        "successes": 1,
    }
    assert ComboState.from_json(text) == s
    assert ComboState.from_json("{}") == ComboState()


maps = st.dictionaries(st.text(min_size=1, max_size=8), st.integers(-(2**53), 2**53), max_size=4)


@given(maps, maps, maps, st.none() | st.text(max_size=8), st.integers(0, 100), maps)
def test_json_round_trip_property(
    c: dict[str, int],
    p: dict[str, int],
    w: dict[str, int],
    active: str | None,
    n: int,
    counts: dict[str, int],
) -> None:
    s = st_of(
        cooldowns=c,
        probes=p,
        current_weights=w,
        active_key=active,
        successes=n,
        success_counts=counts,
    )
    assert ComboState.from_json(s.to_json()) == s


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '{"cooldowns": []}',
        '{"cooldowns": {"a": "5"}}',
        '{"cooldowns": {"a": true}}',
        '{"active_key": 3}',
        '{"successes": 1.5}',
        "not json",
    ],
)
def test_from_json_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        ComboState.from_json(text)


def test_memory_store_update_get_clear() -> None:
    store = MemoryStateStore()
    assert sync(store.get("x")) == ComboState()
    result = sync(store.update("x", lambda s: (note_failure(s, ABC, A, 5_000, now=0), "done")))
    assert result == "done"
    assert sync(store.get("x")).cooldowns == {A: 5_000}
    assert sync(store.get("y")) == ComboState()  # other combos unaffected
    sync(store.update("y", lambda s: (note_success(s, LEAST, B), None)))
    sync(store.clear("x"))
    assert sync(store.get("x")) == ComboState()
    assert sync(store.get("y")).success_counts == {B: 1}


def test_memory_store_update_sees_previous_write() -> None:
    store = MemoryStateStore()
    for _ in range(3):
        sync(store.update("x", lambda s: (note_success(s, LEAST, A), None)))
    seen = sync(store.update("x", lambda s: (s, s.success_counts.get(A))))
    assert seen == 3


def test_memory_store_concurrent_updates_are_atomic() -> None:
    """Many tasks of one event loop updating the same combo lose no write (no await inside)."""
    store = MemoryStateStore()

    async def bump() -> None:
        await asyncio.sleep(0)
        await store.update("x", lambda s: (note_success(s, LEAST, A), None))

    async def run() -> int | None:
        await asyncio.gather(*(bump() for _ in range(200)))
        return (await store.get("x")).success_counts.get(A)

    assert asyncio.run(run()) == 200


# --- definitions and config versions (stamped) -------------------------------------------------

OLD = combo(A, B)
NEW = combo(A, C)


def cool(key: str, until: int) -> Any:
    return lambda s: (note_failure(s, ABC, key, until, now=0), "decided")


def test_a_writer_on_an_older_definition_decides_but_writes_nothing() -> None:
    state = stamped(NEW, 5, cool(C, 9_000))(ComboState())[0]
    assert (state.spec, state.revision) == (NEW.fingerprint, 5)
    out, result = stamped(OLD, 4, cool(A, 7_000))(state)
    assert out is state and result == "decided"


def test_a_writer_on_a_newer_definition_starts_the_state_afresh() -> None:
    state = stamped(OLD, 4, cool(A, 7_000))(ComboState())[0]
    out, _ = stamped(NEW, 5, cool(C, 9_000))(state)
    assert out.cooldowns == {C: 9_000}  # nothing of the old definition's state
    assert (out.spec, out.revision) == (NEW.fingerprint, 5)


def test_the_same_definition_applies_and_keeps_the_newest_version() -> None:
    state = stamped(NEW, 5, cool(C, 9_000))(ComboState())[0]
    out, _ = stamped(NEW, 7, cool(A, 8_000))(state)
    assert out.cooldowns == {A: 8_000, C: 9_000} and out.revision == 7
    late, _ = stamped(NEW, 6, cool(A, 8_500))(out)  # a request loaded between the two
    assert late.cooldowns == {A: 8_500, C: 9_000} and late.revision == 7


def test_without_a_version_the_state_carries_over() -> None:
    # revision 0 on both sides: the reference's own rules (retain) decide, as before stamps.
    state = stamped(OLD, 0, cool(A, 7_000))(ComboState())[0]
    out, _ = stamped(NEW, 0, lambda s: (s, None))(state)
    assert out.cooldowns == {A: 7_000} and out.spec == NEW.fingerprint


def test_an_empty_state_records_nothing() -> None:
    state = stamped(NEW, 5, cool(C, 9_000))(ComboState())[0]
    cleared = stamped(NEW, 6, lambda s: (note_success(s, NEW, C), None))(state)[0]
    assert cleared == ComboState()
    assert cleared.to_json() == ComboState().to_json()


def test_stamps_survive_json_and_bad_ones_are_rejected() -> None:
    state = stamped(NEW, 5, cool(C, 9_000))(ComboState())[0]
    assert ComboState.from_json(state.to_json()) == state
    assert '"spec"' not in ComboState(cooldowns={A: 1}).to_json()
    for text in ('{"spec": 5}', '{"spec": "x", "revision": "2"}', '{"revision": true}'):
        with pytest.raises(ValueError):
            ComboState.from_json(text)


def test_the_fingerprint_is_the_same_in_another_process() -> None:
    import subprocess
    import sys

    code = (
        "from routing.types import ComboSpec, TargetSpec\n"
        "print(ComboSpec(id='main', strategy='round-robin', sticky_limit=1,"
        " targets=(TargetSpec('pa', 'ma'), TargetSpec('pc', 'mc'))).fingerprint)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == NEW.fingerprint
    assert NEW.fingerprint != OLD.fingerprint


def test_blank_knows_every_field_of_the_state() -> None:
    # `stamped` asks `blank()` instead of comparing with `ComboState()`: a field added to the
    # state must not read as blank when it holds something.
    import dataclasses

    samples: dict[str, Any] = {
        "cooldowns": {A: 1},
        "probes": {A: 1},
        "current_weights": {A: 1},
        "active_key": A,
        "successes": 1,
        "success_counts": {A: 1},
        "spec": "fingerprint",
        "revision": 7,
    }
    assert {f.name for f in dataclasses.fields(ComboState)} == set(samples)
    assert ComboState(spec="fingerprint", revision=7).blank()
    for name, value in samples.items():
        state = ComboState(**{name: value})
        assert state.blank() == (name in ("spec", "revision")), name
        # The same answer as the comparison it replaced.
        assert state.blank() == (dataclasses.replace(state, spec=None, revision=0) == ComboState())
