"""The proxy front door: a lean ASGI app for `/v1/*` (mounted in `ocxsite.asgi`).

Per request: authenticate the client key against the cached key map, parse the body,
resolve the model against the in-memory config snapshot, run the attempt loop, and stream
the committing target's answer. No ORM call happens here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from django.conf import settings

from combos.engine.attempts import Outcome, RouteResult, route
from combos.engine.catalog import models_list
from combos.engine.classify import Failure, classify, redact
from combos.engine.types import ComboSpec, ConfigSnapshot, TargetSpec
from combos.engine.validate import resolve_model
from combos.selectors import credential_for
from ocxsite.access import CLIENT_PREFIX, KeyInfo, digest
from ocxsite.runtime import Runtime, get_runtime
from providers.upstream import Caller, attempt

log = logging.getLogger("ocx.proxy")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ENDPOINTS: Mapping[str, Literal["responses", "chat"]] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
}


def error_payload(status: int, type_: str, code: str | None, message: str) -> bytes:
    return json.dumps({"error": {"type": type_, "code": code, "message": message}}).encode()


class HTTPFailure(Exception):
    def __init__(
        self,
        status: int,
        type_: str,
        code: str | None,
        message: str,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_payload(status, type_, code, message)
        self.headers = headers or []


class ClientGone(Exception):
    pass


class Exchange:
    """One client request/response, with the route headers sent at commit."""

    def __init__(self, send: Send, request_id: str) -> None:
        self._send = send
        self.request_id = request_id
        self.started = False
        self.status = 0
        self.combo: str | None = None
        self.attempts = 0

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
        route_headers = self.base_headers() + [
            (b"x-ocx-target", target.key.encode()),
            (b"x-ocx-attempts", str(self.attempts).encode()),
        ]
        await self._send(
            {"type": "http.response.start", "status": status, "headers": headers + route_headers}
        )

    async def write(self, data: bytes) -> None:
        if data:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def finish(self) -> None:
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

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


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _sleep_ms(ms: int) -> None:
    await asyncio.sleep(ms / 1000)


class ProxyApp:
    def __init__(self, runtime: Runtime | None = None) -> None:
        self._runtime = runtime

    @property
    def runtime(self) -> Runtime:
        return self._runtime or get_runtime()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = uuid.uuid4().hex
        exchange = Exchange(send, request_id)
        try:
            await self._handle(scope, receive, exchange)
        except HTTPFailure as exc:
            if not exchange.started:
                await exchange.respond(exc.status, exc.body, exc.headers)
        except ClientGone:
            exchange.status = 499
        finally:
            if exchange.started:
                await exchange.finish()

    async def _handle(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        headers = _headers(scope)
        if path == "/v1/models":
            if method != "GET":
                raise HTTPFailure(405, "invalid_request_error", "method_not_allowed", "Use GET")
            snapshot = await self.runtime.ready()
            key = self._authenticate(headers)
            listing = models_list(snapshot)
            if key.allowed_models:
                listing["data"] = [m for m in listing["data"] if m["id"] in key.allowed_models]
            await exchange.respond(200, json.dumps(listing).encode())
            return
        inbound = ENDPOINTS.get(path)
        if inbound is None:
            raise HTTPFailure(404, "invalid_request_error", "not_found", f"Unknown endpoint {path}")
        if method != "POST":
            raise HTTPFailure(405, "invalid_request_error", "method_not_allowed", "Use POST")
        snapshot = await self.runtime.ready()
        key = self._authenticate(headers)
        body = await _read_body(receive, settings.OCX_PROXY_MAX_BODY)
        request = _parse_json(body)
        model = request.get("model")
        if not isinstance(model, str) or not model.strip():
            raise HTTPFailure(
                400,
                "invalid_request_error",
                "missing_model",
                "model is required and must be a string",
            )
        stream = request.get("stream", False)
        if not isinstance(stream, bool):
            raise HTTPFailure(
                400, "invalid_request_error", "invalid_type", "stream must be a boolean"
            )
        if key.allowed_models and model not in key.allowed_models:
            raise HTTPFailure(
                403, "permission_error", "model_not_allowed", f"This key may not use model {model}"
            )
        # Watch for the client going away while we work: it cancels the upstream at once.
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, task))
        try:
            await self._route(snapshot, inbound, request, model, stream, headers, exchange)
        except asyncio.CancelledError:
            if watcher.done() and not watcher.cancelled():
                raise ClientGone() from None
            raise
        finally:
            watcher.cancel()

    def _authenticate(self, headers: Mapping[str, str]) -> KeyInfo:
        token = headers.get("x-ocx-key", "")
        if not token:
            scheme, _, value = headers.get("authorization", "").partition(" ")
            if scheme.lower() == "bearer" and value.strip().startswith(CLIENT_PREFIX):
                token = value.strip()
        info = self.runtime.keys.get(digest(token)) if token.startswith(CLIENT_PREFIX) else None
        if info is None:
            raise HTTPFailure(
                401,
                "invalid_request_error",
                "invalid_api_key",
                "Missing or invalid ocx client key (Authorization: Bearer ocx_… or x-ocx-key)",
            )
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
    ) -> None:
        resolution = resolve_model(model, snapshot)
        caller = Caller(headers=_caller_headers(headers), request_id=exchange.request_id)
        runtime = self.runtime

        async def dispatch(target: TargetSpec, _last: bool) -> Outcome:
            exchange.attempts += 1
            provider = snapshot.providers[target.provider]
            credential = None if provider.adapter == "chatgpt" else credential_for(provider)
            return await attempt(
                client=runtime.client(provider),
                provider=provider,
                target=target,
                credential=credential,
                inbound=inbound,
                body=request,
                stream=stream,
                caller=caller,
                responder=exchange,
            )

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
            why = _ineligible(snapshot, target, caller)
            if why is not None:
                raise HTTPFailure(503, "server_error", "provider_unavailable", why)
            outcome = await dispatch(target, True)
            if not outcome.committed and outcome.failure is not None:
                _raise_upstream(outcome.failure)
            return
        if resolution.kind != "combo":
            raise HTTPFailure(
                404, "invalid_request_error", "model_not_found", f"Unknown model: {model}"
            )
        assert resolution.combo_id is not None
        combo = snapshot.combos[resolution.combo_id]
        exchange.combo = combo.id

        def predicate(target: TargetSpec) -> str | None:
            return _ineligible(snapshot, target, caller)

        result = await route(
            combo,
            snapshot.providers,
            runtime.store,
            dispatch=dispatch,
            now=_now_ms,
            sleep=_sleep_ms,
            rng=runtime.rng,
            predicate=predicate,
        )
        _finish_route(combo, result, snapshot, caller)


def _finish_route(
    combo: ComboSpec, result: RouteResult, snapshot: ConfigSnapshot, caller: Caller
) -> None:
    if result.served is not None:
        return
    if result.unavailable:
        missing = [why for _, why in result.skipped if why.startswith("credential")]
        message = f"No available targets for combo: {combo.id}"
        if missing and len(missing) == len(result.skipped):
            message += " (" + "; ".join(sorted(set(missing))) + ")"
        extra = (
            [] if result.retry_after is None else [(b"retry-after", result.retry_after.encode())]
        )
        raise HTTPFailure(503, "server_error", "combo_unavailable", message, extra)
    assert result.failure is not None
    _raise_upstream(result.failure)


def _raise_upstream(failure: Failure) -> None:
    """The last upstream failure, sanitized, with its own status (reference §3.7)."""
    if failure.status is None:
        kind = failure.transport or "error"
        status = 504 if kind.startswith("timeout") else 502
        raise HTTPFailure(
            status, "upstream_error", f"upstream_{kind}", f"Provider {kind.replace('_', ' ')}"
        )
    text = redact(failure.message) if failure.message else ""
    message = f"Provider error {failure.status}" + (f": {text}" if text else "")
    code = failure.error_code or classify(failure).code or None
    extra: list[tuple[bytes, bytes]] = []
    retry = failure.headers.get("retry-after")
    if retry is not None and retry.strip().isdigit():
        extra.append((b"retry-after", retry.strip().encode()))
    raise HTTPFailure(failure.status, failure.error_type or "upstream_error", code, message, extra)


def _ineligible(snapshot: ConfigSnapshot, target: TargetSpec, caller: Caller) -> str | None:
    provider = snapshot.providers.get(target.provider)
    if provider is None:
        return "provider_missing"
    if provider.adapter == "chatgpt":
        return (
            None
            if "authorization" in caller.headers
            else "credential_missing: caller ChatGPT token"
        )
    if credential_for(provider) is None:
        if provider.api_key_env:
            return f"credential_missing: environment variable {provider.api_key_env} is not set"
        if provider.adapter != "openai-chat" or provider.api_key is not None:
            return "credential_missing: no API key stored"
        # A local OpenAI-compatible server (e.g. Ollama) may need no key at all.
    return None


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


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPFailure(
            400, "invalid_request_error", "invalid_json", "Request body is not valid UTF-8"
        ) from None
    try:
        data = json.loads(text)
    except ValueError:
        raise HTTPFailure(
            400, "invalid_request_error", "invalid_json", "Request body is not valid JSON"
        ) from None
    if not isinstance(data, dict):
        raise HTTPFailure(
            400, "invalid_request_error", "invalid_json", "Request body must be a JSON object"
        )
    return data


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return
