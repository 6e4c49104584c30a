"""Browser-facing hardening (issue #26 points 5 and 9) against a real `ocx serve` deployed as
behind TLS: CSRF on session-authenticated /api writes, admin login throttling (django-axes),
password validators in the admin's forms, Secure cookies, HSTS and a CSP.

The server trusts `X-Forwarded-For`/`-Proto` from its peer (`OCX_TRUSTED_PROXIES=127.0.0.1`, as
behind a reverse proxy), so a test speaks for a client address or for HTTPS with those headers.
Its cookies are Secure, which httpx keeps from plain-http requests: the tests send them
explicitly, as the browser behind the TLS proxy would.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ROOT, Server, start_server

CSP = "default-src 'self'; frame-ancestors 'none'"
PASSWORD = "Correct-Horse-7b1e"
HTTPS = {"X-Forwarded-For": "10.9.3.1", "X-Forwarded-Proto": "https"}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-tls"),
        extra_env={
            "OCX_SECURE_COOKIES": "1",
            "OCX_HSTS_SECONDS": "31536000",
            "OCX_CSP": CSP,
            "OCX_LOGIN_FAILURE_LIMIT": "5",
            "OCX_TRUSTED_PROXIES": "127.0.0.1",
        },
    )
    try:
        yield server
    finally:
        stop()


def ocx(server: Server, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", *args],
        cwd=ROOT,
        env=server.env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def staff_user(server: Server) -> str:
    name = "staff-" + uuid.uuid4().hex[:6]
    r = ocx(server, "user", "create", name, "--staff", "--password-stdin", stdin=PASSWORD + "\n")
    assert r.returncode == 0, r.stderr
    return name


class Browser:
    """A browser's cookies and requests, from one client address."""

    def __init__(self, server: Server, address: str = "127.0.0.1") -> None:
        self.client = httpx.Client(base_url=server.url, timeout=30)
        self.address = address

    def request(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        headers = {"X-Forwarded-For": self.address, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
        jar = "; ".join(f"{c.name}={c.value}" for c in self.client.cookies.jar)
        if jar:
            headers["Cookie"] = jar
        return self.client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]

    def cookie(self, name: str) -> str:
        return next(c.value for c in self.client.cookies.jar if c.name == name)  # type: ignore[misc]

    def form_token(self, path: str) -> str:
        page = self.request("GET", path)
        assert page.status_code == 200, page.text[:300]
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None
        return token.group(1)

    def login(self, username: str, password: str) -> httpx.Response:
        token = self.form_token("/admin/login/?next=/admin/")
        return self.request(
            "POST",
            "/admin/login/?next=/admin/",
            data={
                "csrfmiddlewaretoken": token,
                "username": username,
                "password": password,
                "next": "/admin/",
            },
        )


def logged_in(server: Server) -> Browser:
    browser = Browser(server)
    r = browser.login(staff_user(server), PASSWORD)
    assert r.status_code == 302 and r.headers["location"] == "/admin/", r.text[:300]
    return browser


def key_users(server: Server) -> set[str]:
    return {k["user"] for k in server.api.get("/api/keys").json()["keys"]}


# --- point 5: CSRF on session-authenticated /api writes ------------------------------------------


def test_session_write_from_a_foreign_origin_is_refused(tls_server: Server) -> None:
    browser = logged_in(tls_server)
    user = "csrf-" + uuid.uuid4().hex[:6]
    r = browser.request(
        "POST",
        "/api/keys",
        content=f'{{"user": "{user}"}}',
        headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    assert r.status_code == 403
    assert r.json() == {
        "error": "CSRF check failed: send the csrftoken cookie's value as X-CSRFToken"
    }
    # Without a token, even from the server's own origin.
    r = browser.request(
        "POST", "/api/keys", json={"user": user}, headers={"Origin": tls_server.url}
    )
    assert r.status_code == 403
    assert user not in key_users(tls_server)
    # Reading needs no token.
    assert browser.request("GET", "/api/keys").status_code == 200


def test_session_write_with_the_csrf_token_works(tls_server: Server) -> None:
    browser = logged_in(tls_server)
    user = "csrf-ok-" + uuid.uuid4().hex[:6]
    r = browser.request(
        "POST",
        "/api/keys",
        json={"user": user},
        headers={"Origin": tls_server.url, "X-CSRFToken": browser.cookie("csrftoken")},
    )
    assert r.status_code == 201, r.text
    assert user in key_users(tls_server)


def test_bearer_calls_need_no_csrf_token(tls_server: Server) -> None:
    user = "bearer-" + uuid.uuid4().hex[:6]
    r = tls_server.api.post(
        "/api/keys",
        content=f'{{"user": "{user}"}}',
        headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    assert r.status_code == 201, r.text
    assert user in key_users(tls_server)


# --- point 9: login throttling ----------------------------------------------------------------


def test_failed_logins_lock_the_user_name_then_the_right_password_is_refused(
    tls_server: Server,
) -> None:
    name = staff_user(tls_server)
    attacker = Browser(tls_server, "10.9.0.1")
    for _ in range(4):
        r = attacker.login(name, "wrong-password")
        assert r.status_code == 200
        assert "Please enter the correct username and password" in r.text
    r = attacker.login(name, "wrong-password")
    assert r.status_code == 429
    assert "Too many failed logins" in r.text
    # The right password no longer gets in, from that address or any other.
    assert attacker.login(name, PASSWORD).status_code == 429
    assert Browser(tls_server, "10.9.0.2").login(name, PASSWORD).status_code == 429
    # Other users log in from elsewhere; management tokens and the CLI are not throttled.
    other = Browser(tls_server, "10.9.0.3")
    assert other.login(staff_user(tls_server), PASSWORD).status_code == 302
    assert (
        tls_server.api.get("/api/keys", headers={"X-Forwarded-For": "10.9.0.1"}).status_code == 200
    )
    assert ocx(tls_server, "user", "list").returncode == 0


def test_failed_logins_lock_the_address(tls_server: Server) -> None:
    attacker = Browser(tls_server, "10.9.1.1")
    for i in range(5):
        r = attacker.login(f"nobody-{i}-{uuid.uuid4().hex[:4]}", "wrong-password")
    assert r.status_code == 429
    # A real user behind that address is locked out too; from another address they log in.
    name = staff_user(tls_server)
    assert attacker.login(name, PASSWORD).status_code == 429
    assert Browser(tls_server, "10.9.1.2").login(name, PASSWORD).status_code == 302


# --- point 9: password validators in the admin ------------------------------------------------


def test_admin_user_forms_refuse_weak_passwords(tls_server: Server) -> None:
    browser = logged_in(tls_server)
    name = "weak-" + uuid.uuid4().hex[:6]
    token = browser.form_token("/admin/auth/user/add/")
    r = browser.request(
        "POST",
        "/admin/auth/user/add/",
        data={
            "csrfmiddlewaretoken": token,
            "username": name,
            "usable_password": "true",
            "password1": "1",
            "password2": "1",
        },
    )
    assert r.status_code == 200
    assert "This password is too short" in r.text
    assert "This password is entirely numeric" in r.text
    listing = ocx(tls_server, "user", "list")
    assert name not in listing.stdout

    # The change-password form of an existing user, too.
    own = staff_user(tls_server)
    users = browser.request("GET", f"/admin/auth/user/?q={own}")
    user_id = re.search(r'href="/admin/auth/user/(\d+)/change/', users.text)
    assert user_id is not None
    path = f"/admin/auth/user/{user_id.group(1)}/password/"
    token = browser.form_token(path)
    r = browser.request(
        "POST",
        path,
        data={"csrfmiddlewaretoken": token, "password1": "password", "password2": "password"},
    )
    assert r.status_code == 200
    assert "This password is too common" in r.text
    assert Browser(tls_server, "10.9.2.1").login(own, PASSWORD).status_code == 302


# --- point 9: cookies, HSTS, CSP ----------------------------------------------------------------


def test_secure_cookies_hsts_and_csp_behind_tls(tls_server: Server) -> None:
    r = tls_server.http.get("/admin/login/", headers=HTTPS)
    assert r.status_code == 200
    assert r.headers["strict-transport-security"] == "max-age=31536000"
    assert r.headers["content-security-policy"] == CSP
    csrf_cookie = next(v for v in r.headers.get_list("set-cookie") if v.startswith("csrftoken="))
    assert "; Secure" in csrf_cookie

    browser = logged_in(tls_server)  # over plain http: the cookie is Secure all the same
    assert browser.request("GET", "/admin/").status_code == 200
    login = Browser(tls_server)
    r = login.login(staff_user(tls_server), PASSWORD)
    session = next(v for v in r.headers.get_list("set-cookie") if v.startswith("sessionid="))
    assert "; Secure" in session and "; HttpOnly" in session

    # HSTS only on HTTPS requests (as Django's SecurityMiddleware sends it); the CSP always.
    r = tls_server.http.get("/healthz")
    assert "strict-transport-security" not in r.headers
    assert r.headers["content-security-policy"] == CSP
