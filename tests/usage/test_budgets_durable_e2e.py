"""Durable budgets and dollar budgets end to end (issue 27) against real `ocx serve` processes
and `ocx mock-upstream`: a spent budget stays spent across a restart without Redis and across
a Redis FLUSHALL; a budget set after spending counts what was already used; a dollar budget's
429 and headers in dollars, its 80 %/100 % events; a chatgpt target costs nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, _server_database, start_server
from tests.ocxsite.deps import RedisServer
from tests.usage.test_budgets_e2e import (
    ask,
    midnight_utc,
    new_key,
    refused_body,
    setup_provider,
    wait_for_output,
)
from tests.usage.test_usage_e2e import CHATGPT_TOKEN

USAGE = {"input_tokens": 60, "output_tokens": 40}  # 100 tokens per answer
# $10,000 per million tokens either way: an answer of 100 tokens costs $1.00.
PRICE = {"inputPerMTok": 10000, "outputPerMTok": 10000}


def priced_provider(server: Server, mock: Mock, name: str, model: str, adapter: str) -> None:
    spec: dict[str, Any] = {
        "adapter": adapter,
        "baseUrl": mock.url + "/v1",
        "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
        "models": {model: {"contextWindow": 100000, "price": PRICE}},
    }
    if adapter != "chatgpt":
        spec["apiKey"] = "sk-test-budget-aaaaaaaaaaaaaaaaaaaaaaaa"
    server.put_provider(name, spec)
    server.wait_synced()


def recorded_tokens(server: Server, user: str, tokens: int, timeout: float = 10) -> None:
    """Wait until the usage rollups hold `tokens` tokens of `user` (the writer's batch)."""
    deadline = time.monotonic() + timeout
    while True:
        report = server.api.get("/api/usage", params={"by": "user", "since": "1d"}).json()
        rows = [r for r in report["rows"] if r["user"] == user]
        got = sum(r["inputTokens"] + r["outputTokens"] for r in rows)
        if got >= tokens:
            return
        assert time.monotonic() < deadline, f"{user}: {got} of {tokens} tokens recorded"
        time.sleep(0.05)


@pytest.fixture
def database() -> Iterator[str | None]:
    """One database for the servers of a test (restarted on it); None: SQLite in the data dir."""
    url, drop = _server_database()
    try:
        yield url
    finally:
        drop()


def serve(tmp: Path, database: str | None, **env: str) -> tuple[Server, Any]:
    return start_server(tmp, extra_env=env, database_url=database)


def test_a_spent_budget_stays_spent_across_a_restart_without_redis(
    tmp_path: Path, mock: Mock, database: str | None
) -> None:
    server, stop = serve(tmp_path, database, REDIS_URL="")
    try:
        setup_provider(server, mock, "rs", "rm")
        reset = midnight_utc()
        created, headers = new_key(server, "restart-dev", budget={"tokens": 150, "period": "day"})
        mock.script("rm", [], then={"usage": USAGE})
        assert ask(server.http, "rs/rm", headers).status_code == 200  # 100
        assert ask(server.http, "rs/rm", headers).status_code == 200  # 100 < 150 → 200
        assert ask(server.http, "rs/rm", headers).status_code == 429
    finally:
        stop()
    # The same data dir and database, no Redis: the counter comes from the usage records.
    server, stop = serve(tmp_path, database, REDIS_URL="")
    try:
        r = ask(server.http, "rs/rm", headers)
        assert r.status_code == 429, r.text
        owner = f"key {created['prefix']}… of restart-dev"
        assert r.json() == refused_body(owner, "150 tokens per day", "200 tokens", reset)
        assert r.headers["x-ocx-budget-remaining"] == "0"
        assert mock.hits("rm") == 2
    finally:
        stop()


def test_a_spent_budget_stays_spent_after_a_redis_flushall(
    tmp_path: Path, mock: Mock, database: str | None
) -> None:
    redis_server = RedisServer()  # its own Redis: FLUSHALL touches no other test's keys
    redis_server.start()
    server, stop = serve(tmp_path, database, REDIS_URL=redis_server.url)
    try:
        setup_provider(server, mock, "fs", "fm")
        reset = midnight_utc()
        created, headers = new_key(server, "flush-dev", budget={"tokens": 150, "period": "day"})
        mock.script("fm", [], then={"usage": USAGE})
        assert ask(server.http, "fs/fm", headers).status_code == 200
        assert ask(server.http, "fs/fm", headers).status_code == 200  # 200
        assert ask(server.http, "fs/fm", headers).status_code == 429
        recorded_tokens(server, "flush-dev", 200)
        assert redis_server.client().flushall()
        r = ask(server.http, "fs/fm", headers)
        assert r.status_code == 429, r.text
        owner = f"key {created['prefix']}… of flush-dev"
        assert r.json() == refused_body(owner, "150 tokens per day", "200 tokens", reset)
        assert mock.hits("fm") == 2
        wait_for_output(server, "the shared store was emptied; seeding them again")
    finally:
        stop()
        redis_server.stop()


def test_a_budget_set_after_spending_counts_what_was_used(server: Server, mock: Mock) -> None:
    priced_provider(server, mock, "ps", "pm", "openai-responses")
    reset = midnight_utc()
    created, headers = new_key(server, "late-dev")
    mock.script("pm", [], then={"usage": USAGE})
    for _ in range(3):
        assert ask(server.http, "ps/pm", headers).status_code == 200  # 300 tokens, $3.00
    recorded_tokens(server, "late-dev", 300)
    owner = f"key {created['prefix']}… of late-dev"

    r = server.api.patch(
        f"/api/keys/{created['id']}", json={"budget": {"tokens": 250, "period": "day"}}
    )
    assert r.status_code == 200, r.text
    r = ask(server.http, "ps/pm", headers)
    assert r.status_code == 429, r.text
    assert r.json() == refused_body(owner, "250 tokens per day", "300 tokens", reset)

    # A dollar budget set now counts the $3.00 already spent today.
    r = server.api.patch(
        f"/api/keys/{created['id']}", json={"budgets": [{"usd": 2, "period": "day"}]}
    )
    assert r.status_code == 200, r.text
    r = ask(server.http, "ps/pm", headers)
    assert r.status_code == 429, r.text
    assert r.json() == refused_body(owner, "$2.00 per day", "$3.00", reset)
    assert r.headers["x-ocx-budget-limit"] == "2.00"
    assert r.headers["x-ocx-budget-remaining"] == "0.00"
    assert mock.hits("pm") == 3


def test_a_dollar_budget_charges_the_served_price(server: Server, mock: Mock) -> None:
    priced_provider(server, mock, "ds", "dm", "openai-responses")
    reset = midnight_utc()
    created, headers = new_key(server, "usd-dev", budget={"usd": 2.5, "period": "day"})
    mock.script("dm", [], then={"usage": USAGE})
    assert ask(server.http, "ds/dm", headers).status_code == 200  # $1.00
    streamed = ask(server.http, "ds/dm", headers, stream=True)  # $2.00: 80 %
    assert streamed.status_code == 200
    assert ask(server.http, "ds/dm", headers).status_code == 200  # $2.00 < $2.50 → $3.00
    r = ask(server.http, "ds/dm", headers)
    assert r.status_code == 429
    owner = f"key {created['prefix']}… of usd-dev"
    assert r.json() == refused_body(owner, "$2.50 per day", "$3.00", reset)
    assert r.headers["x-ocx-budget-limit"] == "2.50"
    assert r.headers["x-ocx-budget-remaining"] == "0.00"
    assert r.headers["x-ocx-budget-reset"] == str(reset)
    assert mock.hits("dm") == 3
    line = wait_for_output(server, f"budget 100%: {owner} has used 100%")
    assert "of its budget of $2.50 per day ($3.00 of $2.50)" in line
    line = wait_for_output(server, f"budget 80%: {owner} has used 80%")
    assert "($2.00 of $2.50)" in line
    assert sum(f"budget 80%: {owner}" in x for x in server.output) == 1


def test_a_chatgpt_target_costs_a_dollar_budget_nothing(server: Server, mock: Mock) -> None:
    priced_provider(server, mock, "cs", "cm", "chatgpt")
    key = server.create_key(user="sub-dev", budget={"usd": 0.5, "period": "day"})
    mock.script("cm", [], then={"usage": USAGE})
    headers = {"x-ocx-key": key, "Authorization": f"Bearer {CHATGPT_TOKEN}"}
    for _ in range(3):  # each worth $1.00 at API prices: a budget of $0.50 is never spent
        r = ask(server.http, "cs/cm", headers)
        assert r.status_code == 200, r.text
    assert mock.hits("cm") == 3
    assert isinstance(server.http, httpx.Client)
