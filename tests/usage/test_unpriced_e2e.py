"""No unpriced request under a dollar budget (issue 42, PRODUCT §9.5), end to end: a model
without a price is refused with 400 `model_unpriced` before any upstream is contacted; inside a
combo its unpriced targets are skipped (reason `unpriced`) while priced ones serve; a `chatgpt`
subscription target is priced at $0, not unpriced; a key without a dollar budget is unaffected."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.conftest import Mock, Server
from tests.usage.test_budgets_e2e import new_key
from tests.usage.test_usage_e2e import CHATGPT_TOKEN

PRICE = {"inputPerMTok": 2, "outputPerMTok": 8}


def _setup(server: Server, mock: Mock, tag: str) -> str:
    provider = f"lp{tag}"
    # The mock is on 127.0.0.1: a local server, whose models have no price list.
    server.put_provider(
        provider,
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": "sk-unpriced-0123456789abcdef",
            "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
            "models": {f"free{tag}": {}, f"paid{tag}": {"price": PRICE}},
        },
    )
    server.put_provider(
        f"cg{tag}",
        {
            "adapter": "chatgpt",
            "baseUrl": mock.url + "/v1",
            "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
            "models": {f"sub{tag}": {}},
        },
    )
    server.put_combo(
        f"mix{tag}",
        {
            "targets": [
                {"provider": provider, "model": f"free{tag}"},
                {"provider": provider, "model": f"paid{tag}"},
            ],
            "strategy": "failover",
        },
    )
    server.put_combo(f"freeonly{tag}", {"targets": [{"provider": provider, "model": f"free{tag}"}]})
    server.wait_synced()
    return provider


def _ask(server: Server, headers: dict[str, str], model: str) -> Any:
    return server.http.post(
        "/v1/responses", json={"model": model, "input": "hello"}, headers=headers
    )


def test_unpriced_models_are_refused_or_skipped_under_a_dollar_budget(
    server: Server, mock: Mock
) -> None:
    tag = uuid.uuid4().hex[:6]
    provider = _setup(server, mock, tag)
    created, headers = new_key(server, f"usd{tag}", budget={"usd": 5, "period": "day"})

    r = _ask(server, headers, f"{provider}/free{tag}")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "model_unpriced"
    assert error["message"].startswith(f"Model {provider}/free{tag} has no price")
    assert (
        f"key {created['prefix']}… of usd{tag} has a dollar budget ($5.00 per day)"
        in (error["message"])
    )
    assert f'models["free{tag}"].price on provider {provider}' in error["message"]
    assert f"ocx provider set {provider} --pricing-provider" in error["message"]
    assert mock.hits(f"free{tag}") == 0  # refused before any upstream was contacted

    only = _ask(server, headers, f"combo/freeonly{tag}")
    assert only.status_code == 400 and only.json()["error"]["code"] == "model_unpriced"
    assert mock.hits(f"free{tag}") == 0

    served = _ask(server, headers, f"combo/mix{tag}")
    assert served.status_code == 200, served.text
    assert served.headers["x-ocx-target"] == f"{provider}/paid{tag}"
    assert mock.hits(f"free{tag}") == 0 and mock.hits(f"paid{tag}") == 1
    deadline = time.monotonic() + 10
    while True:
        rows = server.api.get("/api/requests", params={"combo": f"mix{tag}"}).json()["requests"]
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rows[0]["skipped"] == [[f"{provider}/free{tag}", "unpriced"]]

    # A subscription target costs $0 by design: it is served.
    sub = server.http.post(
        "/v1/responses",
        json={"model": f"cg{tag}/sub{tag}", "input": "hello"},
        headers={
            "x-ocx-key": headers["Authorization"].split()[1],
            "Authorization": f"Bearer {CHATGPT_TOKEN}",
        },
    )
    assert sub.status_code == 200, sub.text


def test_without_a_dollar_budget_an_unpriced_model_is_served(server: Server, mock: Mock) -> None:
    tag = uuid.uuid4().hex[:6]
    provider = _setup(server, mock, tag)
    _, headers = new_key(server, f"tok{tag}", budget={"tokens": 100000, "period": "day"})
    assert _ask(server, headers, f"{provider}/free{tag}").status_code == 200
    assert _ask(server, headers, f"combo/mix{tag}").headers["x-ocx-target"] == (
        f"{provider}/free{tag}"
    )
