"""Run Daphne for ocx (`ocx serve` starts its workers with `python -m server.daphne_main`).

Daphne drops every request header whose name contains "_" (a guard against CVE-2015-0219,
where `X_Forwarded_For` would pass for `X-Forwarded-For` in a WSGI environ). Codex sends its
session as `session_id`, which compaction recall and the `chatgpt` forward need, so exactly
these names are renamed to their dashed form first; every other underscore header is still
dropped by Daphne.

Twisted also parses the Content-Type of every POST with the `email` package, to decode form
submissions into `request.args`; Daphne hands the raw body to the ASGI app and never reads
`args`, so that parsing (a few per cent of a request's CPU) is switched off, and so is the
access-log line Twisted formats for a log Daphne discards.

Twisted writes a request's whole body to memory or a temp file before Daphne runs the ASGI
application, so the body limits of `server.body_limits` are checked here, in Twisted's
parsing: a declared Content-Length above the path's limit is answered 413 once the headers are
in, and a chunked body once its running size passes the limit; the connection is then closed
and nothing more of it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

from server import body_limits, body_now, lifecycle


class _WampSession:
    """Stands in for Autobahn's WAMP `ApplicationSession`, which an ocx worker never runs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("Autobahn's WAMP is not loaded in an ocx Daphne worker")


def _wamp_stand_in() -> types.ModuleType:
    module = types.ModuleType("autobahn.twisted.wamp", _WampSession.__doc__)
    module.ApplicationSession = _WampSession  # type: ignore[attr-defined]
    return module


@contextlib.contextmanager
def _lean_imports() -> Iterator[None]:
    """Import Daphne's stack without two things a worker behind a proxy never uses:

    * pyOpenSSL (about 6 MB). `ocx serve` runs Daphne on plain TCP (TLS ends at the reverse
      proxy), yet Twisted's reactor, TCP and endpoint modules and Autobahn's helpers each try
      to import the TLS layer, and with it pyOpenSSL and cryptography's x509; without
      `OpenSSL` each falls back to plain TCP.
    * Autobahn's WAMP session (8-9 MB). `autobahn.twisted` imports `ApplicationSession` from
      `autobahn.twisted.wamp`, whose authenticators load `cryptography`'s Rust bindings and
      the OpenSSL they carry (7 MB of it). Daphne uses only Autobahn's WebSocket protocol.

    The block lasts only for these imports: anything later that imports `OpenSSL` or
    `autobahn.twisted.wamp` gets the real module. Only the name `autobahn.twisted.
    ApplicationSession`, bound during the block, stays the stand-in, which refuses to run."""
    stand_ins: dict[str, types.ModuleType | None] = {
        "OpenSSL": None,
        "autobahn.twisted.wamp": _wamp_stand_in(),
    }
    placed = {name: module for name, module in stand_ins.items() if name not in sys.modules}
    sys.modules.update(placed)  # type: ignore[arg-type]
    try:
        yield
    finally:
        for name, module in placed.items():
            if name in sys.modules and sys.modules[name] is module:
                del sys.modules[name]


# Autobahn's native UTF-8 validator (for the frames clients send on /ws/events, a few a minute)
# compiles its C declarations with pycparser at import; the pure-Python one checks the same.
os.environ.setdefault("AUTOBAHN_USE_NVX", "0")
with _lean_imports():
    from daphne import http_protocol
    from daphne.cli import CommandLineInterface
    from daphne.server import Server
    from twisted.internet import tcp
    from twisted.web import http

RENAMED = {b"session_id": b"session-id", b"conversation_id": b"conversation-id"}

_process = http_protocol.WebRequest.process
_init = http_protocol.WebRequest.__init__


def _process_with_codex_headers(self: Any) -> Any:
    headers = self.requestHeaders
    for name, alias in RENAMED.items():
        values = headers.getRawHeaders(name)
        if values is not None and not headers.hasHeader(alias):
            headers.setRawHeaders(alias, values)
    return _process(self)


