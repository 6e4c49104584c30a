"""Every served request is charged (issue 42, PRODUCT §9.7), end to end against a real `ocx
serve` and `ocx mock-upstream`: a stream the client abandons before its final usage, an upstream
that breaks after output, and usage figures no upstream should send are all recorded with ocx's
estimate (flagged `usageEstimated`), priced, counted in the rollups (`estimatedRequests`) and
charged to the key's budget. Runs on SQLite and, with DATABASE_URL and REDIS_URL, on PostgreSQL
with Redis."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server
from tests.usage.test_budgets_e2e import new_key
from usage.estimate import CHARS_PER_TOKEN

PRICE = {"inputPerMTok": 2, "outputPerMTok": 8}
PROMPT = "tell me a long story " * 20  # 420 characters: 105 tokens by the estimate
PROMPT_TOKENS = math.ceil(len(PROMPT) / CHARS_PER_TOKEN)


def _setup(server: Server, mock: Mock, name: str, adapter: str, model: str) -> None:
    server.put_provider(
        name,
        {
            "adapter": adapter,
            "baseUrl": mock.url + "/v1",
            "apiKey": "sk-charged-0123456789abcdef",
            "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
            "models": {model: {"contextWindow": 100000, "price": PRICE}},
        },
    )
    server.wait_synced()


def _logged(server: Server, user: str, n: int = 1) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        found = server.api.get("/api/requests", params={"user": user}).json()["requests"]
        if len(found) >= n:
            return found  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"only {len(found)} of {n} requests were logged"
        time.sleep(0.05)


def _usage_totals(server: Server, user: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        r = server.api.get("/api/usage", params={"by": "user", "since": "1h"})
        assert r.status_code == 200, r.text
        rows = [row for row in r.json()["rows"] if row["user"] == user]
        if rows and rows[0]["estimatedRequests"]:
            return rows[0]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, "the estimate did not reach the rollups"
        time.sleep(0.05)


def _abandon(server: Server, path: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    """Open a stream, read three output frames, then leave (close the connection)."""
    seen = 0
    with (
        httpx.Client(base_url=server.url, timeout=30) as http,
        http.stream("POST", path, json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and ('"delta"' in line or '"content"' in line):
                seen += 1
                if seen == 3:
                    break
    return seen


@pytest.mark.parametrize(
    ("adapter", "path"),
    [("openai-responses", "/v1/responses"), ("openai-chat", "/v1/chat/completions")],
)
def test_an_abandoned_stream_is_charged_its_estimate(
    server: Server, mock: Mock, adapter: str, path: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    user, model = f"esc{tag}", f"slow{tag}"
    _setup(server, mock, f"p{tag}", adapter, model)
    # 105 tokens of input alone use the budget up: the next request is refused.
    created, headers = new_key(server, user, budget={"tokens": 100, "period": "day"})
    mock.script(model, [{"deltas": 40, "delta_ms": 100, "usage": {"input_tokens": 999}}])
    expected = PROMPT_TOKENS
    if path == "/v1/responses":
        body: dict[str, Any] = {"model": f"p{tag}/{model}", "input": PROMPT, "stream": True}
    else:
        expected = math.ceil(len(PROMPT + "user") / CHARS_PER_TOKEN)  # the role is text too
        body = {
            "model": f"p{tag}/{model}",
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
        }
    assert _abandon(server, path, body, headers) == 3

    (row,) = _logged(server, user)
    assert row["status"] == 499 and row["outcome"] == "client_cancelled"
    assert row["target"] == f"p{tag}/{model}"
    assert row["usageEstimated"] is True
    assert row["usage"]["inputTokens"] == expected  # not the 999 never sent
    output = row["usage"]["outputTokens"]
    assert 3 <= output < 40 * 10
    assert row["costUsd"] == pytest.approx((expected * 2 + output * 8) / 1e6)
    totals = _usage_totals(server, user)
    assert totals["estimatedRequests"] == 1 and totals["inputTokens"] == expected

    # Charged to the budget like real usage: the next request is refused.
    mock.script(model, [], then={})
    r = httpx.post(server.url + path, json={**body, "stream": False}, headers=headers, timeout=30)
    assert r.status_code == 429, r.text
    assert f"has used {expected + output} tokens" in r.json()["error"]["message"]
    # The refusal's request-log row names the budget that refused it.
    refused = [row for row in _logged(server, user, 2) if row["status"] == 429]
    assert refused[0]["budget"] == f"key {created['prefix']}… of {user}: 100 tokens per day"
    assert row["budget"] is None


def test_an_upstream_that_breaks_after_output_is_charged_its_estimate(
    server: Server, mock: Mock
) -> None:
    tag = uuid.uuid4().hex[:6]
    user, model = f"cut{tag}", f"cut{tag}"
    _setup(server, mock, f"p{tag}", "openai-responses", model)
    _, headers = new_key(server, user, budget={"tokens": 100, "period": "day"})
    # Cut after the third delta: no `response.completed`, so no usage from the upstream.
    mock.script(model, [{"deltas": 10, "cut_after_events": 6}])
    body = {"model": f"p{tag}/{model}", "input": PROMPT, "stream": True}
    r = server.http.post("/v1/responses", json=body, headers=headers)
    assert r.status_code == 200
    assert "error" in r.text  # the explicit terminal error of a truncated stream

    (row,) = _logged(server, user)
    assert row["usageEstimated"] is True
    assert row["usage"]["inputTokens"] == PROMPT_TOKENS
    assert row["usage"]["outputTokens"] >= 1
    assert row["costUsd"] and row["costUsd"] > 0
    r = server.http.post("/v1/responses", json=body, headers=headers)
    assert r.status_code == 429


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": -1000000000, "output_tokens": 5},
        {"input_tokens": "lots", "output_tokens": 5},
        {"input_tokens": 5, "output_tokens": 2.5},
        {"input_tokens": 10**12, "output_tokens": 5},
        {"input_tokens": 500000, "output_tokens": 5},  # beyond the 100,000 context window
    ],
    ids=["negative", "non-numeric", "fraction", "absurd", "beyond-context"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_bad_usage_figures_are_replaced_by_the_estimate_and_never_lose_the_record(
    server: Server, mock: Mock, usage: dict[str, Any], stream: bool
) -> None:
    tag = uuid.uuid4().hex[:6]
    user, model = f"bad{tag}", f"bad{tag}"
    _setup(server, mock, f"p{tag}", "openai-responses", model)
    _, headers = new_key(server, user, budget={"tokens": 1, "period": "day"})
    mock.script(model, [], then={"usage": usage})
    body = {"model": f"p{tag}/{model}", "input": PROMPT, "stream": stream}
    first = server.http.post("/v1/responses", json=body, headers=headers)
    assert first.status_code == 200, first.text

    (row,) = _logged(server, user)
    assert row["status"] == 200
    assert row["usageEstimated"] is True
    assert row["usage"]["inputTokens"] == PROMPT_TOKENS
    output = row["usage"]["outputTokens"]
    assert output >= 1
    assert row["costUsd"] == pytest.approx((PROMPT_TOKENS * 2 + output * 8) / 1e6)
    totals = _usage_totals(server, user)
    assert totals["estimatedRequests"] == 1 and totals["requests"] == 1
    # The budget counted the estimate: never a negative (which would lower the counter and
    # admit the next request) nor an absurd figure.
    r = server.http.post("/v1/responses", json=body, headers=headers)
    assert r.status_code == 429, r.text
    assert f"has used {PROMPT_TOKENS + output} tokens" in r.json()["error"]["message"]
