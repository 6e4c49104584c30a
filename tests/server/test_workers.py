"""`ocx serve --workers N` with Redis: the workers route as one (PRODUCT §2.2, §2.3, §4.2, §5).

Every test talks to several workers on purpose. Each `WorkerClient` is a keep-alive connection
whose serving worker process is identified through /proc (the server side of the TCP connection
is a socket inode owned by exactly one Daphne worker), so the tests can assert that more than one
worker really served the requests, not just that the answers were right.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, Mock, Server, start_server

REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(
    not REDIS_URL, reason="REDIS_URL is not set: several workers need a shared Redis"
)
WORKERS = 3
KEY = "sk-test-workers-aaaaaaaaaaaaaaaaaaaa"


# --- which worker serves a connection ----------------------------------------------------------


def _hex_port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1], 16)


def _server_socket_inode(server_port: int, client_port: int) -> str | None:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if _hex_port(local) == server_port and _hex_port(remote) == client_port:
                return inode
    return None


def _owner_pid(inode: str) -> int | None:
    link = f"socket:[{inode}]"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) == link:
                    return int(entry.name)
        except OSError:
            continue
    return None


class WorkerClient:
    """One keep-alive connection to the server, and the pid of the worker that accepted it."""

    def __init__(self, server: Server, headers: dict[str, str]) -> None:
        self.http = httpx.Client(base_url=server.url, timeout=30, headers=headers)
        r = self.http.get("/healthz")
        assert r.status_code == 200
        stream = r.extensions["network_stream"]
        client_port = stream.get_extra_info("client_addr")[1]
        server_port = int(server.url.rsplit(":", 1)[1])
        inode = _server_socket_inode(server_port, client_port)
        self.pid = None if inode is None else _owner_pid(inode)

    def ask(self, combo_id: str) -> httpx.Response:
        body = {"model": f"combo/{combo_id}", "input": "hi"}
        return self.http.post("/v1/responses", json=body)

    def close(self) -> None:
        self.http.close()


def spread_clients(
    server: Server, headers: dict[str, str], want: int = WORKERS
) -> list[WorkerClient]:
    """Open connections until `want` distinct workers hold one (at most 60 tries); returns
    one client per distinct worker (at least two, or the test fails)."""
    by_pid: dict[int, WorkerClient] = {}
    extra: list[WorkerClient] = []
    for _ in range(60):
        client = WorkerClient(server, headers)
        if client.pid is not None and client.pid not in by_pid:
            by_pid[client.pid] = client
        else:
            extra.append(client)
        if len(by_pid) >= want:
            break
        time.sleep(0.01)
    for client in extra:
        client.close()
    assert len(by_pid) >= 2, f"connections did not spread over workers: {list(by_pid)}"
    return list(by_pid.values())


def wait_all_synced(server: Server, clients: list[WorkerClient], timeout: float = 5) -> None:
    """Every worker (each client's, plus fresh connections) serves the stored config version."""
    deadline = time.monotonic() + timeout
    while True:
        stored = server.http.get("/readyz").json().get("configVersion")
        served = [c.http.get("/healthz").json().get("configVersion") for c in clients]
        for _ in range(2 * WORKERS):
            with httpx.Client(base_url=server.url, timeout=10) as fresh:
                served.append(fresh.get("/healthz").json().get("configVersion"))
        if stored is not None and all(v == stored for v in served):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"config not propagated: stored {stored}, served {served}")
        time.sleep(0.05)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workers_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set: several workers need a shared Redis")
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-workers"),
        workers=WORKERS,
        extra_env={"REDIS_URL": REDIS_URL},
    )
    try:
        yield server
    finally:
        stop()


@pytest.fixture
def setup(workers_server: Server, mock: Mock) -> Any:
    """(server, client headers, worker clients): providers p1/p2 on the mock, a client key, and
    one keep-alive client per distinct worker, every worker warmed up (runtime started)."""
    server = workers_server
    server.reset()
    for name in ("p1", "p2"):
        server.put_provider(
            name,
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": KEY,
                "models": {m: {"contextWindow": 100000} for m in ("fa", "fb")},
            },
        )
    headers = {"Authorization": f"Bearer {server.create_key()}"}
    clients = spread_clients(server, headers)
    for client in clients:
        client.http.get("/v1/models")  # starts the worker's runtime and its config poller
    try:
        yield server, headers, clients
    finally:
        for client in clients:
            client.close()


def new_combo(server: Server, clients: list[WorkerClient], **combo: Any) -> str:
    combo_id = "w" + uuid.uuid4().hex[:8]
    server.put_combo(combo_id, combo)
    wait_all_synced(server, clients)
    return combo_id


# --- tests ---------------------------------------------------------------------------------------


@needs_redis
def test_round_robin_weights_hold_across_workers(setup: Any, mock: Mock) -> None:
    """2:1 smooth weighted round-robin over 300 sequential requests spread over the workers:
    exactly 200:100, and the A,B,A,A,B,A… order, as with one process."""
    server, _, clients = setup
    combo_id = new_combo(
        server,
        clients,
        strategy="round-robin",
        targets=[
            {"provider": "p1", "model": "fa", "weight": 2},
            {"provider": "p2", "model": "fb", "weight": 1},
        ],
    )
    mock.reset()
    served_by: Counter[int | None] = Counter()
    order: list[str] = []
    for i in range(300):
        client = clients[i % len(clients)]
        r = client.ask(combo_id)
        assert r.status_code == 200, r.text
        order.append(r.headers["x-ocx-target"])
        served_by[client.pid] += 1
    assert mock.hits("fa") == 200
    assert mock.hits("fb") == 100
    assert Counter(order) == {"p1/fa": 200, "p2/fb": 100}
    assert order == ["p1/fa", "p2/fb", "p1/fa"] * 100  # A,B,A,A,B,A,… with no slip
    assert len(served_by) >= 2 and min(served_by.values()) >= 100


