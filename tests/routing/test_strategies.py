from __future__ import annotations

import ast
import asyncio
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import strategies as strategies_module
from routing.state import (
    ComboState,
    MemoryStateStore,
    note_abort,
    note_failure,
    note_success,
)
from routing.strategies import (
    PROBE_LEASE_MS,
    SKIP_ATTEMPTED,
    SKIP_COOLING,
    SKIP_LAST_RESORT,
    SKIP_OVERRIDE,
    SKIP_PROBING,
    SKIP_PROVIDER_DISABLED,
    SKIP_PROVIDER_MISSING,
    Predicate,
    Selection,
    advance_after_failure,
    assess,
    fresh_reset_at,
    pick_random,
    pick_reset_window,
    pick_round_robin,
    plan,
    retry_after_seconds,
    select,
)
from routing.types import ComboSpec, ProviderSpec, TargetSpec
from tests.routing.conftest import sync

PROVIDERS: dict[str, ProviderSpec] = {
    p: ProviderSpec(name=p, adapter="openai-chat", base_url="https://x.test/v1")
    for p in ("a", "b", "c", "d")
}


def t(provider: str, weight: int = 1, last_resort: bool = False) -> TargetSpec:
    return TargetSpec(provider=provider, model="m", weight=weight, last_resort=last_resort)


def key(provider: str) -> str:
    return f"{provider}/m"


def mk(
    *targets: TargetSpec,
    strategy: str = "failover",
    sticky: int = 1,
    wait: int = 0,
    policy: str | None = None,
    override: str | None = None,
) -> ComboSpec:
    return ComboSpec(
        id="main",
        targets=targets,
        strategy=strategy,
        sticky_limit=sticky,
        wait_for_cooldown_ms=wait,
        cooldown_wait_policy=policy,
        override=override,
    )


def names(targets: list[TargetSpec | None]) -> str:
    return "".join(x.provider.upper() if x else "-" for x in targets)


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


class Clock:
    """A fake clock whose sleep records durations, advances time, then runs hooks."""

    def __init__(self, start: int = 0) -> None:
        self.t = start
        self.sleeps: list[int] = []
        self.hooks: list[Callable[[int], None]] = []

    def now(self) -> int:
        return self.t

    async def sleep(self, ms: int) -> None:
        self.sleeps.append(ms)
        self.t += ms
        for hook in self.hooks:
            hook(self.t)


def cool(store: MemoryStateStore, combo: ComboSpec, provider: str, until: int) -> None:
    sync(
        store.update(
            combo.id, lambda s: (note_failure(s, combo, key(provider), until, now=0), None)
        )
    )


def run_select(
    combo: ComboSpec,
    store: MemoryStateStore,
    clock: Clock,
    *,
    attempted: frozenset[str] = frozenset(),
    predicate: Predicate | None = None,
    rng: random.Random | None = None,
    providers: Mapping[str, ProviderSpec] = PROVIDERS,
    **kw: object,
) -> Selection:
    return asyncio.run(
        select(
            combo,
            providers,
            store,
            now=clock.now,
            sleep=clock.sleep,
            rng=rng or random.Random(1),
            attempted=attempted,
            predicate=predicate,
            **kw,  # type: ignore[arg-type]
        )
    )


def serve(
    combo: ComboSpec, n: int, *, succeed: bool = True, rng: random.Random | None = None
) -> list[TargetSpec | None]:
    """n sequential requests at time 0, each noting a success (or nothing) on its pick."""
    store = MemoryStateStore()
    out: list[TargetSpec | None] = []
    for _ in range(n):
        sel = run_select(combo, store, Clock(), rng=rng)
        out.append(sel.target)
        if succeed and sel.target is not None:
            succeeded = sel.target.key

            def ok(s: ComboState, k: str = succeeded) -> tuple[ComboState, None]:
                return note_success(s, combo, k), None

            sync(store.update(combo.id, ok))
    return out


def test_module_imports_no_framework() -> None:
    tree = ast.parse(Path(strategies_module.__file__).read_text())
    mods = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    ]
    assert not [m for m in mods if m and m.split(".")[0] in {"django", "ninja", "channels"}]


