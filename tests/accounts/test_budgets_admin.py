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
