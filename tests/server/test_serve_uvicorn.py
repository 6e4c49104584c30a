"""`ocx serve --server uvicorn`: the optional server serves the proxy, the admin and /ws/events.

A real `ocx serve --server uvicorn` process in front of the `mock` upstream, configured through
the management API like every other end-to-end test. Skipped when uvicorn is not installed
(`pip install 'ocx[uvicorn]'`), except the refusal test, which hides uvicorn itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, Mock, Server, sse_events, start_server

HAVE_UVICORN = importlib.util.find_spec("uvicorn") is not None
needs_uvicorn = pytest.mark.skipif(not HAVE_UVICORN, reason="uvicorn is not installed")
CHAT = {"messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def uvicorn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not HAVE_UVICORN:
        pytest.skip("uvicorn is not installed")
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-uvicorn"), server_args=["--server", "uvicorn"]
    )
    try:
        yield server
    finally:
        stop()


@pytest.fixture
def server(uvicorn_server: Server) -> Server:
    uvicorn_server.reset()
    return uvicorn_server


def setup_combo(server: Server, mock: Mock, models: list[str]) -> tuple[str, str]:
    """Provider `p1` (Chat) and `p1r` (Responses) on the mock; a combo over `models` on p1r."""
    key = server.create_key()
    for name, adapter in (("p1", "openai-chat"), ("p1r", "openai-responses")):
        server.put_provider(
            name,
            {
                "adapter": adapter,
                "baseUrl": mock.url + "/v1",
                "apiKey": "sk-test-uvicorn-aaaaaaaaaaaaaaaaaaaa",
                "timeouts": {"firstByteMs": 2000, "idleMs": 2000},
            },
        )
    combo_id = "u" + uuid.uuid4().hex[:8]
    server.put_combo(combo_id, {"targets": [{"provider": "p1r", "model": m} for m in models]})
    server.put_combo(combo_id + "c", {"targets": [{"provider": "p1", "model": models[0]}]})
    server.http.get("/v1/models")
    server.wait_synced()
    return combo_id, key


def auth(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


@needs_uvicorn
def test_worker_is_uvicorn(server: Server) -> None:
    r = server.http.get("/healthz")
    assert r.status_code == 200
    assert r.headers.get("server") == "uvicorn"
    assert any("1 uvicorn worker(s)" in line for line in server.output)


@needs_uvicorn
def test_non_streamed_and_streamed_requests_carry_ocx_headers(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(server, mock, ["m-uv"])
    body = {"model": f"combo/{combo_id}c", "stream": False, **CHAT}
    r = server.http.post("/v1/chat/completions", json=body, headers=auth(key))
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-combo"] == f"{combo_id}c"
    assert r.headers["x-ocx-target"] == "p1/m-uv"
    assert r.headers["x-ocx-attempts"] == "1"
    assert r.headers["x-ocx-request-id"]
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.json()["choices"][0]["message"]["content"]

    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": True}
    with server.http.stream("POST", "/v1/responses", json=body, headers=auth(key)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-ocx-combo"] == combo_id
        assert r.headers["x-ocx-target"] == "p1r/m-uv"
        text = r.read().decode()
    events = sse_events(text)
    assert events[-1][0] == "response.completed"
    assert any(name == "response.output_text.delta" for name, _ in events)


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
@needs_uvicorn
def test_no_nagle_stall_on_keep_alive_connections(server: Server, mock: Mock) -> None:
    """Responses written in parts (headers, body) must not wait for the client's delayed ACK:
    with `uvicorn --fd` the socket lost TCP_NODELAY and every request took >= 40 ms."""
    combo_id, key = setup_combo(server, mock, ["m-uv-fast"])
    body = {"model": f"combo/{combo_id}c", "stream": False, **CHAT}
    took = []
    with httpx.Client(base_url=server.url, timeout=10) as client:  # one keep-alive connection
        for _ in range(8):
            started = time.monotonic()
            r = client.post("/v1/chat/completions", json=body, headers=auth(key))
            took.append(time.monotonic() - started)
            assert r.status_code == 200, r.text
    assert min(took[1:]) < 0.035, took


@needs_uvicorn
def test_codex_session_id_header_reaches_recall(server: Server, mock: Mock) -> None:
    """uvicorn passes `session_id` through as sent (Daphne needs server.daphne_main for it)."""
    combo_id, key = setup_combo(server, mock, ["m-uv-recall"])
    lane = f"019a3c5e-{uuid.uuid4().hex[:12]}"

    def ask(model: str, session: str) -> httpx.Response:
        body = {"model": model, "input": "hi", "stream": True}
        return server.http.post("/v1/responses", json=body, headers=auth(key, session_id=session))

    assert ask("m-uv-recall", lane).status_code == 404  # no combo response on this lane yet
    assert ask(f"combo/{combo_id}", lane).status_code == 200
    r = ask("m-uv-recall", lane)  # the bare name on the same session: back through the combo
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-combo"] == combo_id
    assert ask("m-uv-recall", "another-lane").status_code == 404


@needs_uvicorn
def test_error_response_keeps_the_connection_open(server: Server) -> None:
    """An error answered by the proxy app is a complete ASGI exchange: no traceback, and the
    keep-alive connection stays usable (clients reuse it for the next request)."""
    before = len(server.output)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        peers = set()
        for _ in range(3):
            with client.stream("GET", "/v1/models") as r:
                assert r.status_code == 401
                peers.add(r.extensions["network_stream"].get_extra_info("client_addr"))
                r.read()
            time.sleep(0.05)  # let a closing server close before the next request
    logged = "".join(server.output[before:])
    assert "Exception in ASGI application" not in logged, logged[-2000:]
    assert len(peers) == 1, "the server closed the connection after an error response"


def staff_session(server: Server) -> httpx.Client:
    """A browser-like client logged in through the admin login form (CSRF and all)."""
    username, password = f"staff{uuid.uuid4().hex[:6]}", "pw-" + uuid.uuid4().hex
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput"]
        + ["--username", username, "--email", f"{username}@example.com"],
        cwd=ROOT,
        env={**server.env, "DJANGO_SUPERUSER_PASSWORD": password},
        check=True,
        capture_output=True,
    )
    browser = httpx.Client(base_url=server.url, timeout=30)
    page = browser.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:500]
    r = browser.post(
        "/admin/login/?next=/admin/",
        data={"csrfmiddlewaretoken": token.group(1), "username": username, "password": password},
        headers={"Referer": f"{server.url}/admin/login/"},
    )
    assert r.status_code == 302, r.text[:500]
    assert "sessionid" in browser.cookies
    return browser


@needs_uvicorn
def test_admin_login_page_renders_with_its_css(server: Server) -> None:
    r = server.http.get("/admin/login/")
    assert r.status_code == 200
    assert "/static/admin/css/base.css" in r.text
    css = server.http.get("/static/admin/css/base.css")
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
    assert b"body" in css.content
    browser = staff_session(server)
    assert browser.get("/admin/").status_code == 200


@needs_uvicorn
def test_events_websocket_under_uvicorn(server: Server, mock: Mock) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = server.url.replace("http://", "ws://") + "/ws/events"
    with pytest.raises(InvalidStatus):  # anonymous: the consumer closes before accepting
        with connect(ws_url, origin=server.url, open_timeout=10):  # type: ignore[arg-type]
            pass

    browser = staff_session(server)
    cookie = f"sessionid={browser.cookies['sessionid']}"
    combo_id, key = setup_combo(server, mock, ["m-uv-a", "m-uv-b"])
    mock.script("m-uv-a", [{"status": 429, "headers": {"Retry-After": "30"}}])
    with connect(
        ws_url,
        origin=server.url,  # type: ignore[arg-type]
        additional_headers={"Cookie": cookie},
        open_timeout=10,
    ) as ws:
        body = {"model": f"combo/{combo_id}", "input": "hi", "stream": False}
        r = server.http.post("/v1/responses", json=body, headers=auth(key))
        assert r.status_code == 200, r.text
        assert r.headers["x-ocx-target"] == "p1r/m-uv-b"
        while True:  # other events (other servers sharing Redis) are skipped
            event: dict[str, Any] = json.loads(ws.recv(timeout=10))
            if event.get("kind") == "cooldown" and event.get("combo") == combo_id:
                break
        assert event["target"] == "p1r/m-uv-a"


def test_uvicorn_refused_when_not_installed(tmp_path: Path) -> None:
    """One clear line and a non-zero exit, before anything binds or migrates."""
    code = (
        "import sys; sys.modules['uvicorn'] = None; from ocxsite.cli import main; "
        "sys.exit(main(['serve', '--server', 'uvicorn', '--port', '0']))"
    )
    env = {**os.environ, "OCX_DATA_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ocx: --server uvicorn needs uvicorn, which is not installed")
    assert "ocx listening" not in proc.stdout


def test_check_server_function() -> None:
    from django.core.management import CommandError

    from ocxsite.management.commands import serve

    serve.check_server("daphne")
    cmd = serve.worker_command("daphne", 7)
    assert cmd[1:4] == ["-m", "server.daphne_main", "--fd"]
    if HAVE_UVICORN:
        serve.check_server("uvicorn")
        cmd = serve.worker_command("uvicorn", 7)
        assert cmd[1:] == ["-m", "ocxsite.management.commands.serve", "--uvicorn-fd", "7"]
    else:
        with pytest.raises(CommandError, match="needs uvicorn"):
            serve.check_server("uvicorn")


@needs_uvicorn
def test_uvicorn_worker_froze_its_startup_heap(server: Server) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    r = server.http.get("/metrics")
    found = {
        s.name: s.value for family in text_string_to_metric_families(r.text) for s in family.samples
    }
    assert found["ocx_worker_frozen_objects"] > 10_000
