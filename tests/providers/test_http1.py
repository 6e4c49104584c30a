"""`providers.http1.Http1Transport` against real sockets: a scripted raw asyncio server."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from providers.http1 import Body, Http1Transport, LocalOverload
from tests.certs import self_signed

Answer = Callable[[asyncio.StreamWriter, int], Awaitable[None]]


class Server:
    """Accepts connections, reads each request whole, then runs `answer(writer, n)` for the
    n-th request (0-based, across connections)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # handlers still waiting for a request end quietly
            writer.close()
        await asyncio.sleep(0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/x?q=1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                await self.answer(writer, len(self.requests) - 1)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> Answer:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + extra
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )
        await writer.drain()

    return answer


def reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Clock:
    """The transport's keep-alive clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def client(**kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=Http1Transport(ssl_context=None, **kw),
        timeout=httpx.Timeout(1.0, read=None),
    )


def pool(c: httpx.AsyncClient) -> Http1Transport:
    return cast(Http1Transport, c._transport)


async def settle() -> None:
    """Let every ready task run on to its next wait (no clock, no I/O needed)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def until(done: Callable[[], bool]) -> None:
    """Spin the loop until `done()`: what a peer's socket does has no clock to inject, so this
    returns as soon as the kernel delivered it; the timeout only bounds a failure."""
    async with asyncio.timeout(5):
        while not done():
            await asyncio.sleep(0)


async def post(c: httpx.AsyncClient, url: str, body: bytes = b'{"a":1}') -> httpx.Response:
    return await c.send(c.build_request("POST", url, content=body), stream=True)


async def read(resp: httpx.Response) -> bytes:
    out = b"".join([chunk async for chunk in resp.aiter_raw()])
    await resp.aclose()
    return out


async def test_answer_and_request_on_the_wire() -> None:
    async with Server(ok(extra=b"x-codex-primary-used-percent: 12\r\n")) as srv:
        async with client() as c:
            resp = await post(c, srv.url, b'{"model":"m"}')
            assert resp.status_code == 200
            assert resp.headers["x-codex-primary-used-percent"] == "12"
            assert resp.reason_phrase == "OK"
            assert await read(resp) == b'{"ok":true}'
    head, _, body = srv.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/x?q=1 HTTP/1.1"
    assert f"host: 127.0.0.1:{srv.port}".encode() in [line.lower() for line in lines]
    assert b"content-length: 13" in [line.lower() for line in lines]
    assert body == b'{"model":"m"}'


async def test_a_whole_answer_leaves_its_connection_for_the_next_request() -> None:
    async with Server(ok()) as srv:
        async with client() as c:
            for _ in range(3):
                assert await read(await post(c, srv.url)) == b'{"ok":true}'
            assert pool(c).connections() == 1
    assert srv.connections == 1 and len(srv.requests) == 3


STREAM_PARTS = [b"data: %d\n\n" % i for i in range(20)]


async def chunked_stream(writer: asyncio.StreamWriter, n: int) -> None:
    """A chunked answer of STREAM_PARTS, one chunk per write."""
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    for part in STREAM_PARTS:
        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        await writer.drain()
        await asyncio.sleep(0)
    writer.write(b"0\r\n\r\n")


async def test_chunked_stream_arrives_in_order_and_whole() -> None:
    parts = STREAM_PARTS
    async with Server(chunked_stream) as srv:
        async with client() as c:
            assert await read(await post(c, srv.url)) == b"".join(parts)
            assert await read(await post(c, srv.url)) == b"".join(parts)
    assert srv.connections == 1


async def test_connection_close_answer_is_not_reused() -> None:
    async with Server(ok(extra=b"connection: close\r\n")) as srv:
        async with client() as c:
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
    assert srv.connections == 2


async def test_body_without_length_ends_with_the_connection() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        writer.write(b"part two")
        writer.close()

    async with Server(answer) as srv:
        async with client() as c:
            assert await read(await post(c, srv.url)) == b"part one, part two"
            assert pool(c).connections() == 0


async def test_disconnect_before_the_answer_is_a_protocol_error() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.close()

    async with Server(answer) as srv:
        async with client() as c:
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await post(c, srv.url)
            assert pool(c).connections() == 0


