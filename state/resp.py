"""`RespClient`: the Redis client of the request path (RESP2 over one pipelined connection).

redis-py's asyncio client costs 100–220 µs of CPU per round trip on this project's machines
(a pool checkout under a lock, stream reader/writer, timeouts, response callbacks); a request
with budgets makes four round trips. This client is an asyncio protocol that writes each
command straight to the socket and matches replies to callers in order (RESP answers in the
order asked), so concurrent requests share one connection and a round trip costs about 20 µs.

It does only what the shared-state stores need: plain commands, non-transactional pipelines,
`MULTI`/`EXEC` blocks, Lua scripts (`EVALSHA`, falling back to `EVAL` once the script cache
lost it) and `SCAN`. No pub/sub, no blocking commands (they would stall every caller behind
them): `confignotify`, `doctor` and the admin keep redis-py.

Semantics an operator can rely on:

* the URL is read by redis-py's own parser, and TLS set up by redis-py's own context builder:
  `redis://`, `rediss://` (every `ssl_*` option: CA, client certificate, checks, versions)
  and `unix://`, with user, password and `db`;
* a command is sent at most once: if the connection breaks after sending, the callers waiting
  on it get `ConnectionError` (a budget `INCRBY` may be lost, never counted twice); the next
  call connects again;
* a caller that gives up (a timeout, a cancelled request) leaves its reply to be read and
  dropped, so the connection stays in step;
* if the oldest unanswered command waits longer than `timeout_s` the connection is dropped and
  everything waiting on it fails with `TimeoutError`: a Redis that stopped answering cannot
  hold callers (or memory) forever;
* failures are redis-py's exception types (`redis.RedisError` subclasses), so callers classify
  them as before; messages never carry the URL (it may hold a password).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio.connection import SSLConnection, parse_url

Arg = bytes | str | int | float
Command = Sequence[Arg]

_ERRORS: dict[str, type[rexc.RedisError]] = {
    "NOSCRIPT": rexc.NoScriptError,
    "READONLY": rexc.ReadOnlyError,
    "EXECABORT": rexc.ExecAbortError,
    "NOAUTH": rexc.AuthenticationError,
    "WRONGPASS": rexc.AuthenticationError,
    "LOADING": rexc.BusyLoadingError,
    "OOM": rexc.OutOfMemoryError,
}


class _Incomplete(Exception):
    """The buffer ends inside a reply: wait for more bytes."""


def _error(line: str) -> rexc.RedisError:
    code = line.split(" ", 1)[0]
    return _ERRORS.get(code, rexc.ResponseError)(line)


def _read(buf: bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply starting at `pos`: (value, position after it). An error reply is
    returned (not raised) as its exception, so a pipeline can report it in its place."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    line = bytes(buf[pos + 1 : end])
    pos = end + 2
    if kind == 0x24:  # $ bulk string
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise _Incomplete
        return bytes(buf[pos : pos + n]), pos + n + 2
    if kind == 0x3A:  # : integer
        return int(line), pos
    if kind == 0x2A:  # * array
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = _read(buf, pos)
            items.append(item)
        return items, pos
    if kind == 0x2B:  # + simple string
        return line, pos
    if kind == 0x2D:  # - error
        return _error(line.decode(errors="replace")), pos
    raise rexc.InvalidResponse(f"protocol error: unexpected reply type {chr(kind)!r}")


def _pack(commands: Sequence[Command]) -> bytes:
    parts: list[bytes] = []
    for args in commands:
        if not args:
            # Redis answers nothing to an empty command: the replies would fall out of step.
            raise rexc.DataError("cannot send an empty command to Redis")
        parts.append(b"*%d\r\n" % len(args))
        for arg in args:
            if isinstance(arg, bytes):
                value = arg
            elif isinstance(arg, str):
                value = arg.encode()
            elif isinstance(arg, int) and not isinstance(arg, bool):
                value = b"%d" % arg
            elif isinstance(arg, float):
                value = repr(arg).encode()
            else:
                raise rexc.DataError(f"cannot send a {type(arg).__name__} to Redis")
            parts += (b"$%d\r\n" % len(value), value, b"\r\n")
    return b"".join(parts)


def _first_error(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, rexc.RedisError):
            raise reply


class _Waiter:
    __slots__ = ("future", "count", "replies", "sent")

    def __init__(self, future: asyncio.Future[list[Any]], count: int, sent: float) -> None:
        self.future = future
        self.count = count
        self.replies: list[Any] = []
        self.sent = sent


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.loop = loop
        self.timeout_s = timeout_s
        # Not `asyncio.Transport`: uvloop's transports (`ocx serve --server uvicorn`) are not
        # its subclasses.
        self.transport: Any = None
        self.failed: BaseException | None = None
        self._buf = bytearray()
        self._waiters: deque[_Waiter] = deque()
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def send(self, payload: bytes, count: int) -> asyncio.Future[list[Any]]:
        """Write `count` commands; the future gets their `count` replies."""
        if self.failed is not None:
            raise self.failed
        assert self.transport is not None
        future: asyncio.Future[list[Any]] = self.loop.create_future()
        now = self.loop.time()
        self._waiters.append(_Waiter(future, count, now))
        self.transport.write(payload)
        if self._watchdog is None:
            self._watchdog = self.loop.call_at(now + self.timeout_s, self._check)
        return future

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        waiters = self._waiters
        try:
            while waiters and pos < len(buf):
                value, pos = _read(buf, pos)
                waiter = waiters[0]
                waiter.replies.append(value)
                if len(waiter.replies) == waiter.count:
                    waiters.popleft()
                    if not waiter.future.done():  # else the caller gave up: drop the reply
                        waiter.future.set_result(waiter.replies)
        except _Incomplete:
            pass
        except (ValueError, rexc.InvalidResponse) as exc:
            self._fail(rexc.InvalidResponse(f"protocol error: {exc}"))
            return
        del buf[:pos]
        if buf and not waiters:
            # Redis says why it drops a connection it just accepted (max clients reached) as
            # an error reply before anything was asked.
            try:
                reply, _ = _read(buf, 0)
            except (_Incomplete, ValueError, rexc.InvalidResponse):
                reply = None
            if isinstance(reply, rexc.RedisError):
                self._fail(rexc.ConnectionError(str(reply)))
            else:
                self._fail(rexc.InvalidResponse("protocol error: a reply nobody asked for"))

    def _check(self) -> None:
        self._watchdog = None
        if not self._waiters or self.failed is not None:
            return
        due = self._waiters[0].sent + self.timeout_s
        if self.loop.time() >= due:
            self._fail(rexc.TimeoutError("Timeout reading from socket"))
        else:
            self._watchdog = self.loop.call_at(due, self._check)

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc
        if self.transport is not None:
            self.transport.abort()
        self._release(exc)

    def _release(self, exc: BaseException) -> None:
        if self.loop.is_closed():  # left behind by an earlier event loop (tests, commands)
            self._waiters.clear()
            return
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        while self._waiters:
            future = self._waiters.popleft().future
            if not future.done():
                future.set_exception(exc)

    def eof_received(self) -> bool | None:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self.failed is None:
            self.failed = rexc.ConnectionError("Connection closed by server.")
        self._release(self.failed)

    def close(self) -> None:
        if self.failed is None:
            self.failed = rexc.ConnectionError("Connection closed.")
        if self.transport is not None and not self.loop.is_closed():
            self.transport.close()
        self._release(self.failed)


class Script:
    """A Lua script called by its SHA1; sent whole (`EVAL`) only when Redis lost it."""

    def __init__(self, client: RespClient, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        try:
            return await self.client.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            # EVAL also puts it back in the script cache for the next EVALSHA.
            return await self.client.execute("EVAL", self.source, len(keys), *keys, *args)


class RespClient:
    """One lazily opened, pipelined connection per event loop (see the module docstring)."""

    def __init__(
        self, url: str, *, timeout_s: float = 5.0, connect_timeout_s: float | None = None
    ) -> None:
        opts = parse_url(url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s if connect_timeout_s is not None else timeout_s
        self._host: str = opts.get("host", "localhost")
        self._port: int = int(opts.get("port", 6379))
        self._path: str | None = opts.get("path")
        self._db = int(opts.get("db", 0) or 0)
        self._username: str | None = opts.get("username")
        self._password: str | None = opts.get("password")
        self._ssl = (
            _ssl_context(dict(opts)) if opts.get("connection_class") is SSLConnection else None
        )
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None

    def script(self, source: str) -> Script:
        return Script(self, source)

    async def execute(self, *args: Arg) -> Any:
        (reply,) = await self._send(_pack((args,)), 1)
        if isinstance(reply, rexc.RedisError):
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """Several commands in one round trip (not atomic); raises the first error reply."""
        if not commands:
            return []
        replies = await self._send(_pack(commands), len(commands))
        _first_error(replies)
        return replies

    async def transaction(self, commands: Sequence[Command]) -> list[Any]:
        """`MULTI` … `EXEC` in one round trip: their replies. A command Redis refuses when queued
        (unknown, wrong arity) runs none of them; one that fails while running (wrong type)
        raises here, but the others ran, as Redis transactions do."""
        if not commands:
            return []
        replies = await self._send(_pack((("MULTI",), *commands, ("EXEC",))), len(commands) + 2)
        _first_error(replies)  # a refused command aborts the EXEC (EXECABORT)
        result = replies[-1]
        if not isinstance(result, list):
            raise rexc.ResponseError("transaction discarded")
        _first_error(result)
        return result

    async def get(self, name: str) -> bytes | None:
        return await self.execute("GET", name)  # type: ignore[no-any-return]

    async def mget(self, names: Sequence[str]) -> list[bytes | None]:
        return await self.execute("MGET", *names)  # type: ignore[no-any-return]

    async def delete(self, *names: str) -> int:
        return await self.execute("DEL", *names)  # type: ignore[no-any-return]

    async def pttl(self, name: str) -> int:
        return await self.execute("PTTL", name)  # type: ignore[no-any-return]

    async def ping(self) -> bool:
        return await self.execute("PING") == b"PONG"

    async def scan_iter(self, match: str, count: int = 500) -> AsyncIterator[bytes]:
        cursor = b"0"
        while True:
            cursor, names = await self.execute("SCAN", cursor, "MATCH", match, "COUNT", count)
            for name in names:
                yield name
            if cursor == b"0":
                return

    async def aclose(self) -> None:
        task, self._connecting = self._connecting, None
        if task is not None and not task.done():
            # Not cancelled: other callers may be waiting on it; its connection is closed when
            # it is made.
            task.add_done_callback(_close_made)
        conn, self._conn = self._conn, None
        if conn is not None:
            _close(conn)

    async def _send(self, payload: bytes, count: int) -> list[Any]:
        conn = self._conn
        if conn is None or conn.failed is not None or conn.loop is not asyncio.get_running_loop():
            if conn is not None and conn.failed is None:
                _close(conn)  # made on another event loop
            conn = await self._connection()
        return await conn.send(payload, count)

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        task = self._connecting
        if task is None or task.done() or task.get_loop() is not loop:
            task = self._connecting = loop.create_task(self._connect(loop))
            # Read its failure even when every caller gave up waiting (else asyncio logs
            # "exception was never retrieved" on each probe of a Redis that hangs).
            task.add_done_callback(_retrieve)
        # Concurrent first callers share one connect; one of them being cancelled must not
        # cancel it for the others.
        return await asyncio.shield(task)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        conn = _Connection(loop, self.timeout_s)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self._path is not None:
                    await loop.create_unix_connection(lambda: conn, self._path)
                else:
                    await loop.create_connection(
                        lambda: conn,
                        self._host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host if self._ssl is not None else None,
                    )
                if self._password is not None:
                    await self._auth(conn)
                if self._db:
                    _first_error(await conn.send(_pack((("SELECT", self._db),)), 1))
        except TimeoutError:
            conn.close()
            raise rexc.TimeoutError("Timeout connecting to server") from None
        except ssl.SSLError as exc:
            conn.close()
            raise rexc.ConnectionError(f"TLS handshake failed: {exc.reason}") from None
        except OSError as exc:
            conn.close()
            # asyncio's message names the address; os.strerror (or a resolver's) does not.
            if isinstance(exc, socket.gaierror):
                reason = str(exc.strerror)
            else:
                reason = os.strerror(exc.errno) if exc.errno else type(exc).__name__
            raise rexc.ConnectionError(f"Error {exc.errno} connecting: {reason}") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    async def _auth(self, conn: _Connection) -> None:
        assert self._password is not None
        if self._username is None:
            _first_error(await conn.send(_pack((("AUTH", self._password),)), 1))
            return
        (reply,) = await conn.send(_pack((("AUTH", self._username, self._password),)), 1)
        if isinstance(reply, rexc.ResponseError) and "wrong number of arguments" in str(reply):
            # Redis before 6 has no users: the password alone, as redis-py falls back to.
            (reply,) = await conn.send(_pack((("AUTH", self._password),)), 1)
        _first_error([reply])


def _ssl_context(opts: dict[str, Any]) -> ssl.SSLContext:
    # redis-py's own builder, so every `ssl_*` URL option means what it meant with redis-py.
    opts = {k: v for k, v in opts.items() if k != "connection_class"}
    return SSLConnection(**opts).ssl_context.get()


def _close(conn: _Connection) -> None:
    """Close a connection, from whichever thread: its loop may be another thread's."""
    if conn.loop.is_closed():
        conn.close()  # only marks it failed: its socket goes with the transport
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is conn.loop:
        conn.close()
    else:
        conn.loop.call_soon_threadsafe(conn.close)


def _retrieve(task: asyncio.Task[_Connection]) -> None:
    if not task.cancelled():
        task.exception()


def _close_made(task: asyncio.Task[_Connection]) -> None:
    if not task.cancelled() and task.exception() is None:
        _close(task.result())
