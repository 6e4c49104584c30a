"""Sign-in with the company's identity provider (issue 44, docs/people.md#sso), end to end
against a real OpenID Connect provider (`oidc-provider-mock` on a free port): ocx's client
discovers it, sends the browser there, exchanges the code over HTTP, checks the ID token's
signature with the provider's keys and applies ocx's rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import oidc_provider_mock
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from accounts import roles, sso, team_services, users
from accounts.models import SsoIdentity
from audit.models import AuditEntry
from ocxsite.settings import oidc_config
from tests.conftest import ROOT, start_server

# Real commits: the audit trail writes its entries when a change's transaction commits.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The provider's own library (authlib) warns about its deprecated internals.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:authlib.*"),
]

CLIENT_ID = "ocx-test-client"
CLIENT_SECRET = "oidc-client-secret-never-shown-0123456789"
SSO_LINK = 'href="/login/sso?next='


@pytest.fixture(scope="module")
def issuer() -> Iterator[str]:
    with oidc_provider_mock.run_server_in_thread() as server:
        yield f"http://localhost:{server.server_port}"


@pytest.fixture
def configured(settings: Any, issuer: str) -> Iterator[str]:
    settings.OCX_OIDC_ISSUER = issuer
    settings.OCX_OIDC_CLIENT_ID = CLIENT_ID
    settings.OCX_OIDC_CLIENT_SECRET = CLIENT_SECRET
    sso.forget_endpoints()
    yield issuer
    sso.forget_endpoints()


def sign_in(
    issuer: str, sub: str, claims: dict[str, Any], *, client: Client | None = None, **params: str
) -> tuple[Client, Any]:
    """One sign-in through the provider's authorization form; (the browser, ocx's answer to
    the callback)."""
    client = client or Client()
    r = httpx.put(f"{issuer}/users/{quote(sub, safe='')}", json=claims)
    assert r.status_code == 204, r.text
    start = client.get("/login/sso", params)
    assert start.status_code == 302, start.content[:500]
    authorize = start["Location"]
    assert authorize.startswith(f"{issuer}/oauth2/authorize?")
    assert "code_challenge=" in authorize and "code_challenge_method=S256" in authorize
    assert "scope=openid+email+profile" in authorize
    answer = httpx.post(authorize, data={"sub": sub})
    assert answer.status_code == 302, answer.text[:500]
    callback = urlsplit(answer.headers["location"])
    assert callback.path == "/login/sso/callback"
    return client, client.get(f"{callback.path}?{callback.query}")


def ann(**extra: Any) -> dict[str, Any]:
    return {
        "preferred_username": "ann",
        "email": "ann@corp.example",
        "email_verified": True,
        **extra,
    }


def sso_entries() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(via="sso").order_by("id"))


def test_first_sign_in_creates_a_member_and_the_next_reuses_it(configured: str) -> None:
    browser, r = sign_in(configured, "sub-ann", ann())
    assert r.status_code == 302 and r["Location"] == "/me/"
    user = get_user_model().objects.get(username="ann")
    assert roles.role_of(user) == roles.MEMBER and user.is_active
    assert user.email == "ann@corp.example" and not user.has_usable_password()
    assert SsoIdentity.objects.get(user=user).subject == "sub-ann"
    page = browser.get("/me/")
    assert page.status_code == 200 and "Signed in as <strong>ann</strong>" in page.content.decode()
    [created] = sso_entries()
    assert (created.actor, created.action, created.object_type) == ("ann", "create", "user")
    assert created.changes["role"] == [None, "member"]
    assert created.changes["sso"] == [None, f"{configured} sub-ann"]

    # The second sign-in (another browser) is the same user; nothing changed, nothing recorded.
    _, again = sign_in(configured, "sub-ann", ann())
    assert again.status_code == 302
    assert get_user_model().objects.filter(username="ann").count() == 1
    assert get_user_model().objects.count() == 1
    assert len(sso_entries()) == 1


def test_the_subject_matches_even_when_the_user_name_claim_changed(configured: str) -> None:
    sign_in(configured, "sub-ann", ann())
    _, r = sign_in(configured, "sub-ann", ann(preferred_username="ann.renamed"))
    assert r.status_code == 302
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["ann"]


def test_user_name_is_the_email_without_preferred_username(configured: str) -> None:
    claims = {"email": "bo@corp.example", "email_verified": True}
    _, r = sign_in(configured, "sub-bo", claims)
    assert r.status_code == 302
    assert get_user_model().objects.filter(username="bo@corp.example").exists()


def test_username_claim_setting(configured: str, settings: Any) -> None:
    settings.OCX_OIDC_USERNAME_CLAIM = "nickname"
    _, r = sign_in(configured, "sub-cy", ann(nickname="cy"))
    assert r.status_code == 302
    assert get_user_model().objects.filter(username="cy").exists()


def test_addresses_outside_the_allowed_domains_are_refused(configured: str, settings: Any) -> None:
    settings.OCX_OIDC_ALLOWED_DOMAINS = ["corp.example", "corp2.example"]
    browser, r = sign_in(configured, "sub-eve", ann(email="eve@other.example"))
    assert r.status_code == 403
    body = r.content.decode()
    assert "eve@other.example is not an address ocx takes (corp.example, corp2.example)" in body
    assert CLIENT_SECRET not in body
    assert browser.get("/me/").status_code == 302  # not signed in
    # A verified address of an allowed domain signs in; an unverified one does not.
    _, r = sign_in(configured, "sub-dan", ann(preferred_username="dan", email_verified=False))
    assert r.status_code == 403
    assert "ann@corp.example is not verified at the identity provider" in r.content.decode()
    _, r = sign_in(configured, "sub-ann", ann(email="ann@CORP2.example"))
    assert r.status_code == 302
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["ann"]
    assert not AuditEntry.objects.filter(object_label__contains="dan").exists()


def test_a_user_deactivated_in_ocx_cannot_sign_in(configured: str) -> None:
    browser, r = sign_in(configured, "sub-ann", ann())
    assert r.status_code == 302 and browser.get("/me/").status_code == 200
    users.user_deactivate(username="ann")
    # The session that was open is gone at its next request ...
    assert browser.get("/me/").status_code == 302
    # ... and the provider cannot sign the user in again, whatever it says.
    fresh, r = sign_in(configured, "sub-ann", ann())
    assert r.status_code == 403
    assert "Your ocx account is deactivated" in r.content.decode()
    assert fresh.get("/me/").status_code == 302


def test_a_deactivated_user_of_that_name_is_not_linked_either(configured: str) -> None:
    get_user_model().objects.create_user("ann", email="ann@corp.example", is_active=False)
    _, r = sign_in(configured, "sub-ann", ann())
    assert r.status_code == 403 and "deactivated" in r.content.decode()
    assert not SsoIdentity.objects.exists()


def test_an_existing_user_is_linked_only_by_its_verified_email(configured: str) -> None:
    root = get_user_model().objects.create_user(
        "root", email="root@corp.example", password="pw-0123456789", is_staff=True
    )
    root.is_superuser = True
    root.save()
    AuditEntry.objects.all().delete()
    # Same user name, another address: refused (no takeover of an admin by its name).
    _, r = sign_in(
        configured, "sub-mallory", {"preferred_username": "root", "email": "m@x.example"}
    )
    assert r.status_code == 403
    assert "An ocx user named root exists already" in r.content.decode()
    # The same address, but not verified: refused too.
    unverified = {"preferred_username": "root", "email": "root@corp.example"}
    _, r = sign_in(configured, "sub-mallory", {**unverified, "email_verified": False})
    assert r.status_code == 403
    assert not SsoIdentity.objects.exists() and not sso_entries()
    # The verified address of that user: linked, and the admin stays an admin.
    browser, r = sign_in(configured, "sub-root", {**unverified, "email_verified": True})
    assert r.status_code == 302
    assert SsoIdentity.objects.get(user__username="root").subject == "sub-root"
    root.refresh_from_db()
    assert root.is_superuser and root.has_usable_password()
    [linked] = sso_entries()
    assert (linked.actor, linked.action, linked.changes) == (
        "root",
        "update",
        {"sso": [None, f"{configured} sub-root"]},
    )
    # Another account of the provider with that user's name and address is refused.
    _, r = sign_in(configured, "sub-other", {**unverified, "email_verified": True})
    assert r.status_code == 403
    assert "signs in with another account of the identity provider" in r.content.decode()


def test_teams_claim_joins_existing_teams_only_and_leaves_stale_ones(
    configured: str, settings: Any
) -> None:
    settings.OCX_OIDC_TEAMS_CLAIM = "teams"
    team_services.team_set(name="infra")
    team_services.team_set(name="web")
    AuditEntry.objects.all().delete()
    _, r = sign_in(configured, "sub-ann", ann(teams=["infra", "ghost"]))
    assert r.status_code == 302
    user = get_user_model().objects.get(username="ann")
    assert list(user.groups.values_list("name", flat=True)) == ["infra"]
    assert not Group.objects.filter(name="ghost").exists()
    joined = [e for e in sso_entries() if e.object_type == "team"]
    assert [(e.object_label, e.actor, e.changes) for e in joined] == [
        ("team infra", "ann", {"members": [[], ["ann"]]})
    ]
    # The next sign-in brings membership in line: web joined, infra (no longer claimed) left.
    AuditEntry.objects.all().delete()
    _, r = sign_in(configured, "sub-ann", ann(teams=["web"]))
    assert r.status_code == 302
    assert list(user.groups.values_list("name", flat=True)) == ["web"]
    changed = sorted((e.object_label, e.changes["members"]) for e in sso_entries())
    assert changed == [("team infra", [["ann"], []]), ("team web", [[], ["ann"]])]
    assert {e.actor for e in sso_entries()} == {"ann"}
    # Without the claim at all: no team.
    _, r = sign_in(configured, "sub-ann", ann())
    assert r.status_code == 302 and not user.groups.exists()


def test_teams_are_left_alone_without_the_teams_setting(configured: str) -> None:
    team_services.team_set(name="infra")
    sign_in(configured, "sub-ann", ann())
    team_services.team_set(name="infra", members=["ann"])
    _, r = sign_in(configured, "sub-ann", ann(teams=[]))
    assert r.status_code == 302
    assert list(
        get_user_model().objects.get(username="ann").groups.values_list("name", flat=True)
    ) == ["infra"]


def test_admin_and_viewer_groups_give_the_role(configured: str, settings: Any) -> None:
    settings.OCX_OIDC_ADMIN_GROUPS = ["ocx-admins"]
    settings.OCX_OIDC_VIEWER_GROUPS = ["ocx-viewers", "auditors"]
    browser, r = sign_in(configured, "sub-ann", ann(groups=["auditors", "staff"]))
    assert r.status_code == 302
    user = get_user_model().objects.get(username="ann")
    assert roles.role_of(user) == roles.VIEWER
    assert browser.get("/admin/").status_code == 200  # a viewer reads the admin
    _, r = sign_in(configured, "sub-ann", ann(groups=["ocx-viewers", "ocx-admins"]))
    user.refresh_from_db()
    assert roles.role_of(user) == roles.ADMIN
    _, r = sign_in(configured, "sub-ann", ann(groups=[]))
    user.refresh_from_db()
    assert roles.role_of(user) == roles.MEMBER
    changes = [e.changes.get("role") for e in sso_entries() if e.object_type == "user"]
    assert changes == [[None, "viewer"], ["viewer", "admin"], ["admin", "member"]]
    # The groups claim is configurable.
    settings.OCX_OIDC_GROUPS_CLAIM = "roles"
    sign_in(configured, "sub-ann", ann(roles=["ocx-admins"]))
    user.refresh_from_db()
    assert roles.role_of(user) == roles.ADMIN


@pytest.mark.parametrize(
    ("next_", "lands"),
    [
        ("/admin/", "/admin/"),
        ("/me/?tab=keys", "/me/?tab=keys"),
        ("https://evil.example/", "/me/"),
        ("//evil.example/x", "/me/"),
        ("/\\evil.example", "/me/"),
        ("http://testserver/admin/", "/me/"),
        ("javascript:alert(1)", "/me/"),
    ],
)
def test_next_is_a_local_path_only(configured: str, next_: str, lands: str) -> None:
    _, r = sign_in(configured, "sub-ann", ann(), next=next_)
    assert r.status_code == 302 and r["Location"] == lands


def test_the_login_pages_offer_sso_only_when_configured(
    client: Client, settings: Any, issuer: str
) -> None:
    for page in ("/me/login/", "/admin/login/"):
        r = client.get(page)
        assert r.status_code == 200 and SSO_LINK not in r.content.decode()
    assert client.get("/login/sso").status_code == 404
    assert client.get("/login/sso/callback?code=x&state=y").status_code == 404
    settings.OCX_OIDC_ISSUER = issuer
    settings.OCX_OIDC_CLIENT_ID = CLIENT_ID
    settings.OCX_OIDC_CLIENT_SECRET = CLIENT_SECRET
    portal = client.get("/me/login/").content.decode()
    assert 'href="/login/sso?next=/me/"' in portal
    admin = client.get("/admin/login/?next=/admin/usage/").content.decode()
    assert 'href="/login/sso?next=/admin/usage/"' in admin


def test_provider_denial_and_a_forged_state_show_a_page(configured: str) -> None:
    browser = Client()
    start = browser.get("/login/sso")
    denied = httpx.post(start["Location"], data={"action": "deny"})
    callback = urlsplit(denied.headers["location"])
    r = browser.get(f"{callback.path}?{callback.query}")
    assert r.status_code == 403
    assert "The identity provider did not sign you in (access_denied)" in r.content.decode()
    # A link to an error answer does not sign out whoever is signed in.
    signed_in, _ = sign_in(configured, "sub-ann", ann())
    r = signed_in.get("/login/sso/callback?error=access_denied&state=x")
    assert r.status_code == 403 and signed_in.get("/me/").status_code == 200
    r = browser.get("/login/sso/callback?code=abc&state=forged")
    assert r.status_code == 400
    assert "could not be verified" in r.content.decode()
    r = Client().get("/login/sso/callback?code=abc&state=forged")  # no sign-in started
    assert r.status_code == 403 and "Start again" in r.content.decode()
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["ann"]


def test_an_unreachable_provider_is_a_clear_page(client: Client, settings: Any) -> None:
    settings.OCX_OIDC_ISSUER = "http://127.0.0.1:9"  # discard: nothing listens
    settings.OCX_OIDC_CLIENT_ID = CLIENT_ID
    settings.OCX_OIDC_CLIENT_SECRET = CLIENT_SECRET
    sso.forget_endpoints()
    r = client.get("/login/sso")
    assert r.status_code == 502
    body = r.content.decode()
    assert "Sign-in is unavailable: the identity provider&#x27;s discovery document" in body
    assert CLIENT_SECRET not in body


def test_a_wrong_client_secret_fails_without_showing_it(configured: str, settings: Any) -> None:
    # The mock takes any secret of an unregistered client; a registered one checks it.
    registered = httpx.post(
        f"{configured}/oauth2/clients",
        json={"redirect_uris": ["http://testserver/login/sso/callback"]},
    ).json()
    settings.OCX_OIDC_CLIENT_ID = registered["client_id"]
    settings.OCX_OIDC_CLIENT_SECRET = CLIENT_SECRET  # not the one the provider gave
    _, r = sign_in(configured, "sub-ann", ann())
    assert r.status_code == 502
    body = r.content.decode()
    assert "The identity provider did not complete the sign-in" in body
    assert CLIENT_SECRET not in body and registered["client_secret"] not in body
    # With its own secret the same client signs in.
    settings.OCX_OIDC_CLIENT_SECRET = registered["client_secret"]
    _, r = sign_in(configured, "sub-ann", ann())
    assert r.status_code == 302


def test_safe_next() -> None:
    assert sso.safe_next("/me/") == "/me/"
    for bad in (None, "", "me/", "//x.example", "/\\x.example", "https://x.example/"):
        assert sso.safe_next(bad) is None


def test_partial_settings_are_refused() -> None:
    full = {
        "OCX_OIDC_ISSUER": "https://idp.example/realms/corp/",
        "OCX_OIDC_CLIENT_ID": "ocx",
        "OCX_OIDC_CLIENT_SECRET": "s3cret",
    }
    config = oidc_config(full)
    assert config["OCX_OIDC_ISSUER"] == "https://idp.example/realms/corp"
    assert config["OCX_OIDC_USERNAME_CLAIM"] == "preferred_username"
    assert config["OCX_OIDC_GROUPS_CLAIM"] == "groups"
    assert oidc_config({})["OCX_OIDC_ISSUER"] == ""
    partial = {k: v for k, v in full.items() if k != "OCX_OIDC_CLIENT_SECRET"}
    with pytest.raises(ImproperlyConfigured, match="OCX_OIDC_CLIENT_SECRET missing"):
        oidc_config(partial)
    with pytest.raises(ImproperlyConfigured, match="https://"):
        oidc_config({**full, "OCX_OIDC_ISSUER": "http://idp.example"})
    with pytest.raises(ImproperlyConfigured, match="OCX_OIDC_ALLOWED_DOMAINS"):
        oidc_config({**full, "OCX_OIDC_ALLOWED_DOMAINS": "corp.example,not a domain"})
    assert oidc_config({**full, "OCX_OIDC_ALLOWED_DOMAINS": "@Corp.Example, b.example"})[
        "OCX_OIDC_ALLOWED_DOMAINS"
    ] == ["corp.example", "b.example"]
    # The start stops with the message (no secret in it).
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**env, **partial, "OCX_OIDC_CLIENT_ID": "ocx"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert (
        "SSO needs OCX_OIDC_ISSUER, OCX_OIDC_CLIENT_ID and OCX_OIDC_CLIENT_SECRET together: "
        "OCX_OIDC_ISSUER, OCX_OIDC_CLIENT_ID set, OCX_OIDC_CLIENT_SECRET missing"
    ) in done.stderr


def test_sso_through_ocx_serve(issuer: str, tmp_path: Any) -> None:
    """The settings from the environment, under the real server (ASGI, its own database)."""
    env = {
        "OCX_OIDC_ISSUER": issuer,
        "OCX_OIDC_CLIENT_ID": CLIENT_ID,
        "OCX_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OCX_OIDC_TEAMS_CLAIM": "teams",
    }
    server, stop = start_server(tmp_path, extra_env=env)
    try:
        r = server.api.put("/api/teams", json={"name": "infra", "team": {}})
        assert r.status_code == 200, r.text
        assert 'href="/login/sso?next=/me/"' in server.http.get("/me/login/").text
        r = httpx.put(
            f"{issuer}/users/sub-srv", json=ann(preferred_username="srv", teams=["infra"])
        )
        assert r.status_code == 204
        browser = httpx.Client(base_url=server.url, timeout=30)
        start = browser.get("/login/sso", params={"next": "/me/"})
        assert start.status_code == 302
        answer = httpx.post(start.headers["location"], data={"sub": "sub-srv"})
        callback = urlsplit(answer.headers["location"])
        assert f"{callback.scheme}://{callback.netloc}" == server.url
        done = browser.get(f"{callback.path}?{callback.query}")
        assert done.status_code == 302 and done.headers["location"] == "/me/"
        assert "Signed in as <strong>srv</strong>" in browser.get("/me/").text
        team = server.api.get("/api/teams/infra").json()
        assert "srv" in json.dumps(team)
        audit = server.api.get("/api/audit", params={"actor": "srv"}).json()["entries"]
        assert {(e["via"], e["objectType"], e["action"]) for e in audit} == {
            ("sso", "user", "create"),
            ("sso", "team", "update"),
        }
    finally:
        stop()
