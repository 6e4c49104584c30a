"""Redis down or slow (issue 16, PRODUCT §2.2): the workers keep routing on their own copy of
the routing state, then merge it back when Redis returns.

The test starts its own `redis-server` (no persistence, free port), so stopping it never
disturbs the machine's Redis; it runs in both CI passes (the database is whichever the pass
uses).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, start_server
from tests.ocxsite.deps import RedisServer
from tests.server.test_workers import KEY, spread_clients

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")


@pytest.fixture
def outage(tmp_path_factory: pytest.TempPathFactory, mock: Mock) -> Iterator[Any]:
    redis_server = RedisServer()
    redis_server.start()
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-redis-outage"),
        workers=2,
        # Loaded CI machines: 300 ms still shows the timeout path (a frozen Redis never answers).
        extra_env={"REDIS_URL": redis_server.url, "OCX_REDIS_TIMEOUT_MS": "300"},
    )
    try:
        for name, model in (("p1", "fa"), ("p2", "fb")):
            server.put_provider(
                name,
                {
                    "adapter": "openai-responses",
                    "baseUrl": mock.url + "/v1",
                    "apiKey": KEY,
                    "models": {model: {"contextWindow": 100000}},
                },
            )
        headers = {"Authorization": f"Bearer {server.create_key()}"}
        server.put_combo(
            "one",
            {"targets": [{"provider": "p1", "model": "fa"}, {"provider": "p2", "model": "fb"}]},
        )
        server.put_combo(
            "two",
            {"targets": [{"provider": "p2", "model": "fb"}, {"provider": "p1", "model": "fa"}]},
        )
        server.wait_synced()
        clients = spread_clients(server, headers, want=2)
        yield server, redis_server, clients
    finally:
        stop()
        redis_server.close()


def ask(client: Any, combo_id: str) -> httpx.Response:
    return client.ask(combo_id)


def shared_state(redis_server: RedisServer, server: Server, combo_id: str) -> dict[str, Any] | None:
    raw = redis_server.client().get(f"{server.env['OCX_STATE_KEY_PREFIX']}:combo:{combo_id}")
    return None if raw is None else json.loads(raw)


def readyz_all(server: Server, n: int = 6) -> list[dict[str, Any]]:
    """/readyz from fresh connections (spread over the workers)."""
    out = []
    for _ in range(n):
        with httpx.Client(base_url=server.url, timeout=10) as fresh:
            r = fresh.get("/readyz", headers={"Connection": "close"})
            assert r.status_code == 200, r.text
            out.append(r.json())
    return out


def degraded_gauge(server: Server) -> float:
    text = server.http.get("/metrics").text
    match = re.search(r"^ocx_redis_degraded(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    assert match, "ocx_redis_degraded missing from /metrics"
    return float(match.group(1))


def test_redis_stopped_then_restarted(outage: Any, mock: Mock) -> None:
    server, redis_server, clients = outage
    # Cool fa in combo "one" for 60 s while Redis is up, and let every worker see it.
    mock.script("fa", [{"status": 429, "headers": {"Retry-After": "60"}}])
    first = ask(clients[0], "one")
    assert first.status_code == 200, first.text
    assert first.headers["x-ocx-target"] == "p2/fb"
    for client in clients:
        assert ask(client, "one").headers["x-ocx-target"] == "p2/fb"
    assert mock.hits("fa") == 1
    cooled_until = shared_state(redis_server, server, "one")["cooldowns"]["p1/fa"]  # type: ignore[index]

    redis_server.stop()
    mock.reset()
    # A cooldown that starts during the outage, on worker 0: fb in combo "two".
    mock.script("fb", [{"status": 429, "headers": {"Retry-After": "60"}}])
    r = ask(clients[0], "two")
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p1/fa"
    started = time.monotonic()
    for i in range(20):
        r = ask(clients[i % len(clients)], "one")
        assert r.status_code == 200, r.text
        assert r.headers["x-ocx-target"] == "p2/fb"  # the cooldown known before keeps holding
    r = ask(clients[0], "two")
    assert r.headers["x-ocx-target"] == "p1/fa"  # and the one set during the outage
    assert mock.hits("fa") == 2  # only combo "two"'s requests: cooled fa never hammered
    assert time.monotonic() - started < 15  # no per-request wait on a dead Redis
    bodies = readyz_all(server)
    assert {b["status"] for b in bodies} == {"degraded"}
    assert all(b["redis"].startswith("error: ") and b["database"] == "ok" for b in bodies)
    assert any(b["routingState"]["mode"] == "local" for b in bodies)
    assert degraded_gauge(server) == 1
    assert any("redis unavailable" in line for line in server.output)

    # Redis comes back empty (no persistence): the workers write their states back.
    redis_server.start()
    deadline = time.monotonic() + 30
    while True:
        one, two = (
            shared_state(redis_server, server, "one"),
            shared_state(redis_server, server, "two"),
        )
        if one and two and all(b["status"] == "ok" for b in readyz_all(server, 4)):
            break
        assert time.monotonic() < deadline, f"no resync: one={one} two={two}"
        time.sleep(0.1)
    assert two["cooldowns"]["p2/fb"] > int(time.time() * 1000) + 30_000
    assert one["cooldowns"]["p1/fa"] == cooled_until
    assert any("redis available again" in line for line in server.output)
    assert degraded_gauge(server) == 0
    for client in clients:  # shared mode again, with the merged cooldowns
        assert ask(client, "two").headers["x-ocx-target"] == "p1/fa"


def test_frozen_redis_costs_a_timeout_once_not_per_request(outage: Any, mock: Mock) -> None:
    server, redis_server, clients = outage
    assert ask(clients[0], "one").status_code == 200
    redis_server.pause()
    try:
        started = time.monotonic()
        for i in range(30):
            r = ask(clients[i % len(clients)], "one")
            assert r.status_code == 200, r.text
        # 30 requests over 2 workers: at most a few timeouts of 0.3 s, not 30 of them.
        assert time.monotonic() - started < 8
        assert {b["status"] for b in readyz_all(server, 4)} == {"degraded"}
    finally:
        redis_server.resume()
    deadline = time.monotonic() + 30
    while not all(b["status"] == "ok" for b in readyz_all(server, 4)):
        assert time.monotonic() < deadline, "never left degraded mode"
        time.sleep(0.1)


def test_expired_cooldown_gets_one_probe_per_worker_during_the_outage(
    outage: Any, mock: Mock
) -> None:
    server, redis_server, clients = outage
    mock.script("fa", [{"status": 429, "headers": {"Retry-After": "2"}}])
    assert ask(clients[0], "one").headers["x-ocx-target"] == "p2/fb"
    for client in clients:  # every worker has seen the cooldown
        assert ask(client, "one").headers["x-ocx-target"] == "p2/fb"
    until = shared_state(redis_server, server, "one")["cooldowns"]["p1/fa"]  # type: ignore[index]
    redis_server.stop()
    mock.reset()
    # fa is still broken: each probe fails and cools it again for a minute.
    mock.script("fa", [{"status": 429, "headers": {"Retry-After": "60"}}] * 10)
    time.sleep(max(0.0, until / 1000 - time.time()) + 0.2)
    for i in range(24):
        r = ask(clients[i % len(clients)], "one")
        assert r.status_code == 200, r.text
        assert r.headers["x-ocx-target"] == "p2/fb"
    assert 1 <= mock.hits("fa") <= len(clients)  # at most one probe per worker, not 24


def test_a_token_budget_read_in_the_gates_round_trip_holds_through_the_outage(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, mock: Mock
) -> None:
    """With Redis up a budgeted request reads its counter in the quota gate's round trip, and
    that read is where the worker's copy starts when Redis goes out: spending another worker
    reported there keeps the budget used up through the outage."""
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-redis-outage-budget"),
        extra_env={"REDIS_URL": redis_server.url, "OCX_REDIS_TIMEOUT_MS": "300"},
    )
    try:
        server.put_provider(
            "pb",
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": KEY,
                "models": {"bm": {"contextWindow": 100000}},
            },
        )
        server.wait_synced()
        headers = {
            "Authorization": f"Bearer {server.create_key(budget={'tokens': 250, 'period': 'day'})}"
        }
        mock.script("bm", [], then={"usage": {"input_tokens": 60, "output_tokens": 40}})
        body = {"model": "pb/bm", "input": "hello"}
        for _ in range(2):  # 200 tokens, counted in Redis
            assert server.http.post("/v1/responses", json=body, headers=headers).status_code == 200
        counters = [
            k
            for k in redis_server.client().keys("*")
            if b":budget:" in k and b":tokens:" in k and not k.endswith(b":held")
        ]
        assert [int(redis_server.client().get(k)) for k in counters] == [200]

        # Another worker spends 100 more: seen by the next request's read, which refuses.
        redis_server.client().incrby(counters[0], 100)
        r = server.http.post("/v1/responses", json=body, headers=headers)
        assert r.status_code == 429, r.text
        assert "has used 300 tokens" in r.json()["error"]["message"]

        redis_server.stop()
        for _ in range(2):  # the worker's copy holds the 300 that read saw
            r = server.http.post("/v1/responses", json=body, headers=headers)
            assert r.status_code == 429, r.text
            assert "has used 300 tokens" in r.json()["error"]["message"]
        assert mock.hits("bm") == 2
        assert server.http.get("/readyz").json()["routingState"]["mode"] == "local"
    finally:
        stop()
