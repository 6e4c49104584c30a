"""`server.daphne_main`: what a Daphne worker loads and how it sets up its connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.testing import StringTransport
from twisted.web import http


class NoDelayTransport(StringTransport):
    def __init__(self) -> None:
        super().__init__()
        self.nodelay: list[bool] = []

    def setTcpNoDelay(self, enabled: bool) -> None:  # noqa: N802 - Twisted's name
        self.nodelay.append(enabled)


def test_accepted_connections_turn_nagle_off() -> None:
    from server import daphne_main

    channel = http.HTTPChannel()
    channel.timeOut = None  # no idle timer (it would need a running reactor)
    transport = NoDelayTransport()
    channel.transport = transport
    daphne_main._connection_made_nodelay(channel)
    assert transport.nodelay == [True]
    assert transport.producer is channel  # Twisted's own connectionMade ran too
    # A transport without the option (a UNIX socket) is served all the same.
    bare = http.HTTPChannel()
    bare.timeOut = None
    bare.transport = plain = StringTransport()
    daphne_main._connection_made_nodelay(bare)
    assert plain.producer is bare


def _modules_after(code: str) -> dict[str, object]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ocxsite.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_daphne_worker_loads_neither_pyopenssl_nor_wamp_and_others_still_can() -> None:
    got = _modules_after(
        "import json, sys, django; import server.daphne_main; django.setup(); "
        "import ocxsite.asgi, ocxsite.urls; from twisted.internet import reactor; "
        "from providers.sealing import seal, unseal; assert unseal(seal('sk-x')) == 'sk-x'; "
        "lean = ('OpenSSL', 'cryptography.hazmat.bindings._rust', 'autobahn.twisted.wamp'); "
        "before = sorted(m for m in lean if m in sys.modules); "
        "import OpenSSL.SSL; from autobahn.twisted.wamp import ApplicationSession; "
        "print(json.dumps({'before': before, 'reactor': type(reactor).__name__, "
        "'wamp': hasattr(ApplicationSession, 'onJoin'), "
        "'nvx': __import__('autobahn.websocket').websocket.USES_NVX}))"
    )
    assert got == {"before": [], "reactor": "AsyncioSelectorReactor", "wamp": True, "nvx": False}


def test_a_uvicorn_worker_does_not_load_twisted() -> None:
    got = _modules_after(
        "import json, sys, django; django.setup(); import ocxsite.asgi, ocxsite.urls; "
        "from ocxsite.management.commands import serve; "
        "print(json.dumps({m: m in sys.modules for m in ('twisted', 'daphne', 'OpenSSL')}))"
    )
    assert got == {"twisted": False, "daphne": False, "OpenSSL": False}


def _install(monkeypatch: pytest.MonkeyPatch) -> None:
    """`daphne_main.install()` for one test: every class attribute it patches is put back."""
    from daphne import http_protocol
    from daphne.server import Server

    from server import body_limits, daphne_main

    monkeypatch.setattr(http_protocol, "http", http_protocol.http)
    monkeypatch.setattr(body_limits, "checked_by_server", body_limits.checked_by_server)
    for cls, name in (
        (http_protocol.WebRequest, "process"),
        (http_protocol.WebRequest, "__init__"),
        (http_protocol.WebRequest, "handleContentChunk"),
        (http_protocol.HTTPFactory, "log"),
        (http.HTTPChannel, "allHeadersReceived"),
        (Server, "create_application"),
    ):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    daphne_main.install()


def test_twisted_formats_no_access_log_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from daphne import http_protocol
    from daphne.server import Server

    from server import daphne_main

    # install() patches Daphne's classes for the worker; undone for the rest of this process.
    _install(monkeypatch)
    assert Server.create_application is daphne_main._create_application_reaped
    factory = http_protocol.HTTPFactory(server=None)
    factory._logFile = written = io.StringIO()  # where Twisted would write the line
    channel = http.HTTPChannel()
    channel.transport = StringTransport()
    request = http.Request(channel)
    request.method, request.uri, request.clientproto = b"POST", b"/v1/responses", b"HTTP/1.1"
    factory.log(request)
    assert written.getvalue() == ""
    # Without the change Twisted writes one Common Log Format line per request.
    http.HTTPFactory.log(factory, request)
    assert written.getvalue().count("\n") == 1


async def _one_request(
    app: Any, *, disconnect_first: bool = True, disconnect: bool = True
) -> tuple[Any, object]:
    """One application instance as Daphne's server makes it for a request, through ocx's
    `create_application`; `disconnect` is Daphne marking the request finished."""
    from daphne.server import Server

    from server import daphne_main

    server = Server(application=app, endpoints=["tcp:port=0:interface=127.0.0.1"])
    protocol = object()
    server.connections = {protocol: {}}  # as `Server.run` starts it (not run here)
    daphne_main._create_application_reaped(server, protocol, {"type": "http"})
    instance = server.connections[protocol]["application_instance"]
    if disconnect and disconnect_first:
        server.protocol_disconnected(protocol)
    with contextlib.suppress(RuntimeError):
        await instance
    await asyncio.sleep(0)  # the done callbacks run
    if disconnect and not disconnect_first:
        server.protocol_disconnected(protocol)
    return server, protocol


async def test_a_served_request_is_forgotten_when_its_application_ends() -> None:
    # Daphne held every finished request until its once-a-second sweep: thousands at once
    # under load, 20-30 MB of a worker's heap.
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0)

    server, protocol = await _one_request(app)
    assert protocol not in server.connections


async def test_a_failed_or_unfinished_request_is_left_to_daphnes_sweep() -> None:
    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    # The sweep logs the exception (and answers 500 if the response had not started).
    server, protocol = await _one_request(failing)
    assert server.connections[protocol]["application_instance"].done()
    # The application returned but the response is not finished (no disconnect yet).
    server, protocol = await _one_request(app, disconnect=False)
    assert "application_instance" in server.connections[protocol]
    # Finished after the application ended: the sweep removes it.
    server, protocol = await _one_request(app, disconnect_first=False)
    assert "disconnected" in server.connections[protocol]


def _server_connection(sndbuf: int | None = None) -> tuple[Any, Any, Any]:
    """A Twisted `tcp.Server` over one end of a real socket pair, on a reactor that only records
    which descriptors it was asked to watch for writability."""
    import socket

    from twisted.internet import tcp
    from twisted.internet.protocol import Protocol
    from twisted.internet.testing import MemoryReactor

    ours, peer = socket.socketpair()
    if sndbuf is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    ours.setblocking(False)
    reactor = MemoryReactor()
    conn = tcp.Server(ours, Protocol(), ("127.0.0.1", 1), None, 1, reactor)
    return conn, peer, reactor


def _recv_all(peer: Any, size: int) -> bytes:
    got = b""
    while len(got) < size:
        got += peer.recv(size - len(got))
    return got


def test_a_write_is_sent_at_once_without_watching_for_writability() -> None:
    from server import daphne_main

    conn, peer, reactor = _server_connection()
    try:
        daphne_main._write_through(conn, b"data: one\n\n")
        daphne_main._write_sequence_through(conn, [b"b\r\n", b"data: two\n\n", b"\r\n"])
        assert _recv_all(peer, 11 + 16) == b"data: one\n\nb\r\ndata: two\n\n\r\n"
        assert conn not in reactor.getWriters()  # no epoll change, nothing queued
        assert conn._tempDataBuffer == []
    finally:
        conn.socket.close()
        peer.close()


def test_what_the_socket_does_not_take_is_queued_in_order() -> None:
    from server import daphne_main

    conn, peer, reactor = _server_connection(sndbuf=4096)
    try:
        big = bytes(range(256)) * 4096  # 1 MiB: more than the socket buffers hold
        daphne_main._write_through(conn, big)
        assert conn in reactor.getWriters()  # the rest waits for Twisted's writability turn
        queued = b"".join(conn._tempDataBuffer)
        assert 0 < len(queued) < len(big) and big.endswith(queued)
        # With data queued, a later write goes behind it, never ahead of it.
        daphne_main._write_through(conn, b"tail")
        assert conn._tempDataBuffer[-1] == b"tail"
        sent = len(big) - len(queued)
        assert _recv_all(peer, sent) == big[:sent]
    finally:
        conn.socket.close()
        peer.close()


def test_a_closing_connection_keeps_twisteds_queued_path() -> None:
    from server import daphne_main

    conn, peer, reactor = _server_connection()
    try:
        conn.disconnecting = True
        daphne_main._write_through(conn, b"late")
        assert conn._tempDataBuffer == [b"late"]
        assert conn in reactor.getWriters()
    finally:
        conn.socket.close()
        peer.close()


def test_daphne_reads_twisted_http_without_the_deprecation_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    from daphne import http_protocol
    from twisted.python.deprecate import _ModuleProxy

    assert isinstance(http_protocol.http, _ModuleProxy)  # as Twisted ships it
    _install(monkeypatch)
    assert type(http_protocol.http) is types.ModuleType
    # The same classes: Daphne's `http.Request.write(self, …)` is Twisted's.
    assert http_protocol.http.Request is http.Request
    assert http_protocol.http.HTTPFactory is http.HTTPFactory
    assert isinstance(http, _ModuleProxy)  # everyone else's reference is left as it was


def _daphne_connection(app: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, StringTransport]:
    """A real Daphne HTTP connection (its factory, channel and `WebRequest`) over an in-memory
    transport, patched as in a worker (`install`); `app` runs on the test's loop."""
    from daphne import http_protocol
    from daphne.server import Server
    from twisted.internet.address import IPv4Address

    _install(monkeypatch)
    server = Server(application=app, endpoints=["tcp:port=0:interface=127.0.0.1"])
    server.connections = {}  # as `Server.run` starts it (not run here)
    factory = http_protocol.HTTPFactory(server)
    factory.timeOut = None  # no idle timer on the (not running) reactor
    channel = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 8000))
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport


