"""The portal (issue 44): `/me/` pages and `/api/me/...` for a member's own keys, usage and
budgets, within the policy knobs and their teams' allowed models; a team manager's teams."""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from accounts import access, team_services
from accounts.models import ClientKey
from combos import selectors
from combos import services as combo_services
from providers import services as provider_services
from routing.catalog import build_catalog, catalog_json
from usage.models import UsageRollup

pytestmark = pytest.mark.django_db
PASSWORD = "portal-pw-0123456789"


@pytest.fixture
def member(client: Client) -> Any:
    provider_services.provider_set(
        name="cx",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "http://127.0.0.1:9/v1",
            "models": {"m": {}},
        },
    )
    for combo in ("team", "main"):
        combo_services.combo_set(
            combo_id=combo, raw={"targets": [{"provider": "cx", "model": "m"}]}
        )
    model = get_user_model()
    ann = model.objects.create_user("ann", password=PASSWORD)
    model.objects.create_user("bob", password=PASSWORD)
    model.objects.create_user("mia", password=PASSWORD)
    team_services.team_set(
        name="infra",
        members=["ann"],
        managers=["mia"],
        allowed_models=["combo/team"],
        budgets=[{"tokens": 1000, "period": "month"}],
    )
    return ann


def signed_in(name: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    page = client.get("/me/login/")
    token = page.cookies["csrftoken"].value
    r = client.post(
        "/me/login/", {"username": name, "password": PASSWORD, "csrfmiddlewaretoken": token}
    )
    assert r.status_code == 302 and r["Location"] == "/me/", r.content[:500]
    return client


def api(client: Client, method: str, path: str, body: object = None) -> Any:
    csrf = client.cookies["csrftoken"].value
    if method == "get":
        return client.get(path)
    return getattr(client, method)(
        path, json.dumps(body or {}), "application/json", HTTP_X_CSRFTOKEN=csrf
    )


def test_sign_in_with_a_password_and_see_the_portal(member: Any) -> None:
    assert Client().get("/me/").status_code == 302
    client = signed_in("ann")
    page = client.get("/me/").content.decode()
    assert "My keys" in page and "Signed in as <strong>ann</strong>" in page
    assert "Your teams allow: combo/team." in page
    assert "/static/admin/css/base.css" in page  # the admin's look
    assert "https://" not in page and "http://cdn" not in page  # no external assets
    r = Client().post("/me/login/", {"username": "ann", "password": "wrong"})
    assert r.status_code == 200 and "did not match" in r.content.decode()


def test_member_manages_own_keys_through_the_api(member: Any) -> None:
    client = signed_in("ann")
    r = api(client, "post", "/api/me/keys", {"name": "laptop", "expiresInDays": 30})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["key"].startswith("ocx_") and r["Cache-Control"] == "no-store"
    assert body["name"] == "laptop" and body["expiresAt"] is not None
    key = ClientKey.objects.get(pk=body["id"])
    assert key.user == member and access.digest(body["key"]) == key.digest

    r = api(client, "get", "/api/me/keys")
    assert [k["id"] for k in r.json()["keys"]] == [key.pk]
    assert "key" not in r.json()["keys"][0]
    assert r.json()["teamModels"] == ["combo/team"]

    r = api(client, "post", f"/api/me/keys/{key.pk}/rotate")
    assert r.status_code == 200 and r.json()["key"] != body["key"]
    key.refresh_from_db()
    assert key.digest == access.digest(r.json()["key"])

    r = api(client, "delete", f"/api/me/keys/{key.pk}")
    assert r.json() == {"success": True, "id": key.pk}
    key.refresh_from_db()
    assert key.revoked is not None


def test_api_refusals(member: Any, settings: Any) -> None:
    client = signed_in("ann")
    # Without the CSRF header a session write is refused.
    r = client.post("/api/me/keys", json.dumps({"name": "x"}), "application/json")
    assert r.status_code == 403
    r = api(client, "post", "/api/me/keys", {"name": "x", "allowedModels": ["combo/main"]})
    assert r.status_code == 400
    assert r.json() == {"error": "allowedModels: your teams do not allow combo/main"}
    r = api(client, "post", "/api/me/keys", {"name": "ok", "allowedModels": ["combo/team"]})
    assert r.status_code == 201
    bob_key, _ = access.client_key_create(username="bob")
    for method, path in (
        ("post", f"/api/me/keys/{bob_key.pk}/rotate"),
        ("delete", f"/api/me/keys/{bob_key.pk}"),
    ):
        r = api(client, method, path)
        assert r.status_code == 404 and r.json() == {"error": "no such key of yours"}
    bob_key.refresh_from_db()
    assert bob_key.revoked is None

    settings.OCX_PORTAL_MAX_KEYS = 1
    r = api(client, "post", "/api/me/keys", {"name": "second"})
    assert r.status_code == 403 and "the most allowed" in r.json()["error"]
    settings.OCX_PORTAL_MAX_KEYS = 0
    settings.OCX_PORTAL_MAX_EXPIRY_DAYS = 7
    r = api(client, "post", "/api/me/keys", {"name": "long", "expiresInDays": 30})
    assert r.status_code == 400 and r.json() == {"error": "expiresInDays: at most 7"}
    r = api(client, "post", "/api/me/keys", {"name": "never"})
    assert r.status_code == 400 and r.json() == {"error": "expiresInDays: required, at most 7"}
    settings.OCX_PORTAL_MEMBERS_CREATE_KEYS = False
    r = api(client, "post", "/api/me/keys", {"name": "no", "expiresInDays": 1})
    assert r.status_code == 403
    assert ClientKey.objects.filter(user=member).count() == 1
    assert Client().get("/api/me/keys").status_code == 401


def test_usage_spend_and_budgets_left(member: Any) -> None:
    key, _ = access.client_key_create(username="ann", budgets=[{"usd": 5, "period": "day"}])
    at = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=2)
    UsageRollup.objects.create(
        bucket=at, user="ann", key_id=key.pk, model="combo/team", requests=2,
        input_tokens=100, output_tokens=50, cost_usd=1.25,
    )  # fmt: skip
    UsageRollup.objects.create(bucket=at, user="bob", model="combo/team", requests=9)
    client = signed_in("ann")
    usage = api(client, "get", "/api/me/usage").json()
    assert usage["today"] == {"requests": 2, "tokens": 150, "costUsd": 1.25}
    assert usage["month"] == usage["today"]
    assert usage["byModel"] == [
        {"model": "combo/team", "requests": 2, "tokens": 150, "costUsd": 1.25}
    ]
    owners = {b["owner"]: b for b in usage["budgets"]}
    assert owners[f"key {key.prefix}… of ann"]["left"] == 3.75
    assert owners["team infra"]["used"] == 150 and owners["team infra"]["left"] == 850
    page = client.get("/me/").content.decode()
    assert "$1.25 of $5.00 today" in page and "150 of 1,000 tokens this month" in page


