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
    # Each budget with what its period used and a bar; first, the one that binds the key
    # (issue 42): here its own token budget, used up.
    for text in (
        "<strong>binds: key ocx_bb… of bob: 318 of 300 tokens today (used up)",
        "key: $1.20 of $5.00 this month <meter",
        "key: 318 of 300 tokens today (used up) <meter",
        "user: $1.20 of $100.00 this week <meter",
    ):
        assert text in listing, text
    # The key without budgets of its own is bound by its user's.
    assert "<strong>binds: user bob: $1.20 of $100.00 this week <meter" in listing
    page = client.get(f"/admin/accounts/clientkey/{key.pk}/change/").content.decode()
    assert "binds: key ocx_bb… of bob: 318 of 300 tokens today (used up)" in page
    # A team budget binds too, and shows on the team's list and page (with a bar).
    from django.contrib.auth.models import Group

    from accounts.models import TeamProfile

    team = Group.objects.create(name="infra")
    team.user_set.add(bob)
    TeamProfile.objects.create(group=team, budgets=[{"usd": 1, "period": "day"}])
    listing = client.get("/admin/accounts/clientkey/").content.decode()
    assert "<strong>binds: team infra: $1.20 of $1.00 today (used up) <meter" in listing
    teams = client.get("/admin/accounts/team/").content.decode()
    assert "team: $1.20 of $1.00 today (used up) <meter" in teams
    assert 'max="1.0" value="1.0"' in teams
    team_page = client.get(f"/admin/accounts/team/{team.pk}/change/").content.decode()
    assert "team: $1.20 of $1.00 today (used up)" in team_page
