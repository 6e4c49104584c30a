"""Multi-user and security (PRODUCT §9.1, §9.2) against a real `ocx serve` and `ocx mock-upstream`:
client keys (shown once, stored hashed, revocable, model-restricted, rpm-limited), staff-only
admin and management API, management tokens, and credential isolation: every credential reaches
only where it belongs and appears in no output at all.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest

from tests.conftest import ROOT, Mock, Server, sse_events

KEY_A = "sk-test-AAAAAAAAAAAAAAAAAAAAAAAAAAAA1111"
KEY_B = "sk-test-BBBBBBBBBBBBBBBBBBBBBBBBBBBB2222"
KEY_E = "sk-test-EEEEEEEEEEEEEEEEEEEEEEEEEEEE3333"
SK_LIVE = "sk-live-ECHOEDSECRET0123456789abcdefXYZ"
CALLER_TOKEN = "eyJ-caller-token-Zm9vYmFyYmF6cXV4LmNhbGxlcg.c2lnbmF0dXJl"
COOKIE_SECRET = "cookie-secret-9f8e7d6c5b4a"
PROXY_AUTH = "Basic cHJveHktc2VjcmV0LTQ0NDQ="
STAFF_USER, STAFF_PASSWORD = "sec-staff", "sec-Staff-pw-7d1a9"
PLAIN_USER, PLAIN_PASSWORD = "sec-plain", "sec-Plain-pw-4b2c8"


def provider(base_url: str, *models: str, adapter: str, api_key: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "adapter": adapter,
        "baseUrl": base_url,
        "timeouts": {"firstByteMs": 2000, "idleMs": 2000},
        "models": {m: {"contextWindow": 100000} for m in models},
    }
    if api_key is not None:
        spec["apiKey"] = api_key
    return spec


def sync(server: Server) -> None:
    server.http.get("/v1/models")
    server.wait_synced()


def simple_combo(server: Server, mock: Mock, model: str = "sa") -> str:
    server.put_provider(
        "sp", provider(mock.url + "/v1", model, adapter="openai-responses", api_key=KEY_A)
    )
    combo_id = "sec" + uuid.uuid4().hex[:8]
    server.put_combo(combo_id, {"targets": [{"provider": "sp", "model": model}]})
    sync(server)
    return combo_id


def new_key(server: Server, user: str = "dev", **extra: Any) -> str:
    """A client key, once this worker's cached key map has it (refreshed every poll)."""
    secret = server.create_key(user=user, **extra)
    deadline = time.monotonic() + 5
    headers = {"Authorization": f"Bearer {secret}"}
    while server.http.get("/v1/models", headers=headers).status_code != 200:
        assert time.monotonic() < deadline, "new client key not served"
        time.sleep(0.02)
    return secret


def ask(server: Server, model: str, headers: dict[str, str], **extra: Any) -> httpx.Response:
    return server.http.post(
        "/v1/responses", json={"model": model, "input": "hello", **extra}, headers=headers
    )


def manage(server: Server, *args: str) -> str:
    """A Django management command against the server's own database and settings."""
    r = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"manage.py {args[0]} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def ocx(server: Server, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", *args],
        cwd=ROOT,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"ocx {args} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def query(server: Server, sql: str) -> list[tuple[Any, ...]]:
    url = server.env.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        with psycopg.connect(url) as conn:
            return list(conn.execute(sql).fetchall())
    with sqlite3.connect(server.data_dir / "ocx.sqlite3") as conn:
        return list(conn.execute(sql).fetchall())


USERS_SCRIPT = f"""
from django.contrib.auth import get_user_model
User = get_user_model()
for name, password, staff in (
    ({STAFF_USER!r}, {STAFF_PASSWORD!r}, True),
    ({PLAIN_USER!r}, {PLAIN_PASSWORD!r}, False),
):
    user, _ = User.objects.get_or_create(username=name)
    user.is_staff = staff
    user.is_superuser = staff
    user.set_password(password)
    user.save()
"""

SESSION_SCRIPT = """
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
user = get_user_model().objects.get(username=USERNAME)
s = SessionStore()
s[SESSION_KEY] = str(user.pk)
s[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
s[HASH_SESSION_KEY] = user.get_session_auth_hash()
s.create()
print("SESSION=" + s.session_key)
"""


@pytest.fixture(scope="module")
def users(ocx_server: Server) -> Server:
    manage(ocx_server, "shell", "-c", USERS_SCRIPT)
    return ocx_server


