"""Both budget admins (a key's and a user's) explain the budgets format under the field."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.admin import BUDGETS_HELP
from accounts.models import ClientKey, UserBudget

pytestmark = pytest.mark.django_db


def test_key_and_user_budget_forms_show_the_budgets_help() -> None:
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    alice = get_user_model().objects.create_user("alice", password="pw-123456789")
    key = ClientKey.objects.create(user=alice, prefix="ocx_ab", digest="d" * 64)
    budget = UserBudget.objects.create(user=alice, budgets=[{"tokens": 5, "period": "day"}])
    client = Client()
    client.force_login(root)
    for path in (
        f"/admin/accounts/clientkey/{key.pk}/change/",
        f"/admin/accounts/userbudget/{budget.pk}/change/",
        "/admin/accounts/userbudget/add/",
        "/admin/accounts/clientkey/add/",
    ):
        response = client.get(path)
        assert response.status_code == 200, path
        # Django's admin renders help_text as HTML, unescaped.
        assert f"<div>{BUDGETS_HELP}</div>" in response.content.decode(), path


def test_key_list_and_page_show_budget_use_from_the_records() -> None:
    import datetime as dt

    from django.utils import timezone

    from usage.models import UsageRollup

    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    bob = get_user_model().objects.create_user("bob", password="pw-123456789")
    key = ClientKey.objects.create(
        user=bob,
        prefix="ocx_bb",
        digest="e" * 64,
        budgets=[{"usd": 5, "period": "month"}, {"tokens": 300, "period": "day"}],
    )
    UserBudget.objects.create(user=bob, budgets=[{"usd": 100, "period": "week"}])
    ClientKey.objects.create(user=bob, prefix="ocx_cc", digest="f" * 64)
    now = timezone.now().replace(second=0, microsecond=0)
    UsageRollup.objects.create(
        bucket=now - dt.timedelta(minutes=1) if now.minute else now,
        user="bob",
        key_id=key.pk,
        input_tokens=300,
        output_tokens=18,
        cost_usd=1.2,
    )
    client = Client()
    client.force_login(root)
    listing = client.get("/admin/accounts/clientkey/").content.decode()
    use = (
        "key: $1.20 of $5.00 this month<br>key: 318 of 300 tokens today"
        "<br>user: $1.20 of $100.00 this week"
    )
    assert use in listing
    assert '<td class="field-budget_use">user: $1.20 of $100.00 this week</td>' in listing
    page = client.get(f"/admin/accounts/clientkey/{key.pk}/change/").content.decode()
    assert use in page
