"""The audit trail (issue 44): changes made through the API, the CLI and the admin are recorded
with who, through what, which object and what changed (secrets as ***), once per transaction,
never for a rolled-back write; `GET /api/audit` filters them for viewers and admins."""

from __future__ import annotations

import datetime as dt
import getpass
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.utils import timezone

from accounts import access, team_services, users
from audit import services as audit_services
from audit.models import AuditEntry
from ocxsite import cli

# Real commits: entries are written when a change's transaction commits.
pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-audit-test-0123456789abcdefSECRET"


@pytest.fixture
def tokens() -> dict[str, str]:
    model = get_user_model()
    model.objects.create_user("root", is_staff=True, is_superuser=True)
    model.objects.create_user("vic", is_staff=True)
    model.objects.create_user("mia")
    model.objects.create_user("ann")
    team_services.team_set(name="infra", members=["ann"], managers=["mia"])
    AuditEntry.objects.all().delete()  # the set-up's own entries
    return {name: access.mgmt_token_create(username=name)[1] for name in ("root", "vic", "mia")}


def call(client: Client, token: str, method: str, path: str, body: object = None) -> Any:
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if method == "get":
        return client.get(path, **auth)
    return getattr(client, method)(path, json.dumps(body or {}), "application/json", **auth)


def entries(**filters: Any) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


def test_api_writes_record_who_what_and_the_changes(tokens: dict[str, str], client: Client) -> None:
    AuditEntry.objects.all().delete()  # the tokens' own entries
    root = tokens["root"]
    provider = {"adapter": "openai-chat", "baseUrl": "https://api.example.com/v1"}
    r = call(
        client,
        root,
        "put",
        "/api/providers",
        {"name": "p", "provider": {**provider, "apiKey": SECRET}},
    )
    assert r.status_code == 200
    [created] = entries(object_type="provider")
    assert (created.actor, created.via, created.action, created.object_label) == (
        "root",
        "api",
        "create",
        "provider p",
    )
    assert created.changes["base_url"] == [None, "https://api.example.com/v1"]
    assert created.changes["api_key"] == [None, "***"]
    assert SECRET not in json.dumps(created.changes)

    combo = {"id": "main", "combo": {"targets": [{"provider": "p", "model": "m1"}]}}
    assert call(client, root, "put", "/api/combos", combo).status_code == 200
    # The same combo again: targets deleted and re-created, nothing changed, nothing recorded.
    assert call(client, root, "put", "/api/combos", combo).status_code == 200
    combo["combo"]["targets"].append({"provider": "p", "model": "m2"})  # type: ignore[index]
    assert call(client, root, "put", "/api/combos", combo).status_code == 200
    made, changed = entries(object_type="combo")
    assert made.action == "create" and made.changes["targets"] == [None, ["p/m1"]]
    assert changed.action == "update"
    assert changed.changes == {"targets": [["p/m1"], ["p/m1", "p/m2"]]}

    r = call(client, root, "post", "/api/keys", {"user": "ann", "name": "laptop"})
    key_id = r.json()["id"]
    assert call(client, root, "post", f"/api/keys/{key_id}/rotate").status_code == 200
    assert call(client, root, "delete", f"/api/keys/{key_id}").status_code == 200
    made, rotated, revoked = entries(object_type="key")
    assert made.action == "create" and made.object_label.endswith("of ann")
    assert rotated.changes["secret"] == ["***", "***"]
    assert set(revoked.changes) == {"revoked"} and revoked.changes["revoked"][0] is None
    for entry in (made, rotated, revoked):
        assert r.json()["key"] not in json.dumps(entry.changes)


def test_a_team_managers_member_change_and_role_changes(
    tokens: dict[str, str], client: Client
) -> None:
    get_user_model().objects.create_user("ben")
    AuditEntry.objects.all().delete()
    body = {"name": "infra", "team": {"members": ["ann", "ben"]}}
    assert call(client, tokens["mia"], "put", "/api/teams", body).status_code == 200
    [entry] = entries(object_type="team")
    assert (entry.actor, entry.via, entry.object_label) == ("mia", "api", "team infra")
    assert entry.changes == {"members": [["ann"], ["ann", "ben"]]}

    users.user_set_role(username="vic", role="admin")
    [entry] = entries(object_type="user")
    assert (entry.actor, entry.via) == (f"cli:{getpass.getuser()}", "cli")
    assert entry.changes == {"role": ["viewer", "admin"]}


