"""The `/ws/events` origin check on scheme, host and port (issue #43).

A browser sends the session cookie with any page's WebSocket, so only a page of this site may
open one. Channels' `AllowedHostsOriginValidator` compared the Origin's host with
`OCX_ALLOWED_HOSTS` and ignored its scheme and port: a page on another port of the same host
(another service, plain HTTP beside HTTPS) passed. Now the Origin must be this site's own origin
as the browser reached it: its host and port those of the request's `Host` header (default
ports filled in), its scheme the connection's (`wss` ⇔ `https`: a TLS-terminating proxy tells
the worker through `X-Forwarded-Proto` from an address in `OCX_TRUSTED_PROXIES`), and the host
one of `OCX_ALLOWED_HOSTS`. A missing, `null` or unparsable Origin is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
_DEFAULT_PORT = {"http": 80, "https": 443}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            try:
                return str(value.decode("latin1"))
            except UnicodeDecodeError:
                return None
    return None


def site_origin(scope: Scope) -> tuple[str, str, int] | None:
    """(scheme, host, port) of this site as the request reached it, from its Host header."""
    host_header = _header(scope, b"host")
    if not host_header:
        return None
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    host, port = split_domain_port(host_header.lower())
    if not host:
        return None
    try:
        number = int(port) if port else _DEFAULT_PORT[scheme]
    except ValueError:
        return None
    return scheme, host, number


def same_origin(scope: Scope) -> bool:
    origin = _header(scope, b"origin")
    site = site_origin(scope)
    if not origin or site is None:
        return False
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port or _DEFAULT_PORT.get(parts.scheme)
    except ValueError:
        return False
    host = parts.hostname or ""
    if host and ":" in host and not host.startswith("["):
        host = f"[{host}]"  # urlsplit drops an IPv6 literal's brackets: put them back
    if (parts.scheme, host, port) != site:
        return False
    return validate_host(site[1], settings.ALLOWED_HOSTS)


class SameOriginValidator:
    """ASGI middleware for WebSocket scopes: refuses (closes) a connection whose Origin is not
    this site's own origin, before the session is looked at."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and not same_origin(scope):
            await WebsocketDenier()(scope, receive, send)
            return
        await self.app(scope, receive, send)
