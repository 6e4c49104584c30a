"""Key expiry and rotation (issue 27, Keys): `expiresAt` / `expiresIn` on `/api/keys`,
`POST /api/keys/{id}/rotate`, `ocx key create|set --expires`, `ocx key rotate --grace`, and
what the proxy's key check answers for each secret at an injected time (no sleeping)."""

from __future__ import annotations

import datetime as dt
import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from accounts import access, expiry
from accounts.access import client_keys_active, digest
from accounts.models import ClientKey
from gateway.proxy import HTTPFailure, ProxyApp

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-key-expiry-01"


class Api:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def post(self, path: str, body: object | None = None) -> Any:
        data = json.dumps(body) if body is not None else ""
        return self.client.post(path, data, "application/json", **self.auth)

    def patch(self, key_id: int, body: object) -> Any:
        return self.client.patch(
            f"/api/keys/{key_id}", json.dumps(body), "application/json", **self.auth
        )

    def listed(self, key_id: int) -> dict[str, Any]:
        keys = self.client.get("/api/keys", **self.auth).json()["keys"]
        return next(k for k in keys if k["id"] == key_id)


@pytest.fixture
def api(settings: Any, client: Client) -> Api:
    settings.OCX_ADMIN_TOKEN = TOKEN
    return Api(client)


def check(secret: str, now: float) -> access.KeyInfo:
    """The proxy's own key check against the key map as a worker loads it, at `now`."""
    proxy = SimpleNamespace(runtime=SimpleNamespace(keys=client_keys_active(inactive_users=True)))
    headers = {"x-ocx-key": secret}
    return ProxyApp._authenticate(proxy, headers, clock=lambda: now)  # type: ignore[arg-type]


def refusal(secret: str, now: float) -> HTTPFailure:
    with pytest.raises(HTTPFailure) as caught:
        check(secret, now)
    return caught.value


# --- API: expiry ---------------------------------------------------------------------------------


def test_expires_in_and_expires_at_are_stored_and_listed(api: Api) -> None:
    before = timezone.now()
    r = api.post("/api/keys", {"user": "ann", "expiresIn": "30d"})
    assert r.status_code == 201, r.content
    stored = ClientKey.objects.get(pk=r.json()["id"]).expires
    assert stored is not None
    assert dt.timedelta(days=30) <= stored - before <= dt.timedelta(days=30, seconds=5)
    assert r.json()["expiresAt"] == expiry.iso(stored)
    r = api.post("/api/keys", {"user": "ann", "expiresAt": "2099-01-31T00:00+02:00"})
    assert r.status_code == 201, r.content
    assert r.json()["expiresAt"] == "2099-01-30T22:00:00Z"
    assert api.listed(r.json()["id"])["expiresAt"] == "2099-01-30T22:00:00Z"
    r = api.post("/api/keys", {"user": "ann"})
    assert r.json()["expiresAt"] is None and api.listed(r.json()["id"])["expiresAt"] is None
    for text, hours in (("12h", 12), ("90m", 1.5), ("2w", 336)):
        r = api.post("/api/keys", {"user": "ann", "expiresIn": text})
        got = ClientKey.objects.get(pk=r.json()["id"]).expires
        assert got is not None
        assert abs((got - timezone.now()).total_seconds() - hours * 3600) < 10


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"expiresIn": "30 days"},
            "expiresIn must be a duration such as 90m, 12h, 30d or 2w (got '30 days')",
        ),
        ({"expiresIn": "0d"}, "expiresIn 20"),  # now + 0: already expired (prefix checked)
        ({"expiresIn": "99999999d"}, "expiresIn must be at most 36500d"),
        (
            {"expiresAt": "tomorrow"},
            "expiresAt must be an ISO-8601 date-time with a zone, e.g. 2027-01-31T00:00Z "
            "(got 'tomorrow')",
        ),
        (
            {"expiresAt": "2099-01-31T00:00"},
            "expiresAt must include a time zone (Z or +HH:MM), e.g. 2027-01-31T00:00Z",
        ),
        (
            {"expiresAt": "2020-01-31T00:00Z"},
            "expiresAt 2020-01-31T00:00:00Z is in the past: a new key must expire later",
        ),
        ({"expiresAt": "2099-01-31T00:00Z", "expiresIn": "1d"}, "give expiresAt or expiresIn"),
    ],
)
def test_bad_expiry_is_a_400_and_creates_nothing(
    api: Api, body: dict[str, str], error: str
) -> None:
    r = api.post("/api/keys", {"user": "bea", **body})
    assert r.status_code == 400, r.content
    assert r.json()["error"].startswith(error)
    assert not ClientKey.objects.exists()


