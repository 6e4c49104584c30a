"""The smaller hardening items of issue #43 (point 4), in-process: `Cache-Control: no-store` on
answers that carry a secret, the bootstrap `admin` user's unusable password."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

TOKEN = "bootstrap-admin-token-for-round-two-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(settings: object) -> Client:
    settings.OCX_ADMIN_TOKEN = TOKEN  # type: ignore[attr-defined]
    return Client()


@pytest.mark.django_db
def test_answers_that_carry_a_secret_are_not_stored(api: Client) -> None:
    created = api.post("/api/keys", {"user": "nora"}, content_type="application/json", headers=AUTH)
    assert created.status_code == 201
    assert created.json()["key"].startswith("ocx_")
    assert created["Cache-Control"] == "no-store"
    key_id = created.json()["id"]
    rotated = api.post(
        f"/api/keys/{key_id}/rotate", {}, content_type="application/json", headers=AUTH
    )
    assert rotated.status_code == 200 and rotated.json()["key"].startswith("ocx_")
    assert rotated["Cache-Control"] == "no-store"
    # Every management API answer, a listing included.
    listed = api.get("/api/keys", headers=AUTH)
    assert listed.status_code == 200 and listed["Cache-Control"] == "no-store"


@pytest.mark.django_db
def test_the_bootstrap_admin_has_an_unusable_password(api: Client) -> None:
    assert api.get("/api/keys", headers=AUTH).status_code == 200  # creates the `admin` user
    admin = get_user_model().objects.get(username="admin")
    assert admin.password != ""
    assert not admin.has_usable_password()
    assert not admin.check_password("")
    # The login form refuses it with an empty or any password.
    login = Client().post("/admin/login/", {"username": "admin", "password": ""})
    assert login.status_code in (200, 429) and "_auth_user_id" not in login.client.session
