"""PostgreSQL down or restarting (issue 16): the proxy keeps serving from its loaded snapshot
and key map, the management API answers a clear 503 JSON, and the request log written during
the outage reaches the database once it is back.

The test runs its own throwaway cluster (`initdb` + `pg_ctl` on a free port, see deps.py), so
the machine's PostgreSQL is never stopped. It runs in the PostgreSQL pass of CI only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, start_server
from tests.ocxsite.deps import PgCluster, pg_bin

pytestmark = pytest.mark.skipif(
    pg_bin() is None or not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="the PostgreSQL pass only (needs initdb/pg_ctl)",
)
KEY = "sk-test-pg-outage-aaaaaaaaaaaaaaaaaaaa"


@pytest.fixture
def pg_server(tmp_path_factory: pytest.TempPathFactory, mock: Mock) -> Iterator[Any]:
    pg = PgCluster()
    pg.start()
    server, stop = start_server(tmp_path_factory.mktemp("ocx-pg-outage"), database_url=pg.url)
    try:
        server.put_provider(
            "p1",
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": KEY,
                "models": {"fa": {"contextWindow": 100000}},
            },
        )
        server.put_combo("main", {"targets": [{"provider": "p1", "model": "fa"}]})
        headers = {"Authorization": f"Bearer {server.create_key()}"}
        server.wait_synced()
        yield server, pg, headers
    finally:
        stop()
        pg.close()


def ask(server: Server, headers: dict[str, str]) -> httpx.Response:
    return server.http.post(
        "/v1/responses", json={"model": "combo/main", "input": "hi"}, headers=headers
    )


def test_postgres_stopped_then_restarted(pg_server: Any, mock: Mock) -> None:
    server, pg, headers = pg_server
    assert ask(server, headers).status_code == 200
    pg.stop()

    ids = []
    for _ in range(10):
        r = ask(server, headers)
        assert r.status_code == 200, r.text  # served from the snapshot and key map
        assert r.headers["x-ocx-target"] == "p1/fa"
        ids.append(r.headers["x-ocx-request-id"])
    assert mock.hits("fa") == 11

    r = server.api.get("/api/combos")
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "5"
    assert r.json()["error"].startswith("database unavailable")
    assert str(pg.port) not in r.text and "127.0.0.1" not in r.text  # nothing of the DSN
    # A config write while the database is down: a clear 503, and nothing of it applied later.
    w = server.api.put(
        "/api/combos",
        json={"id": "during", "combo": {"targets": [{"provider": "p1", "model": "fa"}]}},
    )
    assert w.status_code == 503, w.text
    ready = server.http.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "degraded"
    assert ready.json()["database"].startswith("error: ")

    # A config poll failing many times is said once, not once per poll.
    time.sleep(1.0)
    assert sum("database unreachable" in line for line in server.output) <= 3

    pg.start()
    deadline = time.monotonic() + 40
    while True:
        r = server.api.get("/api/requests", params={"limit": 100})
        if r.status_code == 200:
            logged = {e["requestId"] for e in r.json()["requests"]}
            if set(ids) <= logged:
                break
        assert time.monotonic() < deadline, (
            f"request log not flushed: {r.status_code} {r.text[:200]}"
        )
        time.sleep(0.2)
    combos = server.api.get("/api/combos")
    assert combos.status_code == 200
    assert [c["id"] for c in combos.json()["combos"]] == ["main"]
    assert server.http.get("/readyz").json()["status"] == "ok"
    assert ask(server, headers).status_code == 200