def test_patch_sets_and_clears_the_expiry(api: Api) -> None:
    key_id = api.post("/api/keys", {"user": "cal"}).json()["id"]
    r = api.patch(key_id, {"expiresAt": "2099-05-01T12:00Z"})
    assert r.status_code == 200 and r.json()["expiresAt"] == "2099-05-01T12:00:00Z"
    r = api.patch(key_id, {"name": "renamed"})  # absent: unchanged
    assert r.json()["expiresAt"] == "2099-05-01T12:00:00Z"
    r = api.patch(key_id, {"expiresIn": "nonsense"})
    assert r.status_code == 400
    assert ClientKey.objects.get(pk=key_id).expires == dt.datetime(2099, 5, 1, 12, tzinfo=dt.UTC)
    r = api.patch(key_id, {"expiresAt": None})
    assert r.status_code == 200 and r.json()["expiresAt"] is None
    # A past instant on an existing key expires it now (reversibly, unlike a revoke).
    r = api.patch(key_id, {"expiresAt": "2020-01-01T00:00Z"})
    assert r.status_code == 200 and r.json()["expiresAt"] == "2020-01-01T00:00:00Z"


def test_an_expired_key_is_refused_with_key_expired_and_when(api: Api) -> None:
    body = api.post("/api/keys", {"user": "dee", "expiresAt": "2099-01-01T00:00Z"}).json()
    at = dt.datetime(2099, 1, 1, tzinfo=dt.UTC).timestamp()
    assert check(body["key"], at - 1).id == body["id"]
    failure = refusal(body["key"], at)
    assert (failure.status, failure.code) == (401, "key_expired")
    assert str(failure) == (
        f"This ocx key ({body['prefix']}…) expired at 2099-01-01T00:00:00Z: ask an ocx "
        "administrator for a new key or a later expiry (ocx key set ID --expires 30d)"
    )
    # A wrong key is still just wrong.
    assert refusal("ocx_" + "x" * 43, at).code == "invalid_api_key"


# --- API: rotation -------------------------------------------------------------------------------


def test_rotate_without_grace_keeps_everything_but_the_secret(api: Api) -> None:
    created = api.post(
        "/api/keys",
        {
            "user": "eve",
            "name": "laptop",
            "rpmLimit": 30,
            "budgets": [{"tokens": 5000, "period": "day"}],
            "expiresAt": "2099-01-01T00:00Z",
        },
    ).json()
    r = api.post(f"/api/keys/{created['id']}/rotate")
    assert r.status_code == 200, r.content
    rotated = r.json()
    assert rotated["key"].startswith("ocx_") and rotated["key"] != created["key"]
    assert rotated["prefix"] == rotated["key"][:10]
    same = ("id", "user", "name", "rpmLimit", "budgets", "allowedModels", "expiresAt", "created")
    assert {k: rotated[k] for k in same} == {k: created[k] for k in same}
    # No grace: the previous secret stopped at once, so no validity is reported (issue #43).
    assert rotated["previousSecretValidUntil"] is None
    listed = api.listed(created["id"])
    assert listed["previousSecretValidUntil"] is None
    assert "key" not in listed and listed["prefix"] == rotated["prefix"]
    now = timezone.now().timestamp()
    info = check(rotated["key"], now)
    # Same row id: the budget counters (k<id>) and the usage recorded under it keep counting.
    assert info.id == created["id"] and [b.scope for b in info.budgets] == [f"k{created['id']}"]
    failure = refusal(created["key"], now)
    assert (failure.status, failure.code) == (401, "key_expired")
    assert str(failure).startswith("This ocx key was rotated: its previous secret stopped")


def test_rotate_with_grace_keeps_the_old_secret_until_the_grace_ends(api: Api) -> None:
    created = api.post("/api/keys", {"user": "fay"}).json()
    r = api.post(f"/api/keys/{created['id']}/rotate", {"graceSeconds": 3600})
    assert r.status_code == 200, r.content
    rotated = r.json()
    start = dt.datetime.fromisoformat(rotated["rotated"]).timestamp()
    until = dt.datetime.fromisoformat(rotated["previousSecretValidUntil"]).timestamp()
    assert until - start == 3600
    key = ClientKey.objects.get(pk=created["id"])
    assert key.previous_digest == digest(created["key"]) and key.digest == digest(rotated["key"])
    grace_end = key.previous_until.timestamp()  # type: ignore[union-attr]
    # t + grace - 1 s: both secrets work, as the same key.
    assert check(created["key"], grace_end - 1).id == created["id"]
    assert check(rotated["key"], grace_end - 1).id == created["id"]
    # t + grace: the old one is refused and says when it stopped; the new one works.
    failure = refusal(created["key"], grace_end)
    assert (failure.status, failure.code) == (401, "key_expired")
    when = expiry.iso(key.previous_until)  # type: ignore[arg-type]
    assert str(failure) == (
        f"This ocx key was rotated: its previous secret stopped working at {when}. "
        "Use the new secret (ocx key rotate showed it once)"
    )
    assert check(rotated["key"], grace_end + 86400).id == created["id"]
    # A second rotation ends the first secret's grace at once: only one previous secret.
    third = api.post(f"/api/keys/{created['id']}/rotate", {"graceSeconds": 60}).json()
    assert refusal(created["key"], grace_end - 1).code == "invalid_api_key"
    assert check(rotated["key"], timezone.now().timestamp()).id == created["id"]
    assert check(third["key"], timezone.now().timestamp()).id == created["id"]


