"""A write is served by the very next request (PRODUCT §4.2, issue #12).

The first tests use the shared `ocx serve` of `tests/conftest.py` (polling every 100 ms). The
read-your-writes tests start servers whose config poll is 10 minutes, so that only the write
path itself (reload after commit, Redis notice to the other workers) can make a change visible:
every request is made at once after the write returns, with no sleep and no retry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, Mock, Server, start_server
from tests.server.test_workers import spread_clients

PROVIDER = {
    "adapter": "openai-responses",
    "baseUrl": "http://127.0.0.1:9/v1",
    "models": {"m1": {"contextWindow": 8000}},
}
BUDGET_S = 1.0


def models(server: Server, key: str) -> tuple[int, list[str]]:
    r = server.http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    ids = [m["id"] for m in r.json().get("data", [])] if r.status_code == 200 else []
    return r.status_code, ids


def until(check: Callable[[], bool], limit: float = 3.0) -> float:
    """Seconds until `check()` holds (polling every 20 ms); fails after `limit` seconds."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        elapsed = time.monotonic() - start
        assert elapsed < limit, f"not propagated after {elapsed:.2f}s"
        time.sleep(0.02)


def warm(server: Server) -> str:
    """A provider and a working key, with the worker's snapshot loaded and serving them."""
    server.put_provider("prop", PROVIDER)
    key = server.create_key("prop-user")
    until(lambda: "prop/m1" in models(server, key)[1])
    return key


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
def test_new_combo_is_served_within_one_second(server: Server) -> None:
    key = warm(server)
    status, ids = models(server, key)
    assert status == 200
    assert "combo/fresh" not in ids
    start = time.monotonic()
    server.put_combo("fresh", {"targets": [{"provider": "prop", "model": "m1"}]})
    until(lambda: "combo/fresh" in models(server, key)[1])
    elapsed = time.monotonic() - start  # from before the PUT, not from its answer
    assert elapsed < BUDGET_S, f"combo listed after {elapsed:.3f}s"
    listing = server.http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
    row = next(m for m in listing["data"] if m["id"] == "combo/fresh")
    assert row["owned_by"] == "combo"


def test_combo_change_and_delete_are_served_within_one_second(server: Server) -> None:
    key = warm(server)
    server.put_combo("ren", {"targets": [{"provider": "prop", "model": "m1"}]})
    until(lambda: "combo/ren" in models(server, key)[1])

    start = time.monotonic()
    server.put_combo("ren", {"targets": [{"provider": "prop", "model": "m1"}], "alias": "team/ren"})
    until(lambda: (ids := models(server, key)[1]) and "team/ren" in ids and "combo/ren" not in ids)
    assert time.monotonic() - start < BUDGET_S

    start = time.monotonic()
    r = server.api.delete("/api/combos", params={"id": "ren"})
    assert r.status_code == 200
    until(lambda: "team/ren" not in models(server, key)[1])
    assert time.monotonic() - start < BUDGET_S


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
def test_revoked_key_stops_within_one_second(server: Server) -> None:
    key = warm(server)
    keys: list[dict[str, Any]] = server.api.get("/api/keys").json()["keys"]
    key_id = next(k["id"] for k in keys if key.startswith(k["prefix"]))
    assert models(server, key)[0] == 200
    start = time.monotonic()
    r = server.api.delete(f"/api/keys/{key_id}")
    assert r.status_code == 200
    until(lambda: models(server, key)[0] == 401)
    elapsed = time.monotonic() - start
    assert elapsed < BUDGET_S, f"revoked key still accepted after {elapsed:.3f}s"
    r = server.http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_new_key_works_within_one_second(server: Server) -> None:
    warm(server)
    start = time.monotonic()
    key = server.create_key("late-user")
    until(lambda: models(server, key)[0] == 200)
    assert time.monotonic() - start < BUDGET_S


def test_served_config_version_follows_the_store(server: Server) -> None:
    key = warm(server)
    server.put_combo("v", {"targets": [{"provider": "prop", "model": "m1"}]})
    until(lambda: "combo/v" in models(server, key)[1])
    server.wait_synced(timeout=2)


# --- read-your-writes: no poll involved ------------------------------------------------------

# The poll is the safety net; with it this slow, a test passes only through the write path.
NO_POLL = {"OCX_CONFIG_POLL_MS": "600000"}
REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(
    not REDIS_URL, reason="REDIS_URL is not set: several workers need a shared Redis"
)
UPSTREAM_KEY = "sk-test-propagation-aaaaaaaaaaaaaa"


@pytest.fixture(scope="module")
def still_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One worker (SQLite, or PostgreSQL and Redis when the run has them), poll off."""
    server, stop = start_server(tmp_path_factory.mktemp("ocx-ryw"), extra_env=NO_POLL)
    try:
        yield server
    finally:
        stop()


@pytest.fixture(scope="module")
def still_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Three workers sharing Redis, poll off."""
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set: several workers need a shared Redis")
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-ryw-workers"),
        workers=3,
        extra_env={"REDIS_URL": REDIS_URL, **NO_POLL},
    )
    try:
        yield server
    finally:
        stop()


def upstream(mock: Mock) -> dict[str, Any]:
    return {
        "adapter": "openai-responses",
        "baseUrl": mock.url + "/v1",
        "apiKey": UPSTREAM_KEY,
        "models": {m: {"contextWindow": 100000} for m in ("fa", "fb")},
    }


def ask_fresh(server: Server, key: str, model: str) -> httpx.Response:
    """One request on a new connection (so that, with several workers, any may take it)."""
    with httpx.Client(base_url=server.url, timeout=30) as fresh:
        return fresh.post(
            "/v1/responses",
            json={"model": model, "input": "hi"},
            headers={"Authorization": f"Bearer {key}", "Connection": "close"},
        )


