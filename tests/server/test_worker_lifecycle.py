"""Workers dying, stopping and reloading (issue 16): `ocx serve` restarts a killed worker,
SIGTERM lets running streams finish within OCX_SHUTDOWN_GRACE_S and ends the rest with an
in-band error, SIGHUP restarts the workers one at a time without a failed request.

Several workers share state through a `redis-server` the test starts itself (free port), so
these tests run in both CI passes.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events, start_server
from tests.ocxsite.deps import RedisServer

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")
KEY = "sk-test-lifecycle-aaaaaaaaaaaaaaaaaaaa"


def worker_pids(server: Server) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server.proc.pid and b"mock_upstream" not in cmdline:
            pids.add(int(entry.name))
    return pids


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def configure(server: Server, mock: Mock) -> dict[str, str]:
    server.put_provider(
        "p1",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": KEY,
            "models": {"fa": {"contextWindow": 100000}},
        },
    )
    server.put_combo("main", {"targets": [{"provider": "p1", "model": "fa"}]})
    headers = {"Authorization": f"Bearer {server.create_key()}"}
    server.wait_synced()
    return headers


@pytest.fixture
def redis_url() -> Iterator[str]:
    redis_server = RedisServer()
    redis_server.start()
    try:
        yield redis_server.url
    finally:
        redis_server.close()


def serve(tmp: Path, redis_url: str, workers: int, grace: str = "10") -> tuple[Server, Any]:
    return start_server(
        tmp,
        workers=workers,
        extra_env={"REDIS_URL": redis_url, "OCX_SHUTDOWN_GRACE_S": grace},
    )


def stream(url: str, headers: dict[str, str], out: dict[str, Any]) -> None:
    """One streamed request; `out` gets the status, the body read so far, and any error."""
    body = {"model": "combo/main", "input": "hi", "stream": True}
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            with client.stream("POST", "/v1/responses", json=body, headers=headers) as r:
                out["status"] = r.status_code
                out["body"] = ""
                for chunk in r.iter_text():
                    out["body"] += chunk
                    out.setdefault("first_byte", time.monotonic())
    except httpx.HTTPError as exc:
        out["error"] = type(exc).__name__


def start_stream(
    server: Server, headers: dict[str, str], mock: Mock, deltas: int
) -> tuple[threading.Thread, dict[str, Any]]:
    """A stream of `deltas` events 100 ms apart, running in a thread once its first byte came."""
    mock.script("fa", [{"deltas": deltas, "delta_ms": 100}])
    out: dict[str, Any] = {}
    thread = threading.Thread(target=stream, args=(server.url, headers, out))
    thread.start()
    wait_for(lambda: "first_byte" in out, 30, "the stream did not start")
    return thread, out


def test_killed_worker_is_restarted_and_the_others_keep_serving(
    tmp_path: Path, redis_url: str, mock: Mock
) -> None:
    server, stop = serve(tmp_path, redis_url, workers=2)
    try:
        headers = configure(server, mock)
        before = worker_pids(server)
        assert len(before) == 2
        victim = sorted(before)[0]
        os.kill(victim, signal.SIGKILL)
        failures = 0
        for _ in range(20):  # new connections only ever reach the living worker
            with httpx.Client(base_url=server.url, timeout=30) as fresh:
                r = fresh.post(
                    "/v1/responses", json={"model": "combo/main", "input": "hi"}, headers=headers
                )
                failures += r.status_code != 200
        assert failures == 0
        wait_for(
            lambda: len(worker_pids(server)) == 2 and victim not in worker_pids(server),
            30,
            "the killed worker was not replaced",
        )
        assert any(f"worker {victim} ended (signal 9)" in line for line in server.output)
        assert server.proc.poll() is None
        server.wait_synced()
    finally:
        stop()


def test_killed_worker_cuts_its_stream(tmp_path: Path, redis_url: str, mock: Mock) -> None:
    server, stop = serve(tmp_path, redis_url, workers=1)
    try:
        headers = configure(server, mock)
        mock.script("fa", [{"deltas": 100, "delta_ms": 50}])
        out: dict[str, Any] = {}
        thread = threading.Thread(target=stream, args=(server.url, headers, out))
        thread.start()
        wait_for(lambda: "first_byte" in out, 30, "the stream did not start")
        (pid,) = worker_pids(server)
        os.kill(pid, signal.SIGKILL)
        thread.join(30)
        # A cut connection, never a clean end: no terminal event reached the client.
        assert out.get("error") in ("RemoteProtocolError", "ReadError"), out
        assert "response.completed" not in out["body"]
        wait_for(lambda: len(worker_pids(server) - {pid}) == 1, 30, "no new worker")
    finally:
        stop()


def test_sigterm_lets_a_running_stream_finish(tmp_path: Path, redis_url: str, mock: Mock) -> None:
    server, stop = serve(tmp_path, redis_url, workers=1, grace="20")
    try:
        headers = configure(server, mock)
        thread, out = start_stream(server, headers, mock, 20)  # about 2 s
        server.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert out.get("status") == 200 and "error" not in out, out
        events = [e for e, _ in sse_events(out["body"])]
        assert events[-1] == "response.completed"
        server.proc.wait(30)
        assert server.proc.returncode == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(server.url + "/healthz", timeout=2)
    finally:
        stop()


def test_sigterm_ends_a_stream_past_the_grace_with_an_error(
    tmp_path: Path, redis_url: str, mock: Mock
) -> None:
    server, stop = serve(tmp_path, redis_url, workers=1, grace="1")
    try:
        headers = configure(server, mock)
        thread, out = start_stream(server, headers, mock, 200)  # 20 s: longer than the grace
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert "error" not in out, out  # ended in-band, not cut
        events = sse_events(out["body"])
        assert events[-1][0] == "response.failed"
        assert events[-1][1]["response"]["error"]["code"] == "ocx_shutting_down"
        server.proc.wait(30)
        assert time.monotonic() - signalled < 10
    finally:
        stop()


def test_a_draining_worker_answers_with_connection_close_and_closes_idle_connections(
    tmp_path: Path, redis_url: str, mock: Mock
) -> None:
    server, stop = serve(tmp_path, redis_url, workers=1, grace="20")
    try:
        headers = configure(server, mock)
        body = {"model": "combo/main", "input": "hi"}
        with (
            httpx.Client(base_url=server.url, timeout=30) as keepalive,
            httpx.Client(base_url=server.url, timeout=30) as idle,
        ):
            first = keepalive.post("/v1/responses", json=body, headers=headers)
            assert first.status_code == 200 and "connection" not in first.headers
            assert idle.post("/v1/responses", json=body, headers=headers).status_code == 200
            thread, out = start_stream(server, headers, mock, 30)  # about 3 s
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            wait_for(
                lambda: any("shutting down: no new connections" in x for x in server.output),
                30,
                "the worker did not start draining",
            )
            # Same keep-alive connection, mid-drain: served, and told to go elsewhere next.
            during = keepalive.post("/v1/responses", json=body, headers=headers)
            assert during.status_code == 200
            assert during.headers["connection"] == "close"
            thread.join(30)
            assert out.get("status") == 200 and "error" not in out, out
            assert sse_events(out["body"])[-1][0] == "response.completed"
            # The idle connection did not hold the worker until the 20 s grace.
            server.proc.wait(15)
            assert time.monotonic() - signalled < 10
    finally:
        stop()


def test_drain_waits_for_the_open_connections_on_its_own_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from server import lifecycle

    monkeypatch.setattr(lifecycle, "_stopping", False)
    monkeypatch.setenv("OCX_SHUTDOWN_GRACE_S", "5")
    seen: list[float] = []
    events: list[str] = []

    async def run() -> tuple[float, float]:
        loop = asyncio.get_running_loop()

        def connections(now: float) -> int:
            seen.append(now)
            return 0 if len(seen) >= 4 else 1

        start = loop.time()
        await lifecycle.drain(
            lambda: events.append("stop_listening"),
            lambda: events.append("stop"),
            connections=connections,
        )
        return start, loop.time()

    start, end = asyncio.run(run())
    assert events == ["stop_listening", "stop"]
    assert len(seen) == 4 and seen == sorted(seen)
    assert start <= seen[0] and seen[-1] <= end < start + 2


class FakeTransport:
    def __init__(self) -> None:
        self.disconnected = False
        self.disconnecting = False
        self.protocol: Any = None


class FakeChannel:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.requests: list[Any] = []
        self._buffer = b""
        self._dataBuffer: list[bytes] = []
        self.persistent = True
        self.closed_at: float | None = None
        self.now = 0.0

    def loseConnection(self) -> None:  # noqa: N802 - Twisted's name
        self.closed_at = self.now
        self.transport.disconnecting = True


class FakeGeneric:
    def __init__(self) -> None:
        self._channel = FakeChannel()
        self._channel.transport.protocol = self


class FakeRequest:
    def __init__(self, started: bool) -> None:
        self.startedWriting = started
        self.headers: dict[bytes, list[bytes]] = {}

    @property
    def responseHeaders(self) -> Any:  # noqa: N802 - Twisted's name
        outer = self

        class Headers:
            def setRawHeaders(self, name: bytes, values: list[bytes]) -> None:  # noqa: N802
                outer.headers[name.lower()] = values

        return Headers()


def test_a_connection_is_closed_after_it_has_been_idle_for_the_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle time counts from when a connection went idle: a stream that began before the drain
    and ends later leaves its keep-alive connection open for the whole linger after it."""
    from server import daphne_main, lifecycle

    monkeypatch.setattr(lifecycle, "IDLE_LINGER_S", 1.0)
    monkeypatch.setattr(daphne_main, "_channels", __import__("weakref").WeakSet())
    monkeypatch.setattr(daphne_main, "_idle_since", __import__("weakref").WeakKeyDictionary())
    idle, streaming, arriving, upgraded = FakeGeneric(), FakeGeneric(), FakeGeneric(), FakeGeneric()
    stream = FakeRequest(started=True)
    streaming._channel.requests = [stream]
    arriving._channel._buffer = b"POST /v1/respo"  # a request line still arriving
    upgraded._channel.transport.protocol = object()  # a WebSocket now
    for g in (idle, streaming, arriving, upgraded):
        daphne_main._channels.add(g)

    def at(now: float) -> int:
        for g in (idle, streaming, arriving, upgraded):
            g._channel.now = now
        return daphne_main._connections(now)

    assert at(0.0) == 3  # the WebSocket is not waited for
    assert at(0.95) == 3 and idle._channel.closed_at is None
    at(1.0)
    assert idle._channel.closed_at == 1.0
    assert streaming._channel.persistent  # its answer had started: no header to add
    streaming._channel.requests = []  # the stream ends at 1.5
    arriving._channel._buffer = b""
    fresh = FakeRequest(started=False)
    arriving._channel.requests = [fresh]  # ... and the arriving request was parsed
    at(1.5)
    assert fresh.headers == {b"connection": [b"close"]}
    assert not arriving._channel.persistent
    at(2.45)
    assert streaming._channel.closed_at is None  # idle since 1.5 only
    at(2.5)
    assert streaming._channel.closed_at == 2.5
    assert arriving._channel.closed_at is None  # busy: closes itself after its answer
    assert upgraded._channel.closed_at is None


