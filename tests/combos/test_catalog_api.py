from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client, override_settings

from combos.services import combo_set
from providers.services import provider_set
from routing.catalog import validate_catalog

pytestmark = pytest.mark.django_db
TOKEN = "catalog-test-token-0123456789"


def _setup() -> None:
    provider_set(
        name="a",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "http://127.0.0.1:9/v1",
            "apiKeyEnv": "PROVIDER_TEST_UNSET_A",
            "models": {
                "big": {
                    "contextWindow": 200000,
                    "inputModalities": ["text", "image"],
                    "reasoningEfforts": ["low", "medium", "high"],
                }
            },
        },
    )
    provider_set(
        name="b",
        raw={
            "adapter": "openai-chat",
            "baseUrl": "http://127.0.0.1:9/v1",
            "apiKeyEnv": "PROVIDER_TEST_UNSET_B",
            "models": {
                "small": {
                    "contextWindow": 128000,
                    "inputModalities": ["text"],
                    "reasoningEfforts": ["low", "medium"],
                },
                "bare": {},
            },
        },
    )
    combo_set(
        combo_id="mixed",
        raw={
            "targets": [{"provider": "a", "model": "big"}, {"provider": "b", "model": "small"}],
            "defaultEffort": "high",
            "displayName": "Mixed",
        },
    )
    combo_set(combo_id="vague", raw={"targets": [{"provider": "b", "model": "unknown-model"}]})


@override_settings(OCX_ADMIN_TOKEN=TOKEN)
def test_api_catalog_is_valid_and_intersects_members() -> None:
    _setup()
    response = Client().get("/api/catalog", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert not response.content.startswith(b"\xef\xbb\xbf")
    assert validate_catalog(response.content) == []
    rows = {row["slug"]: row for row in json.loads(response.content)["models"]}
    mixed = rows["combo/mixed"]
    assert mixed["display_name"] == "Mixed"
    assert mixed["context_window"] == 128000
    assert mixed["input_modalities"] == ["text"]
    assert [lvl["effort"] for lvl in mixed["supported_reasoning_levels"]] == ["low", "medium"]
    assert mixed["default_reasoning_level"] == "medium"
    assert "a/big" in rows and "b/small" in rows
    # A combo whose member has no metadata is omitted from the catalog but still routable.
    assert "combo/vague" not in rows


@override_settings(OCX_ADMIN_TOKEN=TOKEN)
def test_api_catalog_needs_auth() -> None:
    assert Client().get("/api/catalog").status_code == 401


@override_settings(OCX_ADMIN_TOKEN=TOKEN)
def test_attention_lists_omitted_combo_and_missing_credentials() -> None:
    _setup()
    response = Client().get("/api/catalog/attention", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    body = response.json()
    assert body["omitted"] == [{"combo": "vague", "reason": "missing_member"}]
    notes = "\n".join(body["notes"])
    assert "combo/vague is omitted from the Codex catalog" in notes
    assert "environment variable PROVIDER_TEST_UNSET_A is not set" in notes


def test_catalog_write_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _setup()
    target = tmp_path / "codex" / "catalog.json"
    call_command("catalog", "write", str(target))
    assert capsys.readouterr().out.startswith("Wrote ")
    data = target.read_bytes()
    assert validate_catalog(data) == []
    assert json.loads(data)["models"]
    call_command("catalog", "show", "--json")
    shown = capsys.readouterr().out
    assert json.loads(shown) == json.loads(data)


def test_admin_changelist_shows_needs_attention() -> None:
    _setup()
    user = get_user_model().objects.create_superuser("root", "r@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    page = client.get("/admin/combos/combo/").content.decode()
    assert "Needs attention" in page
    assert "combo/vague is omitted from the Codex catalog" in page


@override_settings(OCX_ADMIN_TOKEN=TOKEN)
def test_client_chosen_model_names_are_aggregated_and_the_list_is_capped() -> None:
    """Issue #43: a bare `provider/<any name>` is served, so clients choose what the unpriced
    list would hold: one note per provider for the undeclared names, and at most 100 notes."""
    from django.utils import timezone

    from combos import selectors
    from usage.models import UsageRollup

    _setup()
    now = timezone.now()
    UsageRollup.objects.bulk_create(
        UsageRollup(bucket=now, target=f"b/made-up-{i:04d}-" + "x" * 60, unpriced_requests=1)
        for i in range(300)
    )
    body = Client().get("/api/catalog/attention", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()
    mine = [n for n in body["notes"] if n.startswith("provider b: ")]
    assert len(mine) == 1, body["notes"]
    assert mine[0].startswith("provider b: 300 undeclared model name(s) served without a price")
    assert "made-up-0000-" in mine[0] and "made-up-0299" not in mine[0]
    assert len(mine[0]) < 400
    assert not any("made-up" in n for n in body["notes"] if n not in mine)

    many = [f"note {i:03d}" for i in range(250)]
    out = selectors.capped(many)
    assert len(out) == selectors.MAX_NOTES
    assert out[-1] == "… and 151 more notes"