def key_id(server: Server, key: str) -> int:
    keys: list[dict[str, Any]] = server.api.get("/api/keys").json()["keys"]
    return int(next(k["id"] for k in keys if key.startswith(k["prefix"])))


def new_key(server: Server, user: str) -> str:
    """A key straight from the API (no waiting: the answer comes after the reload)."""
    r = server.api.post("/api/keys", json={"user": user})
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


def test_a_combo_put_is_served_by_the_very_next_request(still_server: Server, mock: Mock) -> None:
    server = still_server
    server.reset()
    server.put_provider("m", upstream(mock))
    key = new_key(server, "ryw")
    assert ask_fresh(server, key, "m/fa").status_code == 200  # the worker's runtime is running
    for i in range(10):
        combo_id = f"now{i}"
        server.put_combo(combo_id, {"targets": [{"provider": "m", "model": "fa"}]})
        r = ask_fresh(server, key, f"combo/{combo_id}")
        assert r.status_code == 200, r.text
        assert r.headers["x-ocx-target"] == "m/fa"
        server.put_combo(combo_id, {"targets": [{"provider": "m", "model": "fb"}]})
        r = ask_fresh(server, key, f"combo/{combo_id}")
        assert r.headers["x-ocx-target"] == "m/fb"
    r = server.api.delete("/api/combos", params={"id": "now0"})
    assert r.status_code == 200
    r = ask_fresh(server, key, "combo/now0")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert mock.hits("fa") == 11 and mock.hits("fb") == 10


def test_a_new_key_works_and_a_revoked_key_is_refused_at_once(
    still_server: Server, mock: Mock
) -> None:
    server = still_server
    server.reset()
    server.put_provider("m", upstream(mock))
    for i in range(5):
        key = new_key(server, f"once{i}")
        assert ask_fresh(server, key, "m/fa").status_code == 200
        assert server.api.delete(f"/api/keys/{key_id(server, key)}").status_code == 200
        r = ask_fresh(server, key, "m/fa")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert mock.hits("fa") == 5


def test_a_provider_write_is_served_at_once(still_server: Server, mock: Mock) -> None:
    server = still_server
    server.reset()
    key = new_key(server, "prov")
    assert models(server, key) == (200, [])
    server.put_provider("m", upstream(mock))
    assert "m/fa" in models(server, key)[1]
    assert server.api.delete("/api/providers", params={"name": "m"}).status_code == 200
    assert "m/fa" not in models(server, key)[1]


@needs_redis
def test_every_worker_serves_a_write_at_once(still_workers: Server, mock: Mock) -> None:
    """After each PUT returns, every worker (a kept-alive connection on each, and fresh
    connections that land anywhere) serves the new definition: no request sees the old one."""
    server = still_workers
    server.reset()
    server.put_provider("m", upstream(mock))
    key = new_key(server, "all")
    headers = {"Authorization": f"Bearer {key}"}
    clients = spread_clients(server, headers)
    try:
        for client in clients:
            assert client.http.get("/v1/models").status_code == 200  # runtime started
        for i in range(5):
            combo_id = f"all{i}"
            for model in ("fa", "fb"):
                server.put_combo(combo_id, {"targets": [{"provider": "m", "model": model}]})
                for client in clients:
                    r = client.ask(combo_id)
                    assert r.status_code == 200, (client.pid, r.text)
                    assert r.headers["x-ocx-target"] == f"m/{model}", client.pid
                for _ in range(6):
                    r = ask_fresh(server, key, f"combo/{combo_id}")
                    assert r.status_code == 200, r.text
                    assert r.headers["x-ocx-target"] == f"m/{model}"
    finally:
        for client in clients:
            client.close()


@needs_redis
def test_revocation_reaches_every_worker_at_once(still_workers: Server, mock: Mock) -> None:
    """Revoked through the API or the CLI (another process), or its user deactivated, a key is
    refused by every worker as soon as the write returns; so is a model disabled by
    `config load`."""
    server = still_workers
    server.reset()
    server.put_provider("m", upstream(mock))
    ocx(server, "user", "create", "rev-user", "--no-password")
    for how in ("api", "cli", "user"):
        key = new_key(server, f"rev-{how}")
        clients = spread_clients(server, {"Authorization": f"Bearer {key}"})
        try:
            for client in clients:
                assert client.http.get("/v1/models").status_code == 200
            if how == "api":
                assert server.api.delete(f"/api/keys/{key_id(server, key)}").status_code == 200
            elif how == "cli":
                ocx(server, "key", "revoke", str(key_id(server, key)))
            else:
                ocx(server, "user", "deactivate", f"rev-{how}")
            for client in clients:
                r = client.http.get("/v1/models")
                assert r.status_code == 401, (how, client.pid)
            for _ in range(6):
                assert ask_fresh(server, key, "m/fa").status_code == 401
        finally:
            for client in clients:
                client.close()

    key = new_key(server, "disabled")
    clients = spread_clients(server, {"Authorization": f"Bearer {key}"})
    try:
        for client in clients:
            assert "m/fa" in [m["id"] for m in client.http.get("/v1/models").json()["data"]]
        doc = server.data_dir / "disable.json"
        doc.write_text(json.dumps({"disabledModels": ["m/fa"]}))
        ocx(server, "config", "load", str(doc))
        for client in clients:
            ids = [m["id"] for m in client.http.get("/v1/models").json()["data"]]
            assert "m/fa" not in ids and "m/fb" in ids, client.pid
    finally:
        for client in clients:
            client.close()


def ocx(server: Server, *args: str) -> None:
    """Run an `ocx` command as another process against the server's database and Redis."""
    proc = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", *args],
        cwd=ROOT,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