def test_the_grace_never_outlives_the_key(api: Api) -> None:
    created = api.post("/api/keys", {"user": "gus", "expiresIn": "1h"}).json()
    api.post(f"/api/keys/{created['id']}/rotate", {"graceSeconds": 86400})
    expires = ClientKey.objects.get(pk=created["id"]).expires.timestamp()  # type: ignore[union-attr]
    assert check(created["key"], expires - 1).id == created["id"]
    assert refusal(created["key"], expires).code == "key_expired"


@pytest.mark.parametrize(
    "body",
    [
        {"graceSeconds": -1},
        {"graceSeconds": 2592001},
        {"graceSeconds": "soon"},
        {"graceSeconds": True},
        {"graceSeconds": 1.5},
    ],
)
def test_bad_grace_is_a_400_and_rotates_nothing(api: Api, body: dict[str, object]) -> None:
    created = api.post("/api/keys", {"user": "hal"}).json()
    r = api.post(f"/api/keys/{created['id']}/rotate", body)
    assert r.status_code == 400, r.content
    assert "graceSeconds" in json.dumps(r.json())
    assert ClientKey.objects.get(pk=created["id"]).digest == digest(created["key"])


def test_rotating_an_unknown_or_revoked_key_is_a_404(api: Api) -> None:
    created = api.post("/api/keys", {"user": "ida"}).json()
    assert api.post("/api/keys/999999/rotate").status_code == 404
    access.client_key_revoke(key_id=created["id"])
    r = api.post(f"/api/keys/{created['id']}/rotate")
    assert r.status_code == 404 and r.json() == {"error": "unknown or revoked key"}


# --- CLI -----------------------------------------------------------------------------------------


def key(*args: str) -> str:
    out = io.StringIO()
    call_command("key", *args, stdout=out)
    return out.getvalue()


def test_cli_expiry_and_rotation() -> None:
    out = key("create", "--user", "jo", "--create-user", "--expires", "2099-01-31T00:00Z")
    assert "(expires 2099-01-31T00:00:00Z)" in out
    row = ClientKey.objects.get(user__username="jo")
    old_secret = out.strip().splitlines()[-1]
    assert row.digest == digest(old_secret)
    out = key("create", "--user", "jo", "--expires", "30d")
    assert "(expires 20" in out
    with pytest.raises(CommandError, match="--expires 2020-01-01T00:00:00Z is in the past"):
        key("create", "--user", "jo", "--expires", "2020-01-01T00:00Z")
    with pytest.raises(CommandError, match="--expires must be an ISO-8601 date-time"):
        key("create", "--user", "jo", "--expires", "soon")
    assert ClientKey.objects.count() == 2
    out = key("set", str(row.pk), "--expires", "2098-06-01T00:00Z")
    assert "Expires 2098-06-01T00:00:00Z." in out
    assert "expires 2098-06-01T00:00:00Z" in key("list")
    key("set", str(row.pk), "--expires", "none")
    assert ClientKey.objects.get(pk=row.pk).expires is None
    out = key("rotate", str(row.pk), "--grace", "1h")
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"Rotated key {row.pk} of jo. The old secret works until 20")
    assert lines[1] == "The new secret is shown only once:"
    row.refresh_from_db()
    assert row.digest == digest(lines[2]) and row.previous_digest == digest(old_secret)
    assert row.previous_until - row.rotated == dt.timedelta(hours=1)  # type: ignore[operator]
    out = key("rotate", str(row.pk))
    assert "The old secret no longer works." in out
    with pytest.raises(CommandError, match="--grace must be at most 30d"):
        key("rotate", str(row.pk), "--grace", "31d")
    with pytest.raises(CommandError, match="no active key 99999"):
        key("rotate", "99999")


def test_a_grace_that_has_passed_is_not_reported(api: Api) -> None:
    """Issue #43: `previousSecretValidUntil` is reported only while the old secret works."""
    created = api.post("/api/keys", {"user": "gus"}).json()
    rotated = api.post(f"/api/keys/{created['id']}/rotate", {"graceSeconds": 3600}).json()
    assert rotated["previousSecretValidUntil"] is not None
    assert api.listed(created["id"])["previousSecretValidUntil"] is not None
    ClientKey.objects.filter(pk=created["id"]).update(
        previous_until=timezone.now() - dt.timedelta(seconds=1)
    )
    assert api.listed(created["id"])["previousSecretValidUntil"] is None