def staff_client(server: Server) -> httpx.Client:
    """An httpx client logged in through the admin's login form as a staff user."""
    client = httpx.Client(base_url=server.url, timeout=30)
    page = client.get("/admin/login/?next=/admin/")
    assert page.status_code == 200
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token is not None
    r = client.post(
        "/admin/login/?next=/admin/",
        data={
            "csrfmiddlewaretoken": token.group(1),
            "username": STAFF_USER,
            "password": STAFF_PASSWORD,
            "next": "/admin/",
        },
    )
    assert r.status_code == 302 and r.headers["location"] == "/admin/", r.text[:500]
    return client


# ---------------------------------------------------------------------------------------------
# Client keys


def test_key_secret_shown_once_and_stored_hashed(server: Server) -> None:
    r = server.api.post("/api/keys", json={"user": "hash-dev", "name": "laptop"})
    assert r.status_code == 201, r.text
    created = r.json()
    secret = created["key"]
    assert secret.startswith("ocx_") and len(secret) > 30
    assert created["prefix"] == secret[:10]

    listing = server.api.get("/api/keys")
    assert listing.status_code == 200
    assert secret not in listing.text
    mine = [k for k in listing.json()["keys"] if k["id"] == created["id"]]
    assert len(mine) == 1 and "key" not in mine[0]
    assert mine[0]["prefix"] == secret[:10]
    assert secret not in ocx(server, "key", "list")

    rows = query(server, f"SELECT prefix, digest FROM ocxsite_clientkey WHERE id = {created['id']}")
    assert rows == [(secret[:10], hashlib.sha256(secret.encode()).hexdigest())]
    every = json.dumps(query(server, "SELECT * FROM ocxsite_clientkey"), default=str)
    assert secret not in every
    assert secret[10:] not in every
    if not server.env.get("DATABASE_URL"):
        # Nothing of the secret beyond its prefix is anywhere in the database files.
        for path in server.data_dir.glob("ocx.sqlite3*"):
            assert secret[10:].encode() not in path.read_bytes(), path


def test_revoked_key_gets_401_within_one_second(server: Server, mock: Mock) -> None:
    combo_id = simple_combo(server, mock)
    secret = new_key(server, "revoke-dev")
    key_id = next(
        k["id"] for k in server.api.get("/api/keys").json()["keys"] if k["prefix"] == secret[:10]
    )
    headers = {"Authorization": f"Bearer {secret}"}
    assert ask(server, f"combo/{combo_id}", headers).status_code == 200
    hits = mock.hits("sa")

    assert server.api.delete(f"/api/keys/{key_id}").status_code == 200
    revoked_at = time.monotonic()
    while True:
        r = ask(server, f"combo/{combo_id}", headers)
        if r.status_code == 401:
            break
        assert r.status_code == 200, r.text
        assert time.monotonic() - revoked_at < 1.0, "revoked key still accepted after 1 s"
        time.sleep(0.02)
    assert time.monotonic() - revoked_at < 1.0
    assert r.json()["error"]["code"] == "invalid_api_key"
    hits_after = mock.hits("sa")
    assert ask(server, f"combo/{combo_id}", {"x-ocx-key": secret}).status_code == 401
    assert server.http.get("/v1/models", headers=headers).status_code == 401
    assert mock.hits("sa") == hits_after >= hits
    # Revoking again is a 404; the listing shows when it was revoked.
    assert server.api.delete(f"/api/keys/{key_id}").status_code == 404
    listed = {k["id"]: k for k in server.api.get("/api/keys").json()["keys"]}
    assert listed[key_id]["revoked"] is not None


def test_allowed_models_restrict_requests_and_listing(server: Server, mock: Mock) -> None:
    combo_id = simple_combo(server, mock)
    other = "sec" + uuid.uuid4().hex[:8]
    server.put_combo(other, {"targets": [{"provider": "sp", "model": "sa"}]})
    sync(server)
    secret = new_key(server, "limited-dev", allowed_models=[f"combo/{combo_id}"])
    headers = {"Authorization": f"Bearer {secret}"}

    assert ask(server, f"combo/{combo_id}", headers).status_code == 200
    hits = mock.hits("sa")
    for model in (f"combo/{other}", "sp/sa"):
        r = ask(server, model, headers)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "permission_error"
    assert mock.hits("sa") == hits  # refused before any upstream

    listing = server.http.get("/v1/models", headers=headers)
    assert listing.status_code == 200
    assert [m["id"] for m in listing.json()["data"]] == [f"combo/{combo_id}"]
    unrestricted = server.http.get(
        "/v1/models", headers={"Authorization": f"Bearer {new_key(server)}"}
    )
    ids = {m["id"] for m in unrestricted.json()["data"]}
    assert {f"combo/{combo_id}", f"combo/{other}"} <= ids


