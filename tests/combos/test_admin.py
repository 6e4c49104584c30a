from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos import selectors
from combos.models import Combo
from providers.models import ConfigState, Provider
from providers.services import provider_set

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def _providers() -> tuple[Provider, Provider]:
    for name, model in (("p1", "m1"), ("p2", "m2")):
        provider_set(
            name=name,
            raw={
                "adapter": "openai-responses",
                "baseUrl": "http://127.0.0.1:9/v1",
                "apiKeyEnv": "K",
                "models": {model: {"contextWindow": 100000, "inputModalities": ["text"]}},
            },
        )
    return Provider.objects.get(name="p1"), Provider.objects.get(name="p2")


def _combo_post(p1: Provider, p2: Provider, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "combo_id": "main",
        "strategy": "failover",
        "sticky_limit": "1",
        "wait_for_cooldown_ms": "0",
        "default_effort_mode": "fallback",
        "reasoning_effort_mode": "strict",
        "image_input": "auto",
        "targets-TOTAL_FORMS": "2",
        "targets-INITIAL_FORMS": "0",
        "targets-MIN_NUM_FORMS": "0",
        "targets-MAX_NUM_FORMS": "1000",
        "targets-0-position": "0",
        "targets-0-provider": str(p1.pk),
        "targets-0-model": "m1",
        "targets-0-weight": "1",
        "targets-1-position": "1",
        "targets-1-provider": str(p2.pk),
        "targets-1-model": "m2",
        "targets-1-weight": "1",
    }
    data.update(overrides)
    return data


def test_admin_creates_combo_with_ordered_targets_and_bumps_version(staff: Client) -> None:
    p1, p2 = _providers()
    before = ConfigState.objects.get(pk=1).version
    response = staff.post(
        "/admin/combos/combo/add/",
        _combo_post(p1, p2, **{"targets-0-position": "5", "targets-1-position": "2"}),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    spec = selectors.combo_get("main")
    assert spec is not None
    # Reordered by position: p2/m2 (position 2) before p1/m1 (position 5).
    assert [t.key for t in spec.targets] == ["p2/m2", "p1/m1"]
    assert ConfigState.objects.get(pk=1).version == before + 1


def test_admin_shows_validation_error_for_bad_weight_and_stores_nothing(staff: Client) -> None:
    p1, p2 = _providers()
    response = staff.post(
        "/admin/combos/combo/add/", _combo_post(p1, p2, **{"targets-1-weight": "0"})
    )
    assert response.status_code == 200
    assert "targets[1].weight must be an integer from 1 to 10000" in response.content.decode()
    assert not Combo.objects.exists()


def test_admin_rejects_duplicate_targets_after_trimming(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, **{"targets-1-provider": str(p1.pk), "targets-1-model": " m1 "})
    response = staff.post("/admin/combos/combo/add/", data)
    assert response.status_code == 200
    assert "duplicate combo target &quot;p1/m1&quot;" in response.content.decode()
    assert not Combo.objects.exists()


def test_admin_rejects_reserved_alias(staff: Client) -> None:
    p1, p2 = _providers()
    response = staff.post("/admin/combos/combo/add/", _combo_post(p1, p2, alias="combo/x"))
    assert response.status_code == 200
    assert "alias must not use the reserved" in response.content.decode()
    assert not Combo.objects.exists()


def test_admin_changelist_and_export_catalog(staff: Client) -> None:
    p1, p2 = _providers()
    assert staff.post("/admin/combos/combo/add/", _combo_post(p1, p2)).status_code == 302
    page = staff.get("/admin/combos/combo/")
    assert page.status_code == 200
    assert "combo/main" in page.content.decode()
    combo = Combo.objects.get(combo_id="main")
    export = staff.post(
        "/admin/combos/combo/",
        {"action": "export_catalog", "_selected_action": [combo.pk]},
    )
    assert export.status_code == 200
    assert export["Content-Type"] == "application/json"
    slugs = [row["slug"] for row in json.loads(export.content)["models"]]
    assert slugs.count("combo/main") == 1
    assert {"p1/m1", "p2/m2"} <= set(slugs)


def test_non_staff_cannot_reach_admin() -> None:
    user = get_user_model().objects.create_user("dev", password="pw-123456789")
    client = Client()
    client.force_login(user)
    response = client.get("/admin/combos/combo/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
