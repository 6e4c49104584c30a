"""The per-provider HTTP client (`providers.upstream.ProviderClient`)."""

from __future__ import annotations

import asyncio
import ssl

import httpx

from providers.upstream import (
    POOL_CONNECTIONS,
    POOL_KEEPALIVE,
    Caller,
    ProviderClient,
    upstream_headers,
)
from routing.types import ProviderSpec, Timeouts


def test_every_client_shares_one_verifying_tls_context() -> None:
    clients = [
        ProviderClient(ProviderSpec(name=n, adapter="openai-chat", base_url=f"https://{n}.test/v1"))
        for n in ("a", "b")
    ]
    contexts = [c.transport.ssl_context for c in clients]
    assert contexts[0] is contexts[1] and contexts[0] is not None
    assert contexts[0].verify_mode == ssl.CERT_REQUIRED and contexts[0].check_hostname
    for client in clients:
        asyncio.run(client.aclose())


def test_requests_carry_the_provider_timeouts_and_pool_limits() -> None:
    spec = ProviderSpec(
        name="a",
        adapter="openai-chat",
        base_url="http://a.test/v1",
        timeouts=Timeouts(connect_ms=1500, first_byte_ms=9000, idle_ms=7000, total_ms=120_000),
    )
    client = ProviderClient(spec)
    assert (client.transport.max_connections, client.transport.max_keepalive) == (
        POOL_CONNECTIONS,
        POOL_KEEPALIVE,
    )
    request = client.request("http://a.test:8080/v1/chat/completions", {"x-a": "1"}, b"{}")
    assert request.extensions["timeout"] == {
        "connect": 1.5,
        "read": None,
        "write": 120.0,
        "pool": 9.0,  # a wait for ocx's own pool is bounded by the first-byte window
    }
    assert request.url == httpx.URL("http://a.test:8080/v1/chat/completions")
    assert request.headers["host"] == "a.test:8080"
    assert request.headers["content-length"] == "2"
    asyncio.run(client.aclose())


def test_upstream_headers_are_what_httpx_client_sent_plus_ours() -> None:
    spec = ProviderSpec(name="a", adapter="openai-chat", base_url="http://a.test/v1")
    headers = upstream_headers(spec, "sk-a", Caller(headers={}, request_id="r1"))
    assert headers == {
        "accept": "*/*",
        "connection": "keep-alive",
        "user-agent": f"python-httpx/{httpx.__version__}",
        "content-type": "application/json",
        "accept-encoding": "identity",
        "authorization": "Bearer sk-a",
        "x-request-id": "r1",
    }


async def test_an_upstream_cookie_is_never_sent_back() -> None:
    # httpx.AsyncClient kept a cookie jar: one caller's upstream cookie went out on every
    # later caller's request. Requests now go straight to the transport.
    from tests.providers.test_http1 import Server, ok

    async with Server(ok(extra=b"set-cookie: session=caller-a; Path=/\r\n")) as srv:
        spec = ProviderSpec(
            name="a", adapter="openai-chat", base_url=f"http://127.0.0.1:{srv.port}"
        )
        client = ProviderClient(spec)
        for _ in range(2):
            resp = await client.send(client.request(srv.url, {"x-a": "1"}, b"{}"))
            assert resp.headers["set-cookie"].startswith("session=caller-a")
            await resp.aread()
            await resp.aclose()
        await client.aclose()
    assert len(srv.requests) == 2
    assert b"cookie:" not in srv.requests[1].lower().replace(b"set-cookie", b"")


async def test_a_burst_leaves_every_connection_for_the_next_one() -> None:
    # Keeping only 16 idle connections, a worker at 64 in-flight requests closed and reopened
    # about one upstream connection in four. The pool allows far more connections than it keeps
    # idle; a burst of as many requests as it keeps idle still reuses every connection.
    from tests.providers.test_http1 import Server, until

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        # Each burst is answered once all of it has arrived: every request holds a connection.
        await until(lambda: len(srv.requests) >= (n // POOL_KEEPALIVE + 1) * POOL_KEEPALIVE)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()

    async def one(client: ProviderClient) -> bytes:
        resp = await client.send(client.request(srv.url, {}, b"{}"))
        body = await resp.aread()
        await resp.aclose()
        return body

    async with Server(answer) as srv:
        spec = ProviderSpec(
            name="a", adapter="openai-chat", base_url=f"http://127.0.0.1:{srv.port}"
        )
        client = ProviderClient(spec)
        for _ in range(2):
            bodies = await asyncio.gather(*(one(client) for _ in range(POOL_KEEPALIVE)))
            assert bodies == [b"{}"] * POOL_KEEPALIVE
        assert client.transport.max_connections > POOL_KEEPALIVE
        await client.aclose()
    assert len(srv.requests) == 2 * POOL_KEEPALIVE
    assert srv.connections == POOL_KEEPALIVE


async def test_an_idle_read_is_timed_by_the_idle_limit_when_the_first_byte_may_take_longer() -> (
    None
):
    """firstByteMs 120 s, idleMs 30 s (a reasoning model): after the first chunk a stalled read
    times out 30 s after it began, not when the first byte's deadline would have passed."""
    from providers.upstream import _ReadTimer

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    timer = _ReadTimer(loop, task)
    try:
        timer.start(120.0)  # waiting for the first byte
        first = timer._handle
        assert first is not None and first.when() >= loop.time() + 119
        timer.waiting = False  # it came
        timer.start(30.0)  # the next read
        idle = timer._handle
        assert idle is not None and idle is not first and first.cancelled()
        assert loop.time() + 29 <= idle.when() <= loop.time() + 30
        timer.waiting = False
        timer.start(60.0)  # a later deadline: the armed timer moves itself on when it fires
        assert timer._handle is idle
    finally:
        timer.close()