# --- round-robin (§2.4) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "sticky", "n", "expected"),
    [
        ((2, 1), 1, 6, "ABAABA"),
        ((200, 100), 1, 6, "ABAABA"),
        ((2, 1), 2, 12, "AABBAAAABBAA"),
        ((1, 1, 1), 1, 6, "ABCABC"),
        ((1, 1, 1), 3, 9, "AAABBBCCC"),
        ((5, 1), 1, 6, "AAABAA"),
    ],
)
def test_round_robin_sequences(
    weights: tuple[int, ...], sticky: int, n: int, expected: str
) -> None:
    combo = mk(*(t(p, w) for p, w in zip("abc", weights, strict=False)), strategy="round-robin")
    assert names(serve(replace(combo, sticky_limit=sticky), n)) == expected


def test_round_robin_worked_table_weights() -> None:
    cands = (t("a", 2), t("b", 1))
    state = ComboState()
    seen = []
    for _ in range(6):
        state, got = pick_round_robin(replace(state, active_key=None), cands)
        seen.append((got.provider if got else "-", dict(state.current_weights)))
    assert seen == [
        ("a", {"a/m": -1, "b/m": 1}),
        ("b", {"a/m": 1, "b/m": -1}),
        ("a", {"a/m": 0, "b/m": 0}),
        ("a", {"a/m": -1, "b/m": 1}),
        ("b", {"a/m": 1, "b/m": -1}),
        ("a", {"a/m": 0, "b/m": 0}),
    ]


def test_round_robin_pick_without_success_stays_pinned() -> None:
    combo = mk(t("a", 2), t("b", 1), strategy="round-robin")
    assert names(serve(combo, 5, succeed=False)) == "AAAAA"


def test_round_robin_failure_releases_sticky_and_next_step_runs() -> None:
    combo = mk(t("a"), t("b"), strategy="round-robin", sticky=5)
    store = MemoryStateStore()
    clock = Clock()
    first = run_select(combo, store, clock)
    assert first.target == t("a")
    sync(store.update("main", lambda s: (note_failure(s, combo, key("a"), None, now=0), None)))
    assert run_select(combo, store, clock).target == t("b")


def test_round_robin_ineligible_target_keeps_weight() -> None:
    state = ComboState(current_weights={"a/m": 0, "b/m": 0, "c/m": 7})  # type: ignore[arg-type]
    state, got = pick_round_robin(state, (t("a"), t("b")))
    assert got == t("a")
    assert dict(state.current_weights) == {"a/m": -1, "b/m": 1, "c/m": 7}


def test_round_robin_abort_advances_nothing() -> None:
    combo = mk(t("a"), t("b"), strategy="round-robin")
    store = MemoryStateStore()
    clock = Clock()
    assert run_select(combo, store, clock).target == t("a")
    before = sync(store.get("main"))
    sync(store.update("main", lambda s: (note_abort(s, combo, key("a")), None)))
    assert sync(store.get("main")) == before
    assert run_select(combo, store, clock).target == t("a")  # still pinned, no success counted


def test_reconfiguration_late_notes() -> None:
    # §2.1: after removing b, a late failure for surviving a releases the sticky entry (next c),
    # and a late success for removed b is ignored.
    old = mk(t("a"), t("b"), t("c"), strategy="round-robin", sticky=3)
    new = mk(t("a"), t("c"), strategy="round-robin", sticky=3)
    store = MemoryStateStore()
    clock = Clock()
    assert run_select(old, store, clock).target == t("a")
    before = sync(store.get("main"))
    sync(store.update("main", lambda s: (note_success(s, new, key("b")), None)))
    assert sync(store.get("main")) == before
    sync(store.update("main", lambda s: (note_failure(s, new, key("a"), None, now=0), None)))
    assert run_select(new, store, clock).target == t("c")


# --- random, least-used, reset-window (§2.5) -------------------------------------------------


