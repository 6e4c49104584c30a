"""The proxy front door: a lean ASGI app for `/v1/*` (mounted in `ocxsite.asgi`).

Per request: authenticate the client key against the cached key map, parse the body,
resolve the model against the in-memory config snapshot, run the attempt loop, and stream
the committing target's answer. No ORM call happens here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from django.conf import settings

from accounts import expiry
from accounts.access import CLIENT_PREFIX, KeyInfo, digest, model_refusal
from combos.selectors import credential_for
from combos.shaping import (
    ENCRYPTED_TASK_CODE,
    ENCRYPTED_TASK_MESSAGE,
    ENCRYPTED_TASK_STATUS,
    child_body,
    compat_hop,
    encrypted_task_predicate,
    encrypted_task_rejection,
    has_encrypted_agent_task,
    image_rejection,
)
from combos.status import label as status_label
from gateway import alerting, caller_limits, refusals, tracing
from gateway.rescue import BufferOverflow, Rescue, Role
from gateway.runtime import Runtime, get_runtime
from providers.masking import Masker, bearer_value
from providers.upstream import Caller, Responder, attempt
from providers.wire.commit import StreamFailure, terminal_error_frame, truncation_failure
from quota.tracker import Gate
from quota.windows import (
    credential_fingerprint,
    is_exhausted,
    windows_from_error,
    windows_from_headers,
)
from routing.attempts import AttemptRecord, Outcome, RouteResult, route
from routing.catalog import models_list
from routing.classify import Failure, classifier_code, classify, redact
from routing.eligibility import (
    RESOLVED,
    SKIP_CREDENTIAL,
    Access,
    Quota,
    TargetState,
    callers_credential_refused,
    credential_problem,
    forwards_caller_credential,
    target_state,
)
from routing.recall import lane_of, snapshot_liveness
from routing.state import ComboState
from routing.types import ComboSpec, ConfigSnapshot, TargetSpec
from routing.validate import Resolution, resolve_model
from server import body_limits, body_now, lifecycle, metrics
from server.body_now import BodyNow
from server.http_errors import HOST_NOT_ALLOWED, HostGate
from server.turns import Turns
from usage import estimate
from usage import unpriced as pricing_gate
from usage.budget_gate import Refusal
from usage.requestlog import RequestEntry, new_request_id
from usage.reservations import Hold

log = logging.getLogger("ocx.proxy")
request_log = logging.getLogger("ocx.request")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
# A bare `provider/model` request has no combo, hence no routing state.
_NO_STATE = ComboState()
# No after-commit rescue notes (the default policy): one shared empty map, no allocation.
_NO_ROLES: Mapping[int, Role] = MappingProxyType({})
# The quota gate's verdict per credential, as the target state reads it.
_QUOTA: Mapping[str, Quota] = {
    "eligible": "available",
    "ineligible": "limited",
    "probe": "probe_due",
}
# Longer model names are refused (400): a name is a metric label, a log column, a Redis key.
MAX_MODEL_NAME = 256
# The metric label of every model a provider does not declare.
OTHER_MODEL = "(other)"
ENDPOINTS: Mapping[str, Literal["responses", "chat"]] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
}


# Retry-After of a 503 `ocx_overloaded`: long streams free pool slots within seconds.
OVERLOAD_RETRY_AFTER_S = 5


def error_payload(
    status: int,
    type_: str,
    code: str | None,
    message: str,
    fields: Mapping[str, Any] | None = None,
) -> bytes:
    error = {"type": type_, "code": code, "message": message, **(fields or {})}
    return json.dumps({"error": error}).encode()


class HTTPFailure(Exception):
    def __init__(
        self,
        status: int,
        type_: str,
        code: str | None,
        message: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = error_payload(status, type_, code, message, fields)
        self.headers = headers or []
        self.type = type_
        self.message = message

    @classmethod
    def shaped(cls, s: refusals.Shaped) -> HTTPFailure:
        """A refusal as `gateway.refusals` shaped it for the client."""
        return cls(s.status, s.type, s.code, s.message, s.headers, s.fields)

    def stream_failure(self) -> StreamFailure:
        """This error as the in-band terminal of a stream whose status line already went out."""
        return StreamFailure(
            status=self.status, type=self.type, code=self.code or self.type, message=self.message
        )


class ClientGone(Exception):
    pass


class Exchange:
    """One client request/response, with the route headers sent at commit."""

    def __init__(self, send: Send, request_id: str, body_now: BodyNow | None = None) -> None:
        self._send = send
        self._body_now = body_now
        self.request_id = request_id
        self.started = False
        self.status = 0
        self.combo: str | None = None
        self.attempts = 0
        self.upstream_s = 0.0
        # The final body was sent: nothing more may follow (ASGI allows one end of body).
        self.done = False
        # The serving attempt is over: a client leaving now must not cancel the bookkeeping.
        self.upstream_done = False
        self.protocol: Literal["responses", "chat"] = "responses"
        self.streaming = False
        # Set once the request is a POST to a proxy endpoint: from then on it is logged, even
        # when it is refused before its model is read (401, the key's rpm budget, bad JSON).
        self.logged = False
        self.entry = RequestEntry(request_id=request_id, at=time.time())
        self._held: list[bytes] | None = None
        # Budgets (PRODUCT §9.5): the admitted key, and the credential and headers of the
        # answer that was served (its quota windows count against window budgets).
        self.key: KeyInfo | None = None
        # The `target` metric label when the request named an undeclared model (bounded labels).
        self.target_label: str | None = None
        self.served_quota: tuple[tuple[str, str], Mapping[str, str]] | None = None
        # The after-commit rescue's notes on attempts of the route trace, by attempt index.
        self.roles: Mapping[int, Role] = _NO_ROLES
        # The `x-codex-*` rate-limit headers of the latest attempt's answer (PRODUCT §9.10).
        self.codex_headers: list[tuple[bytes, bytes]] = []
        # The request's span while OpenTelemetry tracing is on (gateway.tracing).
        self.trace: Any = None
        # Every request is charged (issue 42, `usage.estimate`): the body, what the client was
        # sent, and the target and usage known when an answer was committed.
        self.request: Mapping[str, Any] | None = None
        self.relayed = estimate.Relayed()
        self.committed_target = ""
        self.noted: Any = None
        # What admission reserved against the budgets (`usage.reservations`), let go at the end.
        self.hold: Hold | None = None

    def note_usage(self, target: TargetSpec, usage: Any) -> None:
        self.committed_target = target.key
        if usage is not None:
            self.noted = usage

    def base_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"x-ocx-request-id", self.request_id.encode())]
        if self.combo is not None:
            headers.append((b"x-ocx-combo", self.combo.encode()))
        return headers

    async def commit(
        self, status: int, headers: list[tuple[bytes, bytes]], target: TargetSpec
    ) -> None:
        self.started = True
        self.status = status
        self.committed_target = target.key
        # A body of known length (non-streaming) is held until `finish`, which runs after the
        # attempt loop recorded the outcome: a client that sends its next request as soon as it
        # has the whole answer must see this one's success (shared round-robin across workers).
        self._held = [] if any(name == b"content-length" for name, _ in headers) else None
        self.entry.ttft_ms = int((time.time() - self.entry.at) * 1000)
        route_headers = self.base_headers() + [
            (b"x-ocx-target", refusals.ascii_token(target.key)),
            (b"x-ocx-attempts", str(self.attempts).encode()),
            *self.codex_headers,
        ]
        await self._send(
            {"type": "http.response.start", "status": status, "headers": headers + route_headers}
        )

    async def write(self, data: bytes) -> None:
        if data:
            self.relayed.count(data)
            if self._held is not None:
                self._held.append(data)
                return
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    def writer_now(self) -> BodyNow | None:
        """A write of a streamed body chunk that is done when it returns (`server.body_now`), or
        None when the server offers none or the body is held for `finish`."""
        if self._body_now is None or self._held is not None or not self.started or self.done:
            return None
        body_now, count = self._body_now, self.relayed.count

        def counted(data: bytes) -> None:
            count(data)
            body_now(data)

        return counted

    async def finish(self) -> None:
        if self.started and not self.done:
            self.done = True
            body = b"".join(self._held or ())
            self._held = None
            await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def respond(
        self, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.started = True
        self.status = status
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *self.base_headers(),
            *(extra or []),
        ]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
        self.done = True


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
        headers = _headers(scope)
        if not self.hosts.allows(headers.get("host") or _server_name(scope)):
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
        body = await _read_body(receive, settings.OCX_PROXY_MAX_BODY)
        request = _parse_json(body)
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
        if not model.isascii() and not _encodable(model):
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
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, task, exchange))
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
                _note_usage(entry, exchange.noted)
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
        forwarded = _caller_headers(headers)
        caller = Caller(
            headers=forwarded,
            request_id=exchange.request_id,
            masker=Masker(functools.partial(_known_secrets, snapshot, forwarded)),
        )
        pairs = {t.key: _credential_pair(snapshot, t, caller) for t in combo.targets}
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
        bare target is attempted once (recorded here, None returned)."""
        runtime = self.runtime
        encrypted_only = encrypted_task_predicate(snapshot.providers) if encrypted else None
        compat: set[str] = set()
        used: set[tuple[str, str]] = set()

        def access(target: TargetSpec) -> Access:
            return _access(snapshot, target, caller, gate, pairs.get(target.key))

        # Set once a caller-forward upstream refused the caller's credential (issue #26).
        refused: list[str] = []
        # Caller-forward targets this caller's own rate limit holds it off (issue #43).
        held = await caller_limits.held_targets(
            runtime.caller_limits, snapshot.providers, combo, pairs
        )

        def predicate(target: TargetSpec) -> str | None:
            # Credential, quota and pin are the target's state (`access`); this is request-local.
            if unpriced and target.key in unpriced:
                return pricing_gate.REASON  # no price under a dollar budget (issue 42)
            if refused and forwards_caller_credential(snapshot.providers[target.provider]):
                # The same refused token would go there too.
                return "caller credential refused"
            if target.key in held:
                return caller_limits.SKIP_REASON
            return encrypted_only(target) if encrypted_only is not None else None

        async def dispatch(
            target: TargetSpec,
            _last: bool,
            *,
            body: dict[str, Any] | None = None,
            responder: Responder | None = None,
        ) -> Outcome:
            exchange.attempts += 1
            provider = snapshot.providers[target.provider]
            credential = None if provider.adapter == "chatgpt" else credential_for(provider)
            child = child_body(
                request if body is None else body,
                combo=combo,
                provider=provider,
                model=target.model,
                protocol=inbound,
                compat=frozenset(compat),
            )
            seen: dict[str, Any] = {}
            started = time.monotonic()
            span = (
                None
                if exchange.trace is None
                else tracing.start_attempt(
                    exchange.trace, provider.name, provider.adapter, target.key, target.model
                )
            )

            def observe(status: int, upstream_headers: Mapping[str, str]) -> None:
                seen["headers"] = upstream_headers
                exchange.codex_headers = refusals.codex_rate_headers(upstream_headers)
                metrics.UPSTREAM_TTFB.labels(provider.name).observe(time.monotonic() - started)

            try:
                outcome = await attempt(
                    client=runtime.client(provider),
                    provider=provider,
                    target=target,
                    credential=credential,
                    inbound=inbound,
                    body=child,
                    stream=stream,
                    caller=caller,
                    responder=exchange if responder is None else responder,
                    observe=observe,
                )
            except BaseException:
                if span is not None:
                    tracing.end_attempt(span, None)
                raise
            finally:
                elapsed = time.monotonic() - started
                exchange.upstream_s += elapsed
            if span is not None:
                tracing.end_attempt(span, outcome)
            if outcome.failure is not None and outcome.failure.message:
                # Before it reaches the client, the request log or a log line (issue #26).
                masked = caller.masker.text(outcome.failure.message)
                outcome = dataclasses.replace(
                    outcome, failure=dataclasses.replace(outcome.failure, message=masked)
                )
            if outcome.committed:
                exchange.upstream_done = True
                metrics.UPSTREAM_LATENCY.labels(provider.name).observe(elapsed)
            failure = outcome.failure
            if failure is not None and failure.transport == "local":
                # Nothing reached the upstream: no quota evidence, no compatibility lesson.
                _note_overload(provider.name, target.key, failure, elapsed, exchange.request_id)
                return outcome
            if outcome.malformed:
                metrics.MALFORMED_FRAMES.labels(provider.name).inc(outcome.malformed)
            pair = pairs.get(target.key)
            if pair is not None:
                used.add(pair)
                limited = await _ingest_quota(runtime, pair, seen.get("headers") or {}, outcome)
                if outcome.committed:
                    exchange.served_quota = (pair, seen.get("headers") or {})
                if limited and provider.adapter == "chatgpt":
                    # This caller's account is out of quota; other accounts may still use
                    # the target, so the quota state (per credential) handles it alone.
                    outcome = dataclasses.replace(outcome, cool=False)
            outcome = await caller_limits.note(
                runtime.caller_limits, provider, target, pair, outcome, combo, held
            )
            failure = outcome.failure
            if (
                failure is not None
                and not outcome.committed
                and forwards_caller_credential(provider)
                and callers_credential_refused(failure.status, classifier_code(failure))
            ):
                # The caller's own token was refused: nothing shared is cooled or marked; the
                # request may still hop to a target with a stored key.
                refused.append(target.key)
                outcome = dataclasses.replace(outcome, callers_own=True)
            if failure is not None and not outcome.committed:
                flag = compat_hop(failure, child, protocol=inbound)
                if flag is not None:
                    compat.add(flag)
            return outcome

        def on_cooldown(target_key: str, until: int, reason: str) -> None:
            metrics.COOLDOWNS.labels(combo.id, target_key).inc()
            runtime.emit(
                {
                    "kind": "cooldown",
                    "combo": combo.id,
                    "target": target_key,
                    "until": until,
                    "reason": reason,
                }
            )

        try:
            if not combo.id:
                target = combo.targets[0]
                ts = target_state(
                    target,
                    providers=snapshot.providers,
                    state=_NO_STATE,
                    now=_now_ms(),
                    access=access(target),
                )
                why = ts.skip or predicate(target)
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
                _record_target(exchange.entry, target, await dispatch(target, True))
                return None
            result = RouteResult()
            rescue = (
                None
                if not stream or combo.after_commit == "error"
                else _rescue(runtime, snapshot, combo, inbound, request, exchange, dispatch, access)
            )
            try:
                await route(
                    combo,
                    snapshot.providers,
                    runtime.store,
                    dispatch=dispatch if rescue is None else rescue.dispatch,
                    now=_now_ms,
                    sleep=_sleep_ms,
                    rng=runtime.rng,
                    predicate=predicate,
                    quota_resets={k: gate.resets.get(p) for k, p in pairs.items() if p is not None},
                    on_cooldown=on_cooldown,
                    result=result,
                    revision=snapshot.version,
                    access=access,
                    on_recovered=alerting.recovered(runtime.alerts, combo.id, _now_ms),
                )
            except asyncio.CancelledError:
                # Client abort: the request log still gets the attempt it made (status 499).
                _record_route(exchange.entry, result)
                raise
            except BufferOverflow as exc:
                # Not the target's fault and no reason to hop: every target's answer is as long.
                assert rescue is not None
                exchange.roles = rescue.roles
                key = rescue.attempted[-1]
                result.attempts.append(
                    AttemptRecord(key, 200, "stop", "buffer_limit_exceeded", None, 0)
                )
                _record_route(exchange.entry, result, exchange.roles)
                raise HTTPFailure(
                    502, "upstream_error", "buffer_limit_exceeded", f"{exc} from {key}"
                ) from None
            finally:
                if rescue is not None:
                    await rescue.close()
            if rescue is not None:
                rescue.apply(result)
                exchange.roles = rescue.roles
        finally:
            for pair in gate.probes - used:
                await runtime.tracker.release(pair, now=_now_ms())
        return result

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
        _record_route(exchange.entry, result, exchange.roles)
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
                    access=_access(snapshot, t, caller, gate, pairs.get(t.key)),
                )
                for t in combo.targets
            ]
        alerting.after_route(
            runtime.alerts, combo.id, result.attempts, states, result.retry_after, _now_ms()
        )
        _finish_route(combo, result, states)


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