def test_sighup_restarts_workers_without_a_failed_request(
    tmp_path: Path, redis_url: str, mock: Mock
) -> None:
    server, stop = serve(tmp_path, redis_url, workers=2)
    try:
        headers = configure(server, mock)
        before = worker_pids(server)
        results: list[int | str] = []
        done = threading.Event()

        def load() -> None:
            body = {"model": "combo/main", "input": "hi"}
            with httpx.Client(base_url=server.url, timeout=30) as keepalive:
                while not done.is_set():
                    try:
                        with httpx.Client(base_url=server.url, timeout=30) as fresh:
                            results.append(
                                fresh.post("/v1/responses", json=body, headers=headers).status_code
                            )
                        results.append(
                            keepalive.post("/v1/responses", json=body, headers=headers).status_code
                        )
                    except httpx.HTTPError as exc:
                        results.append(type(exc).__name__)

        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: len(results) > 10, 30, "no traffic")
        server.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: any("every worker restarted" in line for line in server.output),
            90,
            "the reload did not finish",
        )
        wait_for(lambda: not (worker_pids(server) & before), 60, "old workers still running")
        count = len(results)
        wait_for(lambda: len(results) > count + 10, 30, "no traffic after the reload")
        done.set()
        for t in threads:
            t.join(30)
        assert len(worker_pids(server)) == 2
        bad = [r for r in results if r != 200]
        assert bad == [], f"{len(bad)} of {len(results)} failed: {bad[:5]}"
    finally:
        done.set()
        stop()


def test_a_request_runs_until_its_charge_and_log_entry_are_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drain waits for the `finally` of a request too: its budget charge (a Redis call) and
    its request-log entry, not only the handler."""
    import asyncio

    from gateway.proxy import ProxyApp
    from server import lifecycle

    seen: list[tuple[str, int]] = []
    app = ProxyApp(runtime=object())  # type: ignore[arg-type]

    async def handle(scope: Any, receive: Any, exchange: Any) -> None:
        exchange.key = object()
        exchange.logged = True

    async def charge(exchange: Any) -> None:
        await asyncio.sleep(0)
        seen.append(("charge", lifecycle.inflight()))

    def log_entry(exchange: Any, outcome: str, elapsed: float) -> None:
        seen.append(("log", lifecycle.inflight()))

    monkeypatch.setattr(app, "_handle", handle)
    monkeypatch.setattr(app, "_charge", charge)
    monkeypatch.setattr(app, "_log", log_entry)

    async def nothing(*args: Any) -> Any:
        return None

    asyncio.run(app({"type": "http"}, nothing, nothing))
    assert seen == [("charge", 1), ("log", 1)]
    assert lifecycle.inflight() == 0
