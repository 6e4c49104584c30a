"""A lean HTTP/1.1 transport for httpx: asyncio protocols and httptools' C parser.

httpx's default transport (httpcore, h11 and anyio) was a quarter to two fifths of a proxy
worker's CPU (bench/README.md). This one does only what the upstream path needs: HTTP/1.1
with keep-alive pools per origin, TLS from the stdlib, bodies given as bytes, and the
exception types httpx's own transport raises for the same faults, so the failure
classification in `providers.upstream.attempt` does not change:

- refused, unreachable, TLS handshake failed: `httpx.ConnectError`; too slow: `ConnectTimeout`
- the peer closed before the answer was whole: `RemoteProtocolError`; a reset: `ReadError`
- bytes that are not HTTP: `RemoteProtocolError`
- ocx's own limits, never the upstream's fault: `LocalOverload` (no free connection within the
  pool timeout, or no file descriptor, local port or buffer for a new socket)

Read timeouts are the caller's (`asyncio.timeout` around each read); a cancelled read closes
the connection, since its answer can no longer be taken off the wire. Request bodies are
bytes (no streamed uploads), and HEAD is not supported (its answer's framing differs).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools
import httpx

# Past this many unread body bytes the socket stops being read (the upstream then waits).
READ_HIGH_WATER = 1 << 20
# An answer whose status line and headers are longer than this is refused (h11's bound too).
MAX_HEAD = 100 * 1024

Origin = tuple[bytes, str, int]
_DEFAULT_PORTS = {b"http": 80, b"https": 443}


class _Stray(Exception):
    pass


# A socket ocx could not open for want of its own resources (PRODUCT: local limits are never an
# upstream fault), by errno; the values are `LocalOverload.cause`.
LOCAL_ERRNOS: dict[int, str] = {
    errno.EMFILE: "fd_limit",
    errno.ENFILE: "fd_limit",
    errno.EADDRNOTAVAIL: "no_local_port",
    errno.ENOBUFS: "no_memory",
    errno.ENOMEM: "no_memory",
}
LOCAL_CAUSES: tuple[str, ...] = ("pool_full", "fd_limit", "no_local_port", "no_memory")
# Set on a request's extensions while it waits for a pool slot, so a caller whose own timeout
# ends that wait can tell it from a slow upstream.
POOL_WAIT = "ocx.pool_wait"
# A callable on a request's extensions, called when a wait for a pool slot ends with one: the
# caller's clock for the upstream starts there.
POOL_SLOT = "ocx.pool_slot"


class LocalOverload(httpx.TransportError):
    """ocx's own resources ran out before the upstream was reached: no pool slot in time
    (`pool_full`), or no file descriptor, local port or socket buffer (`LOCAL_ERRNOS`)."""

    def __init__(self, cause: str, message: str, *, request: httpx.Request | None = None) -> None:
        super().__init__(message, request=request)
        self.cause = cause


def local_cause(exc: BaseException) -> str | None:
    """The `LocalOverload` cause of a connect error, or None when it is the network's or the
    peer's. asyncio joins the errors of several addresses into one message without an errno."""
    if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
        return LOCAL_ERRNOS[exc.errno]
    text = str(exc)
    for code, cause in LOCAL_ERRNOS.items():
        if f"[Errno {code}]" in text:
            return cause
    return None


# What a closed connection keeps as its parser: one with no callbacks, never fed.
_SPENT_PARSER = httptools.HttpResponseParser(object())