@needs_redis
def test_cooldown_seen_by_one_worker_applies_to_all(setup: Any, mock: Mock) -> None:
    """A 429 with Retry-After: 3 answered to one worker cools the target for every worker:
    no further hit on it from any worker, on kept-alive or new connections, until it expires."""
    server, headers, clients = setup
    combo_id = new_combo(
        server,
        clients,
        targets=[{"provider": "p1", "model": "fa"}, {"provider": "p2", "model": "fb"}],
    )
    mock.reset()
    mock.script("fa", [{"status": 429, "headers": {"Retry-After": "3"}}])
    started = time.monotonic()
    first = clients[0].ask(combo_id)
    assert first.status_code == 200, first.text
    assert first.headers["x-ocx-target"] == "p2/fb"
    assert first.headers["x-ocx-attempts"] == "2"
    assert mock.hits("fa") == 1

    targets: list[str] = []
    for i in range(30):
        if i % 2:
            r = clients[i % len(clients)].ask(combo_id)
        else:
            with httpx.Client(base_url=server.url, timeout=30, headers=headers) as fresh:
                r = fresh.post(
                    "/v1/responses",
                    json={"model": f"combo/{combo_id}", "input": "hi"},
                    headers={"Connection": "close"},
                )
        assert r.status_code == 200, r.text
        targets.append(r.headers["x-ocx-target"])
    assert time.monotonic() - started < 2.5, "too slow to observe the 3 s cooldown"
    assert mock.hits("fa") == 1, "a worker hit the cooled target"
    assert set(targets) == {"p2/fb"}

    # After the cooldown one probe reaches the target again and it serves.
    time.sleep(max(0.0, 3.2 - (time.monotonic() - started)))
    again = clients[-1].ask(combo_id)
    assert again.status_code == 200, again.text
    assert again.headers["x-ocx-target"] == "p1/fa"
    assert mock.hits("fa") == 2


@needs_redis
def test_config_change_is_served_by_every_worker_within_a_second(setup: Any, mock: Mock) -> None:
    server, _, clients = setup
    combo_id = new_combo(server, clients, targets=[{"provider": "p1", "model": "fa"}])
    for client in clients:
        assert client.ask(combo_id).headers["x-ocx-target"] == "p1/fa"

    server.put_combo(combo_id, {"targets": [{"provider": "p2", "model": "fb"}]})
    changed = time.monotonic()
    pending = {id(c): c for c in clients}
    while pending:
        for key, client in list(pending.items()):
            r = client.ask(combo_id)
            assert r.status_code == 200, r.text
            if r.headers["x-ocx-target"] == "p2/fb":
                del pending[key]
        assert time.monotonic() - changed < 1.0, f"{len(pending)} worker(s) still on the old config"
    # And from then on every worker, on any connection, serves the new definition.
    for client in clients:
        assert client.ask(combo_id).headers["x-ocx-target"] == "p2/fb"
    with httpx.Client(base_url=server.url, timeout=30, headers=clients[0].http.headers) as fresh:
        for _ in range(6):
            r = fresh.post(
                "/v1/responses",
                json={"model": f"combo/{combo_id}", "input": "hi"},
                headers={"Connection": "close"},
            )
            assert r.headers["x-ocx-target"] == "p2/fb"


@needs_redis
def test_changed_combo_state_is_reset_once_for_all_workers(setup: Any, mock: Mock) -> None:
    """A PUT that changes the combo forgets its shared cooldowns for every worker; a PUT that
    leaves the definition unchanged keeps them (as with one process)."""
    server, _, clients = setup
    targets = [{"provider": "p1", "model": "fa"}, {"provider": "p2", "model": "fb"}]
    combo_id = new_combo(server, clients, targets=targets)
    mock.reset()
    mock.script("fa", [{"status": 429, "headers": {"Retry-After": "600"}}])
    assert clients[0].ask(combo_id).headers["x-ocx-target"] == "p2/fb"
    assert mock.hits("fa") == 1

    server.put_combo(combo_id, {"targets": targets})  # same definition: state kept
    wait_all_synced(server, clients)
    for client in clients:
        assert client.ask(combo_id).headers["x-ocx-target"] == "p2/fb"
    assert mock.hits("fa") == 1

    server.put_combo(combo_id, {"targets": targets, "cooldownMs": 5000})  # changed: reset
    wait_all_synced(server, clients)
    for client in clients:
        assert client.ask(combo_id).headers["x-ocx-target"] == "p1/fa"
    assert mock.hits("fa") == 1 + len(clients)


def test_workers_without_redis_are_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env["OCX_DATA_DIR"] = str(tmp_path)
    env.pop("DATABASE_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "serve", "--port", "0", "--workers", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "--workers 2 needs REDIS_URL" in output, output
    assert "ocx listening on" not in output