def _credential_pair(
    snapshot: ConfigSnapshot, target: TargetSpec, caller: Caller
) -> tuple[str, str] | None:
    """(provider, credential fingerprint) whose quota applies to this request on `target`."""
    provider = snapshot.providers.get(target.provider)
    if provider is None:
        return None
    if provider.adapter == "chatgpt":
        # Every ChatGPT account has its own windows: the caller's own token decides.
        secret = caller.headers.get("authorization", "") + caller.headers.get(
            "chatgpt-account-id", ""
        )
    else:
        secret = credential_for(provider) or ""
    return (provider.name, fingerprint(secret)) if secret else None


def _known_secrets(snapshot: ConfigSnapshot, forwarded: Mapping[str, str]) -> list[str | None]:
    """Every credential value this request could meet: the config's keys, the caller's token."""
    return [*_config_secrets(snapshot), bearer_value(forwarded.get("authorization"))]


# The config's credential values, read once per snapshot: every request masks (issue #43).
_secrets_of: list[tuple[ConfigSnapshot, tuple[str | None, ...]]] = []


def _config_secrets(snapshot: ConfigSnapshot) -> tuple[str | None, ...]:
    if _secrets_of and _secrets_of[0][0] is snapshot:
        return _secrets_of[0][1]
    found = tuple(credential_for(p) for p in snapshot.providers.values())
    _secrets_of[:] = [(snapshot, found)]
    return found


