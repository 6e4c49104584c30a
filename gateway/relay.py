"""One request's attempts on the wire (the relay): each attempt's life as a small state machine,
and `AttemptRelay`, which drives it.

`AttemptState` is pure (no I/O, no clock): events in (`answered`, `ended`, `client_gone`), an
explicit state out (`opening → answered → committed → ended`) and, once ended, how the attempt
ended and the usage it saw. An event the table does not allow raises `RelayError`.

`AttemptRelay.dispatch` is what the attempt loop (`routing.attempts.route`) and the after-commit
rescue (`gateway.rescue`) call for one attempt: named steps around `providers.upstream.attempt`
(open, first byte, end), then what the gateway learns from the outcome (quota windows, the
caller's own limits and credential, a compatibility lesson). Metrics, traces and the request's
bookkeeping observe the state; they never decide it. The byte relay itself (commit rule, frames,
end of stream) is `providers.upstream`'s stream reader.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from django.conf import settings

from combos.selectors import credential_for
from combos.shaping import child_body, compat_hop
from combos.status import label as status_label
from gateway import alerting, caller_limits, refusals, tracing
from gateway.access import target_access
from gateway.exchange import Exchange, HTTPFailure
from gateway.outcomes import record_route, record_target
from gateway.rescue import BufferOverflow, Rescue
from gateway.runtime import Runtime
from providers.upstream import Caller, Responder, attempt
from quota.tracker import Gate
from quota.windows import is_exhausted, windows_from_error, windows_from_headers
from routing.attempts import AttemptRecord, Outcome, RouteResult, route
from routing.classify import Failure, classifier_code
from routing.eligibility import (
    Access,
    callers_credential_refused,
    forwards_caller_credential,
    target_state,
)
from routing.state import ComboState
from routing.types import ComboSpec, ConfigSnapshot, ProviderSpec, TargetSpec
from server import metrics
from usage import unpriced as pricing_gate

log = logging.getLogger("ocx.proxy")
# A bare `provider/model` request has no combo, hence no routing state.
_NO_STATE = ComboState()


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _sleep_ms(ms: int) -> None:
    await asyncio.sleep(ms / 1000)


class Phase(enum.Enum):
    OPENING = "opening"  # the request is on its way; no answer yet
    ANSWERED = "answered"  # the upstream's status line and headers are in (its first byte)
    COMMITTED = "committed"  # output reached the client: no hop any more
    ENDED = "ended"


# How an attempt ended: before commit it `failed` (the loop may hop) or stopped inside ocx
# (`local`); after commit it is `complete` or the upstream broke; `client_left` either way.
End = Literal["complete", "upstream_broke", "failed", "local", "client_left"]


class RelayError(Exception):
    """An event the attempt's state table does not allow (a bug in the driver)."""


# The transition table: which events each phase accepts.
_ALLOWED: Mapping[Phase, frozenset[str]] = {
    Phase.OPENING: frozenset({"answered", "ended", "client_gone"}),
    Phase.ANSWERED: frozenset({"ended", "client_gone"}),
    Phase.COMMITTED: frozenset(),  # passed through by `ended` only
    Phase.ENDED: frozenset(),
}


class AttemptState:
    """One attempt's life, pure: fed the events the driver sees, it says where the attempt is,
    how it ended and the usage it saw."""

    __slots__ = ("phase", "end", "status", "usage", "committed")

    def __init__(self) -> None:
        self.phase = Phase.OPENING
        self.end: End | None = None
        self.status: int | None = None
        self.usage: Any = None
        self.committed = False

    def _event(self, name: str) -> None:
        if name not in _ALLOWED[self.phase]:
            raise RelayError(f"{name} while {self.phase.value}")

    def answered(self, status: int) -> None:
        """The upstream's status line arrived (the first byte of its answer)."""
        self._event("answered")
        self.phase, self.status = Phase.ANSWERED, status

    def ended(self, outcome: Outcome) -> End:
        """The attempt returned its outcome: the commit rule's verdict is in `committed`."""
        self._event("ended")
        failure = outcome.failure
        if outcome.committed:
            self.phase, self.committed = Phase.COMMITTED, True
            self.usage = outcome.usage
        end: End
        if failure is not None and failure.transport == "local":
            end = "local"  # stopped inside ocx: nothing reached the upstream
        elif outcome.committed:
            end = "complete" if failure is None else "upstream_broke"
        else:
            end = "failed"
        self.phase, self.end = Phase.ENDED, end
        return end

    def client_gone(self) -> None:
        """The client left (the request's task was cancelled) while the attempt ran."""
        self._event("client_gone")
        self.phase, self.end = Phase.ENDED, "client_left"


