"""Target selection for combos: eligibility, strategies, last-resort policy and cooldown waits.

Implements combos-behaviour.md §2.2–§2.8 and PRODUCT.md §5.1/§5.3/§5.8. Everything but `select`
is a pure function of (combo, providers, state, now, rng): `assess` says which targets may be
picked now and why the others are skipped, `pick` applies the strategy to a candidate list, and
`plan` makes one selection decision (pick, wait, or nothing) including the last-resort policy.
`select` is the async entry point for the attempt loop: it runs `plan` through a `StateStore`
(atomic read-modify-write), sleeps when `plan` says so, and charges every sleep to the combo's
single `waitForCooldownMs` budget per selection.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from routing.eligibility import (
    HARD_SKIPS,
    RESOLVED,
    SKIP_COOLING,
    SKIP_OVERRIDE,
    SKIP_PROBING,
    AccessOf,
    target_state,
)
from routing.eligibility import SKIP_PROVIDER_DISABLED as SKIP_PROVIDER_DISABLED
from routing.eligibility import SKIP_PROVIDER_MISSING as SKIP_PROVIDER_MISSING
from routing.state import ComboState, StateStore, retain, stamped
from routing.types import ComboSpec, ProviderSpec, TargetSpec

POLICY_BEFORE_LAST_RESORT = "before-last-resort"
# A half-open probe whose outcome is never reported frees the target after this long.
PROBE_LEASE_MS = 60_000
QUOTA_FRESH_MS = 30 * 60_000

# Skip reasons recorded in the request log (`Selection.skipped`).
# (provider, credential, quota, override, cooling and probing skips: `eligibility.SKIP_*`.)
SKIP_ATTEMPTED = "attempted"
SKIP_LAST_RESORT = "last_resort_deferred"
# Skips checked after the caller's predicate (the reference's order).
_LATE_SKIPS = (None, SKIP_OVERRIDE, SKIP_COOLING, SKIP_PROBING)

# Caller predicate: None accepts the target, a string rejects it with that skip reason
# (e.g. "credential_unresolved", "quota_exhausted", "encrypted_task").
Predicate = Callable[[TargetSpec], str | None]
Sleep = Callable[[int], Awaitable[None]]


@dataclass(frozen=True)
class Eligibility:
    """`eligible`: pickable now, in configured order. `cooling`: otherwise eligible but cooling
    (the waitable set), with the cooldown end. `skipped`: (key, reason) for every target that is
    not eligible, in configured order. `retrying`: keys admitted by the single-target retry."""

    eligible: tuple[TargetSpec, ...]
    cooling: tuple[tuple[TargetSpec, int], ...]
    skipped: tuple[tuple[str, str], ...]
    retrying: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    """One pure selection decision. Exactly one of: `target` set (dispatch it), `wait_ms > 0`
    (sleep, then plan again; `deferring` marks the last-resort deferral wait), or neither (nothing
    available; `retry_at` is the earliest unexpired cooldown end, for `Retry-After`).
    `declined` marks the synchronous post-failure hop refusing a last resort."""

    target: TargetSpec | None = None
    skipped: tuple[tuple[str, str], ...] = ()
    wait_ms: int = 0
    wait_for: str | None = None
    deferring: bool = False
    declined: bool = False
    retry_at: int | None = None
    probe: bool = False
    single_target_retry: bool = False


@dataclass(frozen=True)
class Selection:
    """Result of `select`. `target` None means nothing is available: answer 503
    `combo_unavailable` on the first pick (with `retry_after_seconds(retry_at, now)`), else the
    last upstream failure. `probe`: this request holds the half-open lease of `target` (pass it to
    `note_abort`). `single_target_retry`: this dispatch uses the one same-target retry (§2.8).
    `notes`: the warnings logged while waiting. `state`: the routing state as this pick left
    it (None when nothing was picked)."""

    target: TargetSpec | None
    skipped: tuple[tuple[str, str], ...]
    waited_ms: int = 0
    retry_at: int | None = None
    probe: bool = False
    single_target_retry: bool = False
    notes: tuple[str, ...] = ()
    state: ComboState | None = None


def policy_active(combo: ComboSpec) -> bool:
    """The last-resort policy applies: opted in and at least one normal target exists."""
    return combo.cooldown_wait_policy == POLICY_BEFORE_LAST_RESORT and any(
        not t.last_resort for t in combo.targets
    )


def assess(
    combo: ComboSpec,
    providers: Mapping[str, ProviderSpec],
    state: ComboState,
    *,
    now: int,
    attempted: frozenset[str] = frozenset(),
    predicate: Predicate | None = None,
    single_target_retry: bool = False,
    access: AccessOf | None = None,
) -> Eligibility:
    """Eligibility of every target (§2.2), checked in order: provider exists and is enabled, not
    attempted in this request, credential and quota (`access`, the caller's per target), caller
    predicate, override pin, not cooling, no foreign probe lease. The target's own part is
    `eligibility.target_state`, the same function status and badges show.

    `single_target_retry` admits the only target of a one-target combo with a wait budget again
    after a cooling failure (§2.8, #4824); the caller passes False after request-local rejections
    or once the retry was used. A manual `override` pins the combo to that target, bypassing
    cooldowns and leases (no automatic switching, PRODUCT.md §8.5).
    """
    eligible: list[TargetSpec] = []
    cooling: list[tuple[TargetSpec, int]] = []
    skipped: list[tuple[str, str]] = []
    retrying: set[str] = set()
    retry_ok = single_target_retry and len(combo.targets) == 1 and combo.wait_for_cooldown_ms > 0
    for target in combo.targets:
        key = target.key
        ts = target_state(
            target,
            providers=providers,
            state=state,
            now=now,
            override=combo.override,
            access=RESOLVED if access is None else access(target),
        )
        # The target's own state decides; request-local checks (attempted, the caller's
        # predicate) slot in where the reference checks them.
        reason: str | None = ts.skip if ts.skip in HARD_SKIPS else None
        if reason is None and key in attempted:
            # Only a target that was cooled may be retried, and only after its cooldown.
            if retry_ok and key in state.cooldowns:
                retrying.add(key)
            else:
                reason = SKIP_ATTEMPTED
        if reason is None and ts.skip not in _LATE_SKIPS:
            reason = ts.skip
        if reason is None and predicate is not None:
            reason = predicate(target)
        if reason is None:
            reason = ts.skip
            if reason == SKIP_COOLING:
                assert ts.until is not None
                cooling.append((target, ts.until))
        if reason is None:
            eligible.append(target)
        else:
            skipped.append((key, reason))
    return Eligibility(tuple(eligible), tuple(cooling), tuple(skipped), frozenset(retrying))


def pick_failover(candidates: tuple[TargetSpec, ...]) -> TargetSpec | None:
    """The first candidate in configured order (§2.3)."""
    return candidates[0] if candidates else None


def pick_round_robin(
    state: ComboState, candidates: tuple[TargetSpec, ...]
) -> tuple[ComboState, TargetSpec | None]:
    """Smooth weighted round-robin with success-counted stickiness (§2.4).

    A still-eligible sticky target is returned unchanged (a pick without a success stays pinned).
    Otherwise one SWRR step over the candidates only: non-candidates keep their weight and are
    left out of the total; ties go to the earlier target.
    """
    if not candidates:
        return state, None
    for target in candidates:
        if target.key == state.active_key:
            return state, target
    weights = dict(state.current_weights)
    total = 0
    best: TargetSpec | None = None
    for target in candidates:
        weights[target.key] = weights.get(target.key, 0) + target.weight
        total += target.weight
        if best is None or weights[target.key] > weights[best.key]:
            best = target
    assert best is not None
    weights[best.key] -= total
    return (
        replace(
            state,
            current_weights=MappingProxyType(weights),
            active_key=best.key,
            successes=0,
        ),
        best,
    )


def pick_random(candidates: tuple[TargetSpec, ...], rng: random.Random) -> TargetSpec | None:
    """Weighted draw (§2.5): r = uniform[0,1) × Σw, walk subtracting weights, first r <= 0."""
    if not candidates:
        return None
    r = rng.random() * sum(t.weight for t in candidates)
    for target in candidates:
        r -= target.weight
        if r <= 0:
            return target
    return candidates[-1]


def pick_least_used(state: ComboState, candidates: tuple[TargetSpec, ...]) -> TargetSpec | None:
    """Fewest recorded successes; ties keep configured order (§2.5)."""
    best: TargetSpec | None = None
    for target in candidates:
        count = state.success_counts.get(target.key, 0)
        if best is None or count < state.success_counts.get(best.key, 0):
            best = target
    return best


def pick_reset_window(
    candidates: tuple[TargetSpec, ...], now: int, quota_resets: Mapping[str, int | None]
) -> TargetSpec | None:
    """Soonest future quota reset wins (§2.5); no applicable reset ranks last; ties keep order.

    `quota_resets[key]` is the soonest applicable reset of the target's fresh snapshot (see
    `fresh_reset_at`), or None/absent when there is none.
    """
    best: TargetSpec | None = None
    best_score = math.inf
    for target in candidates:
        reset = quota_resets.get(target.key)
        score = reset - now if reset is not None and reset > now else math.inf
        if best is None or score < best_score:
            best, best_score = target, score
    return best


def fresh_reset_at(
    updated_at: int, reset_times: Iterable[float | int | None], now: int
) -> int | None:
    """The soonest reset of a quota snapshot for reset-window ranking: the snapshot must be at
    most 30 minutes old (exactly 30 minutes is fresh), and only finite times strictly after
    `now` count."""
    if now - updated_at > QUOTA_FRESH_MS:
        return None
    future = [
        int(t)
        for t in reset_times
        if t is not None and isinstance(t, int | float) and math.isfinite(t) and t > now
    ]
    return min(future) if future else None


def pick(
    combo: ComboSpec,
    state: ComboState,
    candidates: tuple[TargetSpec, ...],
    *,
    now: int,
    rng: random.Random,
    quota_resets: Mapping[str, int | None] | None = None,
) -> tuple[ComboState, TargetSpec | None]:
    """Apply the combo's strategy to already-eligible candidates; only round-robin changes state."""
    strategy = combo.strategy
    if strategy == "round-robin":
        return pick_round_robin(state, candidates)
    if strategy == "random":
        return state, pick_random(candidates, rng)
    if strategy == "least-used":
        return state, pick_least_used(state, candidates)
    if strategy == "reset-window":
        return state, pick_reset_window(candidates, now, quota_resets or {})
    return state, pick_failover(candidates)


def retry_at(combo: ComboSpec, state: ComboState, now: int) -> int | None:
    """The earliest unexpired cooldown end over the combo's targets (None when nothing cools)."""
    ends = [u for t in combo.targets if (u := state.cooling_until(t.key, now)) is not None]
    return min(ends) if ends else None


def retry_after_seconds(retry_at_ms: int | None, now: int) -> int | None:
    """`Retry-After` for `combo_unavailable`: ceil of the remaining seconds, at least 1."""
    if retry_at_ms is None or retry_at_ms <= now:
        return None
    return max(1, -(-(retry_at_ms - now) // 1000))


def _earliest(cooling: Iterable[tuple[TargetSpec, int]]) -> tuple[TargetSpec, int] | None:
    best: tuple[TargetSpec, int] | None = None
    for entry in cooling:
        if best is None or entry[1] < best[1]:
            best = entry
    return best


def _ordered_skips(
    combo: ComboSpec, skipped: Iterable[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
    reasons = dict(skipped)
    return tuple((t.key, reasons[t.key]) for t in combo.targets if t.key in reasons)


def plan(
    combo: ComboSpec,
    providers: Mapping[str, ProviderSpec],
    state: ComboState,
    *,
    now: int,
    rng: random.Random,
    attempted: frozenset[str] = frozenset(),
    predicate: Predicate | None = None,
    budget_ms: int = 0,
    quota_resets: Mapping[str, int | None] | None = None,
    single_target_retry: bool = False,
    decline_last_resort: bool = False,
    probe_lease_ms: int = PROBE_LEASE_MS,
    access: AccessOf | None = None,
) -> tuple[ComboState, Plan]:
    """One selection decision with `budget_ms` of waiting left (§2.6, §2.8).

    Under the last-resort policy: normal targets eligible now are picked first (last resorts do
    not even rotate); otherwise, if the earliest *normal* cooldown ends within the budget, wait
    for it (`deferring`); otherwise the last resorts are released. With no candidate at all, wait
    for the earliest waitable cooldown if it fits the budget. `decline_last_resort` is the
    synchronous post-failure hop: it returns `declined` instead of a last resort while a normal
    target is merely cooling. Picking a half-open target takes its probe lease.
    """
    state = retain(state, combo)
    el = assess(
        combo,
        providers,
        state,
        now=now,
        attempted=attempted,
        predicate=predicate,
        single_target_retry=single_target_retry,
        access=access,
    )
    candidates = el.eligible
    deferred: tuple[tuple[str, str], ...] = ()
    if policy_active(combo) and combo.override is None:
        normal = tuple(t for t in el.eligible if not t.last_resort)
        deferred = tuple((t.key, SKIP_LAST_RESORT) for t in el.eligible if t.last_resort)
        if normal:
            candidates = normal
        else:
            soonest = _earliest((t, u) for t, u in el.cooling if not t.last_resort)
            skipped = _ordered_skips(combo, el.skipped + deferred)
            if soonest is not None and el.eligible and decline_last_resort:
                return state, Plan(skipped=skipped, declined=True)
            if soonest is not None and soonest[1] - now <= budget_ms:
                wait = Plan(
                    skipped=skipped,
                    wait_ms=soonest[1] - now,
                    wait_for=soonest[0].key,
                    deferring=True,
                )
                return state, wait
            deferred = ()
    skipped = _ordered_skips(combo, el.skipped + deferred)
    if candidates:
        state, target = pick(combo, state, candidates, now=now, rng=rng, quota_resets=quota_resets)
        assert target is not None
        probe = combo.override is None and state.is_half_open(target.key, now)
        if probe:
            probes = dict(state.probes)
            probes[target.key] = now + probe_lease_ms
            state = replace(state, probes=MappingProxyType(probes))
        chosen = Plan(
            target=target,
            skipped=skipped,
            probe=probe,
            single_target_retry=target.key in el.retrying,
        )
        return state, chosen
    soonest = _earliest(el.cooling)
    if soonest is not None and soonest[1] - now <= budget_ms:
        return state, Plan(skipped=skipped, wait_ms=soonest[1] - now, wait_for=soonest[0].key)
    return state, Plan(skipped=skipped, retry_at=retry_at(combo, state, now))


def advance_after_failure(
    combo: ComboSpec,
    providers: Mapping[str, ProviderSpec],
    state: ComboState,
    *,
    now: int,
    rng: random.Random,
    attempted: frozenset[str],
    predicate: Predicate | None = None,
    quota_resets: Mapping[str, int | None] | None = None,
    access: AccessOf | None = None,
) -> tuple[ComboState, Plan]:
    """The synchronous post-failure hop (§2.6 step 6): an immediate pick that never waits and,
    under the policy, declines a last resort while a normal target is merely cooling."""
    return plan(
        combo,
        providers,
        state,
        now=now,
        rng=rng,
        attempted=attempted,
        predicate=predicate,
        quota_resets=quota_resets,
        decline_last_resort=True,
        access=access,
    )


def _selection(
    result: Plan, waited: int, notes: list[str], state: ComboState | None = None
) -> Selection:
    return Selection(
        target=result.target,
        skipped=result.skipped,
        waited_ms=waited,
        retry_at=result.retry_at,
        probe=result.probe,
        single_target_retry=result.single_target_retry,
        notes=tuple(notes),
        state=state if result.target is not None else None,
    )


def _wait_note(combo_id: str, result: Plan) -> str:
    if result.deferring:
        return (
            f"[combo] {combo_id}: deferring last resort, "
            f"waiting {result.wait_ms}ms for {result.wait_for}"
        )
    return (
        f"[combo] {combo_id}: all targets cooling, waiting {result.wait_ms}ms for {result.wait_for}"
    )


async def select(
    combo: ComboSpec,
    providers: Mapping[str, ProviderSpec],
    store: StateStore,
    *,
    now: Callable[[], int],
    sleep: Sleep,
    rng: random.Random,
    attempted: frozenset[str] = frozenset(),
    predicate: Predicate | None = None,
    after_failure: bool = False,
    quota_resets: Mapping[str, int | None] | None = None,
    single_target_retry: bool = False,
    refresh: Callable[[], ComboSpec | None] | None = None,
    log: Callable[[str], None] | None = None,
    probe_lease_ms: int = PROBE_LEASE_MS,
    revision: int = 0,
    access: AccessOf | None = None,
) -> Selection:
    """One selection attempt for the attempt loop, waiting at most `combo.wait_for_cooldown_ms`.

    `sleep(ms)` is awaited for every wait (wrap `asyncio.sleep(ms / 1000)`; cancelling it on client
    abort propagates out of `select`). The budget is charged with the larger of the planned sleep
    and the clock's actual advance, and the clock is re-read after each sleep. After a deferral
    the whole selection re-runs; after an ordinary wait exactly one fresh selection follows.
    `after_failure` first tries the synchronous hop, then falls through to the waiting selector.
    `refresh` re-reads the combo after a sleep; None (deleted or renamed) ends with no target.
    `revision` is the config version `combo` was loaded at (see `state.stamped`).
    """
    budget = combo.wait_for_cooldown_ms
    waited = 0
    notes: list[str] = []

    async def run(
        spec: ComboSpec, at: int, budget_ms: int, decline: bool
    ) -> tuple[Plan, ComboState]:
        def step(state: ComboState) -> tuple[ComboState, tuple[Plan, ComboState]]:
            new, chosen = plan(
                spec,
                providers,
                state,
                now=at,
                rng=rng,
                attempted=attempted,
                predicate=predicate,
                budget_ms=budget_ms,
                quota_resets=quota_resets,
                single_target_retry=single_target_retry,
                decline_last_resort=decline,
                probe_lease_ms=probe_lease_ms,
                access=access,
            )
            return new, (chosen, new)

        return await store.update(spec.id, stamped(spec, revision, step))

    if after_failure:
        hop, state = await run(combo, now(), 0, True)
        if hop.target is not None:
            return _selection(hop, waited, notes, state)
    final = False
    while True:
        started = now()
        result, state = await run(combo, started, 0 if final else budget, False)
        if result.wait_ms <= 0:
            return _selection(result, waited, notes, state)
        note = _wait_note(combo.id, result)
        notes.append(note)
        if log is not None:
            log(note)
        await sleep(result.wait_ms)
        spent = max(result.wait_ms, now() - started)
        waited += spent
        budget = max(0, budget - spent)
        final = final or not result.deferring
        if refresh is not None:
            current = refresh()
            if current is None or current.id != combo.id:
                return _selection(Plan(skipped=result.skipped), waited, notes)
            combo = current