def _init_without_form_parsing(self: Any, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    self._parsePOSTFormSubmission = False
    self.ocx_body_limit = None  # set once the headers are in (_all_headers_bounded)
    self.ocx_body_received = 0
    self.ocx_client_key = None  # the client key the body limit looked up, for the proxy


_all_headers_received = http.HTTPChannel.allHeadersReceived
_handle_content_chunk = http_protocol.WebRequest.handleContentChunk


def _ignore(*args: object) -> None:
    """What a refused connection does with whatever else arrives on it."""


def _refuse(channel: Any, path: bytes, limit: int) -> None:
    """Answer 413 and close, lingering: a connection closed with unread data is reset, and the
    reset can destroy the answer before the client reads it. So the write side is closed
    first and what the client still sends is read and dropped (never parsed or kept) for at
    most `body_limits.LINGER_S` or `LINGER_BYTES`, whichever comes first."""
    transport = channel.transport
    transport.write(body_limits.too_large_response(path, limit))
    channel.persistent = False
    channel.setTimeout(None)
    # The body (and anything after it) is dropped unparsed; the request is never processed.
    dropped = 0

    def drop(data: bytes) -> None:
        nonlocal dropped
        dropped += len(data)
        if dropped > body_limits.LINGER_BYTES:
            transport.abortConnection()

    channel.dataReceived = drop
    channel.lineReceived = _ignore
    channel.rawDataReceived = _ignore
    channel.allContentReceived = _ignore
    channel._buffer = b""  # noqa: SLF001

    def end_lingering() -> None:
        if not transport.disconnected:
            transport.abortConnection()

    if hasattr(transport, "loseWriteConnection"):
        transport.loseWriteConnection()
        channel.callLater(body_limits.LINGER_S, end_lingering)  # the reactor's, or a test clock
    else:
        channel.loseConnection()


def _all_headers_bounded(self: Any) -> None:
    request = self.requests[-1]
    path: bytes = self._path  # noqa: SLF001
    headers = [
        (name, value)
        for name, values in request.requestHeaders.getAllRawHeaders()
        for value in values
    ]
    # `self.length`: the declared length (0 without a body), None for a chunked body (the
    # limit whatever its size, then).
    limit, key = body_limits.limits().check(path, headers, self.length)
    if self.length is not None and self.length > limit:
        _refuse(self, path, limit)  # before `gotLength`: no buffer, no 100 Continue
        return
    request.ocx_body_limit = limit
    request.ocx_client_key = key
    request.ocx_body_path = path
    _all_headers_received(self)


def _content_chunk_bounded(self: Any, data: bytes) -> None:
    limit = self.ocx_body_limit
    if limit is None:
        return  # refused already: the rest of the body is dropped
    self.ocx_body_received += len(data)
    if self.ocx_body_received > limit:
        # A chunked body (a declared length was checked with the headers) past its limit.
        self.ocx_body_limit = None
        _refuse(self.channel, self.ocx_body_path, limit)
        return
    _handle_content_chunk(self, data)


def _no_twisted_access_log(self: Any, request: Any) -> None:
    """Twisted formats a Common Log Format line for every request and hands it to its own log,
    which Daphne discards (2 % of a worker's CPU at c=16). Daphne's access log (`-v 1`,
    `--access-log`) is written by Daphne itself and stays."""


_create_application = Server.create_application


def _create_application_reaped(self: Any, protocol: Any, scope: Any) -> Any:
    key = getattr(protocol, "ocx_client_key", None)
    if key is not None:
        scope[body_limits.KEY_SCOPE] = key  # its digest is computed once per request
    if scope.get("type") == "http":
        scope[body_now.SCOPE_KEY] = functools.partial(_body_now, protocol)
    queue = _create_application(self, protocol, scope)
    details = self.connections.get(protocol)
    instance = details.get("application_instance") if details is not None else None
    if instance is not None:
        instance.add_done_callback(functools.partial(_reap, self, protocol))
    return queue


def _body_now(protocol: Any, data: bytes) -> None:
    """`body_now.SCOPE_KEY`: what Daphne's `send` does with a body chunk of a streamed response
    (`Server.handle_reply` → `WebRequest.handle_reply` → Twisted's `Request.write`), without
    their coroutine and the checks that concern a response's start: nothing once the response
    is finished or its client gone; the chunk of a chunked HTTP/1.1 body framed and handed to the
    connection, as `Request.write` does. Anything else (headers not written yet, a body that is
    not chunked) goes through Daphne's own path. Per streamed event this skips the Python of
    Daphne's reply (message checks, a lookup, a debug log call) and of Twisted's write around
    the same one `send`."""
    if protocol.finished or protocol.channel is None:  # `Request.connectionLost` clears it
        return
    if not (protocol.startedWriting and protocol.chunked):
        protocol.handle_reply({"type": "http.response.body", "body": data, "more_body": True})
        return
    if data:
        protocol.sentLength += len(data)
        protocol.channel.write(b"%x\r\n%s\r\n" % (len(data), data))


def _reap(server: Any, protocol: Any, instance: asyncio.Future[Any]) -> None:
    """Forget a served request as soon as both its response and its application are done.

    Daphne keeps every request (its WebRequest, headers, task, queue, timers) in
    `Server.connections` until `application_checker` sweeps them, once a second: at 2,000
    requests a second that is thousands of finished requests held at once, and the heap
    grew by 20-30 MB under load to hold them (bench/README.md, seventh run). A request whose
    application failed or was cancelled, or whose connection is still open, is left to that
    sweep, which logs and handles it as before (ocx's applications answer their own errors,
    so none reaches it in practice)."""
    details = server.connections.get(protocol)
    if details is None or "disconnected" not in details:
        return
    if details.get("application_instance") is not instance:
        return
    if instance.cancelled() or instance.exception() is not None:
        return
    del server.connections[protocol]


def _unwrapped(module: Any) -> Any:
    """The module behind Twisted's deprecation proxy (`twisted.web.http` is one): each
    attribute read through the proxy costs a few µs, and Daphne reads `http.Request` once per
    body chunk it writes (2 % of a worker's CPU per streamed event)."""
    from twisted.python.deprecate import _ModuleProxy

    return (
        object.__getattribute__(module, "_module") if isinstance(module, _ModuleProxy) else module
    )


def install() -> None:
    # Daphne's own reference only: a deprecated name read anywhere else still warns.
    http_protocol.http = _unwrapped(http_protocol.http)
    http_protocol.WebRequest.process = _process_with_codex_headers  # type: ignore[method-assign]
    http_protocol.WebRequest.__init__ = _init_without_form_parsing  # type: ignore[method-assign]
    http_protocol.HTTPFactory.log = _no_twisted_access_log  # type: ignore[method-assign]
    http.HTTPChannel.allHeadersReceived = _all_headers_bounded  # type: ignore[method-assign]
    body_limits.checked_by_server = True
    http_protocol.WebRequest.handleContentChunk = _content_chunk_bounded  # type: ignore[method-assign]
    Server.create_application = _create_application_reaped  # type: ignore[method-assign]


_ports: list[Any] = []
_listen_success = Server.listen_success


def _remember_port(self: Any, port: Any) -> Any:
    _ports.append(port)
    return _listen_success(self, port)


def _stop_listening() -> None:
    for port in _ports:
        port.stopListening()


_connection_made = http.HTTPChannel.connectionMade


def _connection_made_nodelay(self: Any) -> None:
    # Twisted leaves Nagle on for accepted connections: a stream's small SSE writes then wait
    # for the client's ACK of the previous one. Measured at c=1: time to first token 1.84-2.03
    # -> 1.58-1.72 ms, CPU per stream 1.45-1.69 -> 1.24-1.37 ms (bench/README.md).
    set_nodelay = getattr(self.transport, "setTcpNoDelay", None)  # a UNIX socket has none
    if set_nodelay is not None:
        with contextlib.suppress(OSError):
            set_nodelay(True)
    _connection_made(self)


# What `_handle_reply_head_with_body` holds of a connection's writes while it hands over a
# chunk; None: nothing is held.
tcp.Server.ocx_held = None  # type: ignore[attr-defined]
_buffered_write = tcp.Server.write
_buffered_write_sequence = tcp.Server.writeSequence


def _write_through(self: Any, data: bytes) -> None:
    """Send at once when nothing is queued, as asyncio's transports do; queue only the rest.

    Twisted queues every write and sends it when the loop next finds the socket writable: per
    streamed event an epoll change to watch for writability, a loop turn, the send and a second
    epoll change to stop watching, with Twisted's logging context around the callback. For an
    SSE stream that was about half of a worker's CPU per event (bench/README.md, streaming
    CPU). The socket is non-blocking: a send that takes part of the data (a full socket buffer,
    a slow client) leaves the rest to Twisted's queue, which then watches for writability,
    applies its producer backpressure and ends the connection as before; an error also goes
    to the queued path, whose send meets it and closes the connection the usual way."""
    held = self.ocx_held
    if held is not None:
        held.append(bytes(data))
        return
    if (
        data.__class__ is bytes
        and data
        and self.connected
        and not getattr(self, "TLS", False)  # TLS writes go through the TLS layer
        and not self.disconnecting
        and not self._writeDisconnecting  # noqa: SLF001
        and not self._tempDataBuffer  # noqa: SLF001
        and self.offset == len(self.dataBuffer)
    ):
        try:
            sent = self.socket.send(data)
        except OSError:  # EAGAIN, EINTR, or a dead peer that the queued send will meet
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    _buffered_write(self, data)


def _write_sequence_through(self: Any, iovec: list[bytes]) -> None:
    # Twisted's HTTP/1.1 chunked body is (size line, data, CRLF): one send for the three.
    if iovec and (self.ocx_held is not None or all(part.__class__ is bytes for part in iovec)):
        _write_through(self, b"".join(iovec))
    else:
        _buffered_write_sequence(self, iovec)


_handle_reply = http_protocol.WebRequest.handle_reply


def _handle_reply_head_with_body(self: Any, message: dict[str, Any]) -> None:
    """The response's head goes out with its first body chunk, in one `send`.

    Twisted writes the head when the first body chunk comes, then the chunk: two `send`s, one
    more system call for each stream the worker opens (and one more segment for the client to
    read). While this chunk is handed over, what the connection is given is held and then sent
    as one write (`_write_through`), in the same order. Only a chunk with more to follow: a
    last one ends the response, which may close the connection (Twisted would then drop what
    comes after it)."""
    channel = self.channel
    if (
        self.startedWriting
        or channel is None
        or message.get("type") != "http.response.body"
        or not message.get("more_body", False)
        or not isinstance(channel.transport, tcp.Server)
    ):
        _handle_reply(self, message)
        return
    transport: Any = channel.transport
    held: list[bytes] = []
    transport.ocx_held = held
    try:
        _handle_reply(self, message)
    finally:
        transport.ocx_held = None
        if held:
            _write_through(transport, b"".join(held))


_channels: weakref.WeakSet[Any] = weakref.WeakSet()
_build_protocol = http_protocol.HTTPFactory.buildProtocol
_check_persistence = http.HTTPChannel.checkPersistence


def _build_and_remember(self: Any, addr: Any) -> Any:
    channel = _build_protocol(self, addr)
    _channels.add(channel)
    return channel


def _persistence_unless_stopping(self: Any, request: Any, version: bytes) -> bool:
    if lifecycle.stopping():
        # Served, then closed: the client reconnects to a worker that is not stopping.
        request.responseHeaders.setRawHeaders(b"Connection", [b"close"])
        return False
    return bool(_check_persistence(self, request, version))


_idle_since: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _connections(now: float) -> int:
    """The HTTP connections still open (`lifecycle.drain`, `now` its clock). A request whose
    response has not started is answered with `Connection: close`; a connection is closed once
    it has been idle for `IDLE_LINGER_S` (from when it went idle, not from the drain's start:
    a stream that began before the drain ends on a keep-alive connection, and its client may
    send again at once). WebSockets (the admin's live page) are not waited for: they
    reconnect by themselves. Plain HTTP/1.1 over TCP, as `ocx serve` runs Daphne (no TLS or
    HTTP/2 in the worker)."""
    still_open = 0
    for generic in list(_channels):
        # Twisted's factory hands out a wrapper (`_GenericHTTPChannelProtocol`) around the
        # HTTPChannel; a WebSocket upgrade replaces it as the transport's protocol.
        channel = generic._channel  # noqa: SLF001
        transport = channel.transport
        if transport is None or transport.disconnected or transport.protocol is not generic:
            continue
        still_open += 1
        # Busy: a request parsed, or the bytes of the next one still arriving.
        if channel.requests or channel._buffer or channel._dataBuffer:  # noqa: SLF001
            _idle_since.pop(channel, None)
            request = channel.requests[-1] if channel.requests else None
            if request is not None and channel.persistent and not request.startedWriting:
                request.responseHeaders.setRawHeaders(b"Connection", [b"close"])
                channel.persistent = False
            continue
        since = _idle_since.setdefault(channel, now)
        if now - since >= lifecycle.IDLE_LINGER_S and not transport.disconnecting:
            channel.loseConnection()
    return still_open


async def _flush() -> None:
    # The runtime registered its writers' flush (`gateway.runtime`; `server` sits below it).
    await lifecycle.flush_all()


def _stop_reactor() -> None:
    from twisted.internet import reactor

    reactor.stop()  # type: ignore[attr-defined,misc]


def _on_sigterm(signum: int, frame: object) -> None:
    from twisted.internet import reactor

    if lifecycle.stopping():
        return
    lifecycle.mark_stopping()
    loop: asyncio.AbstractEventLoop = reactor._asyncioEventloop  # type: ignore[attr-defined]
    loop.call_soon_threadsafe(
        lambda: loop.create_task(
            lifecycle.drain(_stop_listening, _stop_reactor, _flush, _connections)
        )
    )


def _when_running() -> None:
    # Replaces Twisted's own handling (stop at once, cancelling every request); SIGINT too, as
    # Ctrl-C in a terminal reaches the workers as well as `ocx serve`.
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigterm)
    lifecycle.freeze_heap()
    from twisted.internet import reactor

    lifecycle.started(reactor._asyncioEventloop)  # type: ignore[attr-defined]
    ready_fd = os.environ.pop("OCX_READY_FD", None)
    if ready_fd:
        # Tells `ocx serve` this worker accepts connections (a SIGHUP reload waits for it).
        with contextlib.suppress(OSError):
            os.write(int(ready_fd), b"1")
            os.close(int(ready_fd))


def install_lifecycle() -> None:
    """Graceful SIGTERM (`server.lifecycle`) and the readiness signal for `ocx serve`."""
    from twisted.internet import reactor

    Server.listen_success = _remember_port  # type: ignore[method-assign]
    http_protocol.HTTPFactory.buildProtocol = _build_and_remember  # type: ignore[method-assign]
    http.HTTPChannel.checkPersistence = _persistence_unless_stopping  # type: ignore[method-assign]
    http.HTTPChannel.connectionMade = _connection_made_nodelay  # type: ignore[method-assign]
    tcp.Server.write = _write_through  # type: ignore[method-assign]
    tcp.Server.writeSequence = _write_sequence_through  # type: ignore[method-assign]
    http_protocol.WebRequest.handle_reply = _handle_reply_head_with_body  # type: ignore[method-assign]
    reactor.callWhenRunning(_when_running)  # type: ignore[attr-defined]


if __name__ == "__main__":
    install()
    install_lifecycle()
    CommandLineInterface.entrypoint()