@functools.lru_cache(maxsize=4096)
def fingerprint(secret: str) -> str:
    return credential_fingerprint(secret)


def _note_usage(entry: RequestEntry, usage: Any) -> None:
    if usage is not None:
        entry.input_tokens = usage.input
        entry.output_tokens = usage.output
        entry.cached_tokens = usage.cached
        entry.reasoning_tokens = usage.reasoning
        entry.usage_bad = usage.bad


def _record_target(entry: RequestEntry, target: TargetSpec, outcome: Outcome) -> None:
    """A bare target's one attempt in the request log; its failure is the answer."""
    failed = outcome.failure
    local = failed is not None and failed.transport == "local"
    entry.attempts.append(
        {
            "target": target.key,
            "status": outcome.status if outcome.failure is None else outcome.failure.status,
            "outcome": _bare_outcome(outcome, local),
            **({"reason": classify(failed).reason} if failed and local else {}),
            **({"malformedFrames": outcome.malformed} if outcome.malformed else {}),
        }
    )
    if outcome.committed:
        entry.target = target.key
        _note_usage(entry, outcome.usage)
    if not outcome.committed and outcome.failure is not None:
        _raise_upstream(outcome.failure, target.key)


def _bare_outcome(outcome: Outcome, local: bool) -> str:
    if outcome.committed:
        # An upstream `response.failed` (or a break) after output is no success (issue #43).
        return "served" if outcome.failure is None else "failed_after_commit"
    return "local_overload" if local else "failed"


