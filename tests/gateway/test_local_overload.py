"""ocx's own limits are never an upstream fault (issue #24), end to end through a real
`ocx serve` and `ocx mock-upstream`: a full upstream pool or a worker out of file descriptors
gives 503 `ocx_overloaded` with Retry-After, cools nothing, hops nothing against the target,
is counted in `/metrics` and logged as "local: …"; and a team's 200 concurrent long streams
through one worker with default settings all complete."""

from __future__ import annotations

import asyncio
import json
import re
import resource
import select
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events, start_server
from tests.ocxsite.test_faults import logged

KEY = "sk-test-overload-aaaaaaaaaaaaaaaaaaaa"
# Long enough that nothing but the pool wait ends within a test: the held stream never idles
# out (which would be an upstream fault), and the pool wait is bounded by firstByteMs.
TIMEOUTS = {"connectMs": 2000, "firstByteMs": 1000, "idleMs": 120_000, "totalMs": 300_000}
HELD = {"stall_after_events": 5}  # stalls until the client leaves


def provider(mock: Mock, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "adapter": "openai-responses",
        "baseUrl": mock.url + "/v1",
        "apiKey": KEY,
        "timeouts": TIMEOUTS,
        "models": {model: {"contextWindow": 100000}},
        **extra,
    }


def setup(
    server: Server, mock: Mock, targets: list[tuple[str, str, dict[str, Any]]]
) -> tuple[str, dict[str, str]]:
    """Providers and a failover combo over `targets` (provider, model, extra provider fields)."""
    key = server.create_key(user="overload")
    for name, model, extra in targets:
        server.put_provider(name, provider(mock, model, **extra))
    combo_id = "o" + uuid.uuid4().hex[:8]
    server.put_combo(combo_id, {"targets": [{"provider": p, "model": m} for p, m, _ in targets]})
    server.http.get("/v1/models")
    server.wait_synced()
    return combo_id, {"Authorization": f"Bearer {key}"}


def body(combo_id: str, stream: bool = True) -> dict[str, Any]:
    return {"model": f"combo/{combo_id}", "input": "hi", "stream": stream}


