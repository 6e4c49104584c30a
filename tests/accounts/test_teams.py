"""Teams (issue 27): `/api/teams` through Django's test client, `ocx team` through the CLI's
entry point, the Teams admin through a logged-in client, and what a team puts in its members'
key-map entries (team budgets, allowed-model narrowing)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from accounts import access
from accounts.models import TeamProfile
from combos import services as combo_services
from ocxsite import cli
from providers import services as provider_services
from providers.models import ConfigState
from usage.budgets import ScopedBudget, TokenBudget

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-teams-api-001"
URL = "/api/teams"


class Api:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def put(self, body: object) -> Any:
        return self.client.put(URL, json.dumps(body), "application/json", **self.auth)

    def get(self, path: str = "") -> Any:
        return self.client.get(URL + path, **self.auth)

    def delete(self, name: str | None) -> Any:
        query = "" if name is None else f"?name={name}"
        return self.client.delete(URL + query, **self.auth)


@pytest.fixture
def api(settings: Any, client: Client) -> Api:
    settings.OCX_ADMIN_TOKEN = TOKEN
    provider_services.provider_set(
        name="cx",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "http://127.0.0.1:9/v1",
            "models": {"declared-model": {}, "other": {}},
        },
    )
    for combo in ("team", "main"):
        combo_services.combo_set(
            combo_id=combo, raw={"targets": [{"provider": "cx", "model": "declared-model"}]}
        )
    for name in ("ann", "ben", "cy"):
        get_user_model().objects.create_user(name)
    return Api(client)


def keys_version() -> int:
    return ConfigState.objects.get(pk=1).keys_version


# --- API -------------------------------------------------------------------------------------


def test_put_creates_then_preserves_omitted_fields(api: Api) -> None:
    r = api.put(
        {
            "name": "infra",
            "team": {
                "members": ["ben", "ann"],
                "budgets": [{"tokens": 5000, "period": "month"}],
                "allowedModels": ["combo/team", "cx/declared-model"],
            },
        }
    )
    assert r.status_code == 200, r.content
    infra = {
        "name": "infra",
        "members": ["ann", "ben"],
        "budgets": [{"tokens": 5000, "period": "month"}],
        "allowedModels": ["combo/team", "cx/declared-model"],
        "managers": [],
    }
    assert r.json() == {"success": True, "team": infra}
    # Members are Django's own group membership.
    assert sorted(get_user_model().objects.get(username="ann").groups.values_list("name")) == [
        ("infra",)
    ]

    # Only members given: budgets and allowed models stay.
    r = api.put({"name": "infra", "team": {"members": ["cy"]}})
    assert r.status_code == 200, r.content
    assert r.json()["team"] == {**infra, "members": ["cy"]}
    # Only budgets given (null empties them): members and models stay.
    r = api.put({"name": "infra", "team": {"budgets": None}})
    assert r.json()["team"] == {**infra, "members": ["cy"], "budgets": []}
    # An empty team body changes nothing.
    r = api.put({"name": "infra", "team": {}})
    assert r.json()["team"] == {**infra, "members": ["cy"], "budgets": []}
    r = api.put({"name": "infra", "team": {"allowedModels": []}})
    assert r.json()["team"]["allowedModels"] == []

    assert api.get().json() == {
        "teams": [
            {"name": "infra", "members": ["cy"], "budgets": [], "allowedModels": [], "managers": []}
        ]
    }
    assert api.get("/infra").json() == {
        "team": {
            "name": "infra",
            "members": ["cy"],
            "budgets": [],
            "allowedModels": [],
            "managers": [],
        }
    }


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            {"name": "infra", "team": {"members": ["ann", "zed"]}},
            400,
            "members: unknown user 'zed'",
        ),
        ({"name": "bad name", "team": {}}, 400, "name: 1 to 64 letters"),
        ({"name": "", "team": {}}, 400, "name: 1 to 64 letters"),
        ({"name": "x" * 65, "team": {}}, 400, "name: 1 to 64 letters"),
        (
            {"name": "infra", "team": {"budgets": [{"tokens": 0, "period": "day"}]}},
            400,
            "budgets[0].tokens must be from 1 to",
        ),
        (
            {"name": "infra", "team": {"budgets": [{"tokens": 5, "period": "year"}]}},
            400,
            "budgets[0].period must be one of day, week, month",
        ),
        (
            {"name": "infra", "team": {"budgets": [{"windowPercent": 5, "provider": "nope"}]}},
            400,
            "budgets[0].provider: unknown provider nope",
        ),
        (
            {"name": "infra", "team": {"allowedModels": ["combo/nonexistent"]}},
            400,
            "unknown combo nonexistent in allowedModels (combo/nonexistent)",
        ),
        (
            {"name": "infra", "team": {"allowedModels": ["cx/undeclared"]}},
            400,
            "unknown model cx/undeclared in allowedModels",
        ),
        ({"name": "infra", "team": {"member": ["ann"]}}, 400, "team.member: Extra inputs"),
        ({"name": "infra"}, 400, "team: Field required"),
        ({"name": "infra", "team": {"members": "ann"}}, 400, "team.members: Input should be"),
    ],
)
def test_put_refuses_bad_input_and_changes_nothing(
    api: Api, body: dict[str, Any], status: int, message: str
) -> None:
    r = api.put({"name": "infra", "team": {"members": ["ann"], "allowedModels": ["combo/team"]}})
    assert r.status_code == 200
    version = keys_version()
    r = api.put(body)
    assert r.status_code == status, r.content
    assert r.json()["error"].startswith(message), r.json()
    assert api.get().json()["teams"] == [
        {
            "name": "infra",
            "members": ["ann"],
            "budgets": [],
            "allowedModels": ["combo/team"],
            "managers": [],
        }
    ]
    assert keys_version() == version  # no worker was told of anything


def test_get_and_delete_unknown_team_404_and_delete_keeps_the_users(api: Api) -> None:
    assert api.get("/nope").status_code == 404
    assert api.get("/nope").json() == {"error": "unknown team nope"}
    assert api.delete("nope").status_code == 404
    r = api.delete(None)
    assert r.status_code == 400 and r.json() == {"error": "name query param is required"}
    assert api.put({"name": "infra", "team": {"members": ["ann"]}}).status_code == 200
    r = api.delete("infra")
    assert r.status_code == 200 and r.json() == {"success": True, "name": "infra"}
    assert not Group.objects.filter(name="infra").exists()
    assert not TeamProfile.objects.exists()
    assert get_user_model().objects.filter(username="ann").exists()
    assert api.get().json() == {"teams": []}


def test_teams_api_needs_a_staff_token(api: Api, client: Client) -> None:
    assert client.get(URL).status_code == 401
    r = client.put(URL, json.dumps({"name": "x", "team": {}}), "application/json")
    assert r.status_code == 401
    assert not Group.objects.exists()


# --- the key map -----------------------------------------------------------------------------


def test_key_map_carries_every_team_budget_and_models(api: Api) -> None:
    key, _ = access.client_key_create(username="ann", allowed_models=["combo/team", "combo/main"])
    assert (
        api.put(
            {
                "name": "infra",
                "team": {
                    "members": ["ann"],
                    "budgets": [{"tokens": 900, "period": "day"}],
                    "allowedModels": ["combo/team", "cx/declared-model"],
                },
            }
        ).status_code
        == 200
    )
    assert (
        api.put(
            {
                "name": "apps",
                "team": {"members": ["ann", "ben"], "budgets": [{"tokens": 50, "period": "week"}]},
            }
        ).status_code
        == 200
    )
    infra, apps = Group.objects.get(name="infra"), Group.objects.get(name="apps")
    [info] = access.client_keys_active().values()
    assert info.budgets == (
        ScopedBudget("team", f"t{apps.pk}", "team apps", TokenBudget(50, "week")),
        ScopedBudget("team", f"t{infra.pk}", "team infra", TokenBudget(900, "day")),
    )
    assert info.team_models == (("infra", frozenset({"combo/team", "cx/declared-model"})),)
    # Allowed by the key and by infra (apps has no list).
    assert access.model_refusal(info, "combo/team") is None
    # Allowed by the team but not by the key: the key's own list still applies.
    assert access.model_refusal(info, "cx/declared-model") == (
        "This key may not use model cx/declared-model"
    )
    # Allowed by the key but not by infra: the team narrows it.
    assert access.model_refusal(info, "combo/main") == (
        "This key may not use model combo/main (team infra does not allow it)"
    )
    assert key.pk == info.id


def test_team_write_names_the_affected_users(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from accounts import team_services

    bumps: list[list[tuple[str, str]]] = []
    monkeypatch.setattr(team_services, "keys_bump", lambda changes: bumps.append(list(changes)))
    ann, ben, cy = (get_user_model().objects.get(username=n) for n in ("ann", "ben", "cy"))
    api.put({"name": "infra", "team": {"members": ["ann", "ben"]}})
    api.put({"name": "infra", "team": {"members": ["ben", "cy"]}})  # ann leaves, cy joins
    api.put({"name": "infra", "team": {"budgets": [{"tokens": 5, "period": "day"}]}})
    api.delete("infra")
    assert [sorted(b) for b in bumps] == [
        sorted([("user", str(ann.pk)), ("user", str(ben.pk))]),
        sorted([("user", str(ann.pk)), ("user", str(ben.pk)), ("user", str(cy.pk))]),
        sorted([("user", str(ben.pk)), ("user", str(cy.pk))]),
        sorted([("user", str(ben.pk)), ("user", str(cy.pk))]),
    ]


# --- CLI -------------------------------------------------------------------------------------


def ocx(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_cli_set_list_show_remove(api: Api) -> None:
    code, out, err = ocx(
        "team",
        "set",
        "infra",
        "--member",
        "ann",
        "--member",
        "ben",
        "--budget",
        "tokens=2M/month",
        "--allowed-model",
        "combo/team",
    )
    assert (code, err) == (0, "")
    assert out == (
        "Team infra\n  members: ann, ben\n  budgets: 2000000 tokens per month\n"
        "  allowed models: combo/team\n  managers: none\n"
    )
    # What is not given stays; --add-member / --remove-member change the member list.
    code, out, _ = ocx("team", "set", "infra", "--add-member", "cy", "--remove-member", "ann")
    assert code == 0 and "  members: ben, cy\n" in out and "2000000 tokens per month" in out
    code, out, _ = ocx("team", "set", "infra", "--budget", "none", "--allowed-model", "none")
    assert code == 0
    assert out.endswith("  budgets: none\n  allowed models: any\n  managers: none\n")
    code, out, _ = ocx("team", "list")
    assert (code, out) == (0, "infra  members: ben, cy  budgets: none  models: any\n")
    code, out, _ = ocx("team", "show", "infra")
    assert out.startswith("Team infra\n  members: ben, cy\n")
    code, out, _ = ocx("team", "remove", "infra")
    assert (code, out) == (0, "Removed team infra.\n")
    assert ocx("team", "list")[1] == "No teams.\n"


def test_cli_errors_name_the_problem_and_change_nothing(api: Api) -> None:
    assert ocx("team", "set", "infra", "--member", "ann")[0] == 0
    for args, message in (
        (("--member", "zed"), "ocx: members: unknown user 'zed'"),
        (("--budget", "tokens=lots/day"), "ocx: bad budget 'tokens=lots/day'"),
        (("--allowed-model", "combo/nope"), "ocx: unknown combo nope in allowedModels"),
        (("--member", "ann", "--no-members"), "ocx: give --member or --no-members, not both"),
    ):
        code, _, err = ocx("team", "set", "infra", *args)
        assert code == 1 and err.startswith(message), (args, err)
    code, _, err = ocx("team", "set", "bad/name")
    assert code == 1 and err.startswith("ocx: name: 1 to 64 letters")
    assert ocx("team", "show", "nope")[2] == "ocx: no team nope\n"
    assert ocx("team", "remove", "nope")[2] == "ocx: no team nope\n"
    assert ocx("team", "list")[1] == "infra  members: ann  budgets: none  models: any\n"


# --- admin -----------------------------------------------------------------------------------


def test_admin_adds_and_changes_a_team_with_members(api: Api) -> None:
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(root)
    ann, ben, cy = (get_user_model().objects.get(username=n) for n in ("ann", "ben", "cy"))
    page = client.get("/admin/accounts/team/add/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'class="selectfilter"' in html  # the member picker (FilteredSelectMultiple)
    assert '<option value="combo/team">combo/team</option>' in html
    # The stock Groups page is replaced by Teams.
    assert client.get("/admin/auth/group/").status_code == 404

    version = keys_version()
    r = client.post(
        "/admin/accounts/team/add/",
        {
            "name": "infra",
            "members": [ann.pk, ben.pk],
            "budgets": '[{"tokens": 1000, "period": "day"}]',
            "allowed_models": ["combo/team"],
        },
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    assert keys_version() == version + 1  # one notice names ann and ben
    assert api.get("/infra").json()["team"] == {
        "name": "infra",
        "members": ["ann", "ben"],
        "budgets": [{"tokens": 1000, "period": "day"}],
        "allowedModels": ["combo/team"],
        "managers": [],
    }

    team = Group.objects.get(name="infra")
    change = f"/admin/accounts/team/{team.pk}/change/"
    page = client.get(change).content.decode()
    assert f'<option value="{ann.pk}" selected>ann</option>' in page
    r = client.post(change, {"members": [cy.pk], "budgets": "[]", "allowed_models": []})
    assert r.status_code == 302, r.content.decode()[:2000]
    assert api.get("/infra").json()["team"] == {
        "name": "infra",
        "members": ["cy"],
        "budgets": [],
        "allowedModels": [],
        "managers": [],
    }
    listing = client.get("/admin/accounts/team/").content.decode()
    assert "infra" in listing and "cy" in listing


def test_admin_refuses_bad_values_with_form_errors(api: Api) -> None:
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(root)
    r = client.post(
        "/admin/accounts/team/add/",
        {"name": "bad name", "budgets": '[{"tokens": -1, "period": "day"}]'},
    )
    assert r.status_code == 200
    html = r.content.decode()
    assert "1 to 64 letters" in html
    assert "budgets[0].tokens must be from 1 to" in html
    r = client.post(
        "/admin/accounts/team/add/", {"name": "infra", "allowed_models": ["combo/nope"]}
    )
    assert r.status_code == 200
    assert "Select a valid choice" in r.content.decode()
    assert not Group.objects.exists()


def test_admin_delete_goes_through_the_service(api: Api) -> None:
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(root)
    api.put({"name": "infra", "team": {"members": ["ann"]}})
    team = Group.objects.get(name="infra")
    version = keys_version()
    r = client.post(f"/admin/accounts/team/{team.pk}/delete/", {"post": "yes"})
    assert r.status_code == 302
    assert not Group.objects.exists()
    assert keys_version() == version + 1


def test_a_group_made_elsewhere_is_a_team_and_can_be_changed(api: Api) -> None:
    Group.objects.create(name="Legacy Group")  # e.g. made in a shell, before teams existed
    r = api.put({"name": "Legacy Group", "team": {"members": ["ann"]}})
    assert r.status_code == 200, r.content
    assert r.json()["team"]["members"] == ["ann"]
    # A new team must follow the name rule.
    assert api.put({"name": "New Group", "team": {}}).status_code == 400


def test_membership_set_on_the_users_admin_page_reaches_the_key_map(api: Api) -> None:
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(root)
    api.put({"name": "infra", "team": {"budgets": [{"tokens": 7, "period": "day"}]}})
    access.client_key_create(username="ben")
    ben = get_user_model().objects.get(username="ben")
    infra = Group.objects.get(name="infra")
    version = keys_version()
    r = client.post(
        f"/admin/auth/user/{ben.pk}/change/",
        {
            "username": "ben",
            "is_active": "on",
            "groups": [infra.pk],
            "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00",
            "initial-date_joined_0": "2026-01-01",
            "initial-date_joined_1": "00:00:00",
        },
    )
    assert r.status_code == 302, r.content.decode()[:3000]
    # The user's save names ben; the workers read his keys after the groups were written.
    assert keys_version() == version + 1
    [info] = access.client_keys_active(user_ids=[ben.pk], every=False).values()
    assert [sb.owner for sb in info.budgets] == ["team infra"]