def _record_route(
    entry: RequestEntry, result: RouteResult, roles: Mapping[int, Role] | None = None
) -> None:
    entry.attempts = [
        {
            "target": r.target,
            "status": r.status,
            "outcome": r.outcome,
            "reason": r.reason,
            "cooledUntil": r.cooled_until,
            "ms": r.ms,
            **({"malformedFrames": r.malformed} if r.malformed else {}),
            **({"waitMs": r.wait_ms} if r.wait_ms is not None else {}),
            **_role(r, i, roles),
        }
        for i, r in enumerate(result.attempts)
    ]
    entry.skipped = [[k, why] for k, why in result.skipped]
    if result.served is not None:
        entry.target = result.served.key
        _note_usage(entry, result.usage)


_CONTINUATION_OUTCOMES = frozenset({"continuation", "continuation_refused", "continuation_failed"})


def _role(record: AttemptRecord, index: int, roles: Mapping[int, Role] | None) -> dict[str, str]:
    """The after-commit rescue's role of one attempt in the request log (`gateway.rescue`)."""
    if record.outcome in _CONTINUATION_OUTCOMES:
        return {"role": "continuation"}
    role = None if roles is None else roles.get(index + 1)
    if role is None:
        return {}
    return {"role": role.role, **({"roleDetail": role.detail} if role.detail else {})}


