"""The per-provider HTTP clients (`providers.upstream.ClientPool`)."""

from __future__ import annotations

import asyncio
import ssl

import httpx

from combos.engine.types import ProviderSpec
from providers.upstream import POOL_PARTS, ClientPool


def tls_of(client: httpx.AsyncClient) -> ssl.SSLContext:
    context: ssl.SSLContext = client._transport._pool._ssl_context  # type: ignore[attr-defined]
    return context


def test_every_client_shares_one_verifying_tls_context() -> None:
    pools = [
        ClientPool(ProviderSpec(name=n, adapter="openai-chat", base_url=f"https://{n}.test/v1"))
        for n in ("a", "b")
    ]
    clients = [c for pool in pools for c in pool.clients]
    assert len(clients) == 2 * POOL_PARTS
    assert len({id(tls_of(c)) for c in clients}) == 1
    context = tls_of(clients[0])
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    for pool in pools:
        asyncio.run(pool.aclose())


def test_clients_are_handed_out_in_turn() -> None:
    pool = ClientPool(ProviderSpec(name="a", adapter="openai-chat", base_url="http://a.test/v1"))
    handed = [pool.get() for _ in range(2 * POOL_PARTS)]
    assert handed == pool.clients + pool.clients
    asyncio.run(pool.aclose())
