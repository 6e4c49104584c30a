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
        "after_commit": "error",
        "max_continuations": "1",
        "buffer_max_bytes": "4194304",
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
    assert "Weight must be an integer from 1 to 10000" in response.content.decode()
    assert not Combo.objects.exists()


def test_admin_rejects_duplicate_targets_after_trimming(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, **{"targets-1-provider": str(p1.pk), "targets-1-model": " m1 "})
    response = staff.post("/admin/combos/combo/add/", data)
    assert response.status_code == 200
    assert "Duplicate combo target &quot;p1/m1&quot;" in response.content.decode()
    assert not Combo.objects.exists()


def test_admin_rejects_reserved_alias(staff: Client) -> None:
    p1, p2 = _providers()
    response = staff.post("/admin/combos/combo/add/", _combo_post(p1, p2, alias="combo/x"))
    assert response.status_code == 200
    assert "Alias must not use the reserved" in response.content.decode()
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


# -- the editor: layout, help, errors next to their fields, undeclared-model warning ----------


def _field_errors(html: str, css_class: str) -> str:
    """The text of the admin form row (or inline cell) with class `css_class`."""
    import re

    match = re.search(
        rf'class="[^"]*\b{css_class}\b[^"]*".*?'
        r'(?=<div class="form-row|<td class=|</tr>|</fieldset>)',
        html,
        re.S,
    )
    assert match, f"no element with class {css_class}"
    return match.group(0)


def test_add_form_starts_with_one_target_row_right_under_the_identity_fields(
    staff: Client,
) -> None:
    _providers()
    html = staff.get("/admin/combos/combo/add/").content.decode()
    assert 'name="targets-TOTAL_FORMS" value="1"' in html
    # id, display name, strategy, then the targets table, then the other settings.
    order = [
        html.index('name="combo_id"'),
        html.index('name="display_name"'),
        html.index('name="strategy"'),
        html.index('id="targets-group"'),
        html.index('name="sticky_limit"'),
        html.index('name="cooldown_ms"'),
        html.index('name="override_target"'),
    ]
    assert order == sorted(order)
    # The position is a hidden field the drag script rewrites; the models are on the page.
    assert 'type="hidden" name="targets-0-position"' in html
    assert '"m1"' in html.split('id="ocx-declared-models"')[1].split("</script>")[0]
    assert "ocx/combo-editor.js" in html
    for text in (
        "Empty = the upstream hint, else 60 s",
        "0 = answer at once",
        "Empty = nothing added",
        "Empty = automatic",
        "Default 1; other strategies ignore it.",
        "Off = an ordinary target.",
        "Empty = combo/ID only.",
    ):
        assert text in html, text


def test_change_form_has_no_extra_target_row(staff: Client) -> None:
    p1, p2 = _providers()
    assert staff.post("/admin/combos/combo/add/", _combo_post(p1, p2)).status_code == 302
    combo = Combo.objects.get(combo_id="main")
    html = staff.get(f"/admin/combos/combo/{combo.pk}/change/").content.decode()
    assert 'name="targets-TOTAL_FORMS" value="2"' in html
    assert 'name="targets-INITIAL_FORMS" value="2"' in html


def test_blank_extra_row_with_a_rewritten_position_is_ignored(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, **{"targets-TOTAL_FORMS": "3", "targets-2-position": "2"})
    data["targets-2-weight"] = "1"
    response = staff.post("/admin/combos/combo/add/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert [t.key for t in selectors.combo_get("main").targets] == ["p1/m1", "p2/m2"]  # type: ignore[union-attr]


def test_combo_field_errors_sit_next_to_their_fields(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, sticky_limit="0", override_target="p9/nope")
    response = staff.post("/admin/combos/combo/add/", data)
    assert response.status_code == 200
    html = response.content.decode()
    sticky = _field_errors(html, "field-sticky_limit")
    assert "Sticky limit must be an integer from 1 to 100" in sticky
    assert 'min="1"' in html and 'max="100"' in html
    override = _field_errors(html, "field-override_target")
    assert "Override target &quot;p9/nope&quot; is not one of this combo&#x27;s targets" in override
    # Nothing above the targets table.
    group = html[
        html.index('id="targets-group"') : html.index("</table>", html.index('id="targets-group"'))
    ]
    assert "errorlist" not in group
    assert not Combo.objects.exists()


def test_target_errors_sit_in_their_row_in_saved_order(staff: Client) -> None:
    p1, p2 = _providers()
    # Row 0 is second in order (position 5): "targets[1]" is that row's weight.
    data = _combo_post(
        p1, p2, **{"targets-0-position": "5", "targets-0-weight": "0", "targets-1-position": "1"}
    )
    html = staff.post("/admin/combos/combo/add/", data).content.decode()
    row0 = html[html.index('id="targets-0"') : html.index('id="targets-1"')]
    assert "Weight must be an integer from 1 to 10000" in row0
    assert not Combo.objects.exists()


def test_no_targets_is_an_error_above_the_table(staff: Client) -> None:
    _providers()
    data = _combo_post(*_providers_objs(), **{"targets-TOTAL_FORMS": "1"})
    for key in ("provider", "model", "weight", "position"):
        data[f"targets-0-{key}"] = "1" if key == "weight" else ""
    html = staff.post("/admin/combos/combo/add/", data).content.decode()
    group = html[html.index('id="targets-group"') :]
    assert "Targets must be a non-empty array" in group[: group.index("<table>")]
    assert not Combo.objects.exists()


def _providers_objs() -> tuple[Provider, Provider]:
    return Provider.objects.get(name="p1"), Provider.objects.get(name="p2")


def test_undeclared_model_is_saved_with_a_warning(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, **{"targets-1-model": "m2-preview"})
    response = staff.post("/admin/combos/combo/add/", data, follow=True)
    assert response.status_code == 200
    spec = selectors.combo_get("main")
    assert spec is not None and [t.key for t in spec.targets] == ["p1/m1", "p2/m2-preview"]
    warnings = [str(m) for m in response.context["messages"] if m.level_tag == "warning"]
    assert warnings == [
        'Target p2/m2-preview: provider "p2" does not declare model "m2-preview" '
        "(declared: m2); it is sent upstream as typed, and the combo is left out of the Codex "
        "catalog until the model is declared."
    ]


def test_engine_messages_read_as_words() -> None:
    from combos.admin import human_message

    assert human_message("targets[0].weight must be an integer from 1 to 10000") == (
        "Target 1's weight must be an integer from 1 to 10000"
    )
    assert human_message("cooldownMs must be an integer from 1 to 600000") == (
        "Cooldown ms must be an integer from 1 to 600000"
    )
    assert human_message('duplicate target "a/b" in targets[2]') == (
        'Duplicate target "a/b" in target 3'
    )


def test_admin_saves_the_after_commit_policy(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, after_commit="continue", max_continuations="2")
    response = staff.post("/admin/combos/combo/add/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    spec = selectors.combo_get("main")
    assert spec is not None
    assert (spec.after_commit, spec.max_continuations, spec.buffer_max_bytes) == (
        "continue",
        2,
        4194304,
    )
    page = staff.get(f"/admin/combos/combo/{Combo.objects.get().pk}/change/").content.decode()
    assert "When a stream breaks after it started" in page
    assert "prefill-capable target" in page  # the help text


def test_admin_refuses_an_out_of_range_rescue_bound(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, after_commit="buffer", buffer_max_bytes="10")
    response = staff.post("/admin/combos/combo/add/", data)
    assert response.status_code == 200
    assert "Buffer max bytes must be an integer from 1024 to 67108864" in response.content.decode()
    assert not Combo.objects.exists()