def test_rpm_limit(server: Server, mock: Mock) -> None:
    combo_id = simple_combo(server, mock)
    secret = server.create_key(user="rpm-dev", rpm_limit=3)
    headers = {"Authorization": f"Bearer {secret}"}
    deadline = time.monotonic() + 5
    while server.http.get("/v1/models", headers=headers).status_code != 200:  # not rate-limited
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # The budget is a fixed one-minute window: stay clear of a minute boundary.
    if 60 - time.time() % 60 < 5:
        time.sleep(60 - time.time() % 60 + 0.2)

    for _ in range(3):
        assert ask(server, f"combo/{combo_id}", headers).status_code == 200
    assert mock.hits("sa") == 3
    r = ask(server, f"combo/{combo_id}", headers)

    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "client_rate_limited"
    retry = int(r.headers["retry-after"])
    assert 1 <= retry <= 60
    assert r.headers["x-ocx-request-id"]
    assert mock.hits("sa") == 3  # the 4th reached no upstream
    # Another key of the same user has its own budget.
    other = new_key(server, "rpm-dev")
    assert ask(server, f"combo/{combo_id}", {"Authorization": f"Bearer {other}"}).status_code == 200


# ---------------------------------------------------------------------------------------------
# Staff-only admin and API, management tokens


def test_non_staff_users_have_no_admin_or_api_access(users: Server) -> None:
    server = users
    # The admin login refuses a non-staff user.
    client = httpx.Client(base_url=server.url, timeout=30)
    page = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token is not None
    r = client.post(
        "/admin/login/",
        data={
            "csrfmiddlewaretoken": token.group(1),
            "username": PLAIN_USER,
            "password": PLAIN_PASSWORD,
        },
    )
    assert r.status_code == 200 and "staff account" in r.text
    # Even with a valid session of their own, a non-staff user gets neither.
    out = manage(server, "shell", "-c", SESSION_SCRIPT.replace("USERNAME", repr(PLAIN_USER)))
    session = out.split("SESSION=")[1].strip()
    plain = httpx.Client(base_url=server.url, timeout=30, cookies={"sessionid": session})
    for path in ("/admin/", "/admin/combos/combo/", "/admin/usage/requestlog/"):
        r = plain.get(path)
        assert r.status_code == 302, (path, r.status_code)
        assert r.headers["location"].startswith("/admin/login/")
    for path in ("/api/combos", "/api/providers", "/api/keys", "/api/requests", "/api/status"):
        assert plain.get(path).status_code in (401, 403), path
    assert plain.post("/api/keys", json={"user": "x"}).status_code in (401, 403)
    # No credentials at all, or a client key: 401.
    anonymous = httpx.Client(base_url=server.url, timeout=30)
    assert anonymous.get("/api/combos").status_code == 401
    r = anonymous.get("/admin/")
    assert r.status_code == 302 and r.headers["location"].startswith("/admin/login/")
    client_key = server.create_key(user=PLAIN_USER)
    r = anonymous.get("/api/combos", headers={"Authorization": f"Bearer {client_key}"})
    assert r.status_code == 401


def test_staff_session_has_admin_and_api_access(users: Server) -> None:
    client = staff_client(users)
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/usage/requestlog/").status_code == 200
    r = client.get("/api/combos")
    assert r.status_code == 200, r.text
    assert "combos" in r.json()


def test_management_tokens_follow_their_users_role(users: Server) -> None:
    server = users
    name = "tok-" + uuid.uuid4().hex[:6]
    out = ocx(server, "token", "create", "--user", name)
    token = next(line for line in out.splitlines() if line.startswith("ocxm_"))
    bearer = {"Authorization": f"Bearer {token}"}
    # `ocx token create` made a member: known (not 401), allowed nothing.
    assert server.http.get("/api/combos", headers=bearer).status_code == 403
    ocx(server, "user", "set", name, "--role", "viewer")
    assert server.http.get("/api/combos", headers=bearer).status_code == 200
    assert server.http.get("/api/keys", headers=bearer).status_code == 200
    # Stored hashed, like client keys.
    rows = query(server, "SELECT digest FROM ocxsite_managementtoken")
    assert (hashlib.sha256(token.encode()).hexdigest(),) in rows
    assert token not in json.dumps(
        query(server, "SELECT * FROM ocxsite_managementtoken"), default=str
    )
    # A management token is no client key.
    assert server.http.get("/v1/models", headers=bearer).status_code == 401

    manage(
        server,
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.filter(username={name!r}).update(is_active=False)",
    )
    assert server.http.get("/api/combos", headers=bearer).status_code == 401
    assert server.http.get("/api/keys", headers=bearer).status_code == 401
    # A made-up token of the right shape is refused too.
    fake = {"Authorization": "Bearer ocxm_" + "x" * 43}
    assert server.http.get("/api/combos", headers=fake).status_code == 401


