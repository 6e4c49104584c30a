"""Roles (issue 44, PRODUCT §9.8): every `/api` route, read from the API's own OpenAPI schema
(a route added later is walked too), with every role's token and with none; then a team
manager's scope route by route, sessions, and a viewer in the admin."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from accounts import access, team_services, users
from accounts.models import ClientKey, UserBudget
from ocxsite.api import api as ninja_api
from usage.models import UsageRollup

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "member", "viewer", "manager", "admin")
# What a team manager may call (scoped to their teams inside); every other route is 403 for them.
MANAGER_ROUTES = {
    ("get", "/api/keys"),
    ("post", "/api/keys"),
    ("get", "/api/keys/user-budgets"),
    ("put", "/api/keys/user-budgets/{username}"),
    ("patch", "/api/keys/{key_id}"),
    ("delete", "/api/keys/{key_id}"),
    ("post", "/api/keys/{key_id}/rotate"),
    ("get", "/api/teams"),
    ("get", "/api/teams/{name}"),
    ("put", "/api/teams"),
    ("get", "/api/usage"),
}
# Routes of the portal's own API: any signed-in user, on their own keys.
PORTAL_PREFIX = "/api/me/"


def routes() -> list[tuple[str, str]]:
    schema = ninja_api.get_openapi_schema()
    return sorted((method, path) for path, ops in schema["paths"].items() for method in ops)


ROUTES = routes()


@pytest.fixture
def people(client: Client) -> dict[str, Any]:
    model = get_user_model()
    model.objects.create_user("root", is_staff=True, is_superuser=True)
    model.objects.create_user("vic", is_staff=True)
    for name in ("mia", "ann", "bob"):
        model.objects.create_user(name)
    team_services.team_set(
        name="infra",
        members=["ann"],
        managers=["mia"],
        budgets=[{"tokens": 1000, "period": "day"}],
    )
    team_services.team_set(name="web", members=["bob"])
    tokens = {
        role: access.mgmt_token_create(username=name)[1]
        for role, name in (("admin", "root"), ("viewer", "vic"), ("manager", "mia"))
    }
    tokens["member"] = access.mgmt_token_create(username="bob")[1]
    return {
        "tokens": tokens,
        "ann_key": access.client_key_create(username="ann")[0],
        "bob_key": access.client_key_create(username="bob")[0],
    }


def call(client: Client, token: str | None, method: str, path: str, body: object = None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = json.dumps({} if body is None else body)
    if method == "get":
        return client.get(path, **headers)
    return getattr(client, method)(path, data, "application/json", **headers)


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", lambda m: "999999" if m.group(0) == "{key_id}" else "nobody", path)


def expected_refusal(role: str, method: str, path: str) -> int | None:
    """The status a role must get (401/403), or None: it passes the permission check."""
    if role == "anonymous":
        return 401
    if path.startswith(PORTAL_PREFIX):
        return None
    if role == "admin":
        return None
    if role == "viewer":
        return None if method == "get" else 403
    if role == "manager":
        return None if (method, path) in MANAGER_ROUTES else 403
    return 403  # member


def test_the_walk_covers_the_known_routes() -> None:
    # The manager's routes exist (a renamed route fails here rather than passing unchecked).
    assert MANAGER_ROUTES <= set(ROUTES)
    assert len(ROUTES) >= 26


@pytest.mark.parametrize("role", ROLES)
def test_every_route_checks_the_callers_role(
    role: str, people: dict[str, Any], client: Client
) -> None:
    token = people["tokens"].get(role)
    before = ClientKey.objects.filter(revoked__isnull=True).count()
    wrong = []
    for method, path in ROUTES:
        r = call(client, token, method, concrete(path))
        want = expected_refusal(role, method, path)
        if want is None and r.status_code in (401, 403):
            wrong.append(f"{method.upper()} {path}: {r.status_code} {r.content[:120]!r}")
        elif want is not None and r.status_code != want:
            wrong.append(f"{method.upper()} {path}: {r.status_code}, want {want}")
    assert wrong == []
    if role != "admin":
        assert ClientKey.objects.filter(revoked__isnull=True).count() == before


def test_refusals_say_why(people: dict[str, Any], client: Client) -> None:
    tokens = people["tokens"]
    r = call(client, tokens["viewer"], "put", "/api/combos", {"id": "x", "combo": {}})
    assert r.status_code == 403
    assert r.json() == {
        "error": "forbidden: the viewer role reads only; writes need the admin role"
    }
    r = call(client, tokens["member"], "get", "/api/keys")
    assert r.json() == {
        "error": "forbidden: the member role has no management API access (the portal is /me/)"
    }
    r = call(client, tokens["manager"], "get", "/api/providers")
    assert r.json() == {
        "error": "forbidden: a team manager manages only their teams' keys, members and usage"
    }
    assert call(client, None, "get", "/api/keys").json() == {"error": "unauthorized"}


def test_a_token_keeps_its_users_role(people: dict[str, Any]) -> None:
    bob = get_user_model().objects.get(username="bob")
    assert not bob.is_staff and not bob.is_superuser


# --- a team manager's scope -------------------------------------------------------------------


def test_manager_lists_and_manages_only_their_teams_keys(
    people: dict[str, Any], client: Client
) -> None:
    token = people["tokens"]["manager"]
    ann_key, bob_key = people["ann_key"], people["bob_key"]
    r = call(client, token, "get", "/api/keys")
    assert r.status_code == 200
    assert [k["user"] for k in r.json()["keys"]] == ["ann"]

    r = call(client, token, "post", "/api/keys", {"user": "ann", "name": "laptop"})
    assert r.status_code == 201 and r.json()["key"].startswith("ocx_")
    for user in ("bob", "newcomer", "mia"):
        r = call(client, token, "post", "/api/keys", {"user": user})
        assert r.status_code == 403, user
        assert r.json()["error"] == f"forbidden: {user} is not a member of a team you manage"
    assert not get_user_model().objects.filter(username="newcomer").exists()

    for method, suffix, body in (
        ("patch", "", {"name": "x"}),
        ("post", "/rotate", {}),
        ("delete", "", None),
    ):
        r = call(client, token, method, f"/api/keys/{bob_key.pk}{suffix}", body)
        assert r.status_code == 403, (method, suffix)
    bob_key.refresh_from_db()
    assert bob_key.revoked is None and bob_key.name == ""

    r = call(client, token, "patch", f"/api/keys/{ann_key.pk}", {"budgets": []})
    assert r.status_code == 200
    r = call(client, token, "post", f"/api/keys/{ann_key.pk}/rotate", {})
    assert r.status_code == 200 and r.json()["key"].startswith("ocx_")
    assert call(client, token, "delete", f"/api/keys/{ann_key.pk}").status_code == 200
    assert call(client, token, "delete", "/api/keys/999999").status_code == 404


def test_manager_sets_budgets_up_to_the_teams(people: dict[str, Any], client: Client) -> None:
    token = people["tokens"]["manager"]
    key = people["ann_key"]
    over = {"budgets": [{"tokens": 5000, "period": "day"}]}
    r = call(client, token, "patch", f"/api/keys/{key.pk}", over)
    assert r.status_code == 400
    assert r.json()["error"].startswith("budgets: 5000 tokens per day is more than team infra's")
    key.refresh_from_db()
    assert key.budgets == []
    within = {"budgets": [{"tokens": 500, "period": "day"}, {"usd": 5, "period": "month"}]}
    assert call(client, token, "patch", f"/api/keys/{key.pk}", within).status_code == 200
    r = call(client, token, "put", "/api/keys/user-budgets/ann", over)
    assert r.status_code == 400
    r = call(client, token, "put", "/api/keys/user-budgets/ann", within)
    assert r.status_code == 200
    r = call(client, token, "put", "/api/keys/user-budgets/bob", {"budget": None})
    assert r.status_code == 403
    UserBudget.objects.create(user=get_user_model().objects.get(username="bob"))
    r = call(client, token, "get", "/api/keys/user-budgets")
    assert [u["user"] for u in r.json()["users"]] == ["ann"]
    # An admin is not capped.
    admin = people["tokens"]["admin"]
    assert call(client, admin, "patch", f"/api/keys/{key.pk}", over).status_code == 200


def test_manager_changes_members_of_their_team_only(people: dict[str, Any], client: Client) -> None:
    token = people["tokens"]["manager"]
    r = call(client, token, "put", "/api/teams", {"name": "infra", "team": {"members": ["bob"]}})
    assert r.status_code == 200 and r.json()["team"]["members"] == ["bob"]
    for team in (
        {"budgets": []},
        {"allowedModels": []},
        {"managers": ["mia", "bob"]},
        {"members": ["ann"], "budgets": []},
    ):
        r = call(client, token, "put", "/api/teams", {"name": "infra", "team": team})
        assert r.status_code == 403, team
    r = call(client, token, "put", "/api/teams", {"name": "web", "team": {"members": []}})
    assert r.status_code == 403
    r = call(client, token, "put", "/api/teams", {"name": "new", "team": {"members": []}})
    assert r.status_code == 403
    assert call(client, token, "delete", "/api/teams?name=infra").status_code == 403
    assert [t["name"] for t in call(client, token, "get", "/api/teams").json()["teams"]] == [
        "infra"
    ]
    assert call(client, token, "get", "/api/teams/web").status_code == 403
    infra = call(client, token, "get", "/api/teams/infra").json()["team"]
    assert infra["budgets"] == [{"tokens": 1000, "period": "day"}]
    assert infra["managers"] == ["mia"]


def test_manager_reads_only_their_teams_usage(people: dict[str, Any], client: Client) -> None:
    at = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=5)
    for user, tokens in (("ann", 10), ("bob", 20)):
        UsageRollup.objects.create(bucket=at, user=user, requests=1, input_tokens=tokens)
    r = call(client, people["tokens"]["manager"], "get", "/api/usage?by=user")
    assert r.status_code == 200
    assert [row["user"] for row in r.json()["rows"]] == ["ann"]
    assert r.json()["totals"]["inputTokens"] == 10
    r = call(client, people["tokens"]["viewer"], "get", "/api/usage?by=user")
    assert [row["user"] for row in r.json()["rows"]] == ["ann", "bob"]


# --- sessions and the admin -------------------------------------------------------------------


def test_a_members_session_is_refused_and_a_viewers_session_reads(people: dict[str, Any]) -> None:
    member, viewer = Client(), Client()
    member.force_login(get_user_model().objects.get(username="bob"))
    viewer.force_login(get_user_model().objects.get(username="vic"))
    assert member.get("/api/keys").status_code == 403
    assert member.get("/admin/").status_code == 302  # to the login page: not staff
    assert viewer.get("/api/keys").status_code == 200
    r = viewer.post("/api/keys", json.dumps({"user": "bob"}), "application/json")
    assert r.status_code == 403


def test_a_viewer_reads_every_admin_page_and_changes_nothing(people: dict[str, Any]) -> None:
    viewer = Client()
    viewer.force_login(get_user_model().objects.get(username="vic"))
    index = viewer.get("/admin/")
    assert index.status_code == 200
    pages = sorted(set(re.findall(r'href="(/admin/[a-z_]+/[a-z_]+/)"', index.content.decode())))
    assert "/admin/providers/provider/" in pages and "/admin/accounts/clientkey/" in pages
    for page in pages:
        r = viewer.get(page)
        assert r.status_code == 200, page
        assert 'name="action"' not in r.content.decode() or page.endswith("/combo/"), page
        assert viewer.get(page + "add/").status_code == 403, page
    key = people["bob_key"]
    change = f"/admin/accounts/clientkey/{key.pk}/change/"
    assert viewer.get(change).status_code == 200
    r = viewer.post(change, {"name": "stolen", "user": key.user_id})
    assert r.status_code == 403
    r = viewer.post(
        "/admin/accounts/clientkey/", {"action": "revoke", "_selected_action": [key.pk]}
    )
    key.refresh_from_db()
    assert key.revoked is None and key.name == ""


def test_role_changes_through_the_service(people: dict[str, Any], client: Client) -> None:
    users.user_set_role(username="vic", role="admin")
    token = people["tokens"]["viewer"]
    r = call(client, token, "put", "/api/teams", {"name": "ops", "team": {}})
    assert r.status_code == 200
    users.user_set_role(username="vic", role="member")
    assert call(client, token, "get", "/api/teams").status_code == 403