def _request(version: bytes = b"HTTP/1.1") -> bytes:
    return b"POST /v1/chat/completions " + version + b"\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


async def test_an_http_request_writes_a_streamed_body_chunk_at_once_until_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from server import body_now

    steps: list[str] = []
    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        now = scope[body_now.SCOPE_KEY]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        now(b"data: 0\n\n")  # nothing written yet: Daphne's own path writes the head first
        steps.append("first")
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        now(b'data: {"delta":"twenty"}\n\n')  # done when it returns: no coroutine, no loop turn
        steps.append("written")
        now(b"")  # nothing: an empty chunk would end a chunked body
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        now(b"data: 3\n\n")  # the response is finished: nothing more goes out
        done.set()

    channel, transport = _daphne_connection(app, monkeypatch)
    channel.dataReceived(_request())
    await asyncio.wait_for(done.wait(), 5)
    assert steps == ["first", "written"]
    head, _, body = transport.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding: chunked" in head
    assert body == (
        b"9\r\ndata: 0\n\n\r\n"
        b"9\r\ndata: 1\n\n\r\n"
        b'1a\r\ndata: {"delta":"twenty"}\n\n\r\n'  # the chunk's size in hex
        b"0\r\n\r\n"
    )
    assert channel._channel.requests == []  # the request is done with (keep-alive)