def test_cli_changes_name_the_os_user(tokens: dict[str, str], capsys: Any) -> None:
    assert cli.main(["key", "create", "--user", "ann", "--name", "ci"]) == 0
    assert cli.main(["team", "set", "infra", "--budget", "tokens=1000/day"]) == 0
    key, team = entries(object_type="key")[-1], entries(object_type="team")[-1]
    assert key.actor == team.actor == f"cli:{getpass.getuser()}"
    assert key.via == team.via == "cli"
    assert team.changes == {"budgets": [[], [{"tokens": 1000, "period": "day"}]]}


def test_admin_changes_are_recorded_as_admin(tokens: dict[str, str]) -> None:
    root = get_user_model().objects.get(username="root")
    root.set_password("pw-123456789-long")
    root.save()
    AuditEntry.objects.all().delete()
    staff = Client()
    staff.force_login(root)
    ann = get_user_model().objects.get(username="ann")
    r = staff.post(
        f"/admin/auth/user/{ann.pk}/change/",
        {
            "username": "ann",
            "email": "ann@example.com",
            "role": "viewer",
            "is_active": "on",
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
            "initial-date_joined_0": "2026-01-01",
            "initial-date_joined_1": "00:00:00",
        },
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    user_entry = entries(object_type="user")[-1]
    assert (user_entry.actor, user_entry.via) == ("root", "admin")
    assert user_entry.changes == {
        "email": ["", "ann@example.com"],
        "role": ["member", "viewer"],
    }
    # ann left team infra (no group chosen): the team's entry says so.
    team_entry = entries(object_type="team")[-1]
    assert team_entry.changes == {"members": [["ann"], []]}
    assert team_entry.via == "admin"
    # The page lists it for a viewer; nothing on it can be changed.
    viewer = Client()
    viewer.force_login(get_user_model().objects.get(username="vic"))
    listing = viewer.get("/admin/audit/auditentry/?via__exact=admin").content.decode()
    assert "user ann" in listing and "&quot;member&quot; → &quot;viewer&quot;" in listing
    assert viewer.get(f"/admin/audit/auditentry/{user_entry.pk}/change/").status_code == 200
    assert viewer.post(f"/admin/audit/auditentry/{user_entry.pk}/delete/").status_code == 403


def test_a_rolled_back_write_records_nothing(tokens: dict[str, str]) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        team_services.team_set(name="infra", members=[])
        raise RuntimeError("abort")
    assert entries(object_type="team") == []
    team_services.team_set(name="infra", members=[])
    [entry] = entries(object_type="team")
    assert entry.changes == {"members": [["ann"], []]}


def test_api_audit_filters_and_roles(tokens: dict[str, str], client: Client) -> None:
    old = audit_services.record(
        actor="root",
        via="api",
        action="update",
        object_type="combo",
        object_id="old",
        object_label="combo old",
        changes={},
        now=timezone.now() - dt.timedelta(days=3),
    )
    team_services.team_set(name="infra", members=[])
    assert cli.main(["user", "set", "vic", "--role", "admin"]) == 0
    root, vic, mia = tokens["root"], tokens["vic"], tokens["mia"]
    r = call(client, vic, "get", "/api/audit")
    assert r.status_code == 200
    body = r.json()
    assert [e["object"] for e in body["entries"]][:2] == ["user vic", "team infra"]
    assert body["entries"][-1]["id"] == old.pk
    assert set(body["entries"][0]) == {
        "id", "at", "actor", "via", "action", "objectType", "objectId", "object", "changes",
    }  # fmt: skip
    r = call(client, root, "get", "/api/audit?since=1d&object=team")
    assert [e["object"] for e in r.json()["entries"]] == ["team infra"]
    r = call(client, root, "get", "/api/audit?object=combo:old")
    assert [e["id"] for e in r.json()["entries"]] == [old.pk]
    r = call(client, root, "get", "/api/audit?actor=cli&object=user:vic")
    assert [e["changes"] for e in r.json()["entries"]] == [{"role": ["viewer", "admin"]}]
    assert call(client, root, "get", "/api/audit?actor=root").json()["entries"][0]["id"] == old.pk
    r = call(client, root, "get", "/api/audit?since=yesterday")
    assert r.status_code == 400 and r.json()["error"].startswith("since: expected an ISO 8601")
    assert call(client, mia, "get", "/api/audit").status_code == 403
    assert client.get("/api/audit").status_code == 401


def test_retention(tokens: dict[str, str], settings: Any) -> None:
    settings.OCX_AUDIT_RETENTION_DAYS = 30
    now = timezone.now()
    for days in (40, 10):
        audit_services.record(
            actor="root",
            via="cli",
            action="update",
            object_type="user",
            object_id="1",
            object_label="user root",
            changes={},
            now=now - dt.timedelta(days=days),
        )
    assert audit_services.prune(now=now) == 1
    assert [e.at.date() for e in entries(object_label="user root")] == [
        (now - dt.timedelta(days=10)).date()
    ]
