"""`Exchange.writer_now`: the synchronous body write a server offers (`server.body_now`) is handed
to a stream only while its response is streaming."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.proxy import Exchange
from routing.types import TargetSpec

SSE = [(b"content-type", b"text/event-stream")]
TARGET = TargetSpec("p", "m")


async def _send(message: dict[str, Any]) -> None:
    pass


def test_a_streamed_response_gets_the_servers_write_and_only_while_it_streams() -> None:
    written: list[bytes] = []

    async def go() -> None:
        exchange = Exchange(_send, "r1", written.append)
        assert exchange.writer_now() is None  # nothing started yet
        await exchange.commit(200, SSE, TARGET)
        write = exchange.writer_now()
        assert write is not None
        write(b"data: 1\n\n")
        await exchange.finish()
        assert exchange.writer_now() is None  # the body has ended

    asyncio.run(go())
    assert written == [b"data: 1\n\n"]


def test_a_held_body_or_a_server_without_it_gets_none() -> None:
    async def go() -> None:
        held = Exchange(_send, "r2", lambda data: None)
        await held.commit(200, [(b"content-length", b"2")], TARGET)  # held until `finish`
        assert held.writer_now() is None
        plain = Exchange(_send, "r3")  # uvicorn, or an ASGI test client
        await plain.commit(200, SSE, TARGET)
        assert plain.writer_now() is None

    asyncio.run(go())
