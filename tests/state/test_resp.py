"""`state.resp.RespClient` against real `redis-server` processes (and, for replies a real
Redis never sends, a scripted server on a real socket)."""

from __future__ import annotations

import asyncio
import gc
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis import exceptions as rexc

from state.resp import RespClient, _Incomplete, _read
from tests.certs import self_signed
from tests.ocxsite.deps import RedisServer, free_port

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")


def _spawn(args: list[str], ready: Any) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--save", "", "--appendonly", "no", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not ready():
        assert proc.poll() is None, "redis-server exited"
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.02)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=10)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --- the parser -------------------------------------------------------------------------


def test_read_parses_every_reply_type_and_returns_errors_in_place() -> None:
    wire = (
        b"+OK\r\n:-42\r\n$5\r\nhe\r\nl\r\n$-1\r\n*-1\r\n$0\r\n\r\n"
        b"*3\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n-ERR boom\r\n"
        b"-NOSCRIPT No matching script.\r\n-READONLY You can't write against a replica.\r\n"
    )
    buf = bytearray(wire)
    values = []
    pos = 0
    while pos < len(buf):
        value, pos = _read(buf, pos)
        values.append(value)
    assert values[:6] == [b"OK", -42, b"he\r\nl", None, None, b""]
    nested = values[6]
    assert nested[:2] == [b"a", [1, None]]
    assert type(nested[2]) is rexc.ResponseError and str(nested[2]) == "ERR boom"
    assert type(values[7]) is rexc.NoScriptError
    assert type(values[8]) is rexc.ReadOnlyError


@pytest.mark.parametrize("reply", [b"$5\r\nhello\r\n", b"*2\r\n:1\r\n$3\r\nabc\r\n", b"+PONG\r\n"])
def test_read_waits_for_the_whole_reply_at_every_split(reply: bytes) -> None:
    for cut in range(len(reply)):
        with pytest.raises(_Incomplete):
            _read(bytearray(reply[:cut]), 0)
    assert _read(bytearray(reply), 0)[1] == len(reply)


# --- against a real Redis ---------------------------------------------------------------


async def test_commands_pipelines_and_transactions(redis_server: RedisServer) -> None:
    client = RespClient(redis_server.url)
    try:
        assert await client.ping() is True
        assert await client.execute("SET", "a", "1", "PX", 60_000) == b"OK"
        assert await client.get("a") == b"1"
        assert await client.get("missing") is None
        assert await client.mget(["a", "missing"]) == [b"1", None]
        assert 0 < await client.pttl("a") <= 60_000
        assert await client.pipeline([("INCRBY", "n", 5), ("INCRBY", "n", 2)]) == [5, 7]
        assert await client.transaction([("INCRBY", "t", 3), ("PEXPIRE", "t", 1000)]) == [3, 1]
        assert await client.delete("a", "n", "t") == 3
        await client.execute("SET", "s", "x")
        with pytest.raises(rexc.ResponseError, match="WRONGTYPE"):
            await client.execute("HGETALL", "s")
        # A pipeline reports the first error after reading every reply: the connection stays in
        # step, and the commands around the error ran.
        with pytest.raises(rexc.ResponseError):
            await client.pipeline([("SET", "p1", "1"), ("INCR", "s"), ("SET", "p2", "2")])
        assert await client.mget(["p1", "p2"]) == [b"1", b"2"]
    finally:
        await client.aclose()


async def test_a_refused_command_in_a_transaction_applies_none_of_it(
    redis_server: RedisServer,
) -> None:
    client = RespClient(redis_server.url)
    try:
        with pytest.raises(rexc.ResponseError):
            await client.transaction([("INCRBY", "x", 5), ("NOSUCHCOMMAND",), ("INCRBY", "y", 1)])
        assert await client.mget(["x", "y"]) == [None, None]
        assert await client.get("x") is None  # and the connection is still usable
    finally:
        await client.aclose()