def _rescue(
    runtime: Runtime,
    snapshot: ConfigSnapshot,
    combo: ComboSpec,
    inbound: Literal["responses", "chat"],
    request: Mapping[str, Any],
    exchange: Exchange,
    dispatch: Callable[..., Awaitable[Outcome]],
    access: Callable[[TargetSpec], Access],
) -> Rescue:
    """The after-commit policy of a streaming request on `combo` (`afterCommit` not "error")."""

    async def eligible(target: TargetSpec) -> bool:
        # The state as stored now: the broken target's cooldown is already in it.
        state = await runtime.store.get(combo.id)
        return target_state(
            target,
            providers=snapshot.providers,
            state=state,
            now=_now_ms(),
            override=combo.override,
            access=access(target),
        ).eligible

    return Rescue(
        combo=combo,
        providers=snapshot.providers,
        inbound=inbound,
        request=request,
        exchange=exchange,
        dispatch=dispatch,
        eligible=eligible,
        keepalive_s=settings.OCX_BUFFER_KEEPALIVE_MS / 1000,
    )


def _missing_for_client(target_key: str, why: str) -> str:
    """A missing credential as the client may read it: the provider, never the name of the
    server's environment variable (staff see that in `ocx doctor`, the admin and the log)."""
    if why == f"{SKIP_CREDENTIAL}: caller ChatGPT token":
        return why  # the caller's own token: the caller can act on it
    provider = target_key.split("/", 1)[0]
    return f"{SKIP_CREDENTIAL}: the credential of provider {provider} is not configured"


