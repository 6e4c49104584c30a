"""The attempt loop: select a target, dispatch, classify the failure, cool, hop or stop.

I/O is injected: `dispatch(target)` performs one upstream attempt and says whether it
committed (output reached the client, PRODUCT §5.4) or failed before commit. The loop
owns the bookkeeping of combos-behaviour.md §3–§4: at most one attempt per target
(plus the single-target retry and a combo's `retrySameTarget`, `routing.retry`), cooldowns
with the §3.4 precedence, scopes of §3.3, client aborts that advance nothing, and the route
trace for the request log.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from routing import state as st
from routing.classify import Decision, Failure, classify, overflow_allows
from routing.cooldown import cooldown
from routing.eligibility import AccessOf
from routing.retry import retry_wait
from routing.strategies import Predicate, Sleep, retry_after_seconds, select
from routing.types import ComboSpec, ProviderSpec, TargetSpec


@dataclass(frozen=True)
class Outcome:
    """What one dispatch did. `committed`: the client got output (success, or a failure
    after commit that was already reported in-stream, then `failure` says what broke).
    Otherwise `failure` describes the pre-commit failure to classify."""

    committed: bool
    failure: Failure | None = None
    status: int = 200
    # Token usage the upstream reported (a `providers.wire.usage.Usage`), if any.
    usage: Any = None
    # False when the failure is already handled per credential (a caller's own quota on a
    # shared `chatgpt` target): the target is not cooled for everyone else.
    cool: bool = True
    # True when a caller-forward provider refused the caller's own credential (401/403): the
    # failure is that caller's, so the shared routing state is not touched at all (issue #26).
    callers_own: bool = False
    # Malformed (non-JSON) stream frames seen in this attempt (forwarded or not).
    malformed: int = 0


@dataclass(frozen=True)
class AttemptRecord:
    target: str
    status: int | None
    # "served", "hop", "stop", "failed_after_commit", "client_cancelled", "local_overload",
    # "retry" (the same target is tried again after `wait_ms`: no cooldown, no failure noted)
    outcome: str
    reason: str = ""
    cooled_until: int | None = None
    ms: int = 0
    malformed: int = 0  # malformed stream frames (`Outcome.malformed`)
    wait_ms: int | None = None  # "retry" only: the wait before the next try


@dataclass
class RouteResult:
    """`served`: the target that committed. Otherwise either `unavailable` (the first pick
    found nothing: 503 combo_unavailable with `retry_after`) or `failure` + `decision`
    (the last upstream failure, to return sanitized with its own status)."""

    served: TargetSpec | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    unavailable: bool = False
    retry_after: str | None = None
    failure: Failure | None = None
    decision: Decision | None = None
    failed_after_commit: bool = False
    usage: Any = None


Dispatch = Callable[[TargetSpec, bool], Awaitable[Outcome]]


def _and(first: Predicate | None, second: Predicate | None) -> Predicate | None:
    if first is None or second is None:
        return first or second

    def both(target: TargetSpec) -> str | None:
        return first(target) or second(target)

    return both


async def route(
    combo: ComboSpec,
    providers: Mapping[str, ProviderSpec],
    store: st.StateStore,
    *,
    dispatch: Dispatch,
    now: Callable[[], int],
    sleep: Sleep,
    rng: random.Random,
    predicate: Predicate | None = None,
    quota_resets: Mapping[str, int | None] | None = None,
    on_cooldown: Callable[[str, int, str], None] | None = None,
    result: RouteResult | None = None,
    revision: int = 0,
    access: AccessOf | None = None,
    on_recovered: Callable[[str], None] | None = None,
) -> RouteResult:
    """Route one request through `combo`. `dispatch(target, is_last_chance)` is awaited at most
    once per target (plus the single-target retry); cancellation (client abort) propagates after
    the attempt is recorded, with no cooldown and no success counted. `revision` is the config
    version `combo` was loaded at: a request still running when its combo changes writes
    nothing into the new definition's state (`state.stamped`)."""
    # Filled in place, so a caller whose request is cancelled still has the trace so far.
    result = RouteResult() if result is None else result
    attempted: set[str] = set()
    seen_skips: set[tuple[str, str]] = set()
    after_failure = False
    retry_available = True
    overflow: Predicate | None = None
    first = True
    while True:
        selection = await select(
            combo,
            providers,
            store,
            now=now,
            sleep=sleep,
            rng=rng,
            attempted=frozenset(attempted),
            predicate=_and(predicate, overflow),
            after_failure=after_failure,
            quota_resets=quota_resets,
            single_target_retry=retry_available,
            revision=revision,
            access=access,
        )
        for skip in selection.skipped:
            if skip not in seen_skips and skip[1] != "attempted":
                seen_skips.add(skip)
                result.skipped.append(skip)
        target = selection.target
        if target is None:
            if first:
                result.unavailable = True
                result.retry_after = (
                    None
                    if selection.retry_at is None
                    else str(retry_after_seconds(selection.retry_at, now()))
                )
            return result
        first = False
        if selection.single_target_retry:
            retry_available = False
        key = target.key
        try:
            outcome, elapsed = await _dispatch_retrying(
                combo, providers, target, dispatch, result, now=now, sleep=sleep, rng=rng
            )
        except (asyncio.CancelledError, Exception):
            # The client went, or the dispatch stopped for a reason of its own (a buffered
            # answer over its bound): the pick's probe lease is handed back either way.
            await store.update(
                combo.id, st.stamped(combo, revision, _aborted(combo, key, selection.probe))
            )
            raise
        if outcome.committed and outcome.failure is None:
            # A success that changes nothing in the state this pick saw (a healthy failover
            # target) is not written: one store round trip less per request. A cooldown another
            # worker set meanwhile then stays until it ends, the conservative way round.
            seen = selection.state
            if seen is None or st.note_success(seen, combo, key) != seen:
                await store.update(combo.id, st.stamped(combo, revision, _succeeded(combo, key)))
            if on_recovered is not None and seen is not None and key in seen.cooldowns:
                on_recovered(key)  # a cooled or half-open target served: healthy again
            result.attempts.append(
                AttemptRecord(key, outcome.status, "served", "", None, elapsed, outcome.malformed)
            )
            result.served = target
            result.usage = outcome.usage
            return result
        failure = outcome.failure
        assert failure is not None
        decision = classify(failure)
        if decision.local_overload:
            # ocx's own limit, not the target's: no cooldown, no failure noted, no hop counted
            # against it (only a probe lease this pick took is handed back, as on an abort). The
            # request may still try another target, which has its own pool.
            if selection.probe:
                await store.update(
                    combo.id, st.stamped(combo, revision, _aborted(combo, key, True))
                )
            result.attempts.append(
                AttemptRecord(key, None, "local_overload", decision.reason, None, elapsed)
            )
            result.failure = failure
            result.decision = decision
            attempted.add(key)
            after_failure = True
            continue
        at = now()
        if outcome.callers_own and not outcome.committed:
            # Another caller's valid token would be served: no cooldown, stickiness kept, only
            # a probe lease this request held is given back. No retry of the same target.
            decision = replace(
                decision, reason="caller_credential", scope="none", request_local=True
            )
            until: int | None = None
            cooled: tuple[str, ...] = ()
            retry_available = False
            if selection.probe:
                await store.update(
                    combo.id, st.stamped(combo, revision, _aborted(combo, key, True))
                )
        else:
            found = cooldown(failure, decision, combo_cooldown_ms=combo.cooldown_ms, now=at)
            until = None if found is None or not outcome.cool else at + found.ms
            cooled = _cooled_keys(combo, target, decision) if until is not None else ()
            await store.update(
                combo.id, st.stamped(combo, revision, _failed(combo, (key, *cooled), until, at))
            )
        if until is not None and on_cooldown is not None:
            for other in cooled:
                on_cooldown(other, until, decision.reason)
        if outcome.committed:
            result.attempts.append(
                AttemptRecord(
                    key,
                    outcome.status,
                    "failed_after_commit",
                    decision.reason,
                    until,
                    elapsed,
                    outcome.malformed,
                )
            )
            result.served = target
            result.usage = outcome.usage
            result.failed_after_commit = True
            result.failure = failure
            return result
        result.failure = failure
        result.decision = decision
        if not decision.hop:
            result.attempts.append(
                AttemptRecord(key, failure.status, "stop", decision.reason, until, elapsed)
            )
            return result
        result.attempts.append(
            AttemptRecord(
                key, failure.status, "hop", decision.reason, until, elapsed, outcome.malformed
            )
        )
        attempted.add(key)
        after_failure = True
        if decision.needs_larger_context:
            failed_window = _context_window(providers, target)
            overflow = _larger_than(providers, failed_window)