async def test_a_script_is_sent_whole_only_when_redis_lost_it(redis_server: RedisServer) -> None:
    client = RespClient(redis_server.url)
    sent: list[str] = []
    real = client.execute

    async def counted(*args: Any) -> Any:
        sent.append(str(args[0]))
        return await real(*args)

    client.execute = counted  # type: ignore[method-assign]
    script = client.script("return {KEYS[1], ARGV[1] + 1}")
    try:
        assert await script(keys=["k"], args=[41]) == [b"k", 42]
        assert await script(keys=["k"], args=[1]) == [b"k", 2]
        assert sent == ["EVALSHA", "EVAL", "EVALSHA"]
        sent.clear()
        await real("SCRIPT", "FLUSH")
        assert await script(keys=["k"], args=[2]) == [b"k", 3]
        assert sent == ["EVALSHA", "EVAL"]
    finally:
        await client.aclose()


async def test_concurrent_callers_share_one_connection_and_get_their_own_replies(
    redis_server: RedisServer,
) -> None:
    client = RespClient(redis_server.url)
    try:
        await client.pipeline([("SET", f"k{i}", str(i)) for i in range(300)])
        got = await asyncio.gather(*(client.get(f"k{i}") for i in range(300)))
        assert got == [str(i).encode() for i in range(300)]
        clients = redis_server.client().client_list()
        assert len(clients) == 2  # this client's one connection, and the one listing them
    finally:
        await client.aclose()


async def test_a_caller_that_gives_up_leaves_the_connection_in_step(
    redis_server: RedisServer,
) -> None:
    client = RespClient(redis_server.url)
    try:
        await client.execute("SET", "first", "1")
        await client.execute("SET", "second", "2")
        redis_server.pause()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await client.get("first")
        redis_server.resume()
        # The abandoned GET's reply arrives first and is dropped; this one gets its own.
        assert await client.get("second") == b"2"
    finally:
        redis_server.resume()
        await client.aclose()


async def test_a_redis_that_stops_answering_fails_its_callers_after_timeout_s(
    redis_server: RedisServer,
) -> None:
    client = RespClient(redis_server.url, timeout_s=0.2)
    try:
        await client.ping()
        redis_server.pause()
        started = time.monotonic()
        results = await asyncio.gather(client.get("a"), client.get("b"), return_exceptions=True)
        waited = time.monotonic() - started
        assert [type(r) for r in results] == [rexc.TimeoutError, rexc.TimeoutError]
        assert 0.2 <= waited < 2.0
        redis_server.resume()
        assert await client.ping() is True  # a new connection
    finally:
        redis_server.resume()
        await client.aclose()


async def test_a_restarted_redis_is_reconnected_to(redis_server: RedisServer) -> None:
    client = RespClient(redis_server.url)
    try:
        await client.execute("SET", "a", "1")
        await asyncio.to_thread(redis_server.stop)  # the loop runs meanwhile: it sees the close
        with pytest.raises(rexc.ConnectionError) as refused:
            await client.get("a")
        assert "127.0.0.1" not in str(refused.value)
        await asyncio.to_thread(redis_server.start)
        assert await client.get("a") is None  # no persistence: a new, empty Redis
    finally:
        await client.aclose()


async def test_a_connection_lost_mid_command_fails_it_without_sending_it_again() -> None:
    """At most once: a command in flight when the connection drops is not sent again (a
    budget `INCRBY` may be lost, never counted twice); the next call connects again."""
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(1000)
        received.append(data)
        if b"PING" in data:
            writer.write(b"+PONG\r\n")
            await writer.drain()
            await reader.read(1000)
        writer.transport.abort()  # the INCRBY: dropped unanswered

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = RespClient(f"redis://127.0.0.1:{srv.sockets[0].getsockname()[1]}/0")
    try:
        with pytest.raises(rexc.ConnectionError):
            await client.execute("INCRBY", "n", 1)
        assert await client.ping() is True
        assert [b"INCRBY" in r for r in received] == [True, False]
    finally:
        await client.aclose()
        srv.close()


