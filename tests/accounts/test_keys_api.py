"""`/api/keys` (issue 14 item 6, PRODUCT §9.5) through Django's test client, `ocx key` through
`call_command`, and the admin's key and user-budget forms: camelCase both ways, snake_case
accepted with a deprecation header, allowedModels checked against combos and provider models,
budgets validated the same way everywhere."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from accounts.access import client_keys_active
from accounts.models import ClientKey, UserBudget
from combos import services as combo_services
from providers import services as provider_services

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-keys-api-0001"
URL = "/api/keys"


class Api:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def post(self, body: object) -> Any:
        return self.client.post(URL, json.dumps(body), "application/json", **self.auth)

    def patch(self, key_id: object, body: object) -> Any:
        return self.client.patch(
            f"{URL}/{key_id}", json.dumps(body), "application/json", **self.auth
        )

    def get(self) -> Any:
        return self.client.get(URL, **self.auth)


@pytest.fixture
def api(settings: Any, client: Client) -> Api:
    settings.OCX_ADMIN_TOKEN = TOKEN
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
    return Api(client)


def test_create_speaks_camel_case_both_ways_without_deprecation(api: Api) -> None:
    r = api.post(
        {
            "user": "alice",
            "name": "laptop",
            "allowedModels": ["combo/main", "cx/declared-model"],
            "rpmLimit": 30,
            "budgets": [
                {"tokens": 100000, "period": "day"},
                {"windowPercent": 30, "provider": "cx"},
            ],
        }
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["allowedModels"] == ["combo/main", "cx/declared-model"]
    assert body["rpmLimit"] == 30
    assert body["budgets"] == [
        {"tokens": 100000, "period": "day"},
        {"windowPercent": 30, "provider": "cx"},
    ]
    assert body["key"].startswith("ocx_")
    assert "Deprecation" not in r.headers and "Warning" not in r.headers
    listed = next(k for k in api.get().json()["keys"] if k["id"] == body["id"])
    assert listed["budgets"] == body["budgets"] and "key" not in listed
    assert "allowed_models" not in listed and "rpm_limit" not in listed


def test_snake_case_is_accepted_with_a_deprecation_header(api: Api) -> None:
    r = api.post({"user": "bob", "allowed_models": ["combo/main"], "rpm_limit": 5})
    assert r.status_code == 201, r.content
    assert r.json()["allowedModels"] == ["combo/main"] and r.json()["rpmLimit"] == 5
    assert r.headers["Deprecation"] == "true"
    assert r.headers["Warning"] == (
        '299 - "allowed_models is deprecated; use allowedModels", '
        '299 - "rpm_limit is deprecated; use rpmLimit"'
    )
    r = api.patch(r.json()["id"], {"rpm_limit": 7})
    assert r.status_code == 200 and r.json()["rpmLimit"] == 7
    assert r.headers["Warning"] == '299 - "rpm_limit is deprecated; use rpmLimit"'
    r = api.post({"user": "bob", "rpmLimit": 1, "rpm_limit": 2})
    assert r.status_code == 400
    assert r.json() == {"error": "give rpmLimit or rpm_limit, not both (rpm_limit is deprecated)"}


@pytest.mark.parametrize(
    ("models", "error"),
    [
        (["combo/nonexistent"], "unknown combo nonexistent in allowedModels (combo/nonexistent)"),
        (
            ["cx/undeclared"],
            "unknown model cx/undeclared in allowedModels: provider cx declares no model "
            "undeclared and no combo uses it",
        ),
        (
            ["gpt-5"],
            "unknown model gpt-5 in allowedModels (expected combo/<id>, a combo alias or "
            "<provider>/<model>)",
        ),
        (
            ["nope/m"],
            "unknown model nope/m in allowedModels (expected combo/<id>, a combo alias or "
            "<provider>/<model>)",
        ),
    ],
)
def test_allowed_models_must_name_something_routable(
    api: Api, models: list[str], error: str
) -> None:
    before = ClientKey.objects.count()
    r = api.post({"user": "carol", "allowedModels": ["combo/main", *models]})
    assert r.status_code == 400
    assert r.json() == {"error": error}
    r = api.post({"user": "carol", "allowed_models": models})  # the old name too
    assert r.status_code == 400 and r.json() == {"error": error}
    assert ClientKey.objects.count() == before


def test_a_model_used_by_a_combo_is_allowed(api: Api) -> None:
    r = api.post({"user": "dan", "allowedModels": ["cx/combo-model"]})
    assert r.status_code == 201, r.content


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"budget": {"tokens": 0, "period": "day"}}, "budget.tokens must be from 1 to"),
        ({"budget": {"tokens": 5, "period": "year"}}, "budget.period must be one of"),
        ({"budgets": [{"windowPercent": 30, "provider": "zz"}]}, "unknown provider zz"),
        ({"budget": {"tokens": 5, "period": "day"}, "budgets": []}, "give budget or budgets"),
        ({"budget": [1]}, "budget: "),
    ],
)
def test_bad_budgets_are_400_and_change_nothing(api: Api, body: Any, error: str) -> None:
    r = api.post({"user": "erin", **body})
    assert r.status_code == 400
    assert error in r.json()["error"]
    assert not ClientKey.objects.exists()


def test_patch_changes_only_what_is_given(api: Api) -> None:
    created = api.post({"user": "frank", "name": "a", "rpmLimit": 9}).json()
    r = api.patch(created["id"], {"budget": {"tokens": 5000, "period": "week"}})
    assert r.status_code == 200, r.content
    assert r.json()["budgets"] == [{"tokens": 5000, "period": "week"}]
    assert r.json()["rpmLimit"] == 9 and r.json()["name"] == "a"
    # The key map the proxy loads carries the budget.
    info = next(i for i in client_keys_active().values() if i.id == created["id"])
    assert [(b.kind, b.budget.to_json()) for b in info.budgets] == [
        ("key", {"tokens": 5000, "period": "week"})
    ]
    r = api.patch(created["id"], {"rpmLimit": None, "name": "b", "allowedModels": ["combo/main"]})
    assert r.status_code == 200
    assert (r.json()["rpmLimit"], r.json()["name"], r.json()["allowedModels"]) == (
        None,
        "b",
        ["combo/main"],
    )
    assert r.json()["budgets"] == [{"tokens": 5000, "period": "week"}]
    r = api.patch(created["id"], {"budget": None})
    assert r.status_code == 200 and r.json()["budgets"] == []
    # Bad input changes nothing.
    r = api.patch(created["id"], {"allowedModels": ["combo/x"], "name": "c"})
    assert r.status_code == 400
    assert ClientKey.objects.get(pk=created["id"]).name == "b"
    assert api.patch(99999, {"name": "x"}).status_code == 404
    api.client.delete(f"{URL}/{created['id']}", **api.auth)
    r = api.patch(created["id"], {"name": "x"})
    assert r.status_code == 404 and r.json() == {"error": "unknown or revoked key"}


def test_a_key_whose_budget_provider_was_removed_can_still_be_edited(api: Api) -> None:
    provider_services.provider_set(
        name="gone", raw={"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1"}
    )
    budgets = [{"windowPercent": 20, "provider": "gone"}]
    created = api.post({"user": "ivy", "budgets": budgets}).json()
    provider_services.provider_delete(name="gone")
    r = api.patch(created["id"], {"name": "renamed"})
    assert r.status_code == 200, r.content
    assert r.json()["budgets"] == budgets
    # A new budget must still name a configured provider.
    r = api.patch(created["id"], {"budgets": budgets})
    assert r.status_code == 400
    assert r.json() == {"error": "budgets[0].provider: unknown provider gone"}


def test_user_budgets_through_the_api(api: Api) -> None:
    created = api.post({"user": "judy"}).json()
    url = f"{URL}/user-budgets/judy"
    body = {"budgets": [{"tokens": 5000, "period": "month"}]}
    r = api.client.put(url, json.dumps(body), "application/json", **api.auth)
    assert r.status_code == 200, r.content
    assert r.json() == {"user": "judy", "budgets": [{"tokens": 5000, "period": "month"}]}
    r = api.client.get(f"{URL}/user-budgets", **api.auth)
    assert r.json() == {"users": [{"user": "judy", "budgets": body["budgets"]}]}
    info = next(i for i in client_keys_active().values() if i.id == created["id"])
    assert [(b.kind, b.owner, b.budget.to_json()) for b in info.budgets] == [
        ("user", "user judy", {"tokens": 5000, "period": "month"})
    ]
    bad = {"budget": {"windowPercent": 5, "provider": "nope"}}
    r = api.client.put(url, json.dumps(bad), "application/json", **api.auth)
    assert r.status_code == 400 and r.json() == {"error": "budget.provider: unknown provider nope"}
    r = api.client.put(
        f"{URL}/user-budgets/nobody", json.dumps(body), "application/json", **api.auth
    )
    assert r.status_code == 404 and r.json() == {"error": "no user nobody"}
    r = api.client.put(url, "{}", "application/json", **api.auth)
    assert r.status_code == 400 and r.json() == {"error": "give budget or budgets"}
    assert UserBudget.objects.get().budgets == body["budgets"]  # refused writes changed nothing
    r = api.client.put(url, json.dumps({"budget": None}), "application/json", **api.auth)
    assert r.status_code == 200 and r.json() == {"user": "judy", "budgets": []}
    assert not UserBudget.objects.exists()


# --- CLI ------------------------------------------------------------------------------------------


def key(*args: str) -> str:
    out = io.StringIO()
    call_command("key", *args, stdout=out)
    return out.getvalue()


def test_cli_budgets(api: Api) -> None:
    out = key(
        "create",
        "--user",
        "gina",
        "--create-user",
        "--budget",
        "tokens=100k/day",
        "--budget",
        "window=30%/cx",
    )
    key_id = int(out.split()[2].rstrip("."))
    stored = ClientKey.objects.get(pk=key_id)
    assert stored.budgets == [
        {"tokens": 100000, "period": "day"},
        {"windowPercent": 30, "provider": "cx"},
    ]
    assert "budgets: 100000 tokens per day, 30% of each cx quota window" in key("list")
    assert key("set", str(key_id), "--budget", "tokens=2M/month", "--rpm", "10") == (
        f"Updated key {key_id} ({stored.prefix}…). Budgets: 2000000 tokens per month.\n"
    )
    stored.refresh_from_db()
    assert stored.budgets == [{"tokens": 2000000, "period": "month"}] and stored.rpm_limit == 10
    key("set", str(key_id), "--budget", "none", "--rpm", "none")
    stored.refresh_from_db()
    assert stored.budgets == [] and stored.rpm_limit is None
    with pytest.raises(CommandError, match="bad budget 'tokens=5/year'"):
        key("set", str(key_id), "--budget", "tokens=5/year")
    with pytest.raises(CommandError, match="unknown provider zz"):
        key("set", str(key_id), "--budget", "window=5%/zz")
    with pytest.raises(CommandError, match="unknown combo nope"):
        key("create", "--user", "gina", "--models", "combo/nope")
    # A user's budget, shared by all their keys.
    assert key("user-budget", "gina", "--budget", "tokens=5M/week") == (
        "Budgets of user gina: 5000000 tokens per week.\n"
    )
    info = next(i for i in client_keys_active().values() if i.id == key_id)
    assert [(b.kind, b.scope, b.owner) for b in info.budgets] == [
        ("user", f"u{stored.user_id}", "user gina")
    ]
    assert key("user-budget", "gina") == "Budgets of user gina: 5000000 tokens per week.\n"
    assert key("user-budget", "gina", "--budget", "none") == "Budgets of user gina: none.\n"
    assert not UserBudget.objects.exists()
    with pytest.raises(CommandError, match="no user nobody"):
        key("user-budget", "nobody", "--budget", "tokens=5/day")


# --- admin ----------------------------------------------------------------------------------------


def test_admin_forms_validate_and_normalise_budgets(api: Api, client: Client) -> None:
    staff = get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client.force_login(staff)
    created = api.post({"user": "hank"}).json()
    url = f"/admin/accounts/clientkey/{created['id']}/change/"
    form = {"user": str(ClientKey.objects.get(pk=created["id"]).user_id), "name": "n"}
    form |= {"rpm_limit": "", "expires_0": "", "expires_1": ""}
    day = {"budgets-kind": "tokens", "budgets-scope": "period:day"}
    r = client.post(url, {**form, **day, "budgets-amount": "0"})
    assert r.status_code == 200 and "budgets[0].tokens must be from 1 to" in r.content.decode()
    r = client.post(url, {**form, "allowed_models": ["combo/zz"]})
    assert r.status_code == 200
    assert "Select a valid choice. combo/zz is not one of the available choices." in (
        r.content.decode()
    )
    r = client.post(url, {**form, **day, "budgets-amount": "10"})
    assert r.status_code == 302, r.content.decode()[-3000:]
    assert ClientKey.objects.get(pk=created["id"]).budgets == [{"tokens": 10, "period": "day"}]
    user = get_user_model().objects.get(username="hank")
    r = client.post(
        "/admin/accounts/userbudget/add/",
        {
            "user": str(user.pk),
            "budgets-kind": "windowPercent",
            "budgets-amount": "25",
            "budgets-scope": "provider:cx",
        },
    )
    assert r.status_code == 302, r.content.decode()[-3000:]
    assert UserBudget.objects.get(user=user).budgets == [{"windowPercent": 25, "provider": "cx"}]
    info = next(i for i in client_keys_active().values() if i.id == created["id"])
    assert [b.kind for b in info.budgets] == ["key", "user"]


def test_create_says_when_it_created_the_user_and_refuses_an_inactive_one(api: Api) -> None:
    from django.contrib.auth import get_user_model

    r = api.post({"user": "newbie"})
    assert r.status_code == 201 and r.json()["userCreated"] is True
    r = api.post({"user": "newbie"})
    assert r.status_code == 201 and r.json()["userCreated"] is False
    get_user_model().objects.filter(username="newbie").update(is_active=False)
    r = api.post({"user": "newbie"})
    assert r.status_code == 409
    assert r.json() == {
        "error": "user newbie is deactivated: reactivate it with `ocx user activate newbie` "
        "before giving it a key",
        "code": "user_inactive",
    }
    assert ClientKey.objects.filter(user__username="newbie").count() == 2