async def cut_short(writer: asyncio.StreamWriter, n: int) -> None:
    """An answer of 100 bytes announced, 9 sent, then the connection closed."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
    await writer.drain()
    writer.close()


async def test_disconnect_inside_a_sized_body_is_a_protocol_error() -> None:
    async with Server(cut_short) as srv:
        async with client() as c:
            resp = await post(c, srv.url)
            assert resp.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
                await read(resp)


async def test_reset_inside_a_stream_is_a_read_error() -> None:
    seen = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await seen.wait()  # reset only once the client has the first chunk
        reset(writer)

    async with Server(answer) as srv:
        async with client() as c:
            resp = await post(c, srv.url)
            got = []
            with pytest.raises(httpx.ReadError):
                async for chunk in resp.aiter_raw():
                    got.append(chunk)
                    seen.set()
            assert got == [b"hello"]
            await resp.aclose()
            assert pool(c).connections() == 0


async def test_bytes_that_are_not_http_are_a_protocol_error() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()

    async with Server(answer) as srv:
        async with client() as c:
            with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
                await post(c, srv.url)


async def test_refused_connection_is_a_connect_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await post(c, f"http://127.0.0.1:{port}/v1/x")
        assert pool(c).connections() == 0


async def test_full_pool_waits_then_times_out_and_frees_on_close() -> None:
    async with Server(ok()) as srv:
        async with client(max_connections=1) as c:
            held = await post(c, srv.url)
            # Nothing frees `held`, so this request can only wait out its pool timeout: 0 s
            # ends that wait on the loop's next pass, with no timer to sit through.
            no_wait = httpx.Timeout(1.0, read=None, pool=0)
            with pytest.raises(LocalOverload) as raised:
                await c.send(c.build_request("POST", srv.url, content=b"{}", timeout=no_wait))
            assert raised.value.cause == "pool_full"
            waiting = asyncio.ensure_future(post(c, srv.url))
            await settle()
            assert not waiting.done() and len(pool(c)._waiters) == 1
            assert await read(held) == b'{"ok":true}'
            assert await read(await waiting) == b'{"ok":true}'
    assert srv.connections == 1


async def test_full_pool_closes_an_idle_connection_of_another_origin() -> None:
    async with Server(ok()) as one, Server(ok()) as two:
        async with client(max_connections=1) as c:
            assert await read(await post(c, one.url)) == b'{"ok":true}'
            assert await read(await post(c, two.url)) == b'{"ok":true}'
            assert pool(c).connections() == 1


async def test_answer_closed_before_its_end_closes_the_connection() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        if n > 0:
            writer.write(b"0\r\n\r\n")

    async with Server(answer) as srv:
        async with client() as c:
            resp = await post(c, srv.url)
            await resp.aclose()  # the client went away mid-stream
            assert pool(c).connections() == 0
            assert await read(await post(c, srv.url)) == b"hello"
    assert srv.connections == 2


async def test_cancelled_wait_for_the_answer_closes_the_connection() -> None:
    asked = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        if n == 0:
            asked.set()  # and never answers
        else:
            await ok()(writer, n)

    async with Server(answer) as srv:
        async with client() as c:
            pending = asyncio.ensure_future(post(c, srv.url))
            await asked.wait()  # the request is sent: the client now waits for the answer
            pending.cancel()  # as a caller's read timeout does
            with pytest.raises(asyncio.CancelledError):
                await pending
            assert pool(c).connections() == 0
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
    assert srv.connections == 2


async def test_idle_connection_closed_by_the_upstream_leaves_the_pool() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        await ok()(writer, n)
        if n == 0:
            writer.close()  # keep-alive promised, then dropped while idle

    async with Server(answer) as srv:
        async with client() as c:
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
            # Gone before the next request looks at it: the upstream's FIN alone removes it.
            await until(lambda: pool(c).connections() == 0)
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
    assert srv.connections == 2


async def test_expired_keepalive_connection_is_not_reused() -> None:
    clock = Clock()
    async with Server(ok()) as srv:
        async with client(keepalive_expiry=30.0, now=clock) as c:
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
            clock.t += 30.0  # idle for exactly the expiry: still reused
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
            clock.t += 20.0  # idle counts from the last answer, not the first
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
            assert srv.connections == 1
            clock.t += 30.5
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
            assert pool(c).connections() == 1  # the expired one was closed, not kept
    assert srv.connections == 2 and len(srv.requests) == 4


async def test_interim_answer_is_skipped() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await ok()(writer, n)

    async with Server(answer) as srv:
        async with client() as c:
            resp = await post(c, srv.url)
            assert resp.status_code == 200
            assert await read(resp) == b'{"ok":true}'
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
    assert srv.connections == 1


async def test_error_status_is_an_answer_not_an_exception() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        body = b'{"error":{"type":"rate_limit"}}'
        writer.write(
            b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 3\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )

    async with Server(answer) as srv:
        async with client() as c:
            resp = await post(c, srv.url)
            assert (resp.status_code, resp.headers["retry-after"]) == (429, "3")
            assert await read(resp) == b'{"error":{"type":"rate_limit"}}'
    assert srv.connections == 1


async def test_large_body_is_paused_and_resumed_without_loss() -> None:
    blob = bytes(range(256)) * 12_000  # 3 MB: past the read high-water mark

    async with Server(ok(blob)) as srv:
        async with client() as c:
            resp = await post(c, srv.url)
            (conn,) = pool(c)._all
            # Unread, it piles up until the socket is no longer read.
            await until(lambda: conn.transport is not None and not conn.transport.is_reading())
            assert await read(resp) == blob
            assert await read(await post(c, srv.url)) == blob
    assert srv.connections == 1


async def test_tls_verifies_the_upstream_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            requests.append(await reader.readuntil(b"\r\n\r\n") + await reader.readexactly(2))
            await ok()(writer, 0)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    url = f"https://localhost:{port}/v1/x"
    trusting = ssl.create_default_context(cafile=str(cert))
    try:
        async with httpx.AsyncClient(transport=Http1Transport(ssl_context=trusting)) as c:
            assert await read(await post(c, url, b"{}")) == b'{"ok":true}'
        # The system's CAs do not know this certificate: no request bytes leave.
        async with httpx.AsyncClient(
            transport=Http1Transport(ssl_context=ssl.create_default_context())
        ) as c:
            with pytest.raises(httpx.ConnectError):
                await post(c, url, b"{}")
    finally:
        server.close()
    assert len(requests) == 1


def test_works_on_uvloop() -> None:
    # `ocx serve --server uvicorn` runs on uvloop, whose transports do not subclass asyncio's.
    uvloop = pytest.importorskip("uvloop")

    async def go() -> bytes:
        async with Server(ok()) as srv:
            async with client() as c:
                await read(await post(c, srv.url))
                return await read(await post(c, srv.url))

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(go()) == b'{"ok":true}'


async def test_endless_head_is_refused() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(4000):
            writer.write(b"x-filler-%d: %s\r\n" % (i, b"y" * 40))
        await writer.drain()

    async with Server(answer) as srv:
        async with client() as c:
            with pytest.raises(httpx.RemoteProtocolError, match="too large"):
                await post(c, srv.url)
            assert pool(c).connections() == 0


def _tls_pair(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert, key = self_signed(tmp)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_leaving_a_tls_stream_stops_it_at_the_upstream_at_once(tmp_path: Path, loop: str) -> None:
    # A TLS close() waits for the peer's close_notify (up to 30 s on uvloop); an upstream busy
    # streaming does not answer it, and the model would keep generating for a client that
    # left. The connection is aborted instead. The upstream here is a blocking TLS socket in a
    # thread that only writes, as a streaming server does.
    if loop == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop
    else:
        factory = asyncio.new_event_loop
    server_tls, client_tls = _tls_pair(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stopped_at: list[float] = []
    stopped = threading.Event()

    def upstream() -> None:
        raw, _ = listener.accept()
        with server_tls.wrap_socket(raw, server_side=True) as conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            try:
                for _ in range(2000):  # 10 s at most
                    conn.sendall(b"6\r\ndelta\n\r\n")
                    time.sleep(0.005)
            except OSError:
                stopped_at.append(time.monotonic())
                stopped.set()

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()

    async def leave() -> float:
        transport = Http1Transport(ssl_context=client_tls)
        async with httpx.AsyncClient(transport=transport) as c:
            resp = await post(c, f"https://localhost:{port}/v1/x", b"{}")
            async for _ in resp.aiter_raw():
                break
            await resp.aclose()
            left = time.monotonic()
            assert transport.connections() == 0
            # Waits for the upstream's thread to see the abort, this loop still running (a
            # closing loop would cut the connection anyway and hide a slow close).
            await asyncio.to_thread(stopped.wait, 3.0)
            return left

    with asyncio.Runner(loop_factory=factory) as runner:
        left = runner.run(leave())
    thread.join(15)
    listener.close()
    assert stopped_at and stopped_at[0] - left < 1.0


async def test_a_woken_waiter_that_leaves_passes_the_room_on() -> None:
    async with Server(ok()) as srv:
        async with client(max_connections=1) as c:
            held = await post(c, srv.url)
            second = asyncio.ensure_future(post(c, srv.url))
            third = asyncio.ensure_future(post(c, srv.url))
            await settle()
            assert len(pool(c)._waiters) == 2  # both wait for room, `second` first
            await read(held)  # wakes `second`...
            second.cancel()  # ...which leaves before it runs
            assert await read(await asyncio.wait_for(third, 1)) == b'{"ok":true}'
            with pytest.raises(asyncio.CancelledError):
                await second
    assert srv.connections == 1


@pytest.mark.parametrize(
    "header",
    [
        (b"x-key", b"sk-pasted\nGET /other HTTP/1.1"),
        (b"x-key", b"sk-pasted\r\nx-injected: 1"),
        (b"x-key", b"sk-pasted\rx"),
        (b"x-key", b"sk-pasted\0"),
        (b"x-key\r\nx-injected", b"sk-pasted"),
    ],
)
async def test_a_header_with_a_line_break_is_refused_unsent(header: tuple[bytes, bytes]) -> None:
    # httpx passes header bytes through as given (it checks nothing; h11 did, in httpcore).
    async with Server(ok()) as srv:
        async with client() as c:
            bad = c.build_request("POST", srv.url, content=b"{}", headers=[header])
            with pytest.raises(httpx.LocalProtocolError, match="CR, LF or NUL"):
                await c.send(bad, stream=True)
            assert pool(c).connections() == 0  # refused before a connection was taken
            assert await read(await post(c, srv.url)) == b'{"ok":true}'
    assert len(srv.requests) == 1 and b"sk-pasted" not in srv.requests[0]


@pytest.mark.parametrize(
    "after",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nEVIL!",  # a whole second answer
        b"HTTP/1.1 2",  # half a status line
    ],
)
async def test_bytes_after_a_whole_answer_leave_it_whole_but_the_connection_unused(
    after: bytes,
) -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" + (after if n == 0 else b""))
        await writer.drain()

    async with Server(answer) as srv:
        async with client() as c:
            assert await read(await post(c, srv.url)) == b"ok"
            assert await read(await post(c, srv.url)) == b"ok"
    assert srv.connections == 2


async def test_an_upgrade_answer_is_a_protocol_error() -> None:
    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n"
        )
        await writer.drain()

    async with Server(answer) as srv:
        async with client() as c:
            with pytest.raises(httpx.RemoteProtocolError):
                await post(c, srv.url)
            assert pool(c).connections() == 0


async def post_direct(c: httpx.AsyncClient, url: str) -> httpx.Response:
    """Straight to the transport, as `ProviderClient` sends (no httpx client around it)."""
    return await pool(c).handle_async_request(c.build_request("POST", url, content=b"{}"))


async def read_direct(resp: httpx.Response) -> list[bytes]:
    """The body through `Body.ready` / `wait` (what the streaming proxy reads), not httpx."""
    body = resp.stream
    assert isinstance(body, Body)
    got: list[bytes] = []
    while (chunk := body.ready()) != b"":
        if chunk is None:
            await body.wait()
        else:
            got.append(chunk)
    await resp.aclose()
    return got


async def test_read_directly_a_stream_arrives_whole_and_its_connection_is_reused() -> None:
    parts = STREAM_PARTS
    async with Server(chunked_stream) as srv:
        async with client() as c:
            first = await read_direct(await post_direct(c, srv.url))
            assert b"".join(first) == b"".join(parts)
            assert all(first)  # never an empty chunk: b"" means the end
            assert b"".join(await read_direct(await post_direct(c, srv.url))) == b"".join(parts)
    assert srv.connections == 1


async def test_read_directly_a_body_cut_short_is_a_protocol_error_and_not_reused() -> None:
    async with Server(cut_short) as srv:
        async with client() as c:
            resp = await post_direct(c, srv.url)
            with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
                await read_direct(resp)
            await resp.aclose()
            assert pool(c).connections() == 0


async def test_read_directly_a_reset_is_a_read_error_after_what_arrived() -> None:
    seen = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await seen.wait()
        reset(writer)

    async with Server(answer) as srv:
        async with client() as c:
            resp = await post_direct(c, srv.url)
            body = resp.stream
            assert isinstance(body, Body)
            got = []
            with pytest.raises(httpx.ReadError):
                while (chunk := body.ready()) != b"":
                    if chunk is None:
                        await body.wait()
                    else:
                        got.append(chunk)
                        seen.set()
            assert got == [b"hello"]
            await resp.aclose()
            assert pool(c).connections() == 0


async def raw_post(c: httpx.AsyncClient, url: str) -> httpx.Response:
    """A request sent on the transport itself, as `providers.upstream` sends them: its body is
    the transport's own `Body` (httpx's client would wrap it)."""
    return await pool(c).handle_async_request(c.build_request("POST", url, content=b"{}"))


class Lockstep:
    """The first answer sends STREAM_PARTS one chunk at a time, each once the reader has taken
    everything before it (so each arrives while the reader waits); later answers as
    `chunked_stream`."""

    def __init__(self, together: frozenset[int] = frozenset()) -> None:
        # Bytes of the body the reader (or its sink) has taken; -1 until it starts reading.
        self.taken = -1
        self.together = together  # these parts go out in one write with the one before each

    async def __call__(self, writer: asyncio.StreamWriter, n: int) -> None:
        if n:
            await chunked_stream(writer, n)
            return
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        sent = 0
        for i, part in enumerate(STREAM_PARTS):
            if i not in self.together:
                await until(lambda sent=sent: self.taken >= sent)  # type: ignore[misc]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            if i + 1 not in self.together:
                await writer.drain()
            sent += len(part)
        writer.write(b"0\r\n\r\n")


async def _read_with_sink(
    resp: httpx.Response, sink: Callable[[bytes], bool], lockstep: Lockstep
) -> list[tuple[str, bytes]]:
    """Reads `resp` as the streaming proxy does (`Body.ready` / `Body.wait`), offering `sink`
    every chunk that arrives while it waits; what each got, in the order they got it."""
    body = cast(Body, resp.stream)
    got: list[tuple[str, bytes]] = []
    lockstep.taken = 0

    def taking(chunk: bytes) -> bool:
        if sink(chunk):
            got.append(("sink", chunk))
            lockstep.taken += len(chunk)
            return True
        return False

    while (chunk := body.ready()) != b"":
        if chunk is None:
            await body.wait(taking)
        else:
            got.append(("reader", chunk))
            lockstep.taken += len(chunk)
    await body.aclose()
    return got


async def test_a_sink_takes_each_read_as_it_arrives_and_the_first_it_declines_waits_in_order() -> (
    None
):
    declined = STREAM_PARTS[5]
    # Parts 2 and 3 arrive in one read, and so do the declined part 5 and part 6.
    answer = Lockstep(together=frozenset({3, 6}))
    async with Server(answer) as srv:
        async with client() as c:
            resp = await raw_post(c, srv.url)
            got = await _read_with_sink(resp, lambda c: not c.startswith(declined), answer)
            # Every part once, in order: what one read brought, as one chunk (one write to the
            # client, not one per part); the declined read through the reader (the part behind
            # it never handed to the sink ahead of it); every other read, each arriving while
            # the reader waited, taken by the sink as it came.
            assert got == [
                *[("sink", part) for part in STREAM_PARTS[:2]],
                ("sink", STREAM_PARTS[2] + STREAM_PARTS[3]),
                ("sink", STREAM_PARTS[4]),
                ("reader", declined + STREAM_PARTS[6]),
                *[("sink", part) for part in STREAM_PARTS[7:]],
            ]
            # The answer was whole: its connection serves the next request.
            assert await read(await post(c, srv.url)) == b"".join(STREAM_PARTS)
            assert pool(c).connections() == 1
    assert srv.connections == 1


async def test_a_sink_that_raises_is_the_readers_error_not_a_broken_answer() -> None:
    class WriteFailed(Exception):
        pass

    answer = Lockstep()
    taken: list[bytes] = []

    def sink(chunk: bytes) -> bool:
        if chunk == STREAM_PARTS[3]:
            raise WriteFailed("the client's write failed")
        taken.append(chunk)
        answer.taken += len(chunk)
        return True

    async with Server(answer) as srv:
        async with client() as c:
            body = cast(Body, (await raw_post(c, srv.url)).stream)
            answer.taken = 0
            # Raised by the reader's next read, as its own write would have raised in its
            # loop, and not a RemoteProtocolError from inside the HTTP parser's callback.
            with pytest.raises(WriteFailed):
                while body.ready() is None:
                    await body.wait(sink)
            assert taken == STREAM_PARTS[:3]
            # The answer itself is intact: the part the sink failed on comes next.
            rest = b""
            while (chunk := body.ready()) != b"":
                if chunk is None:
                    await body.wait()
                else:
                    rest += chunk
                    answer.taken += len(chunk)
            await body.aclose()
            assert rest == b"".join(STREAM_PARTS[3:])
            assert pool(c).connections() == 1  # whole, so kept for the next request