async def _first_chunk_sent(scope: Any, receive: Any, send: Any) -> Any:
    """An application's start: the request read, the head and a first chunk sent through ASGI;
    the scope's synchronous body write."""
    from server import body_now

    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    return scope[body_now.SCOPE_KEY]


async def test_a_streamed_body_chunk_is_not_written_once_the_client_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from twisted.internet.error import ConnectionDone
    from twisted.python.failure import Failure

    gone = asyncio.Event()
    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        now = await _first_chunk_sent(scope, receive, send)
        await gone.wait()
        now(b"data: 2\n\n")  # no error, nothing written
        done.set()

    channel, transport = _daphne_connection(app, monkeypatch)
    channel.dataReceived(_request())
    for _ in range(20):
        await asyncio.sleep(0)
    sent = transport.value()
    assert sent.endswith(b"9\r\ndata: 1\n\n\r\n")
    channel.connectionLost(Failure(ConnectionDone()))
    gone.set()
    await asyncio.wait_for(done.wait(), 5)
    assert transport.value() == sent


async def test_a_body_that_is_not_chunked_takes_daphnes_own_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        now = await _first_chunk_sent(scope, receive, send)
        now(b"data: 2\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        done.set()

    channel, transport = _daphne_connection(app, monkeypatch)
    channel.dataReceived(_request(b"HTTP/1.0"))  # no chunked encoding in HTTP/1.0
    await asyncio.wait_for(done.wait(), 5)
    head, _, body = transport.value().partition(b"\r\n\r\n")
    assert b"chunked" not in head
    assert body == b"data: 1\n\ndata: 2\n\n"


async def test_only_http_scopes_get_the_body_write() -> None:
    from daphne.server import Server

    from server import body_now, daphne_main

    scopes: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scopes.append(scope)

    server = Server(application=app, endpoints=["tcp:port=0:interface=127.0.0.1"])
    protocol, socket_protocol = object(), object()
    server.connections = {protocol: {}, socket_protocol: {}}
    daphne_main._create_application_reaped(server, protocol, {"type": "http"})
    daphne_main._create_application_reaped(server, socket_protocol, {"type": "websocket"})
    await asyncio.sleep(0)
    http_scope, socket_scope = scopes
    assert callable(http_scope[body_now.SCOPE_KEY])
    assert body_now.SCOPE_KEY not in socket_scope  # HTTP responses only


class _SendLog:
    """A socket that records each `send` (`tcp.Server` writes through `self.socket`)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.sends: list[bytes] = []

    def send(self, data: bytes) -> int:
        sent: int = self._sock.send(data)
        self.sends.append(bytes(data[:sent]))
        return sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@contextlib.contextmanager
def _tcp_daphne_connection(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, Any, _SendLog]]:
    """A real Daphne HTTP connection over a Twisted `tcp.Server` on a real TCP socket, with the
    worker's writes (`install_lifecycle`'s, nothing else of it); its sends are recorded."""
    import socket

    from daphne import http_protocol
    from daphne.server import Server
    from twisted.internet import tcp
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import MemoryReactor

    from server import daphne_main

    _install(monkeypatch)
    monkeypatch.setattr(tcp.Server, "write", daphne_main._write_through)
    monkeypatch.setattr(tcp.Server, "writeSequence", daphne_main._write_sequence_through)
    held = daphne_main._handle_reply_head_with_body
    monkeypatch.setattr(http_protocol.WebRequest, "handle_reply", held)
    server = Server(application=app, endpoints=["tcp:port=0:interface=127.0.0.1"])
    server.connections = {}
    factory = http_protocol.HTTPFactory(server)
    factory.timeOut = None
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    ours.setblocking(False)
    channel = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 8000))
    conn = tcp.Server(ours, channel, ("127.0.0.1", 1), None, 1, MemoryReactor())
    log = _SendLog(ours)
    conn.socket = log
    try:
        channel.makeConnection(conn)
        yield channel, conn, log
    finally:
        ours.close()
        peer.close()


async def test_the_head_goes_out_with_the_first_chunk_in_one_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        now = await _first_chunk_sent(scope, receive, send)  # the head, then `data: 1`
        now(b"data: 2\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        done.set()

    with _tcp_daphne_connection(app, monkeypatch) as (channel, conn, log):
        channel.dataReceived(_request())
        await asyncio.wait_for(done.wait(), 5)
        head, chunk = log.sends[0].split(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"chunked" in head
        assert chunk == b"9\r\ndata: 1\n\n\r\n"  # in the same send as the head
        assert log.sends[1:] == [b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]
        assert conn.ocx_held is None  # nothing held after


async def test_a_refused_first_chunk_leaves_nothing_held(monkeypatch: pytest.MonkeyPatch) -> None:
    # A body before its start is Daphne's error; the connection's later writes go out as usual.
    errors: list[str] = []
    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        except ValueError as exc:
            errors.append(str(exc))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})
        done.set()

    with _tcp_daphne_connection(app, monkeypatch) as (channel, conn, log):
        channel.dataReceived(_request())
        await asyncio.wait_for(done.wait(), 5)
        assert errors and "not yet been started" in errors[0]
        assert conn.ocx_held is None
        # A last chunk is not held: the head, the chunk and the chunked body's end as Twisted
        # sends them.
        assert log.sends[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert log.sends[1:] == [b"9\r\ndata: 1\n\n\r\n", b"0\r\n\r\n"]
