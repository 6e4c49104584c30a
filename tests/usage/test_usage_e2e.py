"""Usage accounting end to end (PRODUCT §9.5): a real `ocx serve` and `ocx mock-upstream`; the
rollups' totals equal what the mock reported, for every adapter, both inbound APIs, streaming
and not; `GET /api/usage` and `ocx usage` read them back."""

from __future__ import annotations

import concurrent.futures
import csv
import io
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, Mock, Server, sse_events, start_server

ADAPTERS = ("openai-responses", "chatgpt", "openai-chat", "anthropic")
CHATGPT_TOKEN = "chatgpt-caller-token-usage-0123"


def _provider(mock: Mock, adapter: str, models: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "adapter": adapter,
        "baseUrl": mock.url + "/v1",
        "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
        "models": {m: {"contextWindow": 100000} for m in models},
    }
    if adapter != "chatgpt":
        spec["apiKey"] = f"sk-usage-{adapter}-0123456789abcdef"
    return spec


def _headers(key: str, adapter: str) -> dict[str, str]:
    if adapter == "chatgpt":
        # The caller's own ChatGPT token is forwarded; the ocx key goes in x-ocx-key.
        return {"x-ocx-key": key, "Authorization": f"Bearer {CHATGPT_TOKEN}"}
    return {"Authorization": f"Bearer {key}"}


def _ask(
    server: Server,
    key: str,
    adapter: str,
    model: str,
    inbound: str,
    stream: bool,
    **extra: Any,
) -> httpx.Response:
    if inbound == "responses":
        path, body = "/v1/responses", {"model": model, "input": "hello", "stream": stream}
    else:
        path = "/v1/chat/completions"
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hello"}],
            "stream": stream,
        }
    body.update(extra)
    r = server.http.post(path, json=body, headers=_headers(key, adapter))
    assert r.status_code == 200, r.text
    return r


def _usage(server: Server, **params: str) -> httpx.Response:
    return server.api.get("/api/usage", params=params)