@pytest.mark.parametrize(
    ("draw", "expected"),
    [(0.0, "a"), (0.25, "a"), (0.2500001, "b"), (0.5, "b"), (0.9999999, "b")],
)
def test_random_walk(draw: float, expected: str) -> None:
    got = pick_random((t("a", 1), t("b", 3)), FixedRandom(draw))
    assert got is not None and got.provider == expected


def test_random_rounding_past_end_uses_last() -> None:
    assert pick_random((t("a"), t("b")), FixedRandom(1.0000001)) == t("b")


def test_least_used_alternates_and_ignores_failures() -> None:
    combo = mk(t("a"), t("b"), strategy="least-used")
    assert names(serve(combo, 4)) == "ABAB"
    store = MemoryStateStore()
    sync(store.update("main", lambda s: (note_failure(s, combo, key("a"), None, now=0), None)))
    sync(store.update("main", lambda s: (note_success(s, combo, key("b")), None)))
    assert run_select(combo, store, Clock()).target == t("a")


@pytest.mark.parametrize(
    ("resets", "expected"),
    [
        ({}, "a"),
        ({"b/m": 5_000}, "b"),
        ({"a/m": 9_000, "b/m": 5_000, "c/m": 5_000}, "b"),  # tie keeps order
        ({"a/m": 1_000, "b/m": 5_000}, "b"),  # reset == now is not future
        ({"a/m": 999, "b/m": None, "c/m": 1_001}, "c"),
        ({"a/m": None, "b/m": None}, "a"),
    ],
)
def test_reset_window(resets: dict[str, int | None], expected: str) -> None:
    got = pick_reset_window((t("a"), t("b"), t("c")), 1_000, resets)
    assert got is not None and got.provider == expected


@pytest.mark.parametrize(
    ("updated_at", "resets", "expected"),
    [
        (0, [5_000_000, 2_000_000], 2_000_000),
        (1_800_000 - 1_800_000, [1_900_000], 1_900_000),  # exactly 30 min old is fresh
        (-1, [1_900_000], None),  # 30 min + 1 ms is stale
        (0, [1_800_000, None, float("inf"), float("nan")], None),  # == now is not future
        (0, [1_800_001.0], 1_800_001),
    ],
)
def test_fresh_reset_at(updated_at: int, resets: list[float | None], expected: int | None) -> None:
    assert fresh_reset_at(updated_at, resets, now=1_800_000) == expected


# --- eligibility (§2.2) ----------------------------------------------------------------------


def test_assess_reasons() -> None:
    combo = mk(t("a"), t("b"), t("c"), t("d"), t("x"), t("e"))
    providers = dict(PROVIDERS)
    providers["b"] = replace(providers["b"], disabled=True)
    providers["e"] = replace(providers["a"], name="e")
    state = ComboState(cooldowns={"d/m": 5_000, "e/m": 10}, probes={"e/m": 7_000})  # type: ignore[arg-type]

    def pred(target: TargetSpec) -> str | None:
        return "credential_unresolved" if target.provider == "c" else None

    el = assess(combo, providers, state, now=1_000, attempted=frozenset({"a/m"}), predicate=pred)
    assert el.eligible == ()
    assert el.cooling == ((t("d"), 5_000),)
    assert el.skipped == (
        ("a/m", SKIP_ATTEMPTED),
        ("b/m", SKIP_PROVIDER_DISABLED),
        ("c/m", "credential_unresolved"),
        ("d/m", SKIP_COOLING),
        ("x/m", SKIP_PROVIDER_MISSING),
        ("e/m", SKIP_PROBING),
    )
    # the lease lapses at 7000: e becomes pickable again
    later = assess(combo, providers, state, now=7_000, attempted=frozenset({"a/m"}), predicate=pred)
    assert later.eligible == (t("d"), t("e"))


@pytest.mark.parametrize(("now", "expected"), [(59_999, None), (60_000, "a")])
def test_cooldown_boundary_in_pick(now: int, expected: str | None) -> None:
    combo = mk(t("a"))
    state = ComboState(cooldowns={"a/m": 60_000})  # type: ignore[arg-type]
    _, p = plan(combo, PROVIDERS, state, now=now, rng=random.Random(0))
    assert (p.target.provider if p.target else None) == expected
    assert p.retry_at == (60_000 if expected is None else None)


