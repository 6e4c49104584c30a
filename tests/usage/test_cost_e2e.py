"""Cost end to end (issue 27): a real `ocx serve` and `ocx mock-upstream`. A served request's
request-log entry and its usage rollup carry the cost computed from the usage the upstream
reported and the serving target's price (genai-prices data, or the model's own price); a
chatgpt target costs 0 with its value at API prices; a target without a price counts as
unpriced and is listed under "Needs attention". Runs on SQLite and, with DATABASE_URL, on
PostgreSQL."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.conftest import Mock, Server
from tests.usage.test_usage_e2e import CHATGPT_TOKEN

# What the mock reports for every request: 10,000 input tokens of which 2,000 cached, 500
# output tokens of which 200 reasoning.
USAGE = {
    "input_tokens": 10000,
    "cached_tokens": 2000,
    "output_tokens": 500,
    "reasoning_tokens": 200,
}
# gpt-5 at OpenAI in the bundled genai-prices data: $1.25 / $0.125 cached / $10 per MTok.
GPT5_COST = (8000 * 1.25 + 2000 * 0.125 + 500 * 10) / 1e6  # 0.01525
OWN_PRICE = {"inputPerMTok": 2, "cachedInputPerMTok": 0.5, "outputPerMTok": 8}
OWN_COST = (8000 * 2 + 2000 * 0.5 + 500 * 8) / 1e6  # 0.021


def _provider(mock: Mock, adapter: str, models: dict[str, Any], **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "adapter": adapter,
        "baseUrl": mock.url + "/v1",
        "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
        "models": models,
        **extra,
    }
    if adapter != "chatgpt":
        spec["apiKey"] = f"sk-cost-{adapter}-0123456789abcdef"
    return spec


def _logged(server: Server, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        found = server.api.get("/api/requests", params={"request_id": request_id}).json()
        if found["requests"] or time.monotonic() > deadline:
            (entry,) = found["requests"]
            return entry  # type: ignore[no-any-return]
        time.sleep(0.05)


def test_served_requests_carry_their_cost_to_the_log_rollups_and_api(
    server: Server, mock: Mock
) -> None:
    tag = uuid.uuid4().hex[:6]
    user = f"cost{tag}"
    key = server.create_key(user=user)
    oa, sub, loc = f"oa{tag}", f"sub{tag}", f"loc{tag}"
    # The mock listens on 127.0.0.1: a local server has no price unless told which one.
    server.put_provider(
        oa,
        _provider(
            mock,
            "openai-responses",
            {"gpt-5": {"contextWindow": 400000}, "own": {"price": OWN_PRICE}},
            pricingProvider="openai",
        ),
    )
    server.put_provider(sub, _provider(mock, "chatgpt", {"gpt-5": {}}))
    server.put_provider(loc, _provider(mock, "openai-chat", {"q": {}}))
    server.wait_synced()
    for model in ("gpt-5", "own", "q"):
        mock.script(model, [], then={"usage": USAGE})

    served: dict[str, str] = {}
    for target in (f"{oa}/gpt-5", f"{oa}/own", f"{sub}/gpt-5", f"{loc}/q"):
        headers = {"Authorization": f"Bearer {key}"}
        if target.startswith(sub):
            headers = {"x-ocx-key": key, "Authorization": f"Bearer {CHATGPT_TOKEN}"}
        body = {"model": target, "input": "hello", "stream": target.endswith("own")}
        r = server.http.post("/v1/responses", json=body, headers=headers)
        assert r.status_code == 200, r.text
        served[target] = r.headers["x-ocx-request-id"]

    # The request log: one row per request with its cost and its value at API prices.
    want = {
        f"{oa}/gpt-5": (GPT5_COST, GPT5_COST),
        f"{oa}/own": (OWN_COST, OWN_COST),
        f"{sub}/gpt-5": (0.0, GPT5_COST),  # a subscription: no cost, its API value
        f"{loc}/q": (None, None),  # no price
    }
    for target, request_id in served.items():
        entry = _logged(server, request_id)
        assert entry["target"] == target
        assert entry["usage"] == {"inputTokens": 10000, "outputTokens": 500, "cachedTokens": 2000}
        cost, value = want[target]
        assert entry["costUsd"] == (None if cost is None else pytest.approx(cost)), target
        assert entry["apiValueUsd"] == (None if value is None else pytest.approx(value)), target

    # The rollups, through /api/usage: per target and in total.
    report = server.api.get("/api/usage", params={"by": "target,user", "since": "1h"}).json()
    rows = {r["target"]: r for r in report["rows"] if r["user"] == user}
    assert set(rows) == set(want)
    for target, (cost, value) in want.items():
        row = rows[target]
        assert row["requests"] == 1
        assert row["costUsd"] == pytest.approx(cost or 0.0), target
        assert row["apiValueUsd"] == pytest.approx(value or 0.0), target
        assert row["unpricedRequests"] == (1 if cost is None else 0), target
    mine = server.api.get("/api/usage", params={"by": "user", "since": "1h"}).json()
    (row,) = [r for r in mine["rows"] if r["user"] == user]
    assert row["costUsd"] == pytest.approx(GPT5_COST + OWN_COST)
    assert row["apiValueUsd"] == pytest.approx(2 * GPT5_COST + OWN_COST)
    assert row["unpricedRequests"] == 1

    # The unpriced model is named under "Needs attention"; the priced ones are not.
    notes = server.api.get("/api/catalog/attention").json()["notes"]
    assert any(n.startswith(f"{loc}/q has no price") for n in notes), notes
    assert not any(n.startswith((f"{oa}/", f"{sub}/")) for n in notes), notes

    # A price given later costs the next request (the writer reads the served config).
    server.put_provider(
        loc,
        _provider(mock, "openai-chat", {"q": {"price": {"inputPerMTok": 1, "outputPerMTok": 1}}}),
    )
    server.wait_synced()
    r = server.http.post(
        "/v1/responses",
        json={"model": f"{loc}/q", "input": "hello"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    entry = _logged(server, r.headers["x-ocx-request-id"])
    assert entry["costUsd"] == pytest.approx((10000 + 500) / 1e6)
    notes = server.api.get("/api/catalog/attention").json()["notes"]
    assert not any(n.startswith(f"{loc}/q has no price") for n in notes), notes
