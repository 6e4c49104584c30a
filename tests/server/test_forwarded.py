"""`server.forwarded` (issue #43): X-Forwarded-For / -Proto only from `OCX_TRUSTED_PROXIES`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from server.forwarded import ForwardedHeaders, TrustedProxies, forwarded

XFF = [(b"x-forwarded-for", b"6.6.6.6, 203.0.113.9"), (b"x-forwarded-proto", b"https")]


def scope(peer: str, headers: list[tuple[bytes, bytes]], kind: str = "http") -> dict[str, Any]:
    scheme = "ws" if kind == "websocket" else "http"
    return {"type": kind, "client": (peer, 5555), "headers": headers, "scheme": scheme}


def seen(trusted: list[str], sc: dict[str, Any]) -> dict[str, Any]:
    got: dict[str, Any] = {}

    async def app(s: dict[str, Any], receive: Any, send: Any) -> None:
        got.update(s)

    asyncio.run(ForwardedHeaders(app, TrustedProxies(trusted))(sc, None, None))
    return got


def test_by_default_nobody_is_trusted() -> None:
    async def app(s: Any, r: Any, w: Any) -> None:
        pass

    assert forwarded(app, []) is app  # nothing added on the request path
    trusted = TrustedProxies([])
    assert not trusted
    assert trusted.resolve(scope("127.0.0.1", XFF)) == scope("127.0.0.1", XFF)


def test_a_trusted_peer_reports_the_client_and_the_scheme() -> None:
    got = seen(["10.0.0.0/8"], scope("10.1.2.3", XFF))
    # The rightmost address no trusted proxy has: the left one the client may have written.
    assert got["client"] == ("203.0.113.9", 0)
    assert got["scheme"] == "https"
    ws = seen(["10.0.0.0/8"], scope("10.1.2.3", XFF, "websocket"))
    assert ws["scheme"] == "wss"


def test_a_chain_of_trusted_proxies_is_walked_from_the_right() -> None:
    headers = [(b"x-forwarded-for", b"198.51.100.7, 10.0.0.5")]
    assert seen(["10.0.0.0/8"], scope("10.1.2.3", headers))["client"] == ("198.51.100.7", 0)


@pytest.mark.parametrize("peer", ["127.0.0.1", "192.168.1.9", "::1"])
def test_any_other_peer_is_the_client(peer: str) -> None:
    got = seen(["10.0.0.0/8"], scope(peer, XFF))
    assert got["client"] == (peer, 5555)
    assert got["scheme"] == "http"


def test_a_bad_entry_is_named() -> None:
    with pytest.raises(ValueError, match="'not-an-ip' is not an IP address or network"):
        TrustedProxies(["10.0.0.1", "not-an-ip"])
