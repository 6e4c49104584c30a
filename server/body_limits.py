"""Request bodies bounded before they are read (issue #26, point 1).

Every HTTP request has a body limit from its path: the proxy (`/v1/`, `OCX_PROXY_MAX_BODY`), the
management API (`/api/`, `OCX_API_MAX_BODY`), the health and metrics endpoints (`SMALL_MAX_BODY`)
and everything else, the admin included (`OCX_OTHER_MAX_BODY`). Requests that will be answered
401 whatever their body get `OCX_UNAUTH_MAX_BODY` instead: on `/v1/` those without a client
key the worker knows (checked against the proxy's own key map, in memory, only for a body past
that limit; the digest is handed on to the proxy, `KEY_SCOPE`), on `/api/` those
that present no credential at all (no bearer, no session cookie; a management token is checked
in the database, which the server's parsing thread must not wait for).

A declared `Content-Length` above the limit is answered 413 with a JSON error before one byte of
the body is read, and the connection is closed; a chunked body is counted as it arrives and
refused the same way once it passes the limit. Daphne (Twisted) buffers a whole body before the
ASGI application runs, so there the check hooks into Twisted's request parsing
(`server.daphne_main`); uvicorn streams the body to the application, so `BoundedBody`, an ASGI
middleware, does it there (it steps aside in a Daphne worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from server.request_path import normalized

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# /healthz, /readyz, /metrics take GETs: a body there is never needed.
SMALL_MAX_BODY = 1024
_SMALL_PATHS = (b"/healthz", b"/readyz", b"/metrics")
# After a 413 the rest of the body is read and dropped for at most this long / this much before
# the connection is closed (a close with unread data is a reset, which can lose the 413).
LINGER_S = 2.0
LINGER_BYTES = 8 * 1024 * 1024


class Limits:
    """The configured limits (read once from Django's settings, at the first request)."""

    def __init__(self, *, proxy: int, api: int, other: int, unauthenticated: int) -> None:
        self.proxy = proxy
        self.api = api
        self.other = other
        self.unauthenticated = unauthenticated

    @classmethod
    def from_settings(cls) -> Limits:
        from django.conf import settings

        return cls(
            proxy=settings.OCX_PROXY_MAX_BODY,
            api=settings.OCX_API_MAX_BODY,
            other=settings.OCX_OTHER_MAX_BODY,
            unauthenticated=settings.OCX_UNAUTH_MAX_BODY,
        )

    def for_request(
        self, path: bytes, headers: Iterable[tuple[bytes, bytes]], needed: int | None = None
    ) -> int:
        """The body limit of a request to `path` (raw target, query included) with `headers`
        (lower- or mixed-case names); `needed`: see `check`."""
        return self.check(path, headers, needed)[0]

    def check(
        self, path: bytes, headers: Iterable[tuple[bytes, bytes]], needed: int | None = None
    ) -> tuple[int, KnownKey | None]:
        """The body limit of a request to `path` with `headers`, and the client key whose
        digest was computed to tell it (for the proxy to reuse: `KEY_SCOPE`).

        `needed`: the body size in question (the declared length, or the bytes counted so
        far); None: the limit whatever the size. A /v1 request's key is looked up only for a
        body past the unauthenticated limit: below it every sender gets the same answer, so
        the returned limit is then the unauthenticated one, exact only for sizes up to it (a
        chunked body asks again once it passes it)."""
        path = normalized(path)  # the path routing sees (issue #43)
        if path.startswith(b"/v1/"):
            low = min(self.proxy, self.unauthenticated)
            if needed is not None and needed <= low:
                return low, None
            known, key = _known_client_key(headers)
            return (self.proxy if known else low), key
        elif path.startswith(b"/api/") or path == b"/api":
            limit = self.api
        elif path in _SMALL_PATHS or path.rstrip(b"/") in _SMALL_PATHS:
            return min(SMALL_MAX_BODY, self.other), None
        else:
            return self.other, None
        if not _presents_credential(headers):
            return min(limit, self.unauthenticated), None
        return limit, None


# Where the server hands the proxy the client key `Limits.check` looked up (a `KnownKey`), so
# that the key's SHA-256 is computed once per request (the proxy checks the token is the same).
KEY_SCOPE = "ocx.client_key"


@dataclass(frozen=True)
class KnownKey:
    token: str  # the `ocx_…` key as the proxy reads it from the headers
    digest: str  # its SHA-256, hex


def _presents_credential(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        lowered = name.lower()
        if lowered in (b"authorization", b"x-ocx-key") and value.strip():
            return True
        if lowered == b"cookie" and b"sessionid=" in value:
            return True
    return False


def _known_client_key(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bool, KnownKey | None]:
    """Whether a /v1 request carries a client key this worker's proxy accepts (the same rule
    and the same key map as `ProxyApp._authenticate`, so the limit and the 401 agree), and the
    key with its digest when one was computed. A worker loads its key map before it accepts
    traffic (`gateway.runtime.preload_keys`); one that could not (the database was out) knows
    no key, so every request gets the unauthenticated limit until it has (issue #43)."""
    token = bearer = b""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"x-ocx-key":
            token = value.strip()
        elif lowered == b"authorization":
            bearer = value.strip()
    if not token:
        scheme, _, rest = bearer.partition(b" ")
        if scheme.lower() == b"bearer":
            token = rest.strip()
    if not token.startswith(b"ocx_"):
        return False, None
    keys = key_map()
    if keys is None:
        return False, None
    if not token.isascii():
        return False, None  # the map's digests are of the key's text; an `ocx_` key is ASCII
    key = KnownKey(token.decode("ascii"), hashlib.sha256(token).hexdigest())
    info = keys.get(key.digest)
    # A rotated-out, expired or deactivated key gets the 401, so the unauthenticated limit.
    accepted = (
        info is not None
        and getattr(info, "user_active", True)
        and time.time() < getattr(info, "expires_at", math.inf)
    )
    return accepted, key


# Wired by `ocxsite.asgi` (this module sits below the proxy it guards): the worker's client-key
# map as the proxy holds it (None until it is loaded, before the worker accepts traffic) and
# the proxy's request-id maker.
def _no_key_map() -> Mapping[str, object] | None:
    return None


key_map: Callable[[], Mapping[str, object] | None] = _no_key_map
request_id: Callable[[], str] | None = None


_limits: Limits | None = None
# Set by `server.daphne_main`: Twisted checks every request before the application runs, so
# `BoundedBody` has nothing left to do.
checked_by_server = False


def limits() -> Limits:
    global _limits
    if _limits is None:
        _limits = Limits.from_settings()
    return _limits


def reset() -> None:
    """Forget the limits read from settings (tests that change them)."""
    global _limits
    _limits = None


def too_large_body(path: bytes, limit: int) -> bytes:
    """The JSON of a 413: the proxy's OpenAI shape on `/v1/`, `{"error": …}` elsewhere."""
    message = f"Request body exceeds {limit} bytes"
    if normalized(path).startswith(b"/v1/"):
        error: object = {
            "type": "invalid_request_error",
            "code": "request_too_large",
            "message": message,
        }
    else:
        error = message
    return json.dumps({"error": error}).encode()


def too_large_headers(path: bytes, body: bytes) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if normalized(path).startswith(b"/v1/") and request_id is not None:
        # Every proxy answer carries a request id (docs/operations.md "Error shapes").
        headers.append((b"x-ocx-request-id", request_id().encode()))
    return headers


def too_large_response(path: bytes, limit: int) -> bytes:
    """A complete HTTP/1.1 413 response that closes the connection (for Twisted's transport)."""
    body = too_large_body(path, limit)
    head = b"HTTP/1.1 413 Content Too Large\r\n" + b"".join(
        name + b": " + value + b"\r\n" for name, value in too_large_headers(path, body)
    )
    return head + b"\r\n" + body


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length a request declares (None without one or when it is not a number;
    the server's own parser refuses the latter)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return None


class BoundedBody:
    """ASGI middleware: 413 for a body above its path's limit, before the application reads it.

    A declared Content-Length is checked against the headers alone; a body without one
    (chunked) is counted as the application receives it, and once past the limit the client
    gets the 413 (if nothing was answered yet) and the application a disconnect. The 413
    carries `Connection: close`, so the server closes the connection instead of reading the
    rest of the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if checked_by_server or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        path = scope.get("raw_path") or scope["path"].encode()
        length = declared_length(headers)
        if (
            length is None
            and scope.get("method") in ("GET", "HEAD")
            and not any(name.lower() == b"transfer-encoding" for name, _ in headers)
        ):
            await self.app(scope, receive, send)  # no body at all
            return
        # A declared length is the size in question; a chunked body gets the limit whatever
        # its size.
        limit, key = limits().check(path, headers, length)
        if key is not None:
            scope[KEY_SCOPE] = key  # its digest is computed once per request
        if length is not None:
            if length > limit:
                await _send_too_large(send, path, limit, receive)
                return
            await self.app(scope, receive, send)
            return
        await _Counted(self.app, scope, receive, send, path, limit).run()


async def _send_too_large(
    send: Send, path: bytes, limit: int, receive: Receive, *, more: bool = True
) -> None:
    """Send the 413, then read and drop what the client still sends (at most `LINGER_S` and
    `LINGER_BYTES`) before ending the response, after which the server closes the connection:
    closing with unread data would reset it, and the reset can lose the 413."""
    body = too_large_body(path, limit)
    await send(
        {"type": "http.response.start", "status": 413, "headers": too_large_headers(path, body)}
    )
    await send({"type": "http.response.body", "body": body, "more_body": more})
    if not more:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            dropped = 0
            while dropped <= LINGER_BYTES:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break
                dropped += len(message.get("body", b""))
    await send({"type": "http.response.body", "body": b""})


class _Counted:
    """One request whose body is counted as it is received."""

    def __init__(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, path: bytes, limit: int
    ) -> None:
        self.app, self.scope, self._receive, self._send = app, scope, receive, send
        self.path, self.limit = path, limit
        self.received = 0
        self.started = False
        self.refused = False

    async def run(self) -> None:
        await self.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.refused = True
                if not self.started:
                    self.started = True
                    more = message.get("more_body", False)
                    await _send_too_large(
                        self._send, self.path, self.limit, self._receive, more=more
                    )
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return  # the client has its 413; the application's own answer goes nowhere
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
