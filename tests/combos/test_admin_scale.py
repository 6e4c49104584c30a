"""The admin combo list at a team's scale (issue #24): a page of 100 rows out of many combos
reads the config once and the live state once, not once per row."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from combos import selectors
from combos.models import Combo, ComboTarget
from providers import services as provider_services
from providers.models import Provider

pytestmark = pytest.mark.django_db

URL = "/admin/combos/combo/"


def make_combos(count: int) -> None:
    provider_services.provider_set(
        name="p",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "http://127.0.0.1:9/v1",
            "models": {"m": {}},
        },
    )
    provider = Provider.objects.get(name="p")
    combos = Combo.objects.bulk_create(Combo(combo_id=f"c{i:04d}") for i in range(count))
    ComboTarget.objects.bulk_create(
        ComboTarget(combo=c, provider=provider, model="m", position=0) for c in combos
    )


def test_a_page_of_100_combos_reads_the_config_once(
    admin_client: Client,
    monkeypatch: pytest.MonkeyPatch,
    django_assert_max_num_queries: Any,
) -> None:
    make_combos(250)
    reads = []
    original = selectors.config_snapshot

    def counted() -> Any:
        reads.append(1)
        return original()

    monkeypatch.setattr(selectors, "config_snapshot", counted)
    # Fixed: the session, the count, one page of combos and their targets, one config read
    # (providers, models, combos, targets). Not one more per row.
    with django_assert_max_num_queries(20):
        page = admin_client.get(URL)
    assert page.status_code == 200
    assert len(page.context["cl"].result_list) == 100
    assert reads == [1]
    body = page.content.decode()
    # Every row shows its live badges (the provider has no credential), computed for the page.
    assert body.count('class="ocx-badge ocx-no_credential" data-target="p/m"') == 100

    # The same page with twice as many rows in the table costs the same queries.
    make_more = [Combo(combo_id=f"d{i:04d}") for i in range(250)]
    Combo.objects.bulk_create(make_more)
    with django_assert_max_num_queries(20):
        assert admin_client.get(URL, {"p": 2}).status_code == 200