def test_all_disabled_is_unavailable_without_retry_at() -> None:
    providers = {k: replace(v, disabled=True) for k, v in PROVIDERS.items()}
    sel = run_select(
        mk(t("a"), t("b"), wait=5_000), MemoryStateStore(), Clock(), providers=providers
    )
    assert sel.target is None and sel.retry_at is None and sel.waited_ms == 0
    assert sel.skipped == (("a/m", SKIP_PROVIDER_DISABLED), ("b/m", SKIP_PROVIDER_DISABLED))


# --- half-open probing (PRODUCT §5.3) ----------------------------------------------------------


def test_half_open_single_probe_then_heal_or_recool() -> None:
    combo = mk(t("a"), t("b"))
    store = MemoryStateStore()
    cool(store, combo, "a", 10_000)
    clock = Clock(10_000)
    first = run_select(combo, store, clock)
    assert first.target == t("a") and first.probe
    assert sync(store.get("main")).probes == {"a/m": 10_000 + PROBE_LEASE_MS}
    second = run_select(combo, store, clock)
    assert second.target == t("b") and not second.probe
    assert ("a/m", SKIP_PROBING) in second.skipped
    # probe succeeds: healthy, no lease, no further probing
    healed = MemoryStateStore()
    sync(healed.update("main", lambda s: (sync(store.get("main")), None)))
    sync(healed.update("main", lambda s: (note_success(s, combo, key("a")), None)))
    third = run_select(combo, healed, clock)
    assert third.target == t("a") and not third.probe
    # probe fails: cooled again
    sync(
        store.update("main", lambda s: (note_failure(s, combo, key("a"), 70_000, now=10_000), None))
    )
    assert run_select(combo, store, clock).target == t("b")
    assert sync(store.get("main")).probes == {}


def test_lost_probe_lease_expires() -> None:
    combo = mk(t("a"), t("b"))
    store = MemoryStateStore()
    cool(store, combo, "a", 10_000)
    assert run_select(combo, store, Clock(10_000)).probe
    assert run_select(combo, store, Clock(10_000 + PROBE_LEASE_MS - 1)).target == t("b")
    again = run_select(combo, store, Clock(10_000 + PROBE_LEASE_MS))
    assert again.target == t("a") and again.probe


def test_aborted_probe_releases_lease() -> None:
    combo = mk(t("a"), t("b"))
    store = MemoryStateStore()
    cool(store, combo, "a", 10_000)
    assert run_select(combo, store, Clock(10_000)).probe
    sync(store.update("main", lambda s: (note_abort(s, combo, key("a"), probe=True), None)))
    again = run_select(combo, store, Clock(10_001))
    assert again.target == t("a") and again.probe
    assert sync(store.get("main")).cooldowns == {"a/m": 10_000}  # abort set no cooldown, no success


# --- waiting for a cooldown (§2.8) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait", "cooldowns", "sleeps", "target", "retry_at"),
    [
        (0, {"a": 3_000, "b": 5_000}, [], None, 3_000),
        (2_999, {"a": 3_000, "b": 5_000}, [], None, 3_000),
        (3_000, {"a": 3_000, "b": 5_000}, [3_000], "a", None),
        (10_000, {"a": 9_000, "b": 4_000}, [4_000], "b", None),
    ],
)
def test_wait_for_cooldown(
    wait: int,
    cooldowns: dict[str, int],
    sleeps: list[int],
    target: str | None,
    retry_at: int | None,
) -> None:
    combo = mk(t("a"), t("b"), wait=wait)
    store = MemoryStateStore()
    for p, until in cooldowns.items():
        cool(store, combo, p, until)
    clock = Clock()
    sel = run_select(combo, store, clock)
    assert clock.sleeps == sleeps
    assert sel.waited_ms == sum(sleeps)
    assert (sel.target.provider if sel.target else None) == target
    assert sel.retry_at == retry_at
    if sleeps:
        assert sel.notes == (
            f"[combo] main: all targets cooling, waiting {sleeps[0]}ms for {target}/m",
        )