# ---------------------------------------------------------------------------------------------
# Credential isolation (PRODUCT §9.2)


def crawl_admin(client: httpx.Client, limit: int = 150) -> list[tuple[str, str]]:
    """Every admin page reachable by GET links from the index (no logout/delete/password)."""
    seen: set[str] = set()
    queue = ["/admin/"]
    pages: list[tuple[str, str]] = []
    while queue and len(pages) < limit:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code)
        pages.append((path, r.text))
        for href in re.findall(r'href="([^"#]+)"', r.text):
            target = urljoin(path, href).split("?")[0]
            if not target.startswith("/admin/") or target in seen:
                continue
            if any(bad in target for bad in ("logout", "/delete/", "password", "/jsi18n")):
                continue
            if "/static/" in target or target.startswith("/admin/r/"):
                continue
            queue.append(target)
    return pages


def test_credential_isolation_and_no_secret_in_any_output(users: Server, mock: Mock) -> None:
    server = users
    server.reset()
    # pa: Responses API with KEY_A; pb: Chat Completions with KEY_B (another base URL);
    # pc: `chatgpt` (caller-forward, no stored key); pe: KEY_E, its upstream echoes a secret.
    server.put_provider(
        "pa", provider(mock.url + "/v1", "ia", adapter="openai-responses", api_key=KEY_A)
    )
    server.put_provider("pb", provider(mock.url, "ib", adapter="openai-chat", api_key=KEY_B))
    server.put_provider("pc", provider(mock.url, "ic", adapter="chatgpt", api_key=None))
    server.put_provider(
        "pe", provider(mock.url + "/v1", "ie", adapter="openai-responses", api_key=KEY_E)
    )
    combo_id = "iso" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id,
        {"targets": [{"provider": "pe", "model": "ie"}, {"provider": "pa", "model": "ia"}]},
    )
    echo = {
        "status": 401,
        "body": {
            "error": {
                "type": "invalid_request_error",
                "code": "invalid_api_key",
                "message": f"Incorrect API key provided: {SK_LIVE}. Bearer {SK_LIVE}",
            }
        },
    }
    mock.script("ie", [], then=echo)
    mock.script("ib", [], then={"text": "from b"})
    sync(server)
    ocx_key = new_key(server, "iso-dev")

    cookies = {"Cookie": f"sessionid={COOKIE_SECRET}; csrftoken={COOKIE_SECRET}"}
    hop_by_hop = {"Proxy-Authorization": PROXY_AUTH, "Connection": "keep-alive, x-secret-hop"}
    bearer = {"Authorization": f"Bearer {ocx_key}", **cookies, **hop_by_hop}
    x_key = {"x-ocx-key": ocx_key, **cookies}
    caller = {
        "Authorization": f"Bearer {CALLER_TOKEN}",
        "x-ocx-key": ocx_key,
        "chatgpt-account-id": "acct-123",
        **cookies,
    }
    responses: list[httpx.Response] = []

    def send(path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        r = server.http.post(path, json=body, headers=headers)
        responses.append(r)
        return r

    # A combo whose first upstream fails with the echoed secret, then serves from pa.
    for stream in (False, True):
        r = send(
            "/v1/responses", {"model": f"combo/{combo_id}", "input": "x", "stream": stream}, bearer
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-ocx-target"] == "pa/ia"
    # Direct targets, key in x-ocx-key; pb over Chat Completions, streamed and not.
    r = send("/v1/responses", {"model": "pa/ia", "input": "x"}, x_key)
    assert r.status_code == 200, r.text
    for stream in (False, True):
        body = {"model": "pb/ib", "messages": [{"role": "user", "content": "x"}], "stream": stream}
        r = send("/v1/chat/completions", body, x_key)
        assert r.status_code == 200, r.text
    # The upstream's error with the secret, returned directly (sanitized).
    r = send("/v1/responses", {"model": "pe/ie", "input": "x"}, bearer)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["message"].startswith("Provider error 401")
    # The caller's own ChatGPT bearer: forwarded to the chatgpt provider only.
    for stream in (False, True):
        r = send("/v1/responses", {"model": "pc/ic", "input": "x", "stream": stream}, caller)
        assert r.status_code == 200, r.text
        if stream:
            assert "response.completed" in [e for e, _ in sse_events(r.text)]
    r = send("/v1/responses", {"model": "pa/ia", "input": "x"}, caller)
    assert r.status_code == 200, r.text
    r = send("/v1/responses", {"model": "pb/ib", "input": "x"}, caller)
    assert r.status_code == 200, r.text
    # Without the caller bearer the chatgpt target has no credential: nothing is sent.
    r = send("/v1/responses", {"model": "pc/ic", "input": "x"}, x_key)
    assert r.status_code == 503, r.text
    # Unauthenticated and invalid keys, too.
    r = send(
        "/v1/responses", {"model": "pa/ia", "input": "x"}, {"Authorization": f"Bearer {KEY_A}"}
    )
    assert r.status_code == 401

    # What each upstream received.
    own = {"ia": f"Bearer {KEY_A}", "ib": f"Bearer {KEY_B}", "ie": f"Bearer {KEY_E}"}
    own["ic"] = f"Bearer {CALLER_TOKEN}"
    log = mock.log()
    assert {e["model"] for e in log} == {"ia", "ib", "ic", "ie"}, [e["model"] for e in log]
    for e in log:
        headers = e["headers"]
        assert headers.get("authorization") == own[e["model"]], (e["model"], headers)
        assert "x-api-key" not in headers
        everything = json.dumps(e)
        for secret in (KEY_A, KEY_B, KEY_E, CALLER_TOKEN):
            if own[e["model"]] != f"Bearer {secret}":
                assert secret not in everything, (secret, e["model"])
        assert ocx_key not in everything
        assert "x-ocx-key" not in headers
        assert "cookie" not in headers and COOKIE_SECRET not in everything
        assert "proxy-authorization" not in headers and PROXY_AUTH not in everything
        assert "x-secret-hop" not in everything
    chatgpt = [e for e in log if e["model"] == "ic"]
    assert len(chatgpt) == 2
    assert all(e["headers"].get("chatgpt-account-id") == "acct-123" for e in chatgpt)

    # Every output: client responses, the management API, metrics, admin pages, server logs.
    outputs: list[tuple[str, str]] = []
    for r in responses:
        headers_text = "\n".join(f"{k}: {v}" for k, v in r.headers.items())
        outputs.append((f"response {r.request.url.path}", headers_text + "\n" + r.text))
    time.sleep(0.7)  # the request log is written in batches of ≤ 0.5 s
    for path in (
        "/api/requests?limit=1000",
        "/api/providers",
        "/api/status",
        "/api/quota",
        "/api/keys",
        "/api/combos",
        "/api/catalog",
    ):
        r = server.api.get(path)
        assert r.status_code == 200, (path, r.text)
        outputs.append((path, r.text))
    logged = server.api.get("/api/requests", params={"limit": 1000}).json()["requests"]
    assert len(logged) >= len(responses) - 1
    outputs.append(("/metrics", server.http.get("/metrics").text))
    outputs.append(("/readyz", server.http.get("/readyz").text))
    admin = staff_client(server)
    pages = crawl_admin(admin)
    assert len(pages) >= 10, [p for p, _ in pages]
    paths = {p for p, _ in pages}
    assert "/admin/providers/provider/" in paths
    assert "/admin/usage/requestlog/" in paths
    assert any(p.startswith("/admin/usage/requestlog/") and p.endswith("/change/") for p in paths)
    assert any(p.startswith("/admin/providers/provider/") and p.endswith("/change/") for p in paths)
    outputs.extend(pages)
    outputs.append(("server output", "".join(server.output)))

    secrets = {
        "provider key A": KEY_A,
        "provider key B": KEY_B,
        "provider key E": KEY_E,
        "echoed sk-live secret": SK_LIVE,
        "caller token": CALLER_TOKEN,
        "ocx key": ocx_key,
        "ocx key body": ocx_key[10:],
        "cookie": COOKIE_SECRET,
    }
    leaks = [
        f"{what} in {where}"
        for where, text in outputs
        for what, secret in secrets.items()
        if secret in text
    ]
    assert not leaks, leaks
    # The admin shows at most a masked hint of a stored key.
    provider_pages = "".join(t for p, t in pages if p.startswith("/admin/providers/provider/"))
    assert KEY_A[:12] not in provider_pages