class AttemptRelay:
    """One request's attempts on `combo`: `dispatch` runs one, in named steps; `predicate`,
    `access` and `on_cooldown` are what the attempt loop asks of the request."""

    def __init__(
        self,
        runtime: Runtime,
        snapshot: ConfigSnapshot,
        inbound: Literal["responses", "chat"],
        request: dict[str, Any],
        stream: bool,
        combo: ComboSpec,
        caller: Caller,
        pairs: Mapping[str, tuple[str, str] | None],
        gate: Gate,
        exchange: Exchange,
        *,
        encrypted_only: Callable[[TargetSpec], str | None] | None = None,
        unpriced: frozenset[str] = frozenset(),
        held: set[str] | None = None,
    ) -> None:
        self.runtime = runtime
        self.snapshot = snapshot
        self.inbound = inbound
        self.request = request
        self.stream = stream
        self.combo = combo
        self.caller = caller
        self.pairs = pairs
        self.gate = gate
        self.exchange = exchange
        self.unpriced = unpriced
        # Caller-forward targets this caller's own rate limit holds it off (issue #43).
        self.held = set() if held is None else held
        self.encrypted_only = encrypted_only
        self.compat: set[str] = set()
        # The credentials attempted: a probe granted to one not attempted is released.
        self.used: set[tuple[str, str]] = set()
        # Set once a caller-forward upstream refused the caller's credential (issue #26).
        self.refused: list[str] = []

    def access(self, target: TargetSpec) -> Access:
        return target_access(
            self.snapshot, target, self.caller, self.gate, self.pairs.get(target.key)
        )

    def predicate(self, target: TargetSpec) -> str | None:
        # Credential, quota and pin are the target's state (`access`); this is request-local.
        if self.unpriced and target.key in self.unpriced:
            return pricing_gate.REASON  # no price under a dollar budget (issue 42)
        if self.refused and forwards_caller_credential(self.snapshot.providers[target.provider]):
            # The same refused token would go there too.
            return "caller credential refused"
        if target.key in self.held:
            return caller_limits.SKIP_REASON
        return self.encrypted_only(target) if self.encrypted_only is not None else None

    def on_cooldown(self, target_key: str, until: int, reason: str) -> None:
        metrics.COOLDOWNS.labels(self.combo.id, target_key).inc()
        self.runtime.emit(
            {
                "kind": "cooldown",
                "combo": self.combo.id,
                "target": target_key,
                "until": until,
                "reason": reason,
            }
        )

    async def dispatch(
        self,
        target: TargetSpec,
        _last: bool,
        *,
        body: dict[str, Any] | None = None,
        responder: Responder | None = None,
    ) -> Outcome:
        """One attempt: open it, relay it (the upstream module's reader), then learn from its
        outcome."""
        self.exchange.attempts += 1
        provider = self.snapshot.providers[target.provider]
        child = self._child(target, provider, body)
        state = AttemptState()
        seen: dict[str, Any] = {}
        started = time.monotonic()
        outcome, elapsed = await self._open(
            target, provider, child, responder, state, seen, started
        )
        outcome = self._masked(outcome)
        end = state.ended(outcome)
        if state.committed:
            self.exchange.upstream_done = True
            metrics.UPSTREAM_LATENCY.labels(provider.name).observe(elapsed)
        if end == "local":
            # Nothing reached the upstream: no quota evidence, no compatibility lesson.
            assert outcome.failure is not None
            _note_overload(
                provider.name, target.key, outcome.failure, elapsed, self.exchange.request_id
            )
            return outcome
        if outcome.malformed:
            metrics.MALFORMED_FRAMES.labels(provider.name).inc(outcome.malformed)
        return await self._learn(target, provider, child, outcome, seen.get("headers") or {})

    def _child(
        self, target: TargetSpec, provider: ProviderSpec, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The body this target gets (the rescue's continuation passes its own)."""
        return child_body(
            self.request if body is None else body,
            combo=self.combo,
            provider=provider,
            model=target.model,
            protocol=self.inbound,
            compat=frozenset(self.compat),
        )

    async def _open(
        self,
        target: TargetSpec,
        provider: ProviderSpec,
        child: dict[str, Any],
        responder: Responder | None,
        state: AttemptState,
        seen: dict[str, Any],
        started: float,
    ) -> tuple[Outcome, float]:
        """Run the attempt upstream; the first byte (its headers) is observed as it comes."""
        exchange = self.exchange
        span = (
            None
            if exchange.trace is None
            else tracing.start_attempt(
                exchange.trace, provider.name, provider.adapter, target.key, target.model
            )
        )

        def observe(status: int, upstream_headers: Mapping[str, str]) -> None:
            state.answered(status)
            seen["headers"] = upstream_headers
            exchange.codex_headers = refusals.codex_rate_headers(upstream_headers)
            metrics.UPSTREAM_TTFB.labels(provider.name).observe(time.monotonic() - started)

        try:
            outcome = await attempt(
                client=self.runtime.client(provider),
                provider=provider,
                target=target,
                credential=None if provider.adapter == "chatgpt" else credential_for(provider),
                inbound=self.inbound,
                body=child,
                stream=self.stream,
                caller=self.caller,
                responder=exchange if responder is None else responder,
                observe=observe,
            )
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                state.client_gone()
            if span is not None:
                tracing.end_attempt(span, None)
            raise
        finally:
            elapsed = time.monotonic() - started
            exchange.upstream_s += elapsed
        if span is not None:
            tracing.end_attempt(span, outcome)
        return outcome, elapsed

    def _masked(self, outcome: Outcome) -> Outcome:
        if outcome.failure is not None and outcome.failure.message:
            # Before it reaches the client, the request log or a log line (issue #26).
            masked = self.caller.masker.text(outcome.failure.message)
            outcome = dataclasses.replace(
                outcome, failure=dataclasses.replace(outcome.failure, message=masked)
            )
        return outcome

    async def _learn(
        self,
        target: TargetSpec,
        provider: ProviderSpec,
        child: dict[str, Any],
        outcome: Outcome,
        headers: Mapping[str, str],
    ) -> Outcome:
        """What the gateway learns from an attempt that reached the upstream: its quota windows,
        the caller's own limits and credential, a compatibility lesson for the next target."""
        exchange, runtime = self.exchange, self.runtime
        pair = self.pairs.get(target.key)
        if pair is not None:
            self.used.add(pair)
            limited = await _ingest_quota(runtime, pair, headers, outcome)
            if outcome.committed:
                exchange.served_quota = (pair, headers)
            if limited and provider.adapter == "chatgpt":
                # This caller's account is out of quota; other accounts may still use
                # the target, so the quota state (per credential) handles it alone.
                outcome = dataclasses.replace(outcome, cool=False)
        outcome = await caller_limits.note(
            runtime.caller_limits, provider, target, pair, outcome, self.combo, self.held
        )
        failure = outcome.failure
        if failure is None or outcome.committed:
            return outcome
        if forwards_caller_credential(provider) and callers_credential_refused(
            failure.status, classifier_code(failure)
        ):
            # The caller's own token was refused: nothing shared is cooled or marked; the
            # request may still hop to a target with a stored key.
            self.refused.append(target.key)
            outcome = dataclasses.replace(outcome, callers_own=True)
        flag = compat_hop(failure, child, protocol=self.inbound)
        if flag is not None:
            self.compat.add(flag)
        return outcome

    def rescue(self) -> Rescue:
        """The after-commit policy of a streaming request on the combo (`afterCommit` not
        "error")."""
        runtime, snapshot, combo = self.runtime, self.snapshot, self.combo

        async def eligible(target: TargetSpec) -> bool:
            # The state as stored now: the broken target's cooldown is already in it.
            state = await runtime.store.get(combo.id)
            return target_state(
                target,
                providers=snapshot.providers,
                state=state,
                now=_now_ms(),
                override=combo.override,
                access=self.access(target),
            ).eligible

        return Rescue(
            combo=combo,
            providers=snapshot.providers,
            inbound=self.inbound,
            request=self.request,
            exchange=self.exchange,
            dispatch=self.dispatch,
            eligible=eligible,
            keepalive_s=settings.OCX_BUFFER_KEEPALIVE_MS / 1000,
        )

    async def release_probes(self) -> None:
        """Probes granted to credentials this request never attempted go back."""
        for pair in self.gate.probes - self.used:
            await self.runtime.tracker.release(pair, now=_now_ms())


async def _ingest_quota(
    runtime: Runtime, pair: tuple[str, str], headers: Mapping[str, str], outcome: Outcome
) -> bool:
    """Fold an attempt's quota windows into its credential's state; True when the failure
    was structured evidence that the credential is out of quota."""
    now = _now_ms()
    failure = outcome.failure
    windows = windows_from_headers(headers, now=now) if headers else []
    if failure is not None and not outcome.committed:
        if failure.status is not None:
            windows += windows_from_error(failure.status, failure.body, failure.headers, now=now)
            # The error's headers are usually the ones observed above: count each window once.
            windows = list(dict.fromkeys(windows))
        await runtime.tracker.ingest(pair, windows, outcome="failure", now=now)
        return any(is_exhausted(w, now=now) for w in windows)
    await runtime.tracker.ingest(pair, windows, outcome="success", now=now)
    return False


def _note_overload(provider: str, target: str, failure: Failure, s: float, request_id: str) -> None:
    cause = failure.error_code or "overloaded"
    metrics.LOCAL_OVERLOAD.labels(cause).inc()
    log.warning(
        "local overload (%s): request %s to %s (provider %s) stopped inside ocx after %d ms, "
        "the target is not cooled: %s",
        cause,
        request_id,
        target,
        provider,
        int(s * 1000),
        failure.message,
    )


async def send_bare(relay: AttemptRelay, target: TargetSpec) -> None:
    """A bare `provider/model`: its one attempt, refused up front when the target is out."""
    ts = target_state(
        target,
        providers=relay.snapshot.providers,
        state=_NO_STATE,
        now=_now_ms(),
        access=relay.access(target),
    )
    why = ts.skip or relay.predicate(target)
    if why is not None:
        raise HTTPFailure.shaped(
            refusals.unavailable(
                status=503,
                type_="server_error",
                code="provider_unavailable",
                message=why if ts.until is None else f"{ts.target}: {status_label(ts)}",
                until_ms=refusals.earliest_return([ts]),
                now_ms=_now_ms(),
            )
        )
    record_target(relay.exchange.entry, target, await relay.dispatch(target, True))


async def send_route(relay: AttemptRelay) -> RouteResult:
    """A combo: the attempt loop over its targets, with the after-commit rescue of a stream."""
    runtime, snapshot, combo, exchange = relay.runtime, relay.snapshot, relay.combo, relay.exchange
    result = RouteResult()
    rescue = None if not relay.stream or combo.after_commit == "error" else relay.rescue()
    try:
        await route(
            combo,
            snapshot.providers,
            runtime.store,
            dispatch=relay.dispatch if rescue is None else rescue.dispatch,
            now=_now_ms,
            sleep=_sleep_ms,
            rng=runtime.rng,
            predicate=relay.predicate,
            quota_resets={
                k: relay.gate.resets.get(p) for k, p in relay.pairs.items() if p is not None
            },
            on_cooldown=relay.on_cooldown,
            result=result,
            revision=snapshot.version,
            access=relay.access,
            on_recovered=alerting.recovered(runtime.alerts, combo.id, _now_ms),
        )
    except asyncio.CancelledError:
        # Client abort: the request log still gets the attempt it made (status 499).
        record_route(exchange.entry, result)
        raise
    except BufferOverflow as exc:
        # Not the target's fault and no reason to hop: every target's answer is as long.
        assert rescue is not None
        exchange.roles = rescue.roles
        key = rescue.attempted[-1]
        result.attempts.append(AttemptRecord(key, 200, "stop", "buffer_limit_exceeded", None, 0))
        record_route(exchange.entry, result, exchange.roles)
        raise HTTPFailure(
            502, "upstream_error", "buffer_limit_exceeded", f"{exc} from {key}"
        ) from None
    finally:
        if rescue is not None:
            await rescue.close()
    if rescue is not None:
        rescue.apply(result)
        exchange.roles = rescue.roles
    return result