def test_wait_skips_predicate_rejected_targets() -> None:
    combo = mk(t("a"), t("b"), wait=10_000)
    store = MemoryStateStore()
    cool(store, combo, "a", 1_000)
    cool(store, combo, "b", 5_000)
    clock = Clock()
    sel = run_select(
        combo, store, clock, predicate=lambda x: "quota_exhausted" if x.provider == "a" else None
    )
    assert clock.sleeps == [5_000] and sel.target == t("b")


def test_ordinary_wait_makes_one_fresh_selection_only() -> None:
    combo = mk(t("a"), t("b"), wait=10_000)
    store = MemoryStateStore()
    cool(store, combo, "a", 1_000)
    cool(store, combo, "b", 600_000)
    clock = Clock()
    clock.hooks.append(lambda now: cool(store, combo, "a", now + 2_000))
    sel = run_select(combo, store, clock)
    assert clock.sleeps == [1_000]
    assert sel.target is None and sel.retry_at == 3_000 and sel.waited_ms == 1_000


def test_budget_charges_clock_overshoot() -> None:
    combo = mk(t("a", last_resort=True), t("b"), wait=10_000, policy="before-last-resort")
    store = MemoryStateStore()
    cool(store, combo, "b", 3_000)
    cool(store, combo, "a", 11_000)
    clock = Clock()

    def overshoot(now: int) -> None:
        clock.t += 4_000  # the real sleep took 7 s instead of 3 s
        cool(store, combo, "b", clock.t + 600_000)

    clock.hooks.append(overshoot)
    sel = run_select(combo, store, clock)
    # 3 s of budget left at t=7000; the last resort needs 4 s more, so nothing waits again
    assert clock.sleeps == [3_000] and sel.waited_ms == 7_000 and sel.target is None
    assert sel.retry_at == 11_000


def test_combo_deleted_during_wait() -> None:
    combo = mk(t("a"), wait=5_000)
    store = MemoryStateStore()
    cool(store, combo, "a", 2_000)
    clock = Clock()
    sel = run_select(combo, store, clock, refresh=lambda: None)
    assert clock.sleeps == [2_000] and sel.target is None


@pytest.mark.parametrize(
    ("retry_at", "now", "expected"),
    [
        (6_000, 1_000, 5),
        (6_000, 3_500, 3),
        (6_000, 5_999, 1),
        (6_000, 6_000, None),
        (None, 0, None),
    ],
)
def test_retry_after_seconds(retry_at: int | None, now: int, expected: int | None) -> None:
    assert retry_after_seconds(retry_at, now) == expected


@pytest.mark.parametrize(
    ("wait", "allowed", "cooled", "sleeps", "picked"),
    [
        (10_000, True, True, [2_000], True),
        (10_000, False, True, [], False),
        (0, True, True, [], False),
        (10_000, True, False, [], False),  # request-local rejection: no cooldown, no retry
        (1_999, True, True, [], False),
    ],
)
def test_single_target_retry(
    wait: int, allowed: bool, cooled: bool, sleeps: list[int], picked: bool
) -> None:
    combo = mk(t("a"), wait=wait)
    store = MemoryStateStore()
    if cooled:
        cool(store, combo, "a", 2_000)
    clock = Clock()
    sel = run_select(combo, store, clock, attempted=frozenset({"a/m"}), single_target_retry=allowed)
    assert clock.sleeps == sleeps
    assert (sel.target == t("a")) is picked
    assert sel.single_target_retry is picked


def test_single_target_retry_needs_one_target() -> None:
    combo = mk(t("a"), t("b"), wait=10_000)
    store = MemoryStateStore()
    cool(store, combo, "a", 2_000)
    cool(store, combo, "b", 2_000)
    sel = run_select(combo, store, Clock(), attempted=frozenset({"a/m"}), single_target_retry=True)
    assert sel.target == t("b") and not sel.single_target_retry


