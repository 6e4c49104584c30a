"""The key admin (issue 27, Keys) through Django's test client: "Add client key" shows the
secret once (its own page, no-store, never in a URL, a message or the admin log), budgets as
rows and allowed models as a multi-select, validated on the form with nothing saved, an
expiry field, and "Rotate selected key" (grace picked, new secret shown once)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from accounts import access
from accounts.access import digest
from accounts.models import ClientKey, UserBudget
from combos import services as combo_services
from providers import services as provider_services

pytestmark = pytest.mark.django_db
ADD = "/admin/accounts/clientkey/add/"
LIST = "/admin/accounts/clientkey/"
SECRET_RE = re.compile(r'id="ocx-secret" value="(ocx_[A-Za-z0-9_-]+)"')


@pytest.fixture
def admin_client(client: Client) -> Client:
    provider_services.provider_set(
        name="cx",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "http://127.0.0.1:9/v1",
            "models": {"declared-model": {}},
        },
    )
    combo_services.combo_set(
        combo_id="main", raw={"targets": [{"provider": "cx", "model": "combo-model"}]}
    )
    root = get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client.force_login(root)
    return client


def _user(name: str, *, active: bool = True) -> Any:
    return get_user_model().objects.create_user(name, password=None, is_active=active)


def _form(user: Any, **extra: Any) -> dict[str, Any]:
    return {
        "user": str(user.pk),
        "name": "laptop",
        "rpm_limit": "",
        "expires_0": "",
        "expires_1": "",
        "budgets-kind": ["tokens", "windowPercent", "tokens"],
        "budgets-amount": ["250000", "30", ""],
        "budgets-scope": ["period:week", "provider:cx", "period:day"],
        **extra,
    }


def test_the_add_form_offers_real_controls(admin_client: Client) -> None:
    html = admin_client.get(ADD).content.decode()
    # A user search box (autocomplete), the model multi-select of the catalog, budget rows.
    assert 'class="admin-autocomplete' in html
    assert '<select name="allowed_models"' in html and "multiple" in html
    for choice in ("combo/main", "cx/declared-model", "cx/combo-model"):
        assert f'<option value="{choice}">{choice}</option>' in html
    assert '<select name="budgets-kind"' in html
    for kind in ('value="tokens"', 'value="usd"', 'value="windowPercent"'):
        assert kind in html
    assert 'value="provider:cx"' in html and 'value="period:month"' in html
    assert 'name="expires_0"' in html and 'name="expires_1"' in html
    assert "_addanother" not in html and "_continue" not in html
    assert "ocx/key-forms.js" in html


def test_adding_a_key_shows_its_secret_once(admin_client: Client) -> None:
    ann = _user("ann")
    future = timezone.now() + dt.timedelta(days=30)
    r = admin_client.post(
        ADD,
        _form(
            ann,
            allowed_models=["combo/main", "cx/declared-model"],
            rpm_limit="60",
            expires_0=future.strftime("%Y-%m-%d"),
            expires_1="12:00:00",
        ),
    )
    assert r.status_code == 200, r.content.decode()[-2000:]
    assert "no-store" in r["Cache-Control"]
    html = r.content.decode()
    match = SECRET_RE.search(html)
    assert match is not None, html[-3000:]
    secret = match.group(1)
    key = ClientKey.objects.get(user=ann)
    assert key.digest == digest(secret) and key.prefix == secret[:10]
    assert key.name == "laptop" and key.rpm_limit == 60
    assert key.allowed_models == ["combo/main", "cx/declared-model"]
    assert key.budgets == [
        {"tokens": 250000, "period": "week"},
        {"windowPercent": 30, "provider": "cx"},
    ]
    assert key.expires == dt.datetime.combine(future.date(), dt.time(12), dt.UTC)
    assert "Copy the secret now: it is shown only once." in html
    assert 'data-copy="ocx-secret"' in html
    # Nowhere else: not in the admin log, a message for the next page, or the list and key pages.
    assert all(secret not in e.change_message for e in LogEntry.objects.all())
    assert LogEntry.objects.filter(object_id=str(key.pk)).count() == 1
    for page in (LIST, f"{LIST}{key.pk}/change/"):
        later = admin_client.get(page).content.decode()
        assert secret not in later and "ocx-secret" not in later
    # The proxy's map knows the new key.
    info = access.client_keys_active()[digest(secret)]
    assert info.expires_at == key.expires.timestamp()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"budgets-amount": ["0", "30", ""]}, "budgets[0].tokens must be from 1 to"),
        ({"budgets-amount": ["1.5", "30", ""]}, "row 1: a tokens budget needs a whole number"),
        ({"budgets-amount": ["abc", "30", ""]}, "row 1: the amount &#x27;abc&#x27; is not a"),
        (
            {"budgets-scope": ["provider:cx", "provider:cx", "period:day"]},
            "row 1: a tokens budget needs a period (day, week or month)",
        ),
        (
            {"budgets-scope": ["period:week", "period:day", "period:day"]},
            "row 2: a quota-window budget needs a provider (third column)",
        ),
        (
            {
                "budgets-kind": ["tokens", "tokens", "tokens"],
                "budgets-amount": ["5", "6", ""],
                "budgets-scope": ["period:day", "period:week", "period:day"],
            },
            "at most one token budget",
        ),
        ({"allowed_models": ["combo/nope"]}, "combo/nope is not one of the available choices"),
        ({"rpm_limit": "0"}, "requests per minute must be at least 1 (empty: no limit)"),
        (
            {"expires_0": "2020-01-01", "expires_1": "00:00:00"},
            "the expiry 2020-01-01T00:00:00Z is in the past: a new key must expire later",
        ),
    ],
)
def test_a_bad_add_form_shows_the_error_and_saves_nothing(
    admin_client: Client, extra: dict[str, Any], error: str
) -> None:
    bea = _user("bea")
    r = admin_client.post(ADD, _form(bea, **extra))
    assert r.status_code == 200
    html = r.content.decode()
    assert error in html, html[html.find("errorlist") - 200 : html.find("errorlist") + 800]
    assert "ocx-secret" not in html
    assert not ClientKey.objects.exists()
    # The rows typed stay on the form.
    assert html.count('name="budgets-kind"') >= 3


def test_a_deactivated_user_gets_no_key_from_the_form(admin_client: Client) -> None:
    dan = _user("dan", active=False)
    r = admin_client.post(ADD, _form(dan))
    assert r.status_code == 200
    assert "user dan is deactivated: reactivate it before giving it a key" in r.content.decode()
    assert not ClientKey.objects.exists()


def test_the_change_form_edits_rows_and_expiry(admin_client: Client) -> None:
    key, _ = access.client_key_create(
        username="cal", budgets=[{"tokens": 5, "period": "day"}], allowed_models=["combo/main"]
    )
    url = f"{LIST}{key.pk}/change/"
    html = admin_client.get(url).content.decode()
    assert '<option value="combo/main" selected>combo/main</option>' in html
    assert re.search(r'name="budgets-amount" value="5"', html)
    r = admin_client.post(
        url,
        _form(
            key.user,
            allowed_models=[],
            expires_0="2020-01-01",  # a past expiry on an existing key expires it now
            expires_1="00:00:00",
            **{
                "budgets-kind": ["usd", "tokens"],
                "budgets-amount": ["", "7"],
                "budgets-scope": ["period:month", "period:day"],
            },
        ),
    )
    assert r.status_code == 302, r.content.decode()[-2000:]
    key.refresh_from_db()
    assert key.budgets == [{"tokens": 7, "period": "day"}] and key.allowed_models == []
    assert key.expires == dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    listing = admin_client.get(LIST).content.decode()
    assert "expired 2020-01-01T00:00:00Z" in listing


def test_user_budgets_are_rows_too(admin_client: Client) -> None:
    eve = _user("eve")
    r = admin_client.post(
        "/admin/accounts/userbudget/add/",
        {
            "user": str(eve.pk),
            "budgets-kind": ["tokens", "tokens"],
            "budgets-amount": ["2000000", ""],
            "budgets-scope": ["period:month", "period:day"],
        },
    )
    assert r.status_code == 302, r.content.decode()[-2000:]
    assert UserBudget.objects.get(user=eve).budgets == [{"tokens": 2000000, "period": "month"}]
    r = admin_client.post(
        "/admin/accounts/userbudget/add/",
        {
            "user": str(_user("fay").pk),
            "budgets-kind": ["windowPercent"],
            "budgets-amount": ["30"],
            "budgets-scope": ["period:day"],
        },
    )
    assert r.status_code == 200
    assert "row 1: a quota-window budget needs a provider" in r.content.decode()
    assert not UserBudget.objects.filter(user__username="fay").exists()


def test_rotate_selected_key_asks_for_a_grace_then_shows_the_new_secret(
    admin_client: Client,
) -> None:
    key, old = access.client_key_create(username="gus", rpm_limit=9)
    action = {"action": "rotate", "_selected_action": [str(key.pk)]}
    r = admin_client.post(LIST, action)
    assert r.status_code == 200
    html = r.content.decode()
    assert "The old secret keeps working for" in html and 'value="3600"' in html
    assert ClientKey.objects.get(pk=key.pk).digest == digest(old)  # nothing yet
    r = admin_client.post(LIST, {**action, "confirm": "yes", "grace": "3600"})
    assert r.status_code == 200 and "no-store" in r["Cache-Control"]
    html = r.content.decode()
    match = SECRET_RE.search(html)
    assert match is not None, html[-3000:]
    new = match.group(1)
    key.refresh_from_db()
    assert key.digest == digest(new) and key.previous_digest == digest(old)
    assert key.previous_until - key.rotated == dt.timedelta(hours=1)  # type: ignore[operator]
    assert key.rpm_limit == 9
    assert "The old secret keeps working until" in html
    entry = LogEntry.objects.get(object_id=str(key.pk))
    assert entry.change_message == "Rotated the secret (grace 1 hour)."
    assert new not in entry.change_message and old not in entry.change_message
    # Two keys at once: refused, nothing rotated.
    other, _ = access.client_key_create(username="gus")
    r = admin_client.post(
        LIST,
        {"action": "rotate", "_selected_action": [str(key.pk), str(other.pk)]},
        follow=True,
    )
    assert "Select exactly one unrevoked key to rotate." in r.content.decode()
    assert ClientKey.objects.get(pk=key.pk).digest == digest(new)
