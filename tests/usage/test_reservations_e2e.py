"""Bounded overshoot end to end (issue 42, PRODUCT §9.7): a budget worth N requests serves at
most N + 2 of 16 concurrent ones, against a real `ocx serve` and `ocx mock-upstream` (SQLite
in-process counters, or PostgreSQL with Redis when DATABASE_URL and REDIS_URL are set)."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.conftest import Mock, Server
from tests.usage.test_budgets_e2e import USAGE, new_key, setup_provider

N = 3


@pytest.mark.parametrize("kind", ["tokens", "usd"])
def test_a_budget_worth_n_requests_serves_at_most_n_plus_2_of_16_concurrent(
    server: Server, mock: Mock, kind: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    provider, model = f"r{tag}", f"burst{tag}"
    setup_provider(server, mock, provider, model)
    if kind == "usd":
        # 100 tokens at $10 per million (input) and $10 (output): $0.001 a request.
        price = {"inputPerMTok": 10, "outputPerMTok": 10}
        server.put_provider(
            provider,
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": "sk-test-burst-aaaaaaaaaaaaaaaaaaaaaaaa",
                "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
                "models": {model: {"contextWindow": 100000, "price": price}},
            },
        )
        server.wait_synced()
        budget = {"usd": 0.001 * (N + 1), "period": "day"}
    else:
        budget = {"tokens": 100 * (N + 1), "period": "day"}
    _, headers = new_key(server, f"burst{tag}", budget=budget)
    mock.script(model, [], then={"usage": USAGE})
    body = {"model": f"{provider}/{model}", "input": "hello"}
    # One request first: the key's recent cost on the model (100 tokens) is what the next
    # reserve. N requests' worth is left.
    assert server.http.post("/v1/responses", json=body, headers=headers).status_code == 200
    mock.script(model, [], then={"usage": USAGE, "delay_first_byte_ms": 600})

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            return await asyncio.gather(
                *(http.post("/v1/responses", json=body, headers=headers) for _ in range(16))
            )

    answers = asyncio.run(burst())
    statuses = sorted(r.status_code for r in answers)
    served = statuses.count(200)
    assert statuses.count(429) == 16 - served, statuses
    assert 1 <= served <= N + 2, statuses
    assert all(
        r.json()["error"]["code"] == "budget_exceeded" for r in answers if r.status_code == 429
    )
    assert mock.hits(model) == 1 + served  # a refused request reached no upstream