def test_override_pins_even_when_cooling() -> None:
    combo = mk(t("a"), t("b"), t("c"), strategy="round-robin", override="b/m")
    store = MemoryStateStore()
    cool(store, combo, "b", 50_000)
    sel = run_select(combo, store, Clock())
    assert sel.target == t("b") and not sel.probe
    assert sel.skipped == (("a/m", SKIP_OVERRIDE), ("c/m", SKIP_OVERRIDE))
    assert run_select(combo, store, Clock(), attempted=frozenset({"b/m"})).target is None


# --- last-resort policy (§2.6 and the PR's pinned cases) ----------------------------------------

LR = "before-last-resort"
LRC = t("c", last_resort=True)


def lr_combo(wait: int = 10_000, strategy: str = "failover", policy: str | None = LR) -> ComboSpec:
    return mk(t("a"), t("b"), t("c", last_resort=True), strategy=strategy, wait=wait, policy=policy)


def test_brief_cooldown_waits_instead_of_taking_last_resort() -> None:
    combo = lr_combo()
    store = MemoryStateStore()
    cool(store, combo, "a", 2_000)
    cool(store, combo, "b", 600_000)
    clock = Clock()
    sel = run_select(combo, store, clock)
    assert clock.sleeps == [2_000] and sel.target == t("a")
    assert sel.notes == ("[combo] main: deferring last resort, waiting 2000ms for a/m",)


def test_without_policy_last_resort_is_taken_immediately() -> None:
    combo = lr_combo(policy=None)
    store = MemoryStateStore()
    cool(store, combo, "a", 2_000)
    cool(store, combo, "b", 600_000)
    clock = Clock()
    assert run_select(combo, store, clock).target == LRC and clock.sleeps == []


@pytest.mark.parametrize(
    ("case", "wait", "cooldowns", "attempted", "rejected"),
    [
        ("cooling beyond budget", 10_000, {"a": 10_001, "b": 600_000}, (), ()),
        ("all excluded", 10_000, {}, ("a", "b"), ()),
        ("predicate rules out", 10_000, {}, (), ("a", "b")),
        ("budget zero", 0, {"a": 1, "b": 600_000}, (), ()),
        ("mixed", 10_000, {"b": 20_000}, ("a",), ()),
    ],
)
def test_policy_only_defers(
    case: str,
    wait: int,
    cooldowns: dict[str, int],
    attempted: tuple[str, ...],
    rejected: tuple[str, ...],
) -> None:
    combo = lr_combo(wait=wait)
    store = MemoryStateStore()
    for p, until in cooldowns.items():
        cool(store, combo, p, until)
    clock = Clock()
    sel = run_select(
        combo,
        store,
        clock,
        attempted=frozenset(key(p) for p in attempted),
        predicate=lambda x: "quota_exhausted" if x.provider in rejected else None,
    )
    assert sel.target == LRC, case
    assert clock.sleeps == [], case


def test_all_last_resort_combo_dispatches_normally() -> None:
    combo = mk(t("a", last_resort=True), t("b", last_resort=True), wait=10_000, policy=LR)
    store = MemoryStateStore()
    assert run_select(combo, store, Clock()).target == t("a", last_resort=True)
    cool(store, combo, "a", 2_000)
    clock = Clock()
    assert run_select(combo, store, clock).target == t("b", last_resort=True) and clock.sleeps == []


def test_deferral_never_waits_on_last_resort_cooldown() -> None:
    # a is beyond the budget; the fall-through may wait for c (the only candidate left),
    # but that wait is the ordinary one, never the "deferring last resort" one.
    combo = lr_combo()
    store = MemoryStateStore()
    cool(store, combo, "a", 600_000)
    cool(store, combo, "b", 600_000)
    cool(store, combo, "c", 1_000)
    clock = Clock()
    sel = run_select(combo, store, clock)
    assert clock.sleeps == [1_000] and sel.target == LRC
    assert not any("deferring last resort" in n for n in sel.notes)
    assert sel.notes == ("[combo] main: all targets cooling, waiting 1000ms for c/m",)