def test_create_and_rotate_in_the_page_show_the_secret_once(member: Any) -> None:
    client = signed_in("ann")
    csrf = client.cookies["csrftoken"].value
    r = client.post(
        "/me/keys/",
        {"name": "laptop", "allowed_models": ["combo/team"], "csrfmiddlewaretoken": csrf},
    )
    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    page = r.content.decode()
    key = ClientKey.objects.get(user=member)
    secret = page.split('id="ocx-secret" value="')[1].split('"')[0]
    assert access.digest(secret) == key.digest
    snippet = html.unescape(page.split('<pre id="ocx-snippet">')[1].split("</pre>")[0])
    assert snippet.startswith('model = "combo/team"\nmodel_provider = "ocx"\n')
    assert 'base_url = "http://testserver/v1"\n' in snippet
    assert secret not in client.get("/me/").content.decode()
    r = client.post(f"/me/keys/{key.pk}/rotate/", {"csrfmiddlewaretoken": csrf})
    rotated = r.content.decode().split('id="ocx-secret" value="')[1].split('"')[0]
    key.refresh_from_db()
    assert rotated != secret and access.digest(rotated) == key.digest
    r = client.post(f"/me/keys/{key.pk}/revoke/", {"csrfmiddlewaretoken": csrf})
    assert r.status_code == 302
    key.refresh_from_db()
    assert key.revoked is not None
    r = client.get("/me/catalog.json")
    assert r["Content-Disposition"] == 'attachment; filename="ocx-catalog.json"'
    # The same file as `ocx catalog write` makes.
    assert r.content == catalog_json(build_catalog(selectors.config_snapshot()))


def test_a_team_manager_sees_their_teams(member: Any) -> None:
    access.client_key_create(username="ann", name="ci")
    page = signed_in("mia").get("/me/").content.decode()
    assert "Teams I manage" in page and "<td>ann</td>" in page and "ci" in page
    assert "<td>bob</td>" not in page
    assert "Teams I manage" not in signed_in("ann").get("/me/").content.decode()