def _wait_total(server: Server, requests: int, timeout: float = 10.0, **params: str) -> Any:
    """The usage report once `requests` requests are counted (rollups are batched ≤ 0.5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        r = _usage(server, **params)
        assert r.status_code == 200, r.text
        report = r.json()
        if report["totals"]["requests"] >= requests or time.monotonic() > deadline:
            return report
        time.sleep(0.1)


def _expected(n: int, adapter: str) -> dict[str, int]:
    """Distinct scripted usage per case; what ocx must count for it."""
    inp, cached, creation, out, reasoning = 1000 + n, 100 + n, 10 + n, 50 + n, 5 + n
    return {
        "script": {
            "input_tokens": inp,
            "cached_tokens": cached,
            "cache_creation_tokens": creation,
            "output_tokens": out,
            "reasoning_tokens": reasoning,
        },
        "inputTokens": inp,
        "cachedInputTokens": cached,
        "outputTokens": out,
        # The Messages API reports no reasoning-token count.
        "reasoningTokens": 0 if adapter == "anthropic" else reasoning,
    }


def test_usage_from_every_adapter_inbound_and_mode(server: Server, mock: Mock) -> None:
    tag = uuid.uuid4().hex[:6]
    user = f"u{tag}"
    key = server.create_key(user=user)
    cases: list[tuple[str, str, str, bool, str]] = []
    for adapter in ADAPTERS:
        provider = f"{adapter.split('-')[-1]}{tag}"
        models = []
        for inbound in ("responses", "chat"):
            for stream in (False, True):
                model = f"m-{inbound}-{'s' if stream else 'j'}"
                models.append(model)
                cases.append((provider, adapter, inbound, stream, model))
        server.put_provider(provider, _provider(mock, adapter, models))
    server.wait_synced()
    expected: dict[str, dict[str, Any]] = {}
    for n, (provider, adapter, inbound, stream, model) in enumerate(cases):
        want = _expected(n, adapter)
        mock.script(model, [{"usage": want["script"]}])
        r = _ask(server, key, adapter, f"{provider}/{model}", inbound, stream)
        if inbound == "chat" and stream:
            # The client did not set include_usage: it never sees a usage chunk.
            chunks = [d for _, d in sse_events(r.text) if isinstance(d, dict)]
            assert chunks and not any("usage" in c for c in chunks), r.text
            assert r.text.rstrip().endswith("data: [DONE]")
        expected[f"{provider}/{model}"] = want
    # A Chat upstream was asked for the usage chunk the client did not ask for.
    chat_log = [e for e in mock.log() if e["path"].endswith("/chat/completions") and e["stream"]]
    assert chat_log and all(
        e["body"]["stream_options"] == {"include_usage": True} for e in chat_log
    )
    report = _wait_total(server, len(cases), by="target,user", since="1h")
    rows = {row["target"]: row for row in report["rows"] if row["user"] == user}
    assert set(rows) == set(expected)
    for target, want in expected.items():
        row = rows[target]
        got = {k: row[k] for k in ("inputTokens", "cachedInputTokens", "outputTokens")}
        got["reasoningTokens"] = row["reasoningTokens"]
        assert got == {k: v for k, v in want.items() if k != "script"}, target
        assert row["requests"] == 1 and row["unknownUsageRequests"] == 0, target
    mine = _usage(server, by="user", since="1h").json()
    (row,) = [r for r in mine["rows"] if r["user"] == user]
    assert row["inputTokens"] == sum(w["inputTokens"] for w in expected.values())
    assert row["outputTokens"] == sum(w["outputTokens"] for w in expected.values())


@pytest.mark.parametrize("adapter", ["openai-chat", "openai-responses", "anthropic"])
def test_chat_client_that_asks_for_usage_gets_it(server: Server, mock: Mock, adapter: str) -> None:
    tag = uuid.uuid4().hex[:6]
    key = server.create_key(user=f"a{tag}")
    provider = f"p{tag}"
    server.put_provider(provider, _provider(mock, adapter, ["m-ask"]))
    server.wait_synced()
    mock.script("m-ask", [{"usage": {"input_tokens": 11, "output_tokens": 7}}])
    r = _ask(
        server,
        key,
        adapter,
        f"{provider}/m-ask",
        "chat",
        True,
        stream_options={"include_usage": True},
    )
    chunks = [d for _, d in sse_events(r.text) if isinstance(d, dict)]
    usage_chunks = [c for c in chunks if c.get("choices") == [] and "usage" in c]
    assert len(usage_chunks) == 1
    assert usage_chunks[0]["usage"]["prompt_tokens"] == 11
    assert usage_chunks[0]["usage"]["completion_tokens"] == 7


def test_request_without_upstream_usage_is_unknown(server: Server, mock: Mock) -> None:
    tag = uuid.uuid4().hex[:6]
    user = f"n{tag}"
    key = server.create_key(user=user)
    provider = f"p{tag}"
    server.put_provider(provider, _provider(mock, "openai-chat", ["m-none"]))
    server.wait_synced()
    mock.script("m-none", [{"usage": {"omit": True}}], then={"usage": {"omit": True}})
    _ask(server, key, "openai-chat", f"{provider}/m-none", "chat", False)
    _ask(server, key, "openai-chat", f"{provider}/m-none", "chat", True)
    deadline = time.monotonic() + 10
    while True:
        rows = [r for r in _usage(server, by="user").json()["rows"] if r["user"] == user]
        if (rows and rows[0]["requests"] == 2) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rows == [
        {
            "user": user,
            "requests": 2,
            "inputTokens": 0,
            "cachedInputTokens": 0,
            "outputTokens": 0,
            "reasoningTokens": 0,
            "unknownUsageRequests": 2,
            # A local server has no price: no cost, and counted as unpriced.
            "costUsd": 0.0,
            "apiValueUsd": 0.0,
            "unpricedRequests": 2,
            "estimatedRequests": 0,
        }
    ]


def test_api_usage_params_csv_and_cli(server: Server, mock: Mock) -> None:
    tag = uuid.uuid4().hex[:6]
    users = [f"c{tag}a", f"c{tag}b"]
    provider = f"p{tag}"
    spec = _provider(mock, "openai-responses", ["m-csv"])
    spec["models"]["m-csv"]["price"] = {"inputPerMTok": 1000, "outputPerMTok": 5000}
    server.put_provider(provider, spec)
    server.wait_synced()
    mock.script("m-csv", [], then={"usage": {"input_tokens": 20, "output_tokens": 4}})
    for i, user in enumerate(users):
        key = server.create_key(user=user)
        for _ in range(i + 1):
            _ask(server, key, "openai-responses", f"{provider}/m-csv", "responses", False)
    deadline = time.monotonic() + 10
    while True:
        r = _usage(server, by="user,model", since="1h", format="csv")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/csv")
        parsed = [row for row in csv.DictReader(io.StringIO(r.text)) if row["user"] in users]
        if sum(int(p["requests"]) for p in parsed) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert parsed == [
        {
            "user": users[0],
            "model": f"{provider}/m-csv",
            "requests": "1",
            "inputTokens": "20",
            "cachedInputTokens": "0",
            "outputTokens": "4",
            "reasoningTokens": "0",
            "unknownUsageRequests": "0",
            # 20 x $1000 + 4 x $5000 per million tokens.
            "costUsd": "0.04",
            "apiValueUsd": "0.04",
            "unpricedRequests": "0",
            "estimatedRequests": "0",
        },
        {
            "user": users[1],
            "model": f"{provider}/m-csv",
            "requests": "2",
            "inputTokens": "40",
            "cachedInputTokens": "0",
            "outputTokens": "8",
            "reasoningTokens": "0",
            "unknownUsageRequests": "0",
            "costUsd": "0.08",
            "apiValueUsd": "0.08",
            "unpricedRequests": "0",
            "estimatedRequests": "0",
        },
    ]
    # An ISO range that ends before the requests counts none of them.
    old = _usage(
        server, by="user", since="2020-01-01T00:00:00Z", until="2020-01-02T00:00:00Z"
    ).json()
    assert old["rows"] == [] and old["totals"]["requests"] == 0
    assert old["since"] == "2020-01-01T00:00:00Z"
    for params, message in (
        ({"by": "colour"}, "by: unknown dimension 'colour'"),
        ({"by": "user,model,key"}, "by: one or two different dimensions"),
        ({"since": "yesterday"}, "since: expected an ISO 8601 time"),
        ({"since": "1h", "until": "2h"}, "since must be before until"),
        ({"format": "xml"}, "format: use json or csv"),
    ):
        bad = _usage(server, **params)
        assert bad.status_code == 400, params
        assert bad.json()["error"].startswith(message), bad.json()
    assert server.http.get("/api/usage").status_code == 401
    # `ocx usage` against the same database prints the same numbers.
    env = {k: v for k, v in server.env.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "usage", "--by", "user", "--since", "1h", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    cli = {r["user"]: r for r in json.loads(out.stdout)["rows"]}
    assert cli[users[1]]["requests"] == 2 and cli[users[1]]["inputTokens"] == 40
    table = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "usage", "--by", "user", "--since", "1h"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[1].split() == [
        "USER",
        "REQUESTS",
        "INPUT",
        "CACHED",
        "OUTPUT",
        "REASONING",
        "UNKNOWN",
        "COST",
        "API_VALUE",
        "UNPRICED",
        "ESTIMATED",
    ]
    want = [users[1], "2", "40", "0", "8", "0", "0", "$0.08", "$0.08", "0", "0"]
    assert want in [line.split() for line in lines]
    assert lines[-1].split()[0] == "TOTAL"
    bad = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "usage", "--by", "colour"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "unknown dimension 'colour'" in bad.stderr


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="PostgreSQL + Redis pass only")
def test_totals_exact_across_three_workers(tmp_path: Path, mock: Mock) -> None:
    server, stop = start_server(tmp_path, workers=3)
    try:
        key = server.create_key(user="many")
        server.put_provider("pw", _provider(mock, "openai-chat", ["m-w"]))
        server.wait_synced()
        mock.script("m-w", [], then={"usage": {"input_tokens": 7, "output_tokens": 3}})

        def one(i: int) -> int:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                body = {
                    "model": "pw/m-w",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": i % 2 == 0,
                }
                return http.post(
                    "/v1/chat/completions", json=body, headers=_headers(key, "openai-chat")
                ).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(one, range(60)))
        assert statuses == [200] * 60
        report = _wait_total(server, 60, by="user", since="1h")
        assert report["totals"] == {
            "requests": 60,
            "inputTokens": 420,
            "cachedInputTokens": 0,
            "outputTokens": 180,
            "reasoningTokens": 0,
            "unknownUsageRequests": 0,
            "costUsd": 0.0,
            "apiValueUsd": 0.0,
            "unpricedRequests": 60,
            "estimatedRequests": 0,
        }
        # More writes cannot have been pending: the count is stable, not just reached.
        assert _usage(server, by="user", since="1h").json()["totals"]["requests"] == 60
    finally:
        stop()