def _finish_route(
    combo: ComboSpec, result: RouteResult, states: list[TargetState] | None = None
) -> None:
    if result.served is not None:
        return
    if result.unavailable:
        message = f"No available targets for combo: {combo.id}"
        if states:
            # Each target with its state and until when, in `ocx status`'s words; a missing
            # credential names its provider, never the server's variable.
            message += ": " + "; ".join(_unavailable_because(ts) for ts in states)
        now = _now_ms()
        until = refusals.earliest_return(states or ())
        if until is None and result.retry_after is not None:
            until = now + int(result.retry_after) * 1000
        raise HTTPFailure.shaped(
            refusals.unavailable(
                status=503,
                type_="server_error",
                code="combo_unavailable",
                message=message,
                until_ms=until,
                now_ms=now,
            )
        )
    assert result.failure is not None
    last = result.attempts[-1].target if result.attempts else None
    # Another target of the combo may be back before the one that failed last.
    cooled = [r.cooled_until for r in result.attempts if r.cooled_until is not None]
    _raise_upstream(result.failure, last, min(cooled) if cooled else None)


def _unavailable_because(ts: TargetState) -> str:
    if ts.state == "no_credential" and ts.skip is not None:
        return f"{ts.target}: {_missing_for_client(ts.target, ts.skip)}"
    why = f" ({ts.reason})" if ts.reason else ""
    return f"{ts.target}: {status_label(ts)}{why}"


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