def recool_after_expiry(store: MemoryStateStore, combo: ComboSpec, clock: Clock) -> None:
    def hook(now: int) -> None:
        if now >= 3_000 and sync(store.get("main")).cooling_until(key("a"), now) is None:
            sync(
                store.update(
                    "main",
                    lambda s: (note_failure(s, combo, key("a"), now + 600_000, now=now), None),
                )
            )

    clock.hooks.append(hook)


@pytest.mark.parametrize(
    ("c_until", "sleeps"),
    [(3_500, [3_000, 500]), (9_000, [3_000, 6_000])],
)
def test_shared_budget_pinned(c_until: int, sleeps: list[int]) -> None:
    combo = lr_combo(wait=10_000)
    store = MemoryStateStore()
    cool(store, combo, "a", 3_000)
    cool(store, combo, "b", 600_000)
    cool(store, combo, "c", c_until)
    clock = Clock()
    recool_after_expiry(store, combo, clock)
    sel = run_select(combo, store, clock)
    assert clock.sleeps == sleeps
    assert sum(clock.sleeps) <= 10_000
    assert sel.target == LRC and sel.waited_ms == sum(sleeps)
    assert sel.notes[0].startswith("[combo] main: deferring last resort, waiting 3000ms")
    assert "all targets cooling" in sel.notes[1]


def test_shared_budget_exhausted_by_deferral_returns_nothing() -> None:
    combo = lr_combo(wait=10_000)
    store = MemoryStateStore()
    cool(store, combo, "a", 3_000)
    cool(store, combo, "b", 600_000)
    cool(store, combo, "c", 11_000)  # 8 s left after the deferral, only 7 s of budget
    clock = Clock()
    recool_after_expiry(store, combo, clock)
    sel = run_select(combo, store, clock)
    assert clock.sleeps == [3_000] and sel.target is None and sel.retry_at == 11_000


@pytest.mark.parametrize("strategy", ["round-robin", "random", "least-used", "reset-window"])
def test_last_resort_out_of_every_rotation(strategy: str) -> None:
    combo = mk(t("a"), t("c", 100, last_resort=True), strategy=strategy, policy=LR)
    got = serve(combo, 5, rng=random.Random(3))
    assert names(got) == "AAAAA"


def test_last_resort_skip_reason_recorded() -> None:
    sel = run_select(lr_combo(), MemoryStateStore(), Clock())
    assert sel.target == t("a") and sel.skipped == (("c/m", SKIP_LAST_RESORT),)


@pytest.mark.parametrize(
    ("policy", "attempted", "cooled_b", "declined", "target"),
    [
        (LR, ("a",), True, True, None),  # normal b merely cooling: decline the last resort
        (LR, ("a", "b"), False, False, "c"),  # every normal attempted: take it
        (None, ("a",), True, False, "c"),  # no policy: take it
        (LR, ("a",), False, False, "b"),
    ],
)
def test_synchronous_hop(
    policy: str | None,
    attempted: tuple[str, ...],
    cooled_b: bool,
    declined: bool,
    target: str | None,
) -> None:
    combo = lr_combo(policy=policy)
    state = ComboState()
    if cooled_b:
        state = note_failure(state, combo, key("b"), 600_000, now=0)
    _, p = advance_after_failure(
        combo,
        PROVIDERS,
        state,
        now=0,
        rng=random.Random(0),
        attempted=frozenset(key(x) for x in attempted),
    )
    assert p.declined is declined
    assert (p.target.provider if p.target else None) == target


@pytest.mark.parametrize(
    ("b_until", "sleeps", "target"), [(4_000, [4_000], "b"), (60_000, [], "c")]
)
def test_select_after_failure_falls_through_to_waiting(
    b_until: int, sleeps: list[int], target: str
) -> None:
    combo = lr_combo(wait=10_000)
    store = MemoryStateStore()
    cool(store, combo, "a", 600_000)
    cool(store, combo, "b", b_until)
    clock = Clock()
    sel = run_select(combo, store, clock, attempted=frozenset({"a/m"}), after_failure=True)
    assert clock.sleeps == sleeps and sel.target == (LRC if target == "c" else t(target))


