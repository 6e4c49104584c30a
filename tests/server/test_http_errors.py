"""JSON errors for 405/404 under /api and for a disallowed Host on every path (issue #14 item 6).

Real `ocx serve` processes; shapes documented in docs/operations.md "Error shapes".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.http_errors import HOST_NOT_ALLOWED, HostGate
from tests.conftest import Server, start_server

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
HOST_ERROR_V1 = {
    "error": {
        "type": "invalid_request_error",
        "code": "host_not_allowed",
        "message": HOST_NOT_ALLOWED,
    }
}


def _api_operations(server: Server) -> dict[str, set[str]]:
    spec = server.api.get("/api/openapi.json").json()
    return {
        re.sub(r"\{[^}]+\}", "1", path): {m.upper() for m in ops}
        for path, ops in spec["paths"].items()
    }


def test_405_on_every_api_path_is_json(ocx_server: Server) -> None:
    operations = _api_operations(ocx_server)
    assert "/api/combos" in operations and len(operations) >= 8
    checked = 0
    for path, allowed in operations.items():
        for method in METHODS:
            if method in allowed:
                continue
            for client in (ocx_server.api, ocx_server.http):  # with and without a token
                r = client.request(method, path)
                assert r.status_code == 405, (method, path, r.text)
                assert r.headers["content-type"] == "application/json", (method, path)
                assert r.json() == {"error": "method not allowed"}
                assert set(r.headers["allow"].split(", ")) == allowed, (method, path)
                checked += 1
    assert checked >= 2 * 30


def test_post_combos_is_the_issue_example(ocx_server: Server) -> None:
    r = ocx_server.api.post("/api/combos", json={"id": "x", "combo": {"targets": []}})
    assert r.status_code == 405
    assert r.json() == {"error": "method not allowed"}
    assert set(r.headers["allow"].split(", ")) == {"GET", "PUT", "DELETE"}
    assert ocx_server.api.get("/api/combos").json()["combos"] == []  # nothing changed


def test_unknown_api_path_is_a_json_404(ocx_server: Server) -> None:
    r = ocx_server.api.get("/api/no-such-thing")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "not found"}
    # Ninja's own JSON 404s are left as they are.
    r = ocx_server.api.get("/api/combos/no-such-combo")
    assert r.status_code == 404
    assert r.json() == {"error": "unknown combo"}


def test_unknown_path_outside_api_keeps_django_404(ocx_server: Server) -> None:
    r = ocx_server.http.get("/no-such-page")
    assert r.status_code == 404
    assert "application/json" not in r.headers.get("content-type", "")


@pytest.mark.parametrize(
    "path",
    [
        "/admin/",
        "/admin/login/",
        "/api/combos",
        "/healthz",
        "/readyz",
        "/metrics",
        "/static/admin/css/base.css",  # WhiteNoise answers before Django's own Host check
    ],
)
def test_disallowed_host_on_django_paths_is_json_400(ocx_server: Server, path: str) -> None:
    r = ocx_server.api.get(path, headers={"Host": "evil.example"})
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": HOST_NOT_ALLOWED}
    assert "evil.example" not in r.text
    # An allowed Host gets the page.
    assert ocx_server.api.get(path, headers={"Host": "localhost:8787"}).status_code in (200, 302)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("POST", "/v1/responses"), ("POST", "/v1/chat/completions")],
)
def test_disallowed_host_on_v1_is_openai_shaped_400(
    ocx_server: Server, method: str, path: str
) -> None:
    key = ocx_server.create_key()
    r = ocx_server.http.request(
        method,
        path,
        json={"model": "x", "input": "hi"} if method == "POST" else None,
        headers={"Host": "evil.example:8787", "Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == HOST_ERROR_V1
    # The same request with an allowed Host goes on to authentication and routing.
    r = ocx_server.http.get("/v1/models", headers={"Host": "LOCALHOST:1", "x-ocx-key": key})
    assert r.status_code == 200


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, stop = start_server(
        tmp_path_factory.mktemp("hosts"),
        extra_env={"OCX_ALLOWED_HOSTS": "127.0.0.1,ocx.internal,.team.example"},
    )
    try:
        yield server
    finally:
        stop()


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("ocx.internal", True),
        ("ocx.internal:8787", True),
        ("team.example", True),
        ("a.team.example:443", True),
        ("localhost", False),  # allowed by default, not in this server's list
        ("ocx.internal.evil", False),
        ("xteam.example", False),
    ],
)
def test_v1_and_django_agree_on_allowed_hosts(
    team_server: Server, host: str, allowed: bool
) -> None:
    v1 = team_server.http.get("/v1/models", headers={"Host": host})
    django = team_server.http.get("/healthz", headers={"Host": host})
    if allowed:
        assert v1.status_code == 401  # past the Host check: no key
        assert django.status_code == 200
    else:
        assert (v1.status_code, v1.json()) == (400, HOST_ERROR_V1)
        assert (django.status_code, django.json()) == (400, {"error": HOST_NOT_ALLOWED})


def test_host_gate_rules() -> None:
    gate = HostGate(["localhost", ".example.com", "[::1]"])
    assert gate.allows("localhost") and gate.allows("LocalHost:8787")
    assert gate.allows("example.com") and gate.allows("a.b.example.com:1")
    assert gate.allows("[::1]:8787")
    assert not gate.allows("evil.com") and not gate.allows("") and not gate.allows(None)
    assert not gate.allows("localhost.evil.com")
    assert HostGate(["*"]).allows("anything.at.all")
    assert not HostGate([]).allows("localhost")


def test_host_gate_cache_is_bounded() -> None:
    gate = HostGate(["localhost"])
    for i in range(HostGate.CACHE_LIMIT + 50):
        assert not gate.allows(f"h{i}.evil")
    assert len(gate._seen) == HostGate.CACHE_LIMIT
    assert gate.allows("localhost")  # still answered correctly once the cache is full


def test_wildcard_server_accepts_any_host(tmp_path: Path) -> None:
    server, stop = start_server(tmp_path, extra_env={"OCX_ALLOWED_HOSTS": "*"})
    try:
        r = server.http.get("/v1/models", headers={"Host": "whatever.example"})
        assert r.status_code == 401
        assert server.http.get("/healthz", headers={"Host": "whatever.example"}).status_code == 200
    finally:
        stop()