def _raise_upstream(failure: Failure, target: str | None = None, sooner: int | None = None) -> None:
    """The last upstream failure, sanitized, with its own status (reference §3.7), naming the
    `provider/model` it came from (never a credential)."""
    if failure.transport == "local":
        # ocx's own limit: the client may retry soon, on this target or any other.
        cause = failure.error_code or "overloaded"
        raise HTTPFailure(
            503,
            "server_error",
            "ocx_overloaded",
            f"ocx is overloaded ({cause}); retry shortly",
            [(b"retry-after", str(OVERLOAD_RETRY_AFTER_S).encode())],
        )
    if failure.status is None:
        kind = failure.transport or "error"
        status = 504 if kind.startswith("timeout") else 502
        where = f" ({target})" if target else ""
        raise HTTPFailure(
            status,
            "upstream_error",
            f"upstream_{kind}",
            f"Provider {kind.replace('_', ' ')}{where}",
        )
    text = redact(failure.message) if failure.message else ""
    # "from p/m" sits before the colon: a chained ocx still peels the envelope (classify).
    source = f" from {target}" if target else ""
    message = f"Provider error {failure.status}{source}" + (f": {text}" if text else "")
    code = failure.error_code or classify(failure).code or None
    # Its wait as a capped Retry-After, or a usage limit when long (PRODUCT §9.10); `sooner`:
    # when another target of the combo is back.
    now = _now_ms()
    until = refusals.upstream_until(failure, now)
    if until is not None and sooner is not None and now < sooner < until:
        until = sooner
    raise HTTPFailure.shaped(
        refusals.upstream(
            status=failure.status,
            type_=failure.error_type or "upstream_error",
            code=code,
            message=message,
            until_ms=until,
            now_ms=now,
            headers=refusals.codex_rate_headers(failure.headers),
        )
    )


def _access(
    snapshot: ConfigSnapshot,
    target: TargetSpec,
    caller: Caller,
    gate: Gate,
    pair: tuple[str, str] | None,
) -> Access:
    """The caller's credential and its quota on `target`, for `eligibility.target_state`."""
    provider = snapshot.providers.get(target.provider)
    if provider is None:
        return RESOLVED
    secret = None if provider.adapter == "chatgpt" else credential_for(provider)
    missing = credential_problem(provider, secret, caller_token="authorization" in caller.headers)
    if pair is None or pair not in gate.verdicts:
        return Access(missing=missing, credential=None if pair is None else pair[1])
    return Access(
        missing=missing,
        credential=pair[1],
        quota=_QUOTA[gate.verdicts[pair]],
        quota_until=gate.recovery.get(pair),
        probe_granted=pair in gate.probes,
    )


def _server_name(scope: Scope) -> str | None:
    # No Host header (HTTP/1.0): Django checks SERVER_NAME, the address the request came in on.
    server = scope.get("server")
    return server[0] if server else None


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        try:
            out[raw_name.decode("latin-1").lower()] = raw_value.decode("latin-1")
        except UnicodeDecodeError:
            continue
    return out


def _caller_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What an upstream may ever see from the caller: never the ocx key or cookies."""
    out = {
        k: v
        for k, v in headers.items()
        if k
        in (
            "chatgpt-account-id",
            "openai-beta",
            "originator",
            "session_id",
            "version",
            "x-codex-beta-features",
            "x-openai-subagent",
        )
    }
    # Codex's `session_id` reaches us as `session-id` (see server.daphne_main).
    session = headers.get("session-id") or headers.get("session_id")
    if session is not None:
        out["session_id"] = session
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip() and not value.strip().startswith(CLIENT_PREFIX):
        out["authorization"] = f"Bearer {value.strip()}"
    return out


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HTTPFailure(
                413,
                "invalid_request_error",
                "request_too_large",
                f"Request body exceeds {limit} bytes",
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _encodable(text: str) -> bool:
    """Whether `text` is valid Unicode: JSON's `\ud800` escapes give lone surrogates, which no
    upstream body, database row or Redis key can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


NESTED_TOO_DEEPLY = "Request body is nested too deeply"


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPFailure(
            400, "invalid_request_error", "invalid_json", "Request body is not valid UTF-8"
        ) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise HTTPFailure(400, "invalid_request_error", "invalid_json", NESTED_TOO_DEEPLY) from None
    except ValueError:
        raise HTTPFailure(
            400, "invalid_request_error", "invalid_json", "Request body is not valid JSON"
        ) from None
    if not isinstance(data, dict):
        raise HTTPFailure(
            400, "invalid_request_error", "invalid_json", "Request body must be a JSON object"
        )
    return data


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], exchange: Exchange) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not exchange.upstream_done:
                task.cancel()
            return