# --- properties --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=5), st.integers(1, 3))
def test_round_robin_share_matches_weights(weights: list[int], cycles: int) -> None:
    cands = tuple(t(p, w) for p, w in zip("abcde", weights, strict=False))
    state = ComboState()
    counts: Counter[str] = Counter()
    for _ in range(sum(weights) * cycles):
        state, got = pick_round_robin(replace(state, active_key=None), cands)
        assert got is not None
        counts[got.provider] += 1
    assert counts == Counter({c.provider: c.weight * cycles for c in cands})


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=1, max_size=4), st.integers(0, 2**32))
def test_random_share_matches_weights(weights: list[int], seed: int) -> None:
    cands = tuple(t(p, w) for p, w in zip("abcd", weights, strict=False))
    rng = random.Random(seed)
    n = 20_000
    counts = Counter(x.provider for x in (pick_random(cands, rng) for _ in range(n)) if x)
    total = sum(weights)
    for c in cands:
        assert abs(counts[c.provider] / n - c.weight / total) < 0.03


target_st = st.builds(
    lambda p, w, lr: t(p, w, lr),
    st.sampled_from("abcdx"),
    st.integers(1, 5),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    targets=st.lists(target_st, min_size=1, max_size=5, unique_by=lambda x: x.key),
    strategy=st.sampled_from(["failover", "round-robin", "random", "least-used", "reset-window"]),
    policy=st.sampled_from([None, LR]),
    disabled=st.sets(st.sampled_from("abcd")),
    attempted=st.sets(st.sampled_from("abcdx")),
    rejected=st.sets(st.sampled_from("abcdx")),
    cooldowns=st.dictionaries(st.sampled_from("abcdx"), st.integers(0, 20_000)),
    probes=st.dictionaries(st.sampled_from("abcdx"), st.integers(0, 20_000)),
    outcomes=st.lists(st.sampled_from(["ok", "fail", "abort"]), min_size=1, max_size=8),
    seed=st.integers(0, 1000),
    now=st.integers(0, 20_000),
)
def test_never_picks_ineligible_or_attempted(
    targets: list[TargetSpec],
    strategy: str,
    policy: str | None,
    disabled: set[str],
    attempted: set[str],
    rejected: set[str],
    cooldowns: dict[str, int],
    probes: dict[str, int],
    outcomes: list[str],
    seed: int,
    now: int,
) -> None:
    combo = mk(*targets, strategy=strategy, policy=policy)
    providers = {k: replace(v, disabled=k in disabled) for k, v in PROVIDERS.items()}
    state = ComboState(
        cooldowns={key(k): v for k, v in cooldowns.items()},  # type: ignore[arg-type]
        probes={key(k): v for k, v in probes.items()},  # type: ignore[arg-type]
    )
    excluded = frozenset(key(p) for p in attempted)
    rng = random.Random(seed)
    for outcome in outcomes:
        before = state
        state, p = plan(
            combo,
            providers,
            state,
            now=now,
            rng=rng,
            attempted=excluded,
            predicate=lambda x: "rejected" if x.provider in rejected else None,
            quota_resets={key("b"): now + 5, key("c"): now + 1},
        )
        if p.target is None:
            continue
        x = p.target
        assert x in combo.targets
        assert x.provider in providers and not providers[x.provider].disabled
        assert x.key not in excluded and x.provider not in rejected
        assert before.cooling_until(x.key, now) is None
        assert not before.probe_held(x.key, now)
        normal_ok = [
            y
            for y in combo.targets
            if not y.last_resort and y.key not in dict(p.skipped) and y != x
        ]
        if policy == LR and x.last_resort and any(not y.last_resort for y in combo.targets):
            assert not normal_ok
        if outcome == "ok":
            state = note_success(state, combo, x.key)
        elif outcome == "fail":
            state = note_failure(state, combo, x.key, now + 1_000, now=now)
        else:
            state = note_abort(state, combo, x.key, probe=p.probe)
