"""Operations (PRODUCT §4.5): `/healthz`, `/readyz`, `/metrics` and structured JSON request logs.

`/readyz`'s failure cases are unit-level (a patched database cursor, an unreachable Redis); the
rest runs against a real `ocx serve` and `ocx mock-upstream`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Mock, Server, start_server

P1_KEY = "sk-test-ops-p1-aaaaaaaaaaaaaaaaaaaa"
P2_KEY = "sk-test-ops-p2-bbbbbbbbbbbbbbbbbbbb"
PROMPT = "PROMPT-TEXT-not-for-logs-93ab"


def provider(base_url: str, *models: str, api_key: str) -> dict[str, Any]:
    return {
        "adapter": "openai-responses",
        "baseUrl": base_url,
        "apiKey": api_key,
        "timeouts": {"firstByteMs": 2000, "idleMs": 2000},
        "models": {m: {"contextWindow": 100000} for m in models},
    }


def setup(server: Server, mock: Mock) -> tuple[str, str, dict[str, str]]:
    key = server.create_key(user="opsdev")
    server.put_provider("p1", provider(mock.url + "/v1", "fa", api_key=P1_KEY))
    server.put_provider("p2", provider(mock.url + "/v1", "fb", api_key=P2_KEY))
    combo_id = "ops" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id,
        {"targets": [{"provider": "p1", "model": "fa"}, {"provider": "p2", "model": "fb"}]},
    )
    server.http.get("/v1/models")
    server.wait_synced()
    return combo_id, key, {"Authorization": f"Bearer {key}"}


def ask(server: Server, combo_id: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": f"combo/{combo_id}", "input": PROMPT}
    return server.http.post("/v1/responses", json=body, headers=headers)


def samples(server: Server) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    r = server.http.get("/metrics")
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


# ---------------------------------------------------------------------------------------------
# /healthz, /readyz


def test_healthz(server: Server) -> None:
    r = server.http.get("/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    # Open, like /readyz and /metrics: no management credentials needed.
    assert "set-cookie" not in r.headers


def test_readyz_checks_database_and_redis(server: Server) -> None:
    r = server.http.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok"
    assert body["database"] == "ok"
    assert isinstance(body["configVersion"], int)
    if os.environ.get("REDIS_URL"):
        assert body["redis"] == "ok"
    else:
        assert "redis" not in body


class _BrokenConnection:
    def cursor(self) -> Any:
        from django.db import OperationalError

        raise OperationalError("connection refused")


def test_readyz_503_when_the_database_check_fails(
    rf: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from ocxsite import views

    settings.OCX_REDIS_URL = None
    monkeypatch.setattr(views, "connection", _BrokenConnection())
    r = views.readyz(rf.get("/readyz"))
    assert r.status_code == 503
    body = json.loads(r.content)
    assert body["status"] == "unavailable"
    assert body["database"] == "error: OperationalError"
    assert body["configVersion"] is None


@pytest.mark.django_db
def test_readyz_unit_ok_and_redis_failure(rf: Any, settings: Any) -> None:
    from ocxsite import views

    settings.OCX_REDIS_URL = None
    r = views.readyz(rf.get("/readyz"))
    assert r.status_code == 200, r.content
    assert json.loads(r.content)["database"] == "ok"

    settings.OCX_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    r = views.readyz(rf.get("/readyz"))
    # Degraded, not unavailable: the workers route on their own state (issue 16).
    assert r.status_code == 200
    body = json.loads(r.content)
    assert body["status"] == "degraded"
    assert body["database"] == "ok"
    assert body["redis"].startswith("error: ")
    assert any(line.startswith("redis unreachable") for line in body["detail"])


# ---------------------------------------------------------------------------------------------
# /metrics


def test_metrics_count_requests_hops_and_latency(server: Server, mock: Mock) -> None:
    combo_id, _, headers = setup(server, mock)
    before = samples(server)
    n = 4
    for _ in range(n):
        r = ask(server, combo_id, headers)
        assert r.status_code == 200, r.text
        assert r.headers["x-ocx-target"] == "p1/fa"
    # One more that hops from p1/fa (500) to p2/fb.
    mock.script("fa", [{"status": 500}])
    r = ask(server, combo_id, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/fb"

    r = server.http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "# TYPE ocx_requests_total counter" in text
    assert f'ocx_requests_total{{combo="{combo_id}",status="200",target="p1/fa"}} {n}.0' in text
    assert f'ocx_requests_total{{combo="{combo_id}",status="200",target="p2/fb"}} 1.0' in text
    after = samples(server)
    hops = {
        labels: v
        for (name, labels), v in after.items()
        if name == "ocx_hops_total" and ("combo", combo_id) in labels
    }
    assert sum(hops.values()) == 1, hops
    assert value(after, "ocx_cooldowns_started_total", combo=combo_id, target="p1/fa") == 1, (
        "the 500 cools p1/fa"
    )
    for histogram, labels in (
        ("ocx_upstream_latency_seconds", {"provider": "p1"}),
        ("ocx_upstream_ttfb_seconds", {"provider": "p1"}),
        ("ocx_proxy_overhead_seconds", {}),
    ):
        assert f"# TYPE {histogram} histogram" in text
        count = value(after, histogram + "_count", **labels) - value(
            before, histogram + "_count", **labels
        )
        assert count >= n + 1 if histogram == "ocx_proxy_overhead_seconds" else count >= n, (
            histogram,
            count,
        )
        assert value(after, histogram + "_bucket", **labels, le="+Inf") == value(
            after, histogram + "_count", **labels
        )
    assert value(after, "ocx_cooldowns_active", combo=combo_id) == 1  # p1/fa is cooling
    assert "ocx_request_log_dropped_total" in text
    for secret in (P1_KEY, P2_KEY, PROMPT, headers["Authorization"].split(" ")[1]):
        assert secret not in text


# ---------------------------------------------------------------------------------------------
# Structured JSON logs


@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, stop = start_server(
        Path(tmp_path_factory.mktemp("ocx-json")), extra_env={"OCX_LOG_JSON": "1"}
    )
    try:
        yield server
    finally:
        stop()


def json_records(server: Server) -> list[dict[str, Any]]:
    """Every JSON object the server printed on the `ocx.request` logger."""
    out = []
    for line in list(server.output):
        if "{" not in line or "request_id" not in line:
            continue
        out.append(json.loads(line[line.index("{") :]))
    return out


def test_json_logs_one_object_per_request(json_server: Server, mock: Mock) -> None:
    server = json_server
    combo_id, key, headers = setup(server, mock)
    ids = []
    for _ in range(2):
        r = ask(server, combo_id, headers)
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-ocx-request-id"])
    mock.script("fa", [{"status": 500}])
    r = ask(server, combo_id, headers)
    assert r.status_code == 200, r.text
    ids.append(r.headers["x-ocx-request-id"])
    r = server.http.post(
        "/v1/responses", json={"model": "combo/missing", "input": PROMPT}, headers=headers
    )
    assert r.status_code == 404
    ids.append(r.headers["x-ocx-request-id"])

    deadline = time.monotonic() + 5
    while True:
        records = {rec["request_id"]: rec for rec in json_records(server)}
        if set(ids) <= set(records) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert set(ids) <= set(records), server.output[-20:]
    per_request = [rec["request_id"] for rec in json_records(server) if rec["request_id"] in ids]
    assert sorted(per_request) == sorted(ids), "exactly one JSON object per request"

    first = records[ids[0]]
    assert first["model"] == f"combo/{combo_id}"
    assert first["combo"] == combo_id
    assert first["target"] == "p1/fa"
    assert first["status"] == 200
    assert first["user"] == "opsdev"
    hop = records[ids[2]]
    assert hop["target"] == "p2/fb"
    assert hop["status"] == 200
    assert hop["attempts"] == 2
    missing = records[ids[3]]
    assert missing["status"] == 404
    assert missing["model"] == "combo/missing"

    output = "".join(server.output)
    for secret in (PROMPT, key, P1_KEY, P2_KEY):
        assert secret not in output


def test_json_log_lines_are_bare_json_objects(json_server: Server, mock: Mock) -> None:
    server = json_server
    combo_id, _, headers = setup(server, mock)
    r = ask(server, combo_id, headers)
    request_id = r.headers["x-ocx-request-id"]
    deadline = time.monotonic() + 5
    while not any(request_id in line for line in list(server.output)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    line = next(line for line in list(server.output) if request_id in line)
    assert json.loads(line)["request_id"] == request_id


def test_worker_froze_its_startup_heap(server: Server) -> None:
    # lifecycle.freeze_heap: without it a full collection walks the whole heap (p99 stalls).
    assert value(samples(server), "ocx_worker_frozen_objects") > 10_000
