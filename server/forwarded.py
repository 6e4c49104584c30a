"""`OCX_TRUSTED_PROXIES`: whose `X-Forwarded-For` / `X-Forwarded-Proto` a worker honours (#43).

Daphne ran with `--proxy-headers`, which takes `X-Forwarded-For` from any peer: a client that
reaches a worker directly picked its own address, and the per-address login lockout was
sidestepped by rotating the header. Now neither server reads the headers itself (no
`--proxy-headers`, uvicorn's `proxy_headers` off) and this ASGI middleware does, the same for
both: only when the connection's peer is one of `OCX_TRUSTED_PROXIES` (addresses or networks,
comma-separated; default none) is the client taken from `X-Forwarded-For` (the rightmost address
that is not itself a trusted proxy) and the scheme from `X-Forwarded-Proto` (`https`/`wss`).
From any other peer the headers are ignored and the peer is the client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    def __init__(self, entries: Iterable[str]) -> None:
        """`entries`: addresses or CIDR networks; a bad one raises `ValueError` naming it."""
        networks: list[Network] = []
        for entry in entries:
            entry = entry.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(
                    f"OCX_TRUSTED_PROXIES: {entry!r} is not an IP address or network"
                ) from None
        self.networks = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: str | None) -> bool:
        if not address:
            return False
        try:
            ip = ipaddress.ip_address(address.strip().strip("[]"))
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def resolve(self, scope: Scope) -> Scope:
        """`scope` with the client and scheme a trusted proxy reported (a new scope), or as it
        came."""
        client = scope.get("client")
        if not client or not self.trusts(client[0]):
            return scope
        forwarded_for = proto = None
        for name, value in scope.get("headers", []):
            lowered = name.lower()
            if lowered == b"x-forwarded-for":
                forwarded_for = value.decode("latin1")
            elif lowered == b"x-forwarded-proto":
                proto = value.decode("latin1").split(",")[0].strip().lower()
        changed = dict(scope)
        if forwarded_for:
            hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
            # From the right: our proxies appended what they saw; the first hop none of them
            # is, is the client (anything left of it the client may have written itself).
            for hop in reversed(hops):
                if not self.trusts(hop):
                    changed["client"] = (hop.strip("[]"), 0)
                    break
            else:
                if hops:
                    changed["client"] = (hops[0].strip("[]"), 0)
        if proto in ("https", "http"):
            secure = proto == "https"
            if scope["type"] == "websocket":
                changed["scheme"] = "wss" if secure else "ws"
            else:
                changed["scheme"] = proto
        return changed


class ForwardedHeaders:
    """ASGI middleware: `TrustedProxies.resolve` before the application sees the scope."""

    def __init__(self, app: ASGIApp, trusted: TrustedProxies | None = None) -> None:
        self.app = app
        self._trusted = trusted

    def trusted(self) -> TrustedProxies:
        if self._trusted is None:
            from django.conf import settings

            self._trusted = TrustedProxies(settings.OCX_TRUSTED_PROXIES)
        return self._trusted

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        trusted = self.trusted()
        if trusted and scope["type"] in ("http", "websocket"):
            scope = trusted.resolve(scope)
        await self.app(scope, receive, send)


def forwarded(app: ASGIApp, entries: Iterable[str]) -> ASGIApp:
    """`app` behind `ForwardedHeaders` when some proxy is trusted; else `app` itself (nothing
    on the request path by default)."""
    trusted = TrustedProxies(entries)
    return ForwardedHeaders(app, trusted) if trusted else app