def test_one_client_serves_successive_event_loops(redis_server: RedisServer) -> None:
    client = RespClient(redis_server.url)
    asyncio.run(client.execute("SET", "a", "1"))
    assert asyncio.run(client.get("a")) == b"1"
    asyncio.run(client.aclose())


async def test_password_db_and_a_wrong_password(tmp_path: Path) -> None:
    port = free_port()
    proc = _spawn(
        ["--port", str(port), "--bind", "127.0.0.1", "--requirepass", "s3cret"],
        lambda: _listening(port),
    )
    try:
        client = RespClient(f"redis://:s3cret@127.0.0.1:{port}/3")
        await client.execute("SET", "in3", "yes")
        check = redis.Redis(port=port, password="s3cret", db=3)
        assert check.get("in3") == b"yes"
        assert redis.Redis(port=port, password="s3cret", db=0).get("in3") is None
        await client.aclose()
        wrong = RespClient(f"redis://:nope-n0pe@127.0.0.1:{port}/0")
        with pytest.raises(rexc.AuthenticationError) as refused:
            await wrong.ping()
        assert "nope-n0pe" not in str(refused.value)
        unauthenticated = RespClient(f"redis://127.0.0.1:{port}/0")
        with pytest.raises(rexc.AuthenticationError):
            await unauthenticated.ping()
    finally:
        _stop(proc)


async def test_unix_socket() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ocx-resp-"))
    path = tmp / "redis.sock"
    proc = _spawn(["--port", "0", "--unixsocket", str(path)], path.exists)
    try:
        client = RespClient(f"unix://{path}?db=2")
        await client.execute("SET", "u", "1")
        assert redis.Redis(unix_socket_path=str(path), db=2).get("u") == b"1"
        await client.aclose()
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


async def test_tls_verifies_the_server_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    tls = ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    proc = _spawn(
        ["--port", "0", "--bind", "127.0.0.1", *tls, "--tls-auth-clients", "no"],
        lambda: _listening(port),
    )
    try:
        trusting = RespClient(f"rediss://localhost:{port}/0?ssl_ca_certs={cert}")
        assert await trusting.ping() is True
        await trusting.aclose()
        # The system's CAs do not know this certificate.
        with pytest.raises(rexc.ConnectionError, match="TLS"):
            await RespClient(f"rediss://localhost:{port}/0").ping()
        unverified = RespClient(f"rediss://localhost:{port}/0?ssl_cert_reqs=none")
        assert await unverified.ping() is True
        await unverified.aclose()
    finally:
        _stop(proc)


async def test_nothing_listening_is_a_connection_error() -> None:
    client = RespClient(f"redis://127.0.0.1:{free_port()}/0", timeout_s=1.0)
    with pytest.raises(rexc.ConnectionError):
        await client.ping()


# --- replies a real Redis never sends ---------------------------------------------------


