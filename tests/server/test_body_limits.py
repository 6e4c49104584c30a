"""Bodies bounded before they are read (issue #26 point 1), against real `ocx serve` processes
with Daphne (the default) and with uvicorn.

Each request declares 300 MiB (or streams a chunked body) and the test sends only what the
server must read to answer: the headers (or a few chunks). A server that waited for the body
would never answer; one that answered after reading it would have needed the 300 MiB.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server, start_server

HAVE_UVICORN = importlib.util.find_spec("uvicorn") is not None
DECLARED = 300 * 1024 * 1024
PROXY_LIMIT = 256 * 1024


@pytest.fixture(scope="module", params=["daphne", "uvicorn"])
def bounded_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    if request.param == "uvicorn" and not HAVE_UVICORN:
        pytest.skip("uvicorn is not installed")
    server, stop = start_server(
        tmp_path_factory.mktemp(f"ocx-bounded-{request.param}"),
        server_args=["--server", request.param],
        extra_env={"OCX_PROXY_MAX_BODY": str(PROXY_LIMIT)},
    )
    try:
        yield server
    finally:
        stop()


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _head(path: str, framing: str, extra: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", framing]
    lines += [f"{name}: {value}" for name, value in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response: its head, then `Content-Length` bytes of body (the server closes the
    connection after it, having said `Connection: close`; the tests check that header)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def declared(
    server: Server, path: str, extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    with _connect(server) as sock:
        sock.sendall(_head(path, f"Content-Length: {DECLARED}", extra))
        return _answer(sock)


def chunked(
    server: Server, path: str, chunks: int, extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """A chunked body of `chunks` 64 KiB chunks, never terminated: only a refusal answers it."""
    with _connect(server) as sock:
        sock.sendall(_head(path, "Transfer-Encoding: chunked", extra))
        piece = b"10000\r\n" + b"[" * 0x10000 + b"\r\n"
        try:
            for _ in range(chunks):
                sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-body: the answer was sent before the connection closed
        return _answer(sock)


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/v1/responses", 64 * 1024), ("/api/keys", 64 * 1024), ("/healthz", 1024)],
)
def test_declared_body_over_the_limit_is_refused_from_the_headers(
    bounded_server: Server, path: str, limit: int
) -> None:
    status, headers, body = declared(bounded_server, path)
    assert status == 413
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    message = error["message"] if path.startswith("/v1/") else error
    # A proxy answer carries its request id, like every other one.
    assert ("x-ocx-request-id" in headers) is path.startswith("/v1/")
    # No credential presented: /v1 and /api get the unauthenticated limit.
    assert message == f"Request body exceeds {limit} bytes"


def test_a_known_client_key_raises_the_proxy_limit(bounded_server: Server) -> None:
    key = bounded_server.create_key()  # also loads the worker's key map
    status, _, body = declared(bounded_server, "/v1/responses", {"Authorization": f"Bearer {key}"})
    assert status == 413
    assert json.loads(body)["error"] == {
        "type": "invalid_request_error",
        "code": "request_too_large",
        "message": f"Request body exceeds {PROXY_LIMIT} bytes",
    }
    # x-ocx-key (a chatgpt caller's own token in the bearer) counts the same.
    status, _, body = declared(
        bounded_server, "/v1/responses", {"x-ocx-key": key, "Authorization": "Bearer eyJ-chatgpt"}
    )
    assert json.loads(body)["error"]["message"] == f"Request body exceeds {PROXY_LIMIT} bytes"
    # A key of the right shape that the worker does not know: the unauthenticated limit.
    for headers in ({"Authorization": "Bearer ocx_" + "x" * 43}, {"Authorization": "Bearer eyJ"}):
        status, _, body = declared(bounded_server, "/v1/responses", headers)
        assert status == 413
        assert json.loads(body)["error"]["message"] == f"Request body exceeds {64 * 1024} bytes"


def test_a_presented_credential_raises_the_api_limit(bounded_server: Server) -> None:
    # Management tokens are checked in the database, later: presenting one is enough here.
    status, _, body = declared(
        bounded_server, "/api/keys", {"Authorization": "Bearer ocxm_not-checked-yet"}
    )
    assert status == 413
    assert json.loads(body) == {"error": f"Request body exceeds {1024 * 1024} bytes"}


@pytest.mark.parametrize(("path", "limit"), [("/api/keys", 64 * 1024), ("/healthz", 1024)])
def test_chunked_body_is_refused_once_past_the_limit(
    bounded_server: Server, path: str, limit: int
) -> None:
    # 40 chunks = 2.5 MiB, far past either limit; the body never ends.
    status, headers, body = chunked(bounded_server, path, 40)
    assert status == 413
    assert headers["connection"] == "close"
    assert json.loads(body) == {"error": f"Request body exceeds {limit} bytes"}


def test_chunked_proxy_body_of_a_valid_key_is_refused_past_the_proxy_limit(
    bounded_server: Server,
) -> None:
    key = bounded_server.create_key()
    status, _, body = chunked(
        bounded_server, "/v1/responses", 40, {"Authorization": f"Bearer {key}"}
    )
    assert status == 413
    assert json.loads(body)["error"]["message"] == f"Request body exceeds {PROXY_LIMIT} bytes"


def test_bodies_within_the_limit_are_served(bounded_server: Server) -> None:
    r = bounded_server.api.post("/api/keys", json={"user": "bounded"})
    assert r.status_code == 201, r.text
    r = bounded_server.http.post("/v1/responses", json={"model": "x", "input": "hi"})
    assert r.status_code == 401
    assert bounded_server.http.get("/healthz").status_code == 200


@pytest.mark.parametrize("path", ["/%761/responses", "//v1//responses", "/api/../v1/responses"])
def test_every_spelling_of_a_proxy_path_gets_the_proxy_limits(
    bounded_server: Server, path: str
) -> None:
    """Issue #43: one path normalisation before routing and limits."""
    status, headers, body = declared(bounded_server, path)
    assert status == 413
    assert "x-ocx-request-id" in headers  # the proxy's answer shape
    error = json.loads(body)["error"]
    assert error["message"] == f"Request body exceeds {64 * 1024} bytes"
    # Routed to the proxy too: its 401, not Django's 404 (a raw socket: clients normalise).
    small = b'{"model": "m", "input": "hi"}'
    with _connect(bounded_server) as sock:
        sock.sendall(_head(path, f"Content-Length: {len(small)}") + small)
        status, headers, body = _answer(sock)
    assert status == 401, body
    assert "x-ocx-request-id" in headers


