"""Budgets enforced end to end (PRODUCT §9.5, issue 15) against a real `ocx serve` and
`ocx mock-upstream`: token budgets of keys and users, quota-window budgets from rising
`x-codex-primary-used-percent` headers, a running request never cut, every worker refusing once
a budget is used up (PostgreSQL + Redis, 3 workers), and the 80 %/100 % events."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import shlex
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async

from gateway.runtime import Runtime
from tests.conftest import Mock, Server, sse_events, start_server
from tests.gateway.test_events_ws import communicator, receive_matching, session_cookie
from tests.ocxsite.test_security import manage
from tests.server.test_workers import REDIS_URL, needs_redis, spread_clients
from usage.budgets import ScopedBudget, TokenBudget
from usage.models import BudgetEvent

USAGE = {"input_tokens": 60, "output_tokens": 40}  # 100 tokens per answer
API_KEY = "sk-test-budget-aaaaaaaaaaaaaaaaaaaaaaaa"


def setup_provider(server: Server, mock: Mock, name: str, *models: str) -> None:
    server.put_provider(
        name,
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": API_KEY,
            "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
            "models": {m: {"contextWindow": 100000} for m in models},
        },
    )
    server.http.get("/v1/models")
    server.wait_synced()


def new_key(server: Server, user: str, **extra: Any) -> tuple[dict[str, Any], dict[str, str]]:
    r = server.api.post("/api/keys", json={"user": user, **extra})
    assert r.status_code == 201, r.text
    created = r.json()
    headers = {"Authorization": f"Bearer {created['key']}"}
    deadline = time.monotonic() + 5
    while server.http.get("/v1/models", headers=headers).status_code == 401:
        assert time.monotonic() < deadline, "the new client key was not picked up"
        time.sleep(0.02)
    return created, headers


def ask(http: httpx.Client, model: str, headers: dict[str, str], **extra: Any) -> httpx.Response:
    body = {"model": model, "input": "hello", **extra}
    return http.post("/v1/responses", json=body, headers=headers)


def midnight_utc() -> int:
    """Epoch seconds of the next UTC midnight (the default OCX_TIME_ZONE's day end); a test
    running across midnight waits until the new day has begun."""
    now = time.time()
    if 86400 - now % 86400 < 20:
        time.sleep(86400 - now % 86400 + 0.5)
        now = time.time()
    return int(now // 86400 + 1) * 86400


class SecondsTo:
    """Equal to the whole seconds left until `reset_s` as a server answering now counts them
    (`resets_in_seconds`: the request ran between this object's making and its comparison)."""

    def __init__(self, reset_s: int) -> None:
        self.reset_s = reset_s
        self.latest = reset_s - int(time.time())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and self.latest - 120 <= other <= self.latest

    def __repr__(self) -> str:
        return f"<seconds to {self.reset_s}: at most {self.latest}>"


def refused_body(owner: str, budget: str, used: str, reset_s: int) -> dict[str, Any]:
    """A spent budget's 429: a usage limit to Codex (PRODUCT §9.10), `budget_exceeded` kept."""
    reset = dt.datetime.fromtimestamp(reset_s, dt.UTC).isoformat()
    return {
        "error": {
            "type": "usage_limit_reached",
            "code": "budget_exceeded",
            "message": f"Budget exceeded: {owner} may use {budget} and has used {used}; "
            f"it resets at {reset}",
            "resets_at": reset_s,
            "resets_in_seconds": SecondsTo(reset_s),
        }
    }


def wait_for_output(server: Server, text: str, timeout: float = 5) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(server.output):
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no output line with {text!r}")


# --- one worker (SQLite, or PostgreSQL + Redis in the second pass) --------------------------------


def test_token_budget_admits_until_used_up_then_429(server: Server, mock: Mock) -> None:
    setup_provider(server, mock, "bt", "bm")
    reset = midnight_utc()
    created, headers = new_key(server, "budget-dev", budget={"tokens": 250, "period": "day"})
    mock.script("bm", [], then={"usage": USAGE})

    assert ask(server.http, "bt/bm", headers).status_code == 200  # 100
    streamed = ask(server.http, "bt/bm", headers, stream=True)  # 200: past 80 %
    assert streamed.status_code == 200
    assert sse_events(streamed.text)[-1][0] == "response.completed"
    chat = {"model": "bt/bm", "messages": [{"role": "user", "content": "hello"}]}
    r = server.http.post("/v1/chat/completions", json=chat, headers=headers)
    assert r.status_code == 200  # 200 < 250: admitted → 300 (either inbound API counts)
    assert r.json()["usage"]["total_tokens"] == 100
    assert mock.hits("bm") == 3

    before = time.time()
    r = ask(server.http, "bt/bm", headers)
    assert r.status_code == 429
    owner = f"key {created['prefix']}… of budget-dev"
    body = refused_body(owner, "250 tokens per day", "300 tokens", reset)
    assert r.json() == body
    # Codex shows it (ASCII: the prefix's ellipsis spelled out) and stops at once.
    assert r.headers["x-codex-promo-message"] == body["error"]["message"].replace("…", "...")
    assert r.headers["x-should-retry"] == "false"
    assert r.headers["x-ocx-budget-limit"] == "250"
    assert r.headers["x-ocx-budget-remaining"] == "0"
    assert r.headers["x-ocx-budget-reset"] == str(reset)
    assert 0 < int(r.headers["retry-after"]) <= math.ceil(reset - before)
    assert r.headers["x-ocx-request-id"]
    assert mock.hits("bm") == 3  # the refused request reached no upstream
    # The 80 % and 100 % events were logged once each.
    line = wait_for_output(server, f"budget 100%: {owner} has used 100%")
    assert "(300 of 250)" in line
    wait_for_output(server, f"budget 80%: {owner} has used 80%")
    assert sum(f"budget 100%: {owner}" in x for x in server.output) == 1

    # Raising the budget (PATCH) lets the key through again on the next key-map load.
    r = server.api.patch(
        f"/api/keys/{created['id']}", json={"budget": {"tokens": 1000, "period": "day"}}
    )
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 5
    while ask(server.http, "bt/bm", headers).status_code == 429:
        assert time.monotonic() < deadline, "the raised budget was not picked up"
        time.sleep(0.05)


def test_a_running_request_is_never_cut(server: Server, mock: Mock) -> None:
    setup_provider(server, mock, "br", "slow", "fast")
    _, headers = new_key(server, "budget-running", budget={"tokens": 150, "period": "day"})
    mock.script("slow", [{"usage": USAGE, "deltas": 6, "delta_ms": 250}])
    mock.script("fast", [], then={"usage": USAGE})
    first_byte = threading.Event()
    result: dict[str, Any] = {}

    def slow() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            body = {"model": "br/slow", "input": "hello", "stream": True}
            with http.stream("POST", "/v1/responses", json=body, headers=headers) as r:
                result["status"] = r.status_code
                chunks = []
                for chunk in r.iter_text():
                    chunks.append(chunk)
                    first_byte.set()
                result["text"] = "".join(chunks)

    thread = threading.Thread(target=slow)
    thread.start()
    assert first_byte.wait(10), "the slow stream did not start"
    # While it runs, the budget is used up by others and the next request refused.
    assert ask(server.http, "br/fast", headers).status_code == 200  # 100
    assert ask(server.http, "br/fast", headers).status_code == 200  # 200
    refused = ask(server.http, "br/fast", headers)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert thread.is_alive(), "the slow stream ended before the budget ran out"
    thread.join(15)
    assert result["status"] == 200
    events = sse_events(result["text"])
    assert events[-1][0] == "response.completed"  # finished normally, whole
    assert "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
    # Its own usage was counted too: 300 in all.
    r = ask(server.http, "br/fast", headers)
    assert "has used 300 tokens" in r.json()["error"]["message"]


def test_user_budget_is_shared_by_all_the_users_keys(server: Server, mock: Mock) -> None:
    setup_provider(server, mock, "bu", "um")
    reset = midnight_utc()
    user = "budget-user-" + uuid.uuid4().hex[:6]
    _, first = new_key(server, user)
    _, second = new_key(server, user)
    out = manage(server, "key", "user-budget", user, "--budget", "tokens=150/day")
    assert out == f"Budgets of user {user}: 150 tokens per day.\n"
    mock.script("um", [], then={"usage": USAGE})
    # The user budget reaches the key map on the next poll; then both keys spend it.
    deadline = time.monotonic() + 5
    spent = 0
    while ask(server.http, "bu/um", (first, second)[spent % 2]).status_code == 200:
        spent += 1
        assert time.monotonic() < deadline, "the user budget was not picked up"
    assert mock.hits("um") == spent
    # Whichever key asks, the shared budget refuses.
    for headers in (first, second):
        r = ask(server.http, "bu/um", headers)
        assert r.status_code == 429
        # Counted from the key-map load on: the two answers that used it up.
        body = refused_body(f"user {user}", "150 tokens per day", "200 tokens", reset)
        assert r.json() == body
    assert mock.hits("um") == spent


def test_window_percent_budget_counts_each_rise_against_its_request(
    server: Server, mock: Mock
) -> None:
    provider = "bw" + uuid.uuid4().hex[:6]
    setup_provider(server, mock, provider, "wm")
    reset = int(time.time()) + 3 * 3600
    budgeted, mine = new_key(
        server, "budget-window", budgets=[{"windowPercent": 30, "provider": provider}]
    )
    _, other = new_key(server, "budget-window-other")

    def used(percent: int) -> dict[str, Any]:
        primary = {"used_percent": percent, "window_minutes": 300, "reset_at": reset}
        return {"rate_limits": {"primary": primary}}

    mock.script("wm", [used(10), used(30), used(40), used(55), used(62)], then=used(70))
    model = f"{provider}/wm"
    assert ask(server.http, model, mine).status_code == 200  # 10: the baseline, 0 points
    assert ask(server.http, model, other).status_code == 200  # +20: the other key's
    assert ask(server.http, model, mine).status_code == 200  # +10
    assert ask(server.http, model, mine).status_code == 200  # +15: 25 points, past 80 %
    assert ask(server.http, model, mine).status_code == 200  # +7: 32 points
    assert mock.hits("wm") == 5

    r = ask(server.http, model, mine)
    assert r.status_code == 429
    owner = f"key {budgeted['prefix']}… of budget-window"
    assert r.json() == refused_body(
        owner,
        f"30% of each {provider} quota window",
        "32 points of the five_hour window",
        reset,
    )
    assert r.headers["x-ocx-budget-limit"] == "30"
    assert r.headers["x-ocx-budget-remaining"] == "0"
    assert r.headers["x-ocx-budget-reset"] == str(reset)
    assert mock.hits("wm") == 5
    # A key without a budget is not held back.
    assert ask(server.http, model, other).status_code == 200
    wait_for_output(server, f"budget 80%: {owner} has used 80% of its budget of 30% of each")


@contextlib.contextmanager
def redis_commands(prefix: str) -> Iterator[list[list[str]]]:
    """The commands Redis runs that name one of `prefix`'s keys, in order (`MONITOR`)."""
    proc = subprocess.Popen(
        ["redis-cli", "-u", REDIS_URL or "", "monitor"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "OK"
    seen: list[list[str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            client, _, command = line.partition("] ")
            if prefix in command and not client.endswith(" lua"):  # not a script's own steps
                seen.append(shlex.split(command))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        time.sleep(0.3)  # MONITOR's copy of the last commands
        proc.kill()
        reader.join(5)


@needs_redis
def test_with_redis_the_counters_ride_in_the_quota_gates_round_trip(
    server: Server, mock: Mock
) -> None:
    """One read before routing for the quota records, the combo's routing state and the token
    budgets' counters: a single `MGET`; then the reservation of the request's expected cost
    (one script call, issue 42) and at the end the charge, which lets the reservation go in
    the same script call; a refused request makes that one read and nothing else."""
    if not server.env.get("REDIS_URL"):
        pytest.skip("this server runs without Redis")
    prefix = server.env["OCX_STATE_KEY_PREFIX"]
    setup_provider(server, mock, "bg", "gm")
    server.put_combo("bgc", {"targets": [{"provider": "bg", "model": "gm"}]})
    server.wait_synced()
    created, headers = new_key(server, "budget-gate", budget={"tokens": 250, "period": "day"})
    mock.script("gm", [], then={"usage": USAGE})
    assert ask(server.http, "combo/bgc", headers).status_code == 200  # 100; state written
    counter = f"{prefix}:budget:k{created['id']}:tokens:day:"

    with redis_commands(prefix) as commands:
        assert ask(server.http, "combo/bgc", headers).status_code == 200  # 200
    assert [c[0] for c in commands] == ["MGET", "EVALSHA", "EVALSHA"], commands
    names = commands[0][1:]
    # Last, the seeding sentinel: gone after a Redis flush, the counters are seeded again.
    assert [n.split(":", 2)[1] for n in names] == ["quota", "combo", "budget", "budget-seeded"]
    assert names[2].startswith(counter)
    assert names[3] == f"{prefix}:budget-seeded"
    held = names[2] + ":held"
    # The reservation: the counter and its reservations, the limit and the expected 100 tokens
    # (the key's previous request on the model).
    assert commands[1][2:8] == ["2", names[2], held, "1", "250", "100"]
    # The charge: the counter up by 100 tokens, the reservation down by as much.
    assert commands[2][2:5] == ["2", names[2], held]
    assert commands[2][5] == "100" and commands[2][7] == "-100"

    assert ask(server.http, "combo/bgc", headers).status_code == 200  # 200 < 250 → 300
    with redis_commands(prefix) as commands:
        r = ask(server.http, "combo/bgc", headers)
    assert r.status_code == 429 and "has used 300 tokens" in r.json()["error"]["message"]
    assert [c[0] for c in commands] == ["MGET"], commands
    assert mock.hits("gm") == 3


# --- three workers on PostgreSQL + Redis ---------------------------------------------------


@needs_redis
def test_no_worker_admits_once_the_budget_is_used_up(
    tmp_path_factory: pytest.TempPathFactory, mock: Mock
) -> None:
    """3 workers, one Redis: a stream admitted on one worker keeps running while requests on
    the others use the budget up; then no worker admits (each reads the shared counter, none
    a stale count of its own), and the stream still finishes whole and is counted."""
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-budget-workers"),
        workers=3,
        extra_env={"REDIS_URL": REDIS_URL or ""},
    )
    clients: list[Any] = []
    try:
        setup_provider(server, mock, "bx", "xm", "xs")
        created, headers = new_key(
            server, "budget-workers", budget={"tokens": 300, "period": "day"}
        )
        clients = spread_clients(server, headers)
        # Every worker knows the key (its key map is loaded) before the budget is spent.
        for client in clients:
            deadline = time.monotonic() + 5
            while client.http.get("/v1/models").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        mock.script("xm", [], then={"usage": USAGE})
        mock.script("xs", [{"usage": USAGE, "deltas": 8, "delta_ms": 300}])
        first_byte = threading.Event()
        result: dict[str, Any] = {}

        def slow() -> None:
            body = {"model": "bx/xs", "input": "hello", "stream": True}
            with clients[0].http.stream("POST", "/v1/responses", json=body) as r:
                result["status"] = r.status_code
                chunks = []
                for chunk in r.iter_text():
                    chunks.append(chunk)
                    first_byte.set()
                result["text"] = "".join(chunks)

        thread = threading.Thread(target=slow)
        thread.start()
        assert first_byte.wait(10), "the slow stream did not start"
        others = clients[1:]
        statuses = [ask(others[i % len(others)].http, "bx/xm", {}).status_code for i in range(3)]
        assert statuses == [200, 200, 200]  # 300 tokens, spent on the other workers
        for client in others:
            r = ask(client.http, "bx/xm", {})
            assert r.status_code == 429, (client.pid, r.text)
        assert thread.is_alive(), "the slow stream ended before the budget ran out"
        thread.join(20)
        assert result["status"] == 200
        assert sse_events(result["text"])[-1][0] == "response.completed"
        # No worker admits, the stream's worker included; the stream was counted (400).
        for _ in range(2):
            for client in clients:
                r = ask(client.http, "bx/xm", {})
                assert r.status_code == 429, (client.pid, r.text)
                assert r.json()["error"]["code"] == "budget_exceeded"
                assert "has used 400 tokens" in r.json()["error"]["message"]
                assert r.headers["x-ocx-budget-remaining"] == "0"
        assert (mock.hits("xm"), mock.hits("xs")) == (3, 1)
        assert len({c.pid for c in clients}) >= 2
        # The 100 % event fired exactly once over all the workers (it was crossed while the
        # stream still ran, long before these last requests).
        owner = f"key {created['prefix']}… of budget-workers"
        wait_for_output(server, f"budget 100%: {owner}")
        assert sum(f"budget 100%: {owner}" in x for x in server.output) == 1
    finally:
        for client in clients:
            client.close()
        stop()


# --- events on /ws/events and stored (in-process runtime) ----------------------------------


@pytest.mark.django_db(transaction=True)
async def test_budget_events_reach_the_websocket_and_are_stored() -> None:
    cookie = await sync_to_async(session_cookie)(staff=True)
    ws = communicator(cookie)
    connected, _ = await ws.connect()
    assert connected
    runtime = Runtime()
    owner = f"key ocx_{uuid.uuid4().hex[:6]}… of dev"
    budget = ScopedBudget("key", f"k{uuid.uuid4().hex}", owner, TokenBudget(100, "day"))
    now = int(time.time() * 1000)
    try:
        await runtime.budgets.charge((budget,), tokens=85, served=None, now_ms=now)
        got = await receive_matching(
            ws, lambda e: e.get("kind") == "budget" and e.get("owner") == owner
        )
        assert got["percent"] == 80 and got["scope"] == "key"
        assert got["budget"] == {"tokens": 100, "period": "day"}
        assert (got["used"], got["limit"]) == (85, 100)
        assert got["message"].startswith(f"{owner} has used 80% of its budget of 100 tokens")

        def stored() -> list[BudgetEvent]:
            return list(BudgetEvent.objects.filter(owner=owner))

        rows: list[BudgetEvent] = []
        for _ in range(50):
            rows = await sync_to_async(stored)()
            if rows:
                break
            await asyncio.sleep(0.1)
        assert [(r.percent, r.used, r.limit, r.message) for r in rows] == [
            (80, 85.0, 100.0, got["message"])
        ]
        assert json.loads(json.dumps(rows[0].budget)) == {"tokens": 100, "period": "day"}
    finally:
        await ws.disconnect()