async def _scripted(answer: bytes) -> tuple[asyncio.Server, int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(answer)
        await writer.drain()
        await reader.read(100)  # hold the connection until the client drops it
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


@pytest.mark.parametrize("answer", [b"?what\r\n", b"+OK\r\n+EXTRA\r\n"])
async def test_a_garbled_or_unasked_reply_drops_the_connection(answer: bytes) -> None:
    srv, port = await _scripted(answer)
    client = RespClient(f"redis://127.0.0.1:{port}/0")
    try:
        if answer.startswith(b"?"):
            with pytest.raises(rexc.InvalidResponse):
                await client.ping()
        else:
            assert await client.execute("SET", "a", "1") == b"OK"
            await asyncio.sleep(0.01)
            conn = client._conn
            assert conn is not None and isinstance(conn.failed, rexc.InvalidResponse)
    finally:
        await client.aclose()
        srv.close()


def test_ssl_options_follow_the_url() -> None:
    strict = RespClient("rediss://h:1/0")._ssl
    assert strict is not None and strict.verify_mode == ssl.CERT_REQUIRED and strict.check_hostname
    loose = RespClient("rediss://h:1/0?ssl_cert_reqs=none")._ssl
    assert loose is not None and loose.verify_mode == ssl.CERT_NONE and not loose.check_hostname
    assert RespClient("redis://h:1/0")._ssl is None


def test_works_on_uvloop(redis_server: RedisServer) -> None:
    # `ocx serve --server uvicorn` runs on uvloop, whose transports do not subclass asyncio's.
    uvloop = pytest.importorskip("uvloop")

    async def body() -> None:
        client = RespClient(redis_server.url)
        try:
            assert await client.transaction([("INCRBY", "u", 2), ("PEXPIRE", "u", 1000)]) == [2, 1]
            assert await client.get("u") == b"2"
        finally:
            await client.aclose()

    uvloop.run(body())


async def test_an_empty_command_is_refused_unsent(redis_server: RedisServer) -> None:
    client = RespClient(redis_server.url)
    try:
        assert await client.pipeline([]) == []
        assert await client.transaction([]) == []
        with pytest.raises(rexc.DataError):
            await client.pipeline([("SET", "a", "1"), ()])
        assert await client.get("a") is None  # nothing of it was sent
    finally:
        await client.aclose()


async def test_mutual_tls_with_a_client_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)  # its own CA: it also signs the client's certificate
    port = free_port()
    tls = ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    proc = _spawn(
        ["--port", "0", "--bind", "127.0.0.1", *tls, "--tls-ca-cert-file", str(cert)],
        lambda: _listening(port),
    )
    base = f"rediss://localhost:{port}/0?ssl_ca_certs={cert}"
    try:
        client = RespClient(f"{base}&ssl_certfile={cert}&ssl_keyfile={key}")
        assert await client.ping() is True
        await client.aclose()
        with pytest.raises(rexc.ConnectionError):
            await RespClient(base).ping()  # no client certificate: refused
    finally:
        _stop(proc)


async def test_a_refusal_sent_on_connect_is_a_connection_error_with_its_reason() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"-ERR max number of clients reached\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = RespClient(f"redis://127.0.0.1:{srv.sockets[0].getsockname()[1]}/0")
    try:
        with pytest.raises(rexc.ConnectionError, match="max number of clients"):
            await client.ping()
    finally:
        await client.aclose()
        srv.close()


async def test_a_user_and_password_fall_back_to_the_password_on_redis_5() -> None:
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1000):
            seen.append(data)
            if data.startswith(b"*3\r\n$4\r\nAUTH"):
                writer.write(b"-ERR wrong number of arguments for 'auth' command\r\n")
            else:
                writer.write(b"+OK\r\n" if b"AUTH" in data else b"+PONG\r\n")
            await writer.drain()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = RespClient(f"redis://default:pw@127.0.0.1:{srv.sockets[0].getsockname()[1]}/0")
    try:
        assert await client.ping() is True
        assert seen[:2] == [
            b"*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$2\r\npw\r\n",
            b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n",
        ]
    finally:
        await client.aclose()
        srv.close()


async def test_a_connect_nobody_waits_for_any_more_fails_quietly() -> None:
    """The hot path gives up after 50 ms; the connect it started must not log "exception was
    never retrieved" when it fails later (a Redis that hangs at AUTH)."""
    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepts, never answers

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    client = RespClient(f"redis://:pw@127.0.0.1:{port}/0", timeout_s=0.1)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await client.ping()
        task = client._connecting
        assert task is not None
        await asyncio.wait([task])  # done, its exception left unread by this test
        assert task.done() and not task.cancelled()
        del task
        client._connecting = None
        gc.collect()
        await asyncio.sleep(0)
        assert reported == []
    finally:
        loop.set_exception_handler(None)
        await client.aclose()
        for writer in held:
            writer.close()
        srv.close()
