"""The proxy front door: a lean ASGI app for `/v1/*` (mounted in `ocxsite.asgi`).

Per request: authenticate the client key against the cached key map, parse the body,
resolve the model against the in-memory config snapshot, run the attempt loop, and stream
the committing target's answer. No ORM call happens here.

The steps live beside it: the request and its answer (`exchange.py`), the caller's
credentials on a target (`access.py`), each attempt (`relay.py`), what a request costs
(`charging.py`) and what its outcome says (`outcomes.py`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
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
from gateway import alerting, caller_limits, charging, refusals, tracing
from gateway.access import credential_pair, request_masker, target_access
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
    record_route,
)
from gateway.relay import AttemptRelay, send_bare, send_route
from gateway.runtime import Runtime, get_runtime
from providers.upstream import Caller
from providers.wire.commit import StreamFailure, terminal_error_frame, truncation_failure
from quota.tracker import Gate
from routing.attempts import RouteResult
from routing.catalog import models_list
from routing.eligibility import (
    TargetState,
    target_state,
)
from routing.recall import lane_of, snapshot_liveness
from routing.types import ComboSpec, ConfigSnapshot, TargetSpec
from routing.validate import Resolution, resolve_model
from server import body_limits, body_now, lifecycle, metrics
from server.http_errors import HOST_NOT_ALLOWED, HostGate
from server.turns import Turns
from usage.requestlog import RequestEntry, new_request_id

log = logging.getLogger("ocx.proxy")
request_log = logging.getLogger("ocx.request")

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
            exchange.trace = tracing.start_request(scope["path"], scope["headers"])
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
                await _fail(
                    exchange,
                    failure.status,
                    error_payload(failure.status, failure.type, failure.code, failure.message),
                    failure,
                )
            except HTTPFailure as exc:
                outcome = exc.code or "error"
                # (A buffered stream's keep-alive may already have sent the status line.)
                await _fail(exchange, exc.status, exc.body, exc.stream_failure(), exc.headers)
            except ClientGone:
                exchange.status = 499
                outcome = "client_cancelled"
            except RecursionError:
                # JSON the parser took but nested too deep to walk or re-encode (~900 levels):
                # bad input, not a failure of ocx (no traceback in the log).
                log.warning("request %s: body nested too deeply", request_id)
                outcome = "invalid_json"
                await _fail(
                    exchange,
                    400,
                    error_payload(400, "invalid_request_error", "invalid_json", NESTED_TOO_DEEPLY),
                    truncation_failure("was interrupted inside ocx"),
                )
            except Exception:
                # A bug or a state backend failure (Redis down): never a bare 500 and never a
                # stream that ends as if complete.
                log.exception("request %s failed inside ocx", request_id)
                outcome = "internal_error"
                await _fail(
                    exchange,
                    502,
                    error_payload(
                        502,
                        "server_error",
                        "internal_error",
                        f"ocx could not complete the request (request id {request_id})",
                    ),
                    truncation_failure("was interrupted inside ocx"),
                )
            finally:
                await self._end(exchange, outcome, started)

    async def _end(self, exchange: Exchange, outcome: str, started: float) -> None:
        """Every request's end, whatever happened: its usage settled and charged, its budget
        hold let go, its last chunk sent, its log entry and trace closed."""
        if exchange.committed_target:
            charging.settle(self.runtime, exchange, outcome)
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

    async def _charge(self, exchange: Exchange) -> None:
        """Count a finished request against its budgets (`gateway.charging.charge`)."""
        await charging.charge(self.runtime, exchange)

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
        model, stream = _checked(request)
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
            masker=request_masker(snapshot, forwarded),
        )
        pairs = {t.key: credential_pair(snapshot, t, caller) for t in combo.targets}
        unpriced = (
            charging.unpriced(self.runtime, snapshot, combo, model, key)
            if key.budgets
            else frozenset()
        )
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
            charging.refuse(await runtime.budgets.admit(key.budgets, now), now, exchange.entry)
        gate = await runtime.tracker.gate(
            (p for p in pairs.values() if p is not None),
            now=now,
            shared=runtime.shared,
            along=(*state, *(counters or ())),
        )
        if counters:
            if gate.along is None:  # Redis out, or no round trip made: the budget store's copy
                charging.refuse(await runtime.budgets.admit(key.budgets, now), now, exchange.entry)
            else:
                charging.refuse(
                    await runtime.budgets.admit_along(
                        key.budgets, counters, gate.along[len(state) :], now
                    ),
                    now,
                    exchange.entry,
                )
        if key.budgets:
            await charging.reserve(self.runtime, combo, key, exchange, now)
        # A budget admitted here is charged at request end.
        exchange.key = key
        if state and gate.along is not None and not gate.leased:
            runtime.prime_state(combo.id, gate.along[0])
        return gate

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
                await send_bare(relay, combo.targets[0])
                return None
            return await send_route(relay)
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


def _checked(request: Mapping[str, Any]) -> tuple[str, bool]:
    """The request's model and stream flag, or the 400 that says what is wrong with them."""
    model = request.get("model")
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
        raise HTTPFailure(400, "invalid_request_error", "invalid_type", "stream must be a boolean")
    return model, stream


async def _fail(
    exchange: Exchange,
    status: int,
    body: bytes,
    in_band: StreamFailure,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An error as the client can still get it: the whole answer while no status line went
    out; after it, a stream's in-band terminal error, unless its upstream attempt ended it."""
    if not exchange.started:
        await exchange.respond(status, body, headers)
    elif exchange.streaming and not exchange.upstream_done:
        await exchange.write(terminal_error_frame(exchange.protocol, in_band))


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