class _Conn(asyncio.Protocol):
    """One upstream connection; parses one answer at a time."""

    def __init__(self, pool: Http1Transport, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.busy = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None
        # Set while the reader waits (`Body.wait`): takes what each read brings of the body
        # (`data_received`).
        self.sink: Callable[[bytes], bool] | None = None
        self.sink_error: Exception | None = None
        self._begin()

    def _begin(self) -> None:
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.until_close = False  # body framed by the connection's end (no length, not chunked)
        self.done = False
        self.keep_alive = False
        self.error: httpx.TransportError | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.head_bytes = 0
        self.sink = None  # a reader's, from an answer before this one: never this one's
        self.sink_error = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        if self.closed:  # the pool closed while this one was connecting
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            # Nothing was asked: an idle connection that talks is not safe to reuse.
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # Also bytes after a whole answer (`on_message_begin`): that answer stands, but
            # the connection is out of step and is not reused.
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP answer: {exc}"))
            self.close()
            return
        if self.sink is not None and self.chunks:
            self._offer(self.sink)
        if not self.headers_done:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD:
                self._fail(httpx.RemoteProtocolError("answer head too large"))
                self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.busy and not self.done and self.error is None:
            if self.headers_done and self.until_close and exc is None:
                self.done = True
            elif exc is not None:
                self.error = httpx.ReadError(type(exc).__name__)
            elif self.headers_done:
                self.error = httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            else:
                self.error = httpx.RemoteProtocolError(
                    "Server disconnected without sending a response."
                )
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self.pool._forget(self)
        # The parser holds this object's callbacks: kept, it would leave each closed connection
        # (with its transport and socket) to the cyclic collector. Nothing is fed after this.
        self.parser = _SPENT_PARSER

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self.headers_done:
            raise _Stray("bytes after a whole answer")

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the real one follows.
            self.reason = b""
            self.headers = []
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        framed = status in (204, 304)
        for name, _ in self.headers:
            low = name.lower()
            if low == b"content-length" or low == b"transfer-encoding":
                framed = True
        self.until_close = not framed
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if not body:
            return  # an empty read would read as the end of the body (`Body.ready`)
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        if self.sink is None:
            self._wake()
        # else offered to the sink, with the rest of this read, once it is parsed (`_offer`)

    def _offer(self, sink: Callable[[bytes], bool]) -> None:
        """Hands what this read brought of the body to the reader's sink, as one chunk (the
        reader waits, so nothing came before it): one write to the client per upstream read, as
        the reader's own loop makes. Declined, it waits for the reader, and so does all after."""
        data = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        try:
            if sink(data):
                self.discard()
                return
        except Exception as exc:  # the reader's own fault, not the answer's: raised to it
            self.sink_error = exc
        self.sink = None
        self._wake()

    def on_message_complete(self) -> None:
        if not self.headers_done:
            return  # the end of an interim answer
        self.done = True
        self._wake()

    # -- used by the transport and the body stream

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None and not self.done:
            self.error = error
        self._wake()

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def send(self, head: bytes, body: bytes, write_s: float | None) -> None:
        assert self.transport is not None
        self._begin()
        self.busy = True
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        if self._write_paused and not self.closed:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(write_s):
                    await self._drained
            except TimeoutError:
                raise httpx.WriteTimeout("request body not taken in time") from None
            finally:
                self._drained = None
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            await self.wait()

    def take(self) -> bytes:
        data = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        self.discard()
        return data

    def discard(self) -> None:
        self.chunks.clear()
        if self.buffered > READ_HIGH_WATER and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        self.buffered = 0

    def close(self) -> None:
        # abort, not close: a TLS close waits for the peer's close_notify (30 s on uvloop),
        # and a stream the client left must stop at the upstream now.
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True


class Body(httpx.AsyncByteStream):
    """An answer's body. Besides httpx's iteration it can be read directly (`ready` / `wait`):
    a streamed chunk then passes one async generator on its way to the client, not three
    (httpx's `aiter_raw`, this class's `__aiter__`, the proxy's own; issue 24)."""

    def __init__(self, conn: _Conn) -> None:
        self._conn: _Conn | None = conn

    def ready(self) -> bytes | None:
        """What has arrived (all of it, as one bytes), b"" once the body is complete, or None
        when nothing has arrived yet (then `wait`). Raises the connection's error, or
        RemoteProtocolError for a body the peer closed early."""
        conn = self._conn
        if conn is not None and conn.sink_error is not None:
            error, conn.sink_error = conn.sink_error, None
            raise error
        if conn is None or (not conn.chunks and conn.done and conn.error is None):
            return b""
        if conn.chunks:
            return conn.take()
        if conn.error is not None:
            raise conn.error
        if conn.closed:
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"
            )
        return None

    async def wait(self, sink: Callable[[bytes], bool] | None = None) -> None:
        """Until more of the body, its end or an error has arrived. Meanwhile `sink`, when given,
        is offered what each read of the connection brings of the body, as one chunk (from the
        connection's data callback, not a task): a chunk it takes (True) is done with; the first
        it declines, and every chunk after it, are kept for `ready` and end the wait. An
        exception it raises is raised by `ready`, ahead of the chunk it was offered, which stays
        kept as if declined."""
        conn = self._conn
        if conn is None:
            return
        conn.sink = sink
        try:
            await conn.wait()
        finally:
            conn.sink = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := self.ready()) != b"":
            if chunk is None:
                await self.wait()
            else:
                yield chunk
        await self.aclose()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        # Whole and reusable: back to the pool; anything else cannot carry another answer.
        reuse = conn.done and conn.keep_alive and conn.error is None and not conn.closed
        conn.discard()  # unread bytes of a whole answer: reading resumes for the next one
        conn.busy = False
        if not reuse:
            conn.close()
        conn.pool._release(conn, reuse)


