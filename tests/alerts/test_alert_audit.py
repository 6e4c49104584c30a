"""Alert destinations are on the audit trail (issue 44 × 45): who changed one through the API,
and what (the webhook secret and the URL, itself a credential for Slack, only as ***)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts import access
from audit.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "https://hooks.slack.example/services/T000/B000/XXXXSECRETPATH"


def test_alert_destination_changes_are_recorded_without_secrets(client: Client) -> None:
    get_user_model().objects.create_user("root", is_staff=True, is_superuser=True)
    token = access.mgmt_token_create(username="root")[1]
    AuditEntry.objects.all().delete()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    alert = {"kind": "webhook", "url": HOOK, "events": ["budget"], "secret": "s3cr3t"}
    body: dict[str, object] = {"name": "ops", "alert": alert}
    r = client.put("/api/alerts", json.dumps(body), "application/json", **auth)
    assert r.status_code == 200, r.content
    [created] = AuditEntry.objects.filter(object_type="alert")
    assert (created.actor, created.via, created.action, created.object_label) == (
        "root",
        "api",
        "create",
        "alert destination ops",
    )
    assert created.changes["url"] == [None, "***"]
    assert created.changes["secret"] == [None, "***"]
    assert created.changes["events"] == [None, ["budget"]]
    dumped = json.dumps(created.changes)
    assert "XXXXSECRETPATH" not in dumped and "s3cr3t" not in dumped

    body = {"name": "ops", "alert": {"events": ["budget", "key_expiring"]}}
    assert (
        client.put("/api/alerts", json.dumps(body), "application/json", **auth).status_code == 200
    )
    changed = AuditEntry.objects.filter(object_type="alert").order_by("id").last()
    assert changed is not None and changed.action == "update"
    assert changed.changes == {"events": [["budget"], ["budget", "key_expiring"]]}

    assert client.delete("/api/alerts?name=ops", **auth).status_code == 200
    deleted = AuditEntry.objects.filter(object_type="alert").order_by("id").last()
    assert deleted is not None and deleted.action == "delete"