# --- the limit of a path, in-process ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers", "limit"),
    [
        (b"/v1/responses", [], 64),
        (b"/v1/chat/completions?x=1", [(b"X-OCX-Key", b"ocx_abc")], 64),
        (b"/v1/responses", [(b"authorization", b"Bearer sk-not-ours")], 64),
        (b"/api/keys", [], 64),
        (b"/api", [(b"Authorization", b"Bearer ocxm_x")], 1_000),
        (b"/api/keys", [(b"cookie", b"csrftoken=a; sessionid=b")], 1_000),
        (b"/api/keys", [(b"cookie", b"csrftoken=a")], 64),
        (b"/healthz", [(b"authorization", b"Bearer ocxm_x")], 1024),
        (b"/readyz?full=1", [], 1024),
        (b"/metrics/", [], 1024),
        (b"/admin/login/", [], 256_000),
        (b"/apis", [], 256_000),
    ],
)
def test_limit_of_a_path(
    path: bytes, headers: list[tuple[bytes, bytes]], limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server import body_limits

    # A worker that could not load its key map (issue #43: it loads it before it accepts
    # traffic) knows no key: an `ocx_…` key gets the unauthenticated limit too.
    monkeypatch.setattr(body_limits, "key_map", lambda: None)
    limits = body_limits.Limits(proxy=32_000, api=1_000, other=256_000, unauthenticated=64)
    assert limits.for_request(path, headers) == limit


@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
def test_a_cold_worker_refuses_a_made_up_key_from_the_headers(
    server_kind: str, tmp_path: Path
) -> None:
    """Issue #43, point 2: the first request a fresh worker gets, a made-up `ocx_…` key and a
    large body: 413 from the headers (a worker loads its key map before it accepts traffic),
    not the whole body read and then a 401."""
    if server_kind == "uvicorn" and not HAVE_UVICORN:
        pytest.skip("uvicorn is not installed")
    server, stop = start_server(tmp_path, server_args=["--server", server_kind])
    try:
        made_up = {"Authorization": "Bearer ocx_" + "m" * 40}
        # 1 MiB: within the authenticated limit (32 MiB), past the unauthenticated one. The
        # body is never sent: only an answer from the headers comes back.
        with _connect(server) as sock:
            sock.sendall(_head("/v1/responses", f"Content-Length: {1024 * 1024}", made_up))
            status, headers, body = _answer(sock)
        assert status == 413
        assert headers["connection"] == "close"
        assert json.loads(body)["error"]["message"] == f"Request body exceeds {64 * 1024} bytes"
        # The worker loads its config as it starts, with no /v1 request (its first load).
        deadline = time.monotonic() + 10
        while server.http.get("/healthz").json().get("configVersion") is None:
            assert time.monotonic() < deadline, "the worker did not load its config at start"
            time.sleep(0.05)
        # A real key created after the start is known too (the worker follows the writes).
        key = server.create_key()
        body_100k = json.dumps({"model": "no-such-model", "input": "x" * (100 * 1024)})
        r = server.http.post(
            "/v1/responses",
            content=body_100k,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        assert r.json()["error"]["code"] == "model_not_found", r.text
    finally:
        stop()


def test_a_body_between_the_limits_with_a_known_key_is_served(bounded_server: Server) -> None:
    # 100 KiB: past the unauthenticated limit, within the proxy's. The worker hashes the key
    # for the limit and hands the digest to the proxy, which must find the same key with it.
    key = bounded_server.create_key()
    body = json.dumps({"model": "no-such-model", "input": "x" * (100 * 1024)})
    r = bounded_server.http.post(
        "/v1/responses",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert r.status_code not in (401, 413), r.text  # authenticated, not bounded
    assert r.json()["error"]["code"] == "model_not_found"
    # The same body without a known key is refused, from its headers.
    status, _, answer = declared(bounded_server, "/v1/responses", {"Authorization": "Bearer eyJ"})
    assert status == 413
    assert json.loads(answer)["error"]["message"] == f"Request body exceeds {64 * 1024} bytes"


# --- one SHA-256 of the client key per request (issue #24 review) ----------------------------


def _counting_key_map(monkeypatch: pytest.MonkeyPatch, keys: dict[str, object]) -> list[int]:
    from server import body_limits

    reads: list[int] = []

    def key_map() -> dict[str, object]:
        reads.append(1)
        return keys

    monkeypatch.setattr(body_limits, "key_map", key_map)
    return reads


def test_a_v1_body_within_the_unauthenticated_limit_is_not_checked_against_the_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hashlib

    from server import body_limits

    secret = "ocx_known-key"
    reads = _counting_key_map(monkeypatch, {hashlib.sha256(secret.encode()).hexdigest(): object()})
    limits = body_limits.Limits(proxy=32_000, api=1_000, other=256_000, unauthenticated=64)
    known = [(b"authorization", f"Bearer {secret}".encode())]
    unknown = [(b"authorization", b"Bearer ocx_unknown")]
    # Up to the unauthenticated limit every sender gets the same answer: no lookup, no hash.
    for headers in (known, unknown, []):
        assert limits.check(b"/v1/responses", headers, 64) == (64, None)
        assert limits.check(b"/v1/responses", headers, 0) == (64, None)
    assert reads == []
    # Past it the key is looked up, and the lookup is handed on with its digest.
    limit, key = limits.check(b"/v1/responses", known, 65)
    assert limit == 32_000
    assert key == body_limits.KnownKey(secret, hashlib.sha256(secret.encode()).hexdigest())
    # An unknown key past it: still refused at the unauthenticated limit.
    limit, key = limits.check(b"/v1/responses", unknown, 65)
    assert limit == 64
    assert key is not None and key.token == "ocx_unknown"
    assert limits.check(b"/v1/responses", [], 65) == (64, None)
    # A chunked body (no size yet): the limit whatever its size.
    assert limits.check(b"/v1/responses", known, None)[0] == 32_000
    assert limits.check(b"/v1/responses", unknown, None)[0] == 64
    assert len(reads) == 4


def test_the_proxy_reuses_the_digest_of_the_key_the_body_limit_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hashlib

    from accounts.access import KeyInfo
    from gateway import proxy
    from server import body_limits

    secret = "ocx_known-key"
    info = KeyInfo(id=1, prefix=secret[:10], user="u", allowed_models=frozenset(), rpm_limit=None)
    runtime = type("R", (), {"keys": {hashlib.sha256(secret.encode()).hexdigest(): info}})()
    app = proxy.ProxyApp(runtime=runtime)  # type: ignore[arg-type]
    hashed: list[str] = []
    original = proxy.digest

    def counted(token: str) -> str:
        hashed.append(token)
        return original(token)

    monkeypatch.setattr(proxy, "digest", counted)
    headers = {"authorization": f"Bearer {secret}"}
    checked = body_limits.KnownKey(secret, hashlib.sha256(secret.encode()).hexdigest())
    assert app._authenticate(headers, checked) is info
    assert hashed == []
    # Without it (a small body), or for another token, the proxy hashes the key itself.
    assert app._authenticate(headers) is info
    assert app._authenticate(headers, body_limits.KnownKey("ocx_other", "0" * 64)) is info
    assert hashed == [secret, secret]
    with pytest.raises(proxy.HTTPFailure):
        app._authenticate({"authorization": "Bearer ocx_other"}, checked)


def test_an_expired_rotated_out_or_deactivated_key_gets_the_unauthenticated_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """They are in the key map (so that their 401 says why), but the proxy refuses them: the
    body limit must agree with that 401, not grant them the proxy's limit."""
    import hashlib
    import time

    from accounts.access import KeyInfo
    from server import body_limits

    def info(**kw: object) -> KeyInfo:
        return KeyInfo(
            id=1, prefix="ocx_k", user="u", allowed_models=frozenset(), rpm_limit=None, **kw
        )  # type: ignore[arg-type]

    entries = {
        "ocx_live": info(),
        "ocx_expired": info(expires_at=time.time() - 1),
        "ocx_previous": info(expires_at=time.time() - 1, previous=True),
        "ocx_inactive": info(user_active=False),
    }
    _counting_key_map(
        monkeypatch, {hashlib.sha256(s.encode()).hexdigest(): i for s, i in entries.items()}
    )
    limits = body_limits.Limits(proxy=32_000, api=1_000, other=256_000, unauthenticated=64)
    for secret, limit in (
        ("ocx_live", 32_000),
        ("ocx_expired", 64),
        ("ocx_previous", 64),
        ("ocx_inactive", 64),
    ):
        headers = [(b"authorization", f"Bearer {secret}".encode())]
        assert limits.check(b"/v1/responses", headers, 65)[0] == limit, secret