async def _dispatch_retrying(
    combo: ComboSpec,
    providers: Mapping[str, ProviderSpec],
    target: TargetSpec,
    dispatch: Dispatch,
    result: RouteResult,
    *,
    now: Callable[[], int],
    sleep: Sleep,
    rng: random.Random,
) -> tuple[Outcome, int]:
    """Dispatch `target`, and again after a transient failure while the combo's
    `retrySameTarget` allows (each retry is a "retry" record: nothing cooled or noted); the
    last outcome and its duration. The deadline is the target's `totalMs` from the first try.
    On a client abort the attempt (or the wait) is recorded as cancelled and the error raised."""
    policy = combo.retry_same_target
    deadline: int | None = None
    retries = 0
    while True:
        started = now()
        if policy is not None and retries == 0:
            provider = providers.get(target.provider)
            deadline = None if provider is None else started + provider.timeouts.total_ms
        try:
            outcome = await dispatch(target, False)
        except asyncio.CancelledError:
            result.attempts.append(
                AttemptRecord(
                    target.key, 499, "client_cancelled", "client_cancelled", None, now() - started
                )
            )
            raise
        elapsed = now() - started
        failure = outcome.failure
        if policy is None or failure is None or outcome.committed:
            return outcome, elapsed
        if outcome.callers_own or not outcome.cool:
            return outcome, elapsed  # the caller's own credential or quota: not transient
        decision = classify(failure)
        verdict = retry_wait(
            failure, decision, policy, retries_done=retries, now=now(), deadline=deadline, rng=rng
        )
        if verdict.wait_ms is None:
            return outcome, elapsed
        result.attempts.append(
            AttemptRecord(
                target.key,
                failure.status,
                "retry",
                decision.reason,
                None,
                elapsed,
                outcome.malformed,
                verdict.wait_ms,
            )
        )
        retries += 1
        waited = now()
        try:
            await sleep(verdict.wait_ms)
        except asyncio.CancelledError:
            result.attempts.append(
                AttemptRecord(
                    target.key, 499, "client_cancelled", "client_cancelled", None, now() - waited
                )
            )
            raise


