"""The ledger adds up (issue 42, PRODUCT §9.7), end to end: a mixed day — plain requests,
streams, a hop, upstream errors, an abandoned stream, nonsense usage — then `ocx usage verify`
(the CLI and `GET /api/usage/verify`) finds the request log, the rollups and the budget counters
in agreement; again after a restart without Redis, and with Redis after a FLUSHALL."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ROOT, Mock, Server
from tests.ocxsite.deps import RedisServer
from tests.usage.test_budgets_durable_e2e import database, serve  # noqa: F401 - fixture
from tests.usage.test_budgets_e2e import new_key

PRICE = {"inputPerMTok": 3, "outputPerMTok": 15}
USAGE = {"input_tokens": 60, "output_tokens": 40}


def _setup(server: Server, mock: Mock, tag: str) -> tuple[dict[str, str], str]:
    spec = {
        "adapter": "openai-responses",
        "baseUrl": mock.url + "/v1",
        "apiKey": "sk-ledger-0123456789abcdef",
        "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
        "models": {m: {"contextWindow": 100000, "price": PRICE} for m in ("a", "b", "c")},
    }
    server.put_provider(f"p{tag}", spec)
    server.put_combo(
        f"day{tag}",
        {"targets": [{"provider": f"p{tag}", "model": "a"}, {"provider": f"p{tag}", "model": "b"}]},
    )
    server.wait_synced()
    user = f"ledger{tag}"
    # The user exists once a key was made for it: a key first, then its user's budget.
    _, headers = new_key(
        server,
        user,
        budgets=[{"tokens": 10**6, "period": "day"}, {"usd": 50, "period": "week"}],
    )
    r = server.api.put(
        f"/api/keys/user-budgets/{user}", json={"budgets": [{"usd": 100, "period": "month"}]}
    )
    assert r.status_code == 200, r.text
    return headers, user


def _day(server: Server, mock: Mock, headers: dict[str, str], tag: str) -> int:
    """One of everything; the number of requests sent."""
    model = f"p{tag}/c"
    mock.script("c", [], then={"usage": USAGE})
    mock.script("a", [], then={"usage": USAGE})
    mock.script("b", [], then={"usage": USAGE})
    http = server.http
    sent = 0
    for stream in (False, True, False):
        r = http.post(
            "/v1/responses", json={"model": model, "input": "hi", "stream": stream}, headers=headers
        )
        assert r.status_code == 200, r.text
        sent += 1
    # A hop: the combo's first target fails, the second serves.
    mock.script("a", [{"status": 500}], then={"usage": USAGE})
    r = http.post(
        "/v1/responses", json={"model": f"combo/day{tag}", "input": "hi"}, headers=headers
    )
    assert r.status_code == 200 and r.headers["x-ocx-target"] == f"p{tag}/b"
    sent += 1
    # An upstream error (passed on), and nonsense usage (charged the estimate).
    mock.script(
        "c", [{"status": 400}, {"usage": {"input_tokens": -(10**9)}}], then={"usage": USAGE}
    )
    assert (
        http.post("/v1/responses", json={"model": model, "input": "x"}, headers=headers).status_code
        == 400
    )
    assert (
        http.post("/v1/responses", json={"model": model, "input": "x"}, headers=headers).status_code
        == 200
    )
    sent += 2
    # An abandoned stream.
    mock.script("c", [{"deltas": 30, "delta_ms": 100, "usage": USAGE}], then={"usage": USAGE})
    body = {"model": model, "input": "a story please", "stream": True}
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with client.stream("POST", "/v1/responses", json=body, headers=headers) as r:
            for line in r.iter_lines():
                if "output_text.delta" in line and line.startswith("data:"):
                    break
    sent += 1
    return sent


def _logged(server: Server, user: str, n: int) -> None:
    deadline = time.monotonic() + 15
    while len(server.api.get("/api/requests", params={"user": user}).json()["requests"]) < n:
        assert time.monotonic() < deadline, "the requests were not all logged"
        time.sleep(0.05)
    time.sleep(0.6)  # the charge of the last one precedes its log batch


def _cli_verify(server: Server) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in server.env.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "usage", "verify"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _agrees(server: Server, counters: int) -> dict[str, Any]:
    r = server.api.get("/api/usage/verify")
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["differences"] == [] and data["agrees"] is True, data
    assert f"budget counters against records: {counters} counter(s)" in data["checked"], data
    out = _cli_verify(server)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("the ledger agrees")
    assert f"budget counters against records: {counters} counter(s)" in out.stdout
    return data  # type: ignore[no-any-return]


def test_a_mixed_day_adds_up_across_a_restart_without_redis(
    tmp_path: Path,
    mock: Mock,
    database: str | None,  # noqa: F811 - the fixture
) -> None:
    tag = uuid.uuid4().hex[:6]
    server, stop = serve(tmp_path, database, REDIS_URL="")
    try:
        headers, user = _setup(server, mock, tag)
        sent = _day(server, mock, headers, tag)
        _logged(server, user, sent)
        data = _agrees(server, 3)  # the key's tokens/day and usd/week, the user's usd/month
        assert any("request log against rollups" in c for c in data["checked"])
    finally:
        stop()
    server, stop = serve(tmp_path, database, REDIS_URL="")
    try:
        more = _day(server, mock, headers, tag)
        _logged(server, user, sent + more)
        _agrees(server, 3)
        # A ledger that does not add up is said so, with exit 1: a request-log row that no
        # rollup and no counter counted.
        env = {k: v for k, v in server.env.items() if k != "DJANGO_SETTINGS_MODULE"}
        code = (
            "import django, datetime as dt; django.setup(); "
            "from usage.models import RequestLog; "
            f"RequestLog.objects.create(request_id='x', at=dt.datetime.now(dt.UTC), user='{user}', "
            "key_prefix='ocx_zz', input_tokens=5, output_tokens=1, status=200)"
        )
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "ocxsite.settings"},
            check=True,
            timeout=60,
        )
        out = _cli_verify(server)
        assert out.returncode == 1, out.stdout
        assert f"DIFFERENCE: user {user} key ocx_zz…: requests: request log 1, rollups 0" in (
            out.stdout
        )
        assert "the ledger disagrees: " in out.stderr
    finally:
        stop()


def test_a_mixed_day_adds_up_across_a_redis_flushall(
    tmp_path: Path,
    mock: Mock,
    database: str | None,  # noqa: F811 - the fixture
) -> None:
    redis_server = RedisServer()  # its own Redis: FLUSHALL touches no other test's keys
    redis_server.start()
    server, stop = serve(tmp_path, database, REDIS_URL=redis_server.url)
    try:
        tag = uuid.uuid4().hex[:6]
        headers, user = _setup(server, mock, tag)
        sent = _day(server, mock, headers, tag)
        _logged(server, user, sent)
        _agrees(server, 3)
        assert redis_server.client().flushall()
        data = server.api.get("/api/usage/verify").json()
        assert data["agrees"] is True and any("emptied" in n for n in data["notes"]), data
        more = _day(server, mock, headers, tag)  # the first one seeds the counters again
        _logged(server, user, sent + more)
        data = _agrees(server, 3)
        assert json.dumps(data)  # the API's answer is plain JSON
    finally:
        stop()
        redis_server.stop()
