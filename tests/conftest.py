"""Shared fixtures: real `ocx mock-upstream` and real `ocx serve` processes on loopback.

End-to-end tests never share the pytest-django test database with the server: each server
gets its own data dir (SQLite) or its own fresh PostgreSQL database when DATABASE_URL points
at PostgreSQL, and is configured through its own management API (OCX_ADMIN_TOKEN).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.ocxsite.deps import RedisServer

ROOT = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"


SLOW_TIMEOUT_S = 300
# The pytest-xdist worker this process is ("gw0", "gw1", ...; "" when the run is not parallel).
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: real-browser (Chromium) admin tests")
    config.addinivalue_line(
        "markers",
        "slow: starts `ocx serve` or another heavy process (set by tests/conftest.py for every "
        "test that calls start_server or uses a fixture that does); the quick loop is "
        '`pytest -m "not slow"`',
    )
    if WORKER:
        _isolate_worker()


def _isolate_worker() -> None:
    """What the in-process tests of parallel workers would share: the Redis key prefix (and the
    config notice channel under it) and the channel layer's groups. The databases are per worker
    already (pytest-django's `_gwN` suffix) and so is every server's (a copy of its own)."""
    from django.conf import settings

    prefix = f"{settings.OCX_STATE_KEY_PREFIX}-{WORKER}"
    settings.OCX_STATE_KEY_PREFIX = prefix
    os.environ["OCX_STATE_KEY_PREFIX"] = prefix  # processes the tests start themselves
    layer = settings.CHANNEL_LAYERS["default"]
    if "CONFIG" in layer:  # channels_redis (with REDIS_URL)
        layer["CONFIG"]["prefix"] = f"asgi-{WORKER}"


@functools.cache
def _source(func: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(func)
    except (OSError, TypeError):
        return ""


def _calls(func: Callable[..., Any], names: frozenset[str]) -> bool:
    pattern = r"\b(" + "|".join(sorted(names)) + r")\("
    return re.search(pattern, _source(func)) is not None


@functools.cache
def _server_starters(module: Any) -> frozenset[str]:
    """`start_server` and the module's own functions that call it (directly or through another)."""
    names = frozenset({"start_server"})
    funcs = [
        f
        for f in vars(module).values()
        if inspect.isfunction(f)
        and f.__module__ == module.__name__
        and not f.__name__.startswith("test")
    ]
    for _ in range(3):
        names |= {f.__name__ for f in funcs if _calls(f, names)}
    return names


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` every test that starts `ocx serve` (in its body or any fixture it uses), and
    keep the tests that share a module- or class-scoped fixture (a server of their module) on
    one xdist worker (`--dist loadgroup`), so that each module starts its servers once.

    A test that asserts a time (a bound, a wait) carries `@pytest.mark.xdist_group("timed")`:
    those run one after another on one worker, never two at once."""
    for item in items:
        infos = getattr(item, "_fixtureinfo", None)
        defs = [d[-1] for d in infos.name2fixturedefs.values() if d] if infos else []
        func = getattr(item, "function", None)
        module = getattr(item, "module", None)
        starters = _server_starters(module) if module is not None else frozenset({"start_server"})
        funcs = [func, *(d.func for d in defs)]
        if any(_calls(f, starters) for f in funcs if f is not None):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") and item.get_closest_marker("timeout") is None:
            # pytest-timeout's 120 s (pyproject.toml) is a hang's bound; a test that starts
            # servers and CLI processes can take longer on 2 loaded cores (parallel passes).
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        shared = any(d.scope in ("module", "class") for d in defs)
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def _start(
    cmd: list[str],
    env: dict[str, str],
    marker: str,
    timeout: float = 30,
    preexec_fn: Callable[[], None] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=preexec_fn,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            url = line.strip().split(" ")[-1] if "listening on" in line else ""
            if marker == "ocx listening on":
                url = line.split("ocx listening on ")[1].split(" ")[0]
            OUTPUT[proc.pid] = seen
            _drain(proc, seen)
            return proc, url
    proc.kill()
    raise RuntimeError("process did not start:\n" + "".join(seen))


# Every line a started process printed (stdout and stderr), by pid: log-content tests read it.
OUTPUT: dict[int, list[str]] = {}


def _drain(proc: subprocess.Popen[str], lines: list[str]) -> None:
    # Keep reading the child's output so that it never blocks on a full pipe.
    import threading

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if os.environ.get("OCX_TEST_ECHO"):
                sys.stderr.write(line)

    threading.Thread(target=pump, daemon=True).start()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class Mock:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=10)

    def script(
        self, model: str, steps: list[dict[str, Any]], then: dict[str, Any] | None = None
    ) -> None:
        payload: dict[str, Any] = {"model": model, "steps": steps}
        if then is not None:
            payload["then"] = then
        self.http.post("/_mock/script", json=payload).raise_for_status()

    def log(self, model: str | None = None) -> list[dict[str, Any]]:
        params = {"model": model} if model else None
        return self.http.get("/_mock/log", params=params).json()

    def hits(self, model: str) -> int:
        return len(self.log(model))

    def reset(self) -> None:
        self.http.post("/_mock/reset").raise_for_status()


@pytest.fixture(scope="session")
def mock_upstream() -> Iterator[Mock]:
    proc, url = _start(
        [sys.executable, "-m", "mockupstream", "--port", "0"],
        dict(os.environ),
        "listening on",
    )
    mock = Mock(url)
    try:
        yield mock
    finally:
        _stop(proc)


@pytest.fixture
def mock(mock_upstream: Mock) -> Mock:
    mock_upstream.reset()
    return mock_upstream


# A server's database starts as a copy of one migrated in this test run: `ocx serve` then has
# no migration to apply (on a 2-vCPU CI machine a fresh `migrate` cost each start ~1 s of CPU
# and 1-3 s of wall time, and the suite starts a server per module and more). `fresh_db=True`
# gives a test the empty database instead.
_MIGRATED: dict[str, str] = {}


def _migrate(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=ROOT,
        env={k: v for k, v in env.items() if k != "DJANGO_SETTINGS_MODULE"},
        check=True,
        timeout=300,
    )


def _migrated_sqlite() -> Path:
    path = _MIGRATED.get("sqlite")
    if path is None:
        data = tempfile.mkdtemp(prefix="ocx-migrated-")
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        _migrate({**env, "OCX_DATA_DIR": data})
        path = os.path.join(data, "ocx.sqlite3")
        with sqlite3.connect(path) as db:  # everything into the file itself, none in its WAL
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _MIGRATED["sqlite"] = path
        atexit.register(shutil.rmtree, data, True)
    return Path(path)


def _migrated_postgres(admin_url: str, parts: Any) -> str:
    import psycopg

    name = _MIGRATED.get("postgres")
    if name is None:
        name = f"ocx_e2e_migrated_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        _migrate({**os.environ, "DATABASE_URL": urlunsplit(parts._replace(path=f"/{name}"))})
        _MIGRATED["postgres"] = name
        atexit.register(_drop_database, admin_url, name)
    return name


def _drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _server_database(fresh: bool = False) -> tuple[str | None, callable]:  # type: ignore[valid-type]
    """A PostgreSQL database for one server when DATABASE_URL is PostgreSQL: a copy of the
    migrated one, or empty when `fresh`."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return None, lambda: None
    import psycopg

    parts = urlsplit(url)
    name = f"ocx_e2e_{uuid.uuid4().hex[:10]}"
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    template = "" if fresh else f' TEMPLATE "{_migrated_postgres(admin_url, parts)}"'
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{template}')
    return urlunsplit(parts._replace(path=f"/{name}")), lambda: _drop_database(admin_url, name)


class Server:
    def __init__(self, url: str, proc: subprocess.Popen[str], data_dir: Path) -> None:
        self.url = url
        self.proc = proc
        self.data_dir = data_dir
        self.env: dict[str, str] = {}  # the environment `ocx serve` was started with
        self.superuser = False  # tests/browser: its admin user exists (createsuperuser ran)
        # Everything the server and its workers printed so far (stdout and stderr, by line).
        self.output: list[str] = OUTPUT.setdefault(proc.pid, [])
        self.api = httpx.Client(
            base_url=url, timeout=30, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        self.http = httpx.Client(base_url=url, timeout=60)

    def put_provider(self, name: str, provider: dict[str, Any]) -> None:
        r = self.api.put("/api/providers", json={"name": name, "provider": provider})
        assert r.status_code == 200, r.text

    def put_combo(self, combo_id: str, combo: dict[str, Any]) -> None:
        r = self.api.put("/api/combos", json={"id": combo_id, "combo": combo})
        assert r.status_code == 200, r.text

    def create_key(self, user: str = "dev", **extra: Any) -> str:
        r = self.api.post("/api/keys", json={"user": user, **extra})
        assert r.status_code == 201, r.text
        key: str = r.json()["key"]
        # The answer comes after every worker reloaded its key map (docs/operations.md); the
        # wait stays for servers whose Redis a test has taken away (then the poll brings it).
        deadline = time.monotonic() + 5
        while self.http.get("/v1/models", headers={"x-ocx-key": key}).status_code == 401:
            assert time.monotonic() < deadline, "the new client key was not picked up"
            time.sleep(0.02)
        return key

    def wait_synced(self, timeout: float = 5) -> None:
        """Wait until the worker serves the stored config version (PRODUCT §4.2)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Any /v1 request makes the worker load its snapshot (401 here is expected).
            self.http.get("/v1/models")
            stored = self.http.get("/readyz").json().get("configVersion")
            served = self.http.get("/healthz").json().get("configVersion")
            if stored is not None and stored == served:
                return
            time.sleep(0.02)
        raise AssertionError(f"config not propagated: stored {stored}, served {served}")

    def reset(self) -> None:
        for combo in self.api.get("/api/combos").json()["combos"]:
            self.api.delete("/api/combos", params={"id": combo["id"]})
        for provider in self.api.get("/api/providers").json()["providers"]:
            self.api.delete("/api/providers", params={"name": provider["name"]})


def start_server(
    tmp: Path,
    *,
    workers: int = 1,
    extra_env: dict[str, str] | None = None,
    server_args: list[str] | None = None,
    database_url: str | None = None,
    preexec_fn: Callable[[], None] | None = None,
    fresh_db: bool = False,
) -> tuple[Server, callable]:  # type: ignore[valid-type]
    # `database_url`: a database the test runs itself (tests/ocxsite/deps.py PgCluster).
    # `preexec_fn`: run in the `ocx serve` child before it starts (e.g. a lowered rlimit).
    # `fresh_db`: an empty database that `ocx serve` creates (else a migrated copy).
    db_url, drop = (database_url, lambda: None) if database_url else _server_database(fresh_db)
    env = {
        **os.environ,
        "OCX_DATA_DIR": str(tmp),
        "OCX_ADMIN_TOKEN": ADMIN_TOKEN,
        "OCX_CONFIG_POLL_MS": "100",
        # A loaded CI machine must not trip the Redis circuit breaker of tests about other
        # things (50 ms by default); the Redis-outage tests set their own.
        "OCX_REDIS_TIMEOUT_MS": "1000",
        # A server stopped with a stream still running ends it within 5 s (default 30 s).
        "OCX_SHUTDOWN_GRACE_S": "5",
        **(extra_env or {}),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if db_url:
        env["DATABASE_URL"] = db_url
    else:
        env.pop("DATABASE_URL", None)
        sqlite = Path(env["OCX_DATA_DIR"]) / "ocx.sqlite3"
        if not fresh_db and not sqlite.exists():
            sqlite.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.copyfile(_migrated_sqlite(), sqlite)
            sqlite.chmod(0o600)  # as `ocx serve` makes it
    # The server uses Redis whenever the test run has REDIS_URL (CI's second pass); each server
    # gets its own state key prefix so servers sharing one Redis database never see each other.
    if "OCX_STATE_KEY_PREFIX" not in (extra_env or {}):
        env["OCX_STATE_KEY_PREFIX"] = f"ocx-test-{uuid.uuid4().hex[:10]}"
    proc, url = _start(
        [sys.executable, "-m", "ocxsite.cli", "serve", "--port", "0", "--workers", str(workers)]
        + (server_args or []),
        env,
        "ocx listening on",
        timeout=60,
        preexec_fn=preexec_fn,
    )
    server = Server(url, proc, tmp)
    server.env = env
    # Wait until a worker answers.
    deadline = time.monotonic() + 30
    while True:
        try:
            if server.http.get("/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("server did not answer /healthz")
        time.sleep(0.05)

    def stop() -> None:
        _stop(proc)
        drop()

    return server, stop


@pytest.fixture(scope="module")
def ocx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, stop = start_server(tmp_path_factory.mktemp("ocx"))
    try:
        yield server
    finally:
        stop()


@pytest.fixture
def server(ocx_server: Server) -> Server:
    ocx_server.reset()
    return ocx_server


def sse_events(text: str) -> list[tuple[str | None, Any]]:
    """Parse an SSE body into (event, data) pairs; data is JSON-decoded when possible."""
    out: list[tuple[str | None, Any]] = []
    for frame in text.replace("\r\n", "\n").split("\n\n"):
        event = None
        data_lines = []
        for line in frame.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data_lines.append(line[5:].lstrip())
        if not data_lines:
            continue
        data = "\n".join(data_lines)
        try:
            out.append((event, json.loads(data)))
        except ValueError:
            out.append((event, data))
    return out


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A throwaway `redis-server` (tests/ocxsite/deps.py) of one test, stopped after it."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()