Update = Callable[[st.ComboState], tuple[st.ComboState, None]]


def _ms(now: Callable[[], int], started: int) -> int:
    return now() - started


def _aborted(combo: ComboSpec, key: str, probe: bool) -> Update:
    return lambda s: (st.note_abort(s, combo, key, probe=probe), None)


def _succeeded(combo: ComboSpec, key: str) -> Update:
    return lambda s: (st.note_success(s, combo, key), None)


def _failed(combo: ComboSpec, keys: tuple[str, ...], until: int | None, at: int) -> Update:
    def fail(s: st.ComboState) -> tuple[st.ComboState, None]:
        for key in dict.fromkeys(keys):
            s = st.note_failure(s, combo, key, until, at)
        return s, None

    return fail


def _cooled_keys(combo: ComboSpec, target: TargetSpec, decision: Decision) -> tuple[str, ...]:
    if decision.scope == "provider":
        return tuple(t.key for t in combo.targets if t.provider == target.provider)
    return (target.key,)


def _context_window(providers: Mapping[str, ProviderSpec], target: TargetSpec) -> int | None:
    provider = providers.get(target.provider)
    model = None if provider is None else provider.models.get(target.model)
    return None if model is None else model.context_window


def _larger_than(providers: Mapping[str, ProviderSpec], failed: int | None) -> Predicate:
    def larger(target: TargetSpec) -> str | None:
        if overflow_allows(failed, _context_window(providers, target)):
            return None
        return "context_too_small"

    return larger
