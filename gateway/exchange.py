"""One client request and its answer: the ASGI types, the body read and parsed, the errors
(`HTTPFailure`, shaped for the client), and `Exchange`, which sends the status line once at
commit and counts what the client was sent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from accounts.access import CLIENT_PREFIX, KeyInfo
from gateway import refusals
from gateway.rescue import Role
from providers.wire.commit import StreamFailure
from routing.types import TargetSpec
from server.body_now import BodyNow
from usage import estimate
from usage.requestlog import RequestEntry
from usage.reservations import Hold

Scope = dict[str, Any]


Receive = Callable[[], Awaitable[dict[str, Any]]]


Send = Callable[[dict[str, Any]], Awaitable[None]]


# No after-commit rescue notes (the default policy): one shared empty map, no allocation.
NO_ROLES: Mapping[int, Role] = MappingProxyType({})


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
        self.roles: Mapping[int, Role] = NO_ROLES
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


def server_name(scope: Scope) -> str | None:
    # No Host header (HTTP/1.0): Django checks SERVER_NAME, the address the request came in on.
    server = scope.get("server")
    return server[0] if server else None


def request_headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        try:
            out[raw_name.decode("latin-1").lower()] = raw_value.decode("latin-1")
        except UnicodeDecodeError:
            continue
    return out


def caller_headers(headers: Mapping[str, str]) -> dict[str, str]:
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


async def read_body(receive: Receive, limit: int) -> bytes:
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


def encodable(text: str) -> bool:
    """Whether `text` is valid Unicode: JSON's `\ud800` escapes give lone surrogates, which no
    upstream body, database row or Redis key can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


NESTED_TOO_DEEPLY = "Request body is nested too deeply"


def parse_json(body: bytes) -> dict[str, Any]:
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


async def watch_disconnect(receive: Receive, task: asyncio.Task[Any], exchange: Exchange) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not exchange.upstream_done:
                task.cancel()
            return
