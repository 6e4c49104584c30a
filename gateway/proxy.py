"""The proxy front door: a lean ASGI app for `/v1/*` (mounted in `ocxsite.asgi`).

Per request: authenticate the client key against the cached key map, parse the body,
resolve the model against the in-memory config snapshot, run the attempt loop, and stream
the committing target's answer. No ORM call happens here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from django.conf import settings

from accounts import expiry
from accounts.access import CLIENT_PREFIX, KeyInfo, digest, model_refusal
from combos.shaping import (
    ENCRYPTED_TASK_CODE,
    ENCRYPTED_TASK_MESSAGE,
    ENCRYPTED_TASK_STATUS,
    encrypted_task_predicate,
    encrypted_task_rejection,
    has_encrypted_agent_task,
    image_rejection,
)
from combos.status import label as status_label
from gateway import alerting, caller_limits, refusals, tracing
from gateway.access import credential_pair, known_secrets, target_access
from gateway.exchange import (
    NESTED_TOO_DEEPLY,
    ClientGone,
    Exchange,
    HTTPFailure,
    Receive,
    Scope,
    Send,
    caller_headers,
    encodable,
    error_payload,
    parse_json,
    read_body,
    request_headers,
    server_name,
    watch_disconnect,
)
from gateway.outcomes import (
    finish_route,
    note_usage,
    record_route,
    record_target,
)
from gateway.relay import AttemptRelay
from gateway.rescue import BufferOverflow
from gateway.runtime import Runtime, get_runtime
from providers.masking import Masker
from providers.upstream import Caller
from providers.wire.commit import terminal_error_frame, truncation_failure
from quota.tracker import Gate
from routing.attempts import AttemptRecord, RouteResult, route
from routing.catalog import models_list
from routing.eligibility import (
    TargetState,
    target_state,
)
from routing.recall import lane_of, snapshot_liveness
from routing.state import ComboState
from routing.types import ComboSpec, ConfigSnapshot, TargetSpec
from routing.validate import Resolution, resolve_model
from server import body_limits, body_now, lifecycle, metrics
from server.http_errors import HOST_NOT_ALLOWED, HostGate
from server.turns import Turns
from usage import estimate
from usage import unpriced as pricing_gate
from usage.budget_gate import Refusal
from usage.requestlog import RequestEntry, new_request_id

log = logging.getLogger("ocx.proxy")
request_log = logging.getLogger("ocx.request")

# A bare `provider/model` request has no combo, hence no routing state.
_NO_STATE = ComboState()
# Longer model names are refused (400): a name is a metric label, a log column, a Redis key.
MAX_MODEL_NAME = 256
# The metric label of every model a provider does not declare.
OTHER_MODEL = "(other)"
ENDPOINTS: Mapping[str, Literal["responses", "chat"]] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
}


def _expired(info: KeyInfo) -> str:
    when = expiry.iso(dt.datetime.fromtimestamp(info.expires_at, dt.UTC))
    if info.previous:
        return (
            f"This ocx key was rotated: its previous secret stopped working at {when}. "
            "Use the new secret (ocx key rotate showed it once)"
        )
    return (
        f"This ocx key ({info.prefix}…) expired at {when}: ask an ocx administrator for a new "
        "key or a later expiry (ocx key set ID --expires 30d)"
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _sleep_ms(ms: int) -> None:
    await asyncio.sleep(ms / 1000)


class ProxyApp:
    def __init__(self, runtime: Runtime | None = None) -> None:
        self._runtime = runtime
        # ALLOWED_HOSTS as Django applies it elsewhere, precomputed (a dict lookup per request).
        self.hosts = HostGate(settings.ALLOWED_HOSTS)
        self.turns = Turns()
        tracing.setup()  # on only with OTEL_EXPORTER_OTLP_ENDPOINT (and the `otel` extra)

    @property
    def runtime(self) -> Runtime:
        return self._runtime or get_runtime()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = new_request_id()
        exchange = Exchange(send, request_id, scope.get(body_now.SCOPE_KEY))
        started = time.monotonic()
        if tracing.TRACER is not None:
            exchange.trace = tracing.start_request(scope["path"])
        outcome = "ok"
        # The whole request, its `finally` too (charge, last chunk, log entry): a drain must
        # not see nothing in flight while a request still writes.
        with lifecycle.track():
            try:
                await self._handle(scope, receive, exchange)
            except asyncio.CancelledError:
                if not lifecycle.stopping():
                    raise
                # The worker's shutdown grace ran out: an explicit error, never a clean end.
                outcome = "shutdown"
                failure = lifecycle.SHUTDOWN_FAILURE
                if not exchange.started:
                    await exchange.respond(
                        failure.status,
                        error_payload(failure.status, failure.type, failure.code, failure.message),
                    )
                elif exchange.streaming and not exchange.upstream_done:
                    await exchange.write(terminal_error_frame(exchange.protocol, failure))
            except HTTPFailure as exc:
                outcome = exc.code or "error"
                if not exchange.started:
                    await exchange.respond(exc.status, exc.body, exc.headers)
                elif exchange.streaming and not exchange.upstream_done:
                    # A buffered stream's keep-alive already sent the status line.
                    await exchange.write(
                        terminal_error_frame(exchange.protocol, exc.stream_failure())
                    )
            except ClientGone:
                exchange.status = 499
                outcome = "client_cancelled"
            except RecursionError:
                # JSON the parser took but nested too deep to walk or re-encode (~900 levels):
                # bad input, not a failure of ocx (no traceback in the log).
                log.warning("request %s: body nested too deeply", request_id)
                outcome = "invalid_json"
                if not exchange.started:
                    await exchange.respond(
                        400,
                        error_payload(
                            400, "invalid_request_error", "invalid_json", NESTED_TOO_DEEPLY
                        ),
                    )
                elif exchange.streaming and not exchange.upstream_done:
                    await exchange.write(
                        terminal_error_frame(
                            exchange.protocol, truncation_failure("was interrupted inside ocx")
                        )
                    )
            except Exception:
                # A bug or a state backend failure (Redis down): never a bare 500 and never a
                # stream that ends as if complete.
                log.exception("request %s failed inside ocx", request_id)
                outcome = "internal_error"
                if not exchange.started:
                    await exchange.respond(
                        502,
                        error_payload(
                            502,
                            "server_error",
                            "internal_error",
                            f"ocx could not complete the request (request id {request_id})",
                        ),
                    )
                elif exchange.streaming and not exchange.upstream_done:
                    await exchange.write(
                        terminal_error_frame(
                            exchange.protocol, truncation_failure("was interrupted inside ocx")
                        )
                    )
            finally:
                if exchange.committed_target:
                    self._settle(exchange, outcome)
                if exchange.key is not None:
                    await self._charge(exchange)
                if exchange.hold is not None:
                    await self.runtime.reservations.release(exchange.hold)
                if exchange.started:
                    try:
                        await exchange.finish()
                    except OSError:
                        outcome = "client_cancelled"
                if exchange.logged:
                    self._log(exchange, outcome, time.monotonic() - started)
                if exchange.trace is not None:
                    tracing.end_request(exchange.trace, exchange.entry, outcome)

    def _log(self, exchange: Exchange, outcome: str, elapsed: float) -> None:
        entry = exchange.entry
        entry.status = exchange.status
        entry.duration_ms = int(elapsed * 1000)
        if outcome == "ok" and any(
            a.get("outcome") == "failed_after_commit" for a in entry.attempts
        ):
            outcome = "failed_after_commit"
        entry.outcome = outcome
        target = exchange.target_label if entry.target else ""
        metrics.REQUESTS.labels(entry.combo, target or entry.target, str(entry.status)).inc()
        metrics.PROXY_OVERHEAD.observe(max(0.0, elapsed - exchange.upstream_s))
        runtime = self.runtime
        if settings.OCX_REQUEST_LOG or settings.OCX_USAGE:
            runtime.requestlog.submit(entry)
        if settings.OCX_LOG_JSON:
            request_log.info(
                json.dumps(
                    {
                        "request_id": entry.request_id,
                        "user": entry.user,
                        "model": entry.requested_model,
                        "combo": entry.combo,
                        "target": entry.target,
                        "status": entry.status,
                        "outcome": entry.outcome,
                        "attempts": len(entry.attempts),
                        "ms": entry.duration_ms,
                    }
                )
            )

    async def _handle(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        headers = request_headers(scope)
        if not self.hosts.allows(headers.get("host") or server_name(scope)):
            raise HTTPFailure(400, "invalid_request_error", "host_not_allowed", HOST_NOT_ALLOWED)
        if path == "/v1/models":
            if method != "GET":
                raise HTTPFailure(405, "invalid_request_error", "method_not_allowed", "Use GET")
            snapshot = await self.runtime.ready()
            key = self._authenticate(headers, scope.get(body_limits.KEY_SCOPE))
            listing = models_list(snapshot)
            if key.allowed_models or key.team_models:
                listing["data"] = [
                    m for m in listing["data"] if model_refusal(key, m["id"]) is None
                ]
            await exchange.respond(200, json.dumps(listing).encode())
            return
        inbound = ENDPOINTS.get(path)
        if inbound is None:
            raise HTTPFailure(404, "invalid_request_error", "not_found", f"Unknown endpoint {path}")
        if method != "POST":
            raise HTTPFailure(405, "invalid_request_error", "method_not_allowed", "Use POST")
        exchange.logged = True
        # A burst of new requests is opened a few dozen per loop pass (`server.turns`).
        turn = self.turns.take()
        if turn is not None:
            await turn
        snapshot = await self.runtime.ready()
        entry = exchange.entry
        key = self._authenticate(headers, scope.get(body_limits.KEY_SCOPE), entry=entry)
        if key.rpm_limit is not None:
            await self._limit(key)
        body = await read_body(receive, settings.OCX_PROXY_MAX_BODY)
        request = parse_json(body)
        exchange.request = request
        model = request.get("model")
        entry.requested_model = model if isinstance(model, str) else "?"
        entry.stream = exchange.streaming = request.get("stream") is True
        exchange.protocol = inbound
        if not isinstance(model, str) or not model.strip():
            raise HTTPFailure(
                400,
                "invalid_request_error",
                "missing_model",
                "model is required and must be a string",
            )
        if not model.isascii() and not encodable(model):
            raise HTTPFailure(
                400,
                "invalid_request_error",
                "invalid_model",
                "model is not valid Unicode (it contains a lone surrogate escape)",
            )
        if len(model) > MAX_MODEL_NAME:
            raise HTTPFailure(
                400,
                "invalid_request_error",
                "model_too_long",
                f"model must be at most {MAX_MODEL_NAME} characters (got {len(model)})",
            )
        stream = request.get("stream", False)
        if not isinstance(stream, bool):
            raise HTTPFailure(
                400, "invalid_request_error", "invalid_type", "stream must be a boolean"
            )
        refusal = model_refusal(key, model) if key.allowed_models or key.team_models else None
        if refusal is not None:
            raise HTTPFailure(403, "permission_error", "model_not_allowed", refusal)
        # Watch for the client going away while we work: it cancels the upstream at once.
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, task, exchange))
        try:
            await self._route(snapshot, inbound, request, model, stream, headers, exchange, key)
        except asyncio.CancelledError:
            if watcher.done() and not watcher.cancelled():
                raise ClientGone() from None
            raise
        finally:
            watcher.cancel()

    async def _limit(self, key: KeyInfo) -> None:
        """The key's rpm limit (PRODUCT §9.1): one shared-counter hit, before the body is read."""
        assert key.rpm_limit is not None
        wait = await self.runtime.limiter.hit(key.id, key.rpm_limit, _now_ms())
        if wait is not None:
            raise HTTPFailure(
                429,
                "rate_limit_error",
                "client_rate_limited",
                f"This key is limited to {key.rpm_limit} requests per minute",
                refusals.retry_after(wait),
            )

    def _settle(self, exchange: Exchange, outcome: str) -> None:
        """The usage of a request that reached a client: the upstream's figures, checked, or
        the estimate (`usage.estimate`) when they are bad or the answer was cut short."""
        entry = exchange.entry
        if not entry.target:
            entry.target = exchange.committed_target  # the client left mid-answer
            if entry.input_tokens is None and entry.output_tokens is None:
                note_usage(entry, exchange.noted)
        # Cut short: the client left, or the upstream broke after output (a combo's attempt
        # `failed_after_commit`; a bare target's `served` with the failure's status).
        cut_short = outcome == "client_cancelled" or any(
            a.get("outcome") == "failed_after_commit"
            or (a.get("outcome") == "served" and (a.get("status") or 0) >= 300)
            for a in entry.attempts
        )
        estimate.settle(
            entry,
            request=exchange.request,
            relayed=exchange.relayed,
            cut_short=cut_short,
            cap=estimate.context_window(self.runtime.snapshot, entry.target),
            bad=entry.usage_bad,
        )

    async def _charge(self, exchange: Exchange) -> None:
        """Count a finished request against the budgets (before its last byte is sent, so the
        client's next request already sees it). Never fails the request."""
        runtime, key = self.runtime, exchange.key
        if key is None:
            return
        served = exchange.served_quota
        providers = runtime.budgets.window_providers(runtime.keys) if served else frozenset()
        if not key.budgets and (served is None or served[0][0] not in providers):
            return
        entry = exchange.entry
        known = entry.input_tokens is not None or entry.output_tokens is not None
        tokens = (entry.input_tokens or 0) + (entry.output_tokens or 0) if known else None
        try:
            usd = 0
            if known and runtime.budgets.wants_cost(key.budgets):
                usd = runtime.budgets.cost_micros(
                    runtime.snapshot,
                    entry.target,
                    at=entry.at,
                    input_tokens=entry.input_tokens,
                    cached_tokens=entry.cached_tokens,
                    output_tokens=entry.output_tokens,
                )
            if tokens is not None and key.budgets:
                # The next reservation of this key on this model expects about as much.
                runtime.reservations.recent.learn(key.id, entry.requested_model, tokens, usd)
            hold = exchange.hold
            shared = hold is not None and hold.shared
            if await runtime.budgets.charge(
                key.budgets,
                tokens=tokens,
                served=served,
                now_ms=_now_ms(),
                providers=providers,
                usd_micros=usd,
                release=hold.items if hold is not None and shared else (),
            ):
                exchange.hold = None  # let go in the charge's own call
        except Exception:  # noqa: BLE001 - the answer is complete; only the count is lost
            log.exception("could not count request %s against its budgets", exchange.request_id)

    def _authenticate(
        self,
        headers: Mapping[str, str],
        checked: body_limits.KnownKey | None = None,
        entry: RequestEntry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> KeyInfo:
        """The caller's key. `checked`: the key the server's body limit already hashed (the same
        token: its digest is reused, one SHA-256 per request); an `entry` (the request log's)
        names its user and key, also when the key is refused as expired or its user as
        deactivated."""
        token = headers.get("x-ocx-key", "")
        if not token:
            scheme, _, value = headers.get("authorization", "").partition(" ")
            if scheme.lower() == "bearer" and value.strip().startswith(CLIENT_PREFIX):
                token = value.strip()
        info = None
        if token.startswith(CLIENT_PREFIX):
            found = checked.digest if checked is not None and checked.token == token else None
            info = self.runtime.keys.get(found or digest(token))
        if info is None:
            raise HTTPFailure(
                401,
                "invalid_request_error",
                "invalid_api_key",
                "Missing or invalid ocx client key (Authorization: Bearer ocx_… or x-ocx-key)",
            )
        if entry is not None:
            entry.key_prefix, entry.user, entry.key_id = info.prefix, info.user, info.id
        if not info.user_active:
            # The key is right; its owner was deactivated (`ocx user deactivate`).
            raise HTTPFailure(
                401,
                "invalid_request_error",
                "user_inactive",
                f"The user of this ocx key ({info.user}) is deactivated: ask an ocx administrator "
                "to reactivate it (ocx user activate)",
            )
        if clock() >= info.expires_at:  # the whole expiry check: math.inf when none
            raise HTTPFailure(401, "invalid_request_error", "key_expired", _expired(info))
        return info

    async def _route(
        self,
        snapshot: ConfigSnapshot,
        inbound: Literal["responses", "chat"],
        request: dict[str, Any],
        model: str,
        stream: bool,
        headers: Mapping[str, str],
        exchange: Exchange,
        key: KeyInfo,
    ) -> None:
        """The request once its key is known and within its rpm limit, one domain question at a
        time: where to (`_where_to`, `_recall`), may they on that route (`_admit`: quota and
        budgets in one round trip), the wire (`_send`), what to record (`_record`)."""
        lane = lane_of(headers, request)
        resolution = resolve_model(model, snapshot)
        if resolution.kind == "unresolved" and lane is not None:
            resolution = await self._recall(resolution, snapshot, model, lane, key)
        combo = _where_to(resolution, snapshot, model, exchange)
        encrypted = _check_shape(combo, snapshot, request, inbound)
        forwarded = caller_headers(headers)
        caller = Caller(
            headers=forwarded,
            request_id=exchange.request_id,
            masker=Masker(functools.partial(known_secrets, snapshot, forwarded)),
        )
        pairs = {t.key: credential_pair(snapshot, t, caller) for t in combo.targets}
        unpriced = self._unpriced(snapshot, combo, model, key) if key.budgets else frozenset()
        gate = await self._admit(combo, pairs, key, exchange)
        result = await self._send(
            snapshot,
            inbound,
            request,
            stream,
            combo,
            caller,
            pairs,
            gate,
            encrypted,
            exchange,
            unpriced,
        )
        if result is not None:
            await self._record(snapshot, combo, caller, pairs, gate, result, lane, key, exchange)

    def _unpriced(
        self, snapshot: ConfigSnapshot, combo: ComboSpec, model: str, key: KeyInfo
    ) -> frozenset[str]:
        """Under a dollar budget, the route's targets without a price (`usage.unpriced`): a
        combo skips them; a route with only such targets is refused before any upstream."""
        budget = pricing_gate.usd_budget(key.budgets)
        if budget is None:
            return frozenset()
        prices = self.runtime.budgets.prices
        found = pricing_gate.unpriced_keys(prices, snapshot, combo, time.time())
        if found and all(t.key in found for t in combo.targets):
            raise HTTPFailure(
                400,
                "invalid_request_error",
                pricing_gate.CODE,
                pricing_gate.refusal(model, found, budget),
            )
        return found

    async def _recall(
        self,
        resolution: Resolution,
        snapshot: ConfigSnapshot,
        model: str,
        lane: str,
        key: KeyInfo,
    ) -> Resolution:
        """Compaction recall (reference §7): a bare upstream model name this client's session
        got from a combo earlier routes through that combo again."""
        recalled = await self.runtime.recall.recall(
            str(key.id), lane, model, now=_now_ms(), live=snapshot_liveness(snapshot)
        )
        return resolution if recalled is None else Resolution("combo", combo_id=recalled)

    async def _admit(
        self,
        combo: ComboSpec,
        pairs: Mapping[str, tuple[str, str] | None],
        key: KeyInfo,
        exchange: Exchange,
    ) -> Gate:
        """May they on this route (quota, usage): the credentials' quota gate and the key's
        budgets. With Redis the combo's routing state comes in the quota read's round trip (a
        pick decided on it that writes nothing, a healthy one, needs no check of its own), and
        so do the counters of the key's token budgets: one round trip for all three stores."""
        runtime = self.runtime
        if key.budgets and runtime.budgets.unseeded(key.budgets):
            # Counters not yet raised to what was recorded (a restart, a new budget): wait for
            # that (bounded), so that a spent budget is not admitted.
            await runtime.budgets.seed(key.budgets)
        now = _now_ms()
        state = runtime.state_along(combo.id) if combo.id else ()
        counters = runtime.budgets.along(key.budgets, now) if key.budgets else None
        if key.budgets and counters is None:
            _refuse(await runtime.budgets.admit(key.budgets, now), now, exchange.entry)
        gate = await runtime.tracker.gate(
            (p for p in pairs.values() if p is not None),
            now=now,
            shared=runtime.shared,
            along=(*state, *(counters or ())),
        )
        if counters:
            if gate.along is None:  # Redis out, or no round trip made: the budget store's copy
                _refuse(await runtime.budgets.admit(key.budgets, now), now, exchange.entry)
            else:
                _refuse(
                    await runtime.budgets.admit_along(
                        key.budgets, counters, gate.along[len(state) :], now
                    ),
                    now,
                    exchange.entry,
                )
        if key.budgets:
            await self._reserve(combo, key, exchange, now)
        # A budget admitted here is charged at request end.
        exchange.key = key
        if state and gate.along is not None and not gate.leased:
            runtime.prime_state(combo.id, gate.along[0])
        return gate

    async def _reserve(self, combo: ComboSpec, key: KeyInfo, exchange: Exchange, now: int) -> None:
        """Reserve the request's expected cost against its budgets (`usage.reservations`): the
        key's recent cost on this model, else the estimate of its input at the first target's
        price. Refused when the requests in flight already take the rest of a budget."""
        runtime = self.runtime
        model = exchange.entry.requested_model
        expected = runtime.reservations.recent.get(key.id, model)
        if expected is None:
            tokens, micros = estimate.input_estimate(exchange.request), 0
            if runtime.budgets.wants_cost(key.budgets):
                micros = runtime.budgets.cost_micros(
                    runtime.snapshot,
                    combo.targets[0].key,
                    at=time.time(),
                    input_tokens=tokens,
                    cached_tokens=0,
                    output_tokens=0,
                )
            expected = (tokens, micros)
        hold = await runtime.reservations.reserve(
            key.budgets, tokens=expected[0], micros=expected[1], now_ms=now
        )
        if isinstance(hold, Refusal):
            _refuse(hold, now, exchange.entry)
        else:
            exchange.hold = hold

    async def _send(
        self,
        snapshot: ConfigSnapshot,
        inbound: Literal["responses", "chat"],
        request: dict[str, Any],
        stream: bool,
        combo: ComboSpec,
        caller: Caller,
        pairs: Mapping[str, tuple[str, str] | None],
        gate: Gate,
        encrypted: bool,
        exchange: Exchange,
        unpriced: frozenset[str] = frozenset(),
    ) -> RouteResult | None:
        """The wire (providers): attempt the combo's targets in the attempt loop's order; a
        bare target is attempted once (recorded here, None returned). Each attempt is the
        relay's (`gateway.relay.AttemptRelay`)."""
        runtime = self.runtime
        encrypted_only = encrypted_task_predicate(snapshot.providers) if encrypted else None
        held = await caller_limits.held_targets(
            runtime.caller_limits, snapshot.providers, combo, pairs
        )
        relay = AttemptRelay(
            runtime,
            snapshot,
            inbound,
            request,
            stream,
            combo,
            caller,
            pairs,
            gate,
            exchange,
            encrypted_only=encrypted_only,
            unpriced=unpriced,
            held=held,
        )
        try:
            if not combo.id:
                await _send_bare(relay, combo.targets[0])
                return None
            return await _send_route(relay)
        finally:
            await relay.release_probes()

    async def _record(
        self,
        snapshot: ConfigSnapshot,
        combo: ComboSpec,
        caller: Caller,
        pairs: Mapping[str, tuple[str, str] | None],
        gate: Gate,
        result: RouteResult,
        lane: str | None,
        key: KeyInfo,
        exchange: Exchange,
    ) -> None:
        """What to record of a combo's route: the request log's attempts, hop metrics and
        events, the session's recall of the served model; then the error when none served.
        (The budget charge and the log line follow in `__call__`.)"""
        runtime = self.runtime
        record_route(exchange.entry, result, exchange.roles)
        for record in result.attempts:
            if record.outcome == "retry":
                metrics.SAME_TARGET_RETRIES.labels(combo.id, record.reason).inc()
            elif record.outcome == "hop":
                metrics.HOPS.labels(combo.id, record.reason).inc()
                # Only when a hop happened: a request served first time emits nothing.
                runtime.emit(
                    {
                        "kind": "hop",
                        "combo": combo.id,
                        "target": record.target,
                        "status": record.status,
                        "reason": record.reason,
                    }
                )
        if result.served is not None and not result.failed_after_commit and lane is not None:
            await runtime.recall.remember(
                str(key.id),
                lane,
                result.served.model,
                combo.id,
                now=_now_ms(),
                target=result.served.key,
            )
        states: list[TargetState] | None = None
        if result.unavailable:
            # The 503 says why each target was out (an error path: one state read is cheap).
            current = await runtime.store.get(combo.id)
            now = _now_ms()
            states = [
                target_state(
                    t,
                    providers=snapshot.providers,
                    state=current,
                    now=now,
                    override=combo.override,
                    access=target_access(snapshot, t, caller, gate, pairs.get(t.key)),
                )
                for t in combo.targets
            ]
        alerting.after_route(
            runtime.alerts, combo.id, result.attempts, states, result.retry_after, _now_ms()
        )
        finish_route(combo, result, states)


async def _send_bare(relay: AttemptRelay, target: TargetSpec) -> None:
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


async def _send_route(relay: AttemptRelay) -> RouteResult:
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


def _where_to(
    resolution: Resolution, snapshot: ConfigSnapshot, model: str, exchange: Exchange
) -> ComboSpec:
    """Where to (combos/routing): the combo the model resolved to; a bare `provider/model` is a
    combo of that one target with no id (no routing state)."""
    if resolution.kind == "unknown_combo":
        raise HTTPFailure(
            404,
            "invalid_request_error",
            "model_not_found",
            f"Unknown combo: {resolution.combo_id}",
        )
    if resolution.kind == "target":
        assert resolution.provider is not None and resolution.model is not None
        target = TargetSpec(resolution.provider, resolution.model)
        if resolution.model not in snapshot.providers[resolution.provider].models:
            # Any name goes upstream; metrics name only declared models (issue #26).
            exchange.target_label = f"{resolution.provider}/{OTHER_MODEL}"
        return ComboSpec(id="", targets=(target,))
    if resolution.kind == "combo":
        assert resolution.combo_id is not None
        combo = snapshot.combos[resolution.combo_id]
        exchange.combo = exchange.entry.combo = combo.id
        return combo
    raise HTTPFailure(404, "invalid_request_error", "model_not_found", f"Unknown model: {model}")


def _check_shape(
    combo: ComboSpec,
    snapshot: ConfigSnapshot,
    request: Mapping[str, Any],
    inbound: Literal["responses", "chat"],
) -> bool:
    """Refuse a body no target of the combo can take (images, an encrypted agent task); True
    when the body carries an encrypted agent task (only its providers may serve it)."""
    rejection = image_rejection(combo, request, inbound)
    if rejection is not None:
        raise HTTPFailure(400, "invalid_request_error", None, rejection)
    encrypted = inbound == "responses" and has_encrypted_agent_task(request)
    if encrypted and encrypted_task_rejection(combo, snapshot.providers, request) is not None:
        raise HTTPFailure(
            ENCRYPTED_TASK_STATUS,
            "invalid_request_error",
            ENCRYPTED_TASK_CODE,
            ENCRYPTED_TASK_MESSAGE,
        )
    return encrypted


def _refuse(refusal: Refusal | None, now: int, entry: RequestEntry | None = None) -> None:
    """A used-up budget (PRODUCT §9.5) refuses the request, as a usage limit (§9.10); its
    request-log row names it."""
    if refusal is not None:
        if entry is not None:
            entry.budget = f"{refusal.budget.owner}: {refusal.budget.budget.describe()}"
        raise HTTPFailure.shaped(
            refusals.budget_exceeded(
                message=refusal.message(),
                reset_ms=refusal.reset_ms,
                headers=refusal.headers(now),
                now_ms=now,
            )
        )