def overloads(server: Server, cause: str) -> float:
    text = server.http.get("/metrics").text
    found = re.search(rf'^ocx_local_overload_total\{{cause="{cause}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def target_states(server: Server, combo_id: str) -> list[str]:
    r = server.api.get("/api/status", params={"combo": combo_id})
    assert r.status_code == 200, r.text
    return [t["state"] for t in r.json()["combos"][0]["targets"]]


def wait_for(done: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def assert_overloaded(r: httpx.Response, cause: str) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "5"
    error = r.json()["error"]
    assert error["code"] == "ocx_overloaded"
    assert error["type"] == "server_error"
    assert cause in error["message"]


def test_a_full_pool_is_a_local_overload_that_cools_nothing(server: Server, mock: Mock) -> None:
    combo_id, headers = setup(server, mock, [("tiny", "t1", {"maxConnections": 1})])
    mock.script("t1", [HELD])
    before = overloads(server, "pool_full")
    with server.http.stream("POST", "/v1/responses", json=body(combo_id), headers=headers) as a:
        # The only connection of the pool is held by a stream that goes on for as long as it
        # is read.
        assert a.status_code == 200
        held_id = a.headers["x-ocx-request-id"]
        wait_for(lambda: mock.hits("t1") == 1, "the held stream never reached the mock")
        b = server.http.post("/v1/responses", json=body(combo_id), headers=headers)
        assert_overloaded(b, "pool_full")
    # Nothing reached the upstream for the second request.
    assert mock.hits("t1") == 1
    assert overloads(server, "pool_full") == before + 1
    entry = logged(server, b.headers["x-ocx-request-id"])
    assert entry["status"] == 503
    assert entry["outcome"] == "ocx_overloaded"
    assert entry["attempts"] == [
        {
            "target": "tiny/t1",
            "status": None,
            "outcome": "local_overload",
            "reason": "local: pool_full",
            "cooledUntil": None,
            "ms": entry["attempts"][0]["ms"],
        }
    ]
    assert any("local overload (pool_full)" in line for line in server.output)
    # The held stream's client left: once its entry is written its connection is back.
    logged(server, held_id)
    assert target_states(server, combo_id) == ["available"]
    c = server.http.post("/v1/responses", json=body(combo_id, stream=False), headers=headers)
    assert c.status_code == 200, c.text
    assert (c.headers["x-ocx-target"], c.headers["x-ocx-attempts"]) == ("tiny/t1", "1")
    assert mock.hits("t1") == 2
    assert target_states(server, combo_id) == ["available"]


def test_a_full_pool_tries_the_next_target_and_leaves_its_own_eligible(
    server: Server, mock: Mock
) -> None:
    # Another provider has its own pool: the request is served there, and the full one stays
    # first in line (a cooled target would send the next request to the fallback).
    combo_id, headers = setup(
        server, mock, [("tiny", "t2", {"maxConnections": 1}), ("roomy", "r2", {})]
    )
    mock.script("t2", [HELD])
    with server.http.stream("POST", "/v1/responses", json=body(combo_id), headers=headers) as a:
        assert a.status_code == 200
        held_id = a.headers["x-ocx-request-id"]
        wait_for(lambda: mock.hits("t2") == 1, "the held stream never reached the mock")
        b = server.http.post("/v1/responses", json=body(combo_id, stream=False), headers=headers)
        assert b.status_code == 200, b.text
        assert (b.headers["x-ocx-target"], b.headers["x-ocx-attempts"]) == ("roomy/r2", "2")
    entry = logged(server, b.headers["x-ocx-request-id"])
    assert [
        (a["target"], a["outcome"], a["reason"], a["cooledUntil"]) for a in entry["attempts"]
    ] == [
        ("tiny/t2", "local_overload", "local: pool_full", None),
        ("roomy/r2", "served", "", None),
    ]
    logged(server, held_id)
    assert target_states(server, combo_id) == ["available", "available"]
    c = server.http.post("/v1/responses", json=body(combo_id, stream=False), headers=headers)
    assert (c.status_code, c.headers["x-ocx-target"]) == (200, "tiny/t2")
    assert (mock.hits("t2"), mock.hits("r2")) == (2, 1)


# ---------------------------------------------------------------------------------------------
# Out of file descriptors

FD_LIMIT = 160


def _low_fd_limit() -> None:
    # A hard limit `ocx serve` cannot pass; it raises the soft limit to it.
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT // 2, FD_LIMIT))


@pytest.fixture
def fd_server(tmp_path: Path) -> Iterator[Server]:
    server, stop = start_server(tmp_path, preexec_fn=_low_fd_limit)
    try:
        yield server
    finally:
        stop()


def _raw_request(url: str, payload: dict[str, Any], headers: dict[str, str]) -> bytes:
    data = json.dumps(payload).encode()
    host = urlsplit(url).netloc
    lines = ["POST /v1/responses HTTP/1.1", f"host: {host}", "content-type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"content-length: {len(data)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def _answered(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    found = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    length = int(found.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return int(lines[0].split(" ")[1]), found, rest[:length]


def test_out_of_file_descriptors_is_a_local_overload(fd_server: Server, mock: Mock) -> None:
    server = fd_server
    raised = f"ocx open-files limit: {FD_LIMIT} (raised from {FD_LIMIT // 2})"
    assert any(raised in line for line in server.output)
    assert any(
        f"open-files limit: {FD_LIMIT}" in line and "worker" in line for line in server.output
    )
    combo_id, headers = setup(server, mock, [("fds", "f1", {})])
    mock.script("f1", [], then=HELD)
    # The probe's connection is accepted now, while the worker still has descriptors: its
    # request later needs only the upstream socket.
    probe = _connect(server.url)
    probe.sendall(f"GET /healthz HTTP/1.1\r\nhost: {urlsplit(server.url).netloc}\r\n\r\n".encode())
    assert _read_answer(probe)[0] == 200
    held: list[socket.socket] = []
    try:
        # Held streams (two descriptors each in the worker) until one is refused: at accept
        # (the connection is closed) or at its upstream socket (503 ocx_overloaded).
        while True:
            assert len(held) < FD_LIMIT, "the worker never ran out of descriptors"
            sock = _connect(server.url)
            held.append(sock)
            sock.sendall(_raw_request(server.url, body(combo_id), headers))
            count = len(held)
            wait_for(
                lambda: mock.hits("f1") >= count or _answered(sock),  # noqa: B023
                "a held stream neither reached the mock nor was answered",
            )
            if mock.hits("f1") < count:
                break
        # Out of descriptors: the probe's request cannot open its upstream socket.
        probe.sendall(_raw_request(server.url, body(combo_id), headers))
        status, answer_headers, raw = _read_answer(probe)
        assert status == 503, raw
        assert answer_headers["retry-after"] == "5"
        assert json.loads(raw)["error"]["code"] == "ocx_overloaded"
        assert "fd_limit" in json.loads(raw)["error"]["message"]
        probe_id = answer_headers["x-ocx-request-id"]
    finally:
        for sock in held:
            sock.close()
        probe.close()
    reached = mock.hits("f1")
    assert any("local overload (fd_limit)" in line for line in server.output)
    entry = logged(server, probe_id)
    assert [(a["outcome"], a["reason"], a["cooledUntil"]) for a in entry["attempts"]] == [
        ("local_overload", "local: fd_limit", None)
    ]
    assert overloads(server, "fd_limit") >= 1
    # The streams' clients are gone: the worker gets its descriptors back, and the target
    # was never cooled.
    mock.script("f1", [], then={})

    def served() -> bool:
        r = server.http.post("/v1/responses", json=body(combo_id, stream=False), headers=headers)
        return r.status_code == 200

    wait_for(served, "the target never served again")
    assert target_states(server, combo_id) == ["available"]
    assert mock.hits("f1") > reached


# ---------------------------------------------------------------------------------------------
# A team's concurrency

STREAMS = 200


async def _stream_all(
    url: str, combo_id: str, headers: dict[str, str]
) -> list[tuple[int, str, bytes, float, float]]:
    limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=0)
    timeout = httpx.Timeout(120, connect=60, pool=120)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def one() -> tuple[int, str, bytes, float, float]:
            async with client.stream(
                "POST", "/v1/responses", json=body(combo_id), headers=headers
            ) as r:
                started = time.monotonic()  # the response head: the stream is committed
                data = await r.aread()
                return (
                    r.status_code,
                    r.headers.get("x-ocx-target", ""),
                    data,
                    started,
                    time.monotonic(),
                )

        return await asyncio.gather(*(one() for _ in range(STREAMS)))


def test_two_hundred_long_streams_through_one_worker_all_complete(
    server: Server, mock: Mock
) -> None:
    # Default pool settings: the old pool of 64 connections made stream 65 wait for one of the
    # first 64 to end (and after connectMs gave it 502 and cooled the target).
    key = server.create_key(user="team")
    for name, model in (("team1", "l1"), ("team2", "l2")):
        server.put_provider(
            name,
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": KEY,
                "models": {model: {"contextWindow": 100000}},
            },
        )
    combo_id = "t" + uuid.uuid4().hex[:8]
    targets = [{"provider": "team1", "model": "l1"}, {"provider": "team2", "model": "l2"}]
    server.put_combo(combo_id, {"targets": targets})
    server.wait_synced()
    # 20 deltas 20 ms apart, with a pause after the first one that leaves every stream time to
    # start before any ends, on a loaded machine too.
    paced = {"deltas": 20, "delta_ms": 20, "stall_after_events": 5, "stall_ms": 3000}
    mock.script("l1", [], then=paced)
    headers = {"Authorization": f"Bearer {key}"}
    results = asyncio.run(_stream_all(server.url, combo_id, headers))
    assert [(status, target) for status, target, *_ in results] == [(200, "team1/l1")] * STREAMS
    for _, _, data, _, _ in results:
        events = sse_events(data.decode())
        kinds = [e for e, _ in events]
        assert kinds.count("response.output_text.delta") == 20
        assert kinds[-1] == "response.completed"
        # Every delta once and in order (most are written from the upstream connection's
        # callback under Daphne, `server.body_now`): together they are the completed text.
        text = "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
        [message] = events[-1][1]["response"]["output"]
        assert text == message["content"][0]["text"]
    # All 200 were streaming at once: every one had started before the first one ended.
    assert max(r[3] for r in results) < min(r[4] for r in results)
    assert mock.hits("l1") == STREAMS and mock.hits("l2") == 0
    assert target_states(server, combo_id) == ["available", "available"]
