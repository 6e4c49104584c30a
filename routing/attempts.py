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
from routing.strategies import Predicate, Selection, Sleep, retry_after_seconds, select
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
    loop = _Loop(
        combo,
        providers,
        store,
        dispatch=dispatch,
        now=now,
        sleep=sleep,
        rng=rng,
        predicate=predicate,
        quota_resets=quota_resets,
        on_cooldown=on_cooldown,
        result=result,
        revision=revision,
        access=access,
        on_recovered=on_recovered,
    )
    first = True
    while True:
        selection = await loop.pick()
        target = selection.target
        if target is None:
            if first:
                loop.unavailable(selection)
            return result
        first = False
        if selection.single_target_retry:
            loop.retry_available = False
        outcome, elapsed = await loop.attempt(selection, target)
        if outcome.committed and outcome.failure is None:
            await loop.served(selection, target, outcome, elapsed)
            return result
        if await loop.failed(selection, target, outcome, elapsed):
            return result


class _Loop:
    """What `route` carries from one pick to the next, and its steps: pick a target, attempt
    it, then note a success, or a failure (cool, record, hop or stop)."""

    def __init__(
        self,
        combo: ComboSpec,
        providers: Mapping[str, ProviderSpec],
        store: st.StateStore,
        *,
        dispatch: Dispatch,
        now: Callable[[], int],
        sleep: Sleep,
        rng: random.Random,
        predicate: Predicate | None,
        quota_resets: Mapping[str, int | None] | None,
        on_cooldown: Callable[[str, int, str], None] | None,
        result: RouteResult,
        revision: int,
        access: AccessOf | None,
        on_recovered: Callable[[str], None] | None,
    ) -> None:
        self.combo = combo
        self.providers = providers
        self.store = store
        self.dispatch = dispatch
        self.now = now
        self.sleep = sleep
        self.rng = rng
        self.predicate = predicate
        self.quota_resets = quota_resets
        self.on_cooldown = on_cooldown
        self.result = result
        self.revision = revision
        self.access = access
        self.on_recovered = on_recovered
        self.attempted: set[str] = set()
        self.seen_skips: set[tuple[str, str]] = set()
        self.after_failure = False
        self.retry_available = True
        self.overflow: Predicate | None = None

    async def pick(self) -> Selection:
        """The next target (or none), its skips added to the route trace once each."""
        selection = await select(
            self.combo,
            self.providers,
            self.store,
            now=self.now,
            sleep=self.sleep,
            rng=self.rng,
            attempted=frozenset(self.attempted),
            predicate=_and(self.predicate, self.overflow),
            after_failure=self.after_failure,
            quota_resets=self.quota_resets,
            single_target_retry=self.retry_available,
            revision=self.revision,
            access=self.access,
        )
        for skip in selection.skipped:
            if skip not in self.seen_skips and skip[1] != "attempted":
                self.seen_skips.add(skip)
                self.result.skipped.append(skip)
        return selection

    def unavailable(self, selection: Selection) -> None:
        """The first pick found nothing: 503 combo_unavailable, with when to retry."""
        self.result.unavailable = True
        self.result.retry_after = (
            None
            if selection.retry_at is None
            else str(retry_after_seconds(selection.retry_at, self.now()))
        )

    async def _update(self, update: Update) -> None:
        await self.store.update(self.combo.id, st.stamped(self.combo, self.revision, update))

    async def attempt(self, selection: Selection, target: TargetSpec) -> tuple[Outcome, int]:
        try:
            return await _dispatch_retrying(
                self.combo,
                self.providers,
                target,
                self.dispatch,
                self.result,
                now=self.now,
                sleep=self.sleep,
                rng=self.rng,
            )
        except (asyncio.CancelledError, Exception):
            # The client went, or the dispatch stopped for a reason of its own (a buffered
            # answer over its bound): the pick's probe lease is handed back either way.
            await self._update(_aborted(self.combo, target.key, selection.probe))
            raise

    async def served(
        self, selection: Selection, target: TargetSpec, outcome: Outcome, elapsed: int
    ) -> None:
        key = target.key
        # A success that changes nothing in the state this pick saw (a healthy failover
        # target) is not written: one store round trip less per request. A cooldown another
        # worker set meanwhile then stays until it ends, the conservative way round.
        seen = selection.state
        if seen is None or st.note_success(seen, self.combo, key) != seen:
            await self._update(_succeeded(self.combo, key))
        if self.on_recovered is not None and seen is not None and key in seen.cooldowns:
            self.on_recovered(key)  # a cooled or half-open target served: healthy again
        self.result.attempts.append(
            AttemptRecord(key, outcome.status, "served", "", None, elapsed, outcome.malformed)
        )
        self.result.served = target
        self.result.usage = outcome.usage

    async def failed(
        self, selection: Selection, target: TargetSpec, outcome: Outcome, elapsed: int
    ) -> bool:
        """A failed attempt noted; True when the route ends here (served after all, or stop)."""
        failure = outcome.failure
        assert failure is not None
        decision = classify(failure)
        if decision.local_overload:
            await self._local_overload(selection, target.key, failure, decision, elapsed)
            return False
        decision, until = await self._cool(selection, target, outcome, decision)
        return self._after_failure(target, outcome, decision, until, elapsed)

    async def _local_overload(
        self,
        selection: Selection,
        key: str,
        failure: Failure,
        decision: Decision,
        elapsed: int,
    ) -> None:
        # ocx's own limit, not the target's: no cooldown, no failure noted, no hop counted
        # against it (only a probe lease this pick took is handed back, as on an abort). The
        # request may still try another target, which has its own pool.
        if selection.probe:
            await self._update(_aborted(self.combo, key, True))
        self.result.attempts.append(
            AttemptRecord(key, None, "local_overload", decision.reason, None, elapsed)
        )
        self.result.failure = failure
        self.result.decision = decision
        self.attempted.add(key)
        self.after_failure = True

    async def _cool(
        self, selection: Selection, target: TargetSpec, outcome: Outcome, decision: Decision
    ) -> tuple[Decision, int | None]:
        """Cool what the failure's scope says (none for the caller's own credential); the
        decision as recorded and the cooldown's end."""
        failure = outcome.failure
        assert failure is not None
        key, combo = target.key, self.combo
        at = self.now()
        if outcome.callers_own and not outcome.committed:
            # Another caller's valid token would be served: no cooldown, stickiness kept, only
            # a probe lease this request held is given back. No retry of the same target.
            decision = replace(
                decision, reason="caller_credential", scope="none", request_local=True
            )
            until: int | None = None
            cooled: tuple[str, ...] = ()
            self.retry_available = False
            if selection.probe:
                await self._update(_aborted(combo, key, True))
        else:
            found = cooldown(failure, decision, combo_cooldown_ms=combo.cooldown_ms, now=at)
            until = None if found is None or not outcome.cool else at + found.ms
            cooled = _cooled_keys(combo, target, decision) if until is not None else ()
            await self._update(_failed(combo, (key, *cooled), until, at))
        if until is not None and self.on_cooldown is not None:
            for other in cooled:
                self.on_cooldown(other, until, decision.reason)
        return decision, until

    def _after_failure(
        self,
        target: TargetSpec,
        outcome: Outcome,
        decision: Decision,
        until: int | None,
        elapsed: int,
    ) -> bool:
        """Record the failed attempt: broken after commit or a stop ends the route (True); a
        hop goes on, to a target with a larger context window when that was the cause."""
        failure, result, key = outcome.failure, self.result, target.key
        assert failure is not None
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
            return True
        result.failure = failure
        result.decision = decision
        if not decision.hop:
            result.attempts.append(
                AttemptRecord(key, failure.status, "stop", decision.reason, until, elapsed)
            )
            return True
        result.attempts.append(
            AttemptRecord(
                key, failure.status, "hop", decision.reason, until, elapsed, outcome.malformed
            )
        )
        self.attempted.add(key)
        self.after_failure = True
        if decision.needs_larger_context:
            failed_window = _context_window(self.providers, target)
            self.overflow = _larger_than(self.providers, failed_window)
        return False


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