class Http1Transport(httpx.AsyncBaseTransport):
    """Keep-alive pools per origin, at most `max_connections` sockets in all."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None,
        max_connections: int = 64,
        max_keepalive: int = 16,
        keepalive_expiry: float = 30.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.max_keepalive = max_keepalive
        self.keepalive_expiry = keepalive_expiry
        self._now = now  # keep-alive idle clock; injectable so tests need not sleep
        self._idle: dict[Origin, list[_Conn]] = {}
        self._all: set[_Conn] = set()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closing = False

    def connections(self) -> int:
        return len(self._all)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}", request=request)
        # The IDNA-encoded name, as in the Host header, for DNS and TLS (SNI, verification).
        origin: Origin = (scheme, url.raw_host.decode("ascii"), url.port or _DEFAULT_PORTS[scheme])
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = request.content  # raises httpx.RequestNotRead for a streamed body
        raw = request.headers.raw
        head = b"".join(
            [
                request.method.encode(),
                b" ",
                url.raw_path,
                b" HTTP/1.1\r\n",
                *[b"%s: %s\r\n" % pair for pair in raw],
                b"\r\n",
            ]
        )
        # A CR, LF or NUL inside a name or value (a pasted key with a newline) would end the
        # head early and put the connection out of step with its answers: refused, unsent.
        lines = len(raw) + 2
        if head.count(b"\n") != lines or head.count(b"\r") != lines or b"\0" in head:
            raise httpx.LocalProtocolError(
                "a request header or the target contains CR, LF or NUL", request=request
            )
        pool_s = timeouts.get("pool")
        deadline = None if pool_s is None else asyncio.get_running_loop().time() + pool_s
        conn = await self._acquire(origin, timeouts, request, deadline)
        try:
            await conn.send(head, body, timeouts.get("write"))
        except BaseException as exc:
            conn.busy = False
            conn.close()
            self._release(conn, False)
            if isinstance(exc, httpx.TransportError) and exc._request is None:
                exc.request = request
            raise
        return httpx.Response(
            conn.status,
            headers=conn.headers,
            stream=Body(conn),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": conn.reason.strip()},
        )

    async def _acquire(
        self,
        origin: Origin,
        timeouts: dict[str, float | None],
        request: httpx.Request,
        deadline: float | None,
    ) -> _Conn:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if self._now() - conn.idle_since > self.keepalive_expiry:
                conn.close()
                self._all.discard(conn)
                self._wake_waiter()
                continue
            conn.busy = True
            return conn
        if len(self._all) >= self.max_connections:
            self._evict_idle()
        if len(self._all) >= self.max_connections:
            await self._wait_for_room(deadline, request)
            return await self._acquire(origin, timeouts, request, deadline)
        return await self._connect(origin, timeouts.get("connect"), request)

    async def _connect(
        self, origin: Origin, connect_s: float | None, request: httpx.Request
    ) -> _Conn:
        loop = asyncio.get_running_loop()
        scheme, host, port = origin
        tls = self.ssl_context if scheme == b"https" else None
        if scheme == b"https" and tls is None:
            tls = ssl.create_default_context()
        conn = _Conn(self, origin)
        self._all.add(conn)  # counts against the limit while it connects
        try:
            async with asyncio.timeout(connect_s):
                await loop.create_connection(
                    lambda: conn, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except TimeoutError:
            self._all.discard(conn)
            self._wake_waiter()
            raise httpx.ConnectTimeout("connect timeout", request=request) from None
        except (OSError, ssl.SSLError) as exc:
            self._all.discard(conn)
            self._wake_waiter()
            cause = local_cause(exc)
            if cause is not None:
                raise LocalOverload(cause, str(exc), request=request) from None
            raise httpx.ConnectError(type(exc).__name__, request=request) from None
        except BaseException:
            self._all.discard(conn)
            conn.close()
            self._wake_waiter()
            raise
        conn.busy = True
        return conn

    def _evict_idle(self) -> None:
        for conns in self._idle.values():
            while conns:
                victim = conns.pop(0)
                victim.close()
                self._all.discard(victim)
                return

    async def _wait_for_room(self, deadline: float | None, request: httpx.Request) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        request.extensions[POOL_WAIT] = True
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except BaseException as exc:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self._wake_waiter()  # woken, but leaving: the room goes to the next in line
            if isinstance(exc, TimeoutError):
                raise LocalOverload(
                    "pool_full",
                    f"no free upstream connection (all {self.max_connections} in use)",
                    request=request,
                ) from None
            # Cancelled (by the caller's own timeout): the mark stays for the caller to read.
            raise
        request.extensions.pop(POOL_WAIT, None)
        on_slot = request.extensions.get(POOL_SLOT)
        if on_slot is not None:
            on_slot()

    def _wake_waiter(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _release(self, conn: _Conn, reuse: bool) -> None:
        if self._closing:
            conn.close()
        elif reuse:
            idle = self._idle.setdefault(conn.origin, [])
            if len(idle) < self.max_keepalive:
                conn.idle_since = self._now()
                idle.append(conn)
                self._wake_waiter()
                return
            conn.close()
        self._all.discard(conn)
        self._wake_waiter()

    def _forget(self, conn: _Conn) -> None:
        # connection_lost: an idle connection the upstream closed leaves the pool now.
        if not conn.busy:
            idle = self._idle.get(conn.origin)
            if idle and conn in idle:
                idle.remove(conn)
            if conn in self._all:
                self._all.discard(conn)
                self._wake_waiter()

    async def aclose(self) -> None:
        self._closing = True
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()

    def __repr__(self) -> str:
        return f"<Http1Transport {len(self._all)} connections>"
