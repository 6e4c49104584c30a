"""`/api/combos` (combos-behaviour.md §8.1-§8.3, PRODUCT.md §4.2) through Django's test client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts import access
from combos import selectors
from providers import services as provider_services
from providers.models import ConfigState
from routing import validate

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-combos-api-0001"
URL = "/api/combos"


def provider(name: str, *, disabled: bool = False) -> None:
    raw: dict[str, object] = {"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1"}
    if disabled:
        raw["disabled"] = True
    provider_services.provider_set(name=name, raw=raw)


def version() -> int:
    state = ConfigState.objects.filter(pk=1).first()
    return 0 if state is None else state.version


class Api:
    def __init__(self, client: Client, token: str) -> None:
        self.client = client
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    def get(self, path: str = URL, **params: Any) -> Any:
        return self.client.get(path, params, **self.auth)

    def put(self, body: object, *, raw: bytes | str | None = None) -> Any:
        data = raw if raw is not None else json.dumps(body)
        return self.client.put(URL, data=data, content_type="application/json", **self.auth)

    def delete(self, query: str = "") -> Any:
        return self.client.delete(URL + query, **self.auth)

    def put_ok(self, combo_id: str, combo: dict[str, Any], **extra: Any) -> dict[str, Any]:
        r = self.put({"id": combo_id, "combo": combo, **extra})
        assert r.status_code == 200, r.content
        return r.json()


@pytest.fixture
def api(settings: Any, client: Client) -> Api:
    settings.OCX_ADMIN_TOKEN = TOKEN
    provider("a")
    provider("b")
    return Api(client, TOKEN)


def assert_rejected(api: Api, body: object, status: int, message: str, **kw: Any) -> None:
    """The request fails with exactly `{"error": message}` and the config is unchanged."""
    before = selectors.config_dump()
    v = version()
    r = api.put(body, **kw)
    assert r.status_code == status, r.content
    assert r.json() == {"error": message}
    assert selectors.config_dump() == before
    assert version() == v


# --- §8.1 GET ---


def test_get_empty_list(api: Api) -> None:
    r = api.get()
    assert r.status_code == 200
    assert r.json() == {"combos": []}


def test_get_list_sorted_with_always_present_fields(api: Api) -> None:
    for cid in ("zulu", "alpha", "Mike"):
        api.put_ok(cid, {"targets": [{"provider": "a", "model": "m1"}]})
    r = api.get()
    assert r.status_code == 200
    combos = r.json()["combos"]
    # locale-aware order (the reference uses localeCompare), not code-point order
    assert [c["id"] for c in combos] == ["alpha", "Mike", "zulu"]
    alpha = next(c for c in combos if c["id"] == "alpha")
    assert alpha == {
        "id": "alpha",
        "model": "combo/alpha",
        "strategy": "failover",
        "stickyLimit": 1,
        "defaultEffort": None,
        "alias": None,
        "nativeAlias": False,
        "displayName": None,
        "override": None,
        "targets": [{"provider": "a", "model": "m1", "weight": 1, "lastResort": False}],
    }
    for key in (
        "cooldownMs",
        "waitForCooldownMs",
        "imageInput",
        "reasoningEffortMode",
        "defaultEffortMode",
        "cooldownWaitPolicy",
    ):
        assert key not in alpha


def test_get_list_sorted_by_id(api: Api) -> None:
    for cid in ("c", "a1", "b2"):
        api.put_ok(cid, {"targets": [{"provider": "a", "model": "m1"}]})
    assert [c["id"] for c in api.get().json()["combos"]] == ["a1", "b2", "c"]


def test_get_list_shows_non_default_fields(api: Api) -> None:
    combo = {
        "targets": [
            {"provider": "a", "model": "m1", "weight": 3},
            {"provider": "b", "model": "m2", "lastResort": True},
        ],
        "strategy": "round-robin",
        "stickyLimit": 5,
        "cooldownMs": 60000,
        "waitForCooldownMs": 2500,
        "cooldownWaitPolicy": "before-last-resort",
        "defaultEffort": "high",
        "defaultEffortMode": "force",
        "reasoningEffortMode": "adaptive",
        "imageInput": "disabled",
        "alias": " team/fast ",
        "displayName": " Fast ",
    }
    api.put_ok("full", combo)
    listed = api.get().json()["combos"][0]
    assert listed == {
        "id": "full",
        "model": "team/fast",
        "strategy": "round-robin",
        "stickyLimit": 5,
        "cooldownMs": 60000,
        "waitForCooldownMs": 2500,
        "cooldownWaitPolicy": "before-last-resort",
        "defaultEffort": "high",
        "defaultEffortMode": "force",
        "reasoningEffortMode": "adaptive",
        "imageInput": "disabled",
        "alias": "team/fast",
        "nativeAlias": False,
        "displayName": "Fast",
        "override": None,
        "targets": [
            {"provider": "a", "model": "m1", "weight": 3, "lastResort": False},
            {"provider": "b", "model": "m2", "weight": 1, "lastResort": True},
        ],
    }


def test_get_output_put_back_writes_no_defaults(api: Api) -> None:
    api.put_ok("echo", {"targets": [{"provider": "a", "model": "m1"}]})
    before = selectors.config_dump()
    listed = api.get().json()["combos"][0]
    body = {k: v for k, v in listed.items()}
    api.put_ok("echo", body)
    assert selectors.config_dump() == before
    assert selectors.config_dump()["combos"]["echo"] == {
        "strategy": "failover",
        "stickyLimit": 1,
        "defaultEffort": None,
        "targets": [{"provider": "a", "model": "m1", "weight": 1}],
    }


def test_get_one(api: Api) -> None:
    api.put_ok("one", {"targets": [{"provider": "a", "model": "m1"}]})
    r = api.get(URL + "/one")
    assert r.status_code == 200
    assert r.json()["combo"]["id"] == "one"
    assert r.json()["combo"]["model"] == "combo/one"
    assert r.json()["combo"]["targets"] == [
        {"provider": "a", "model": "m1", "weight": 1, "lastResort": False}
    ]


@pytest.mark.parametrize("cid", ["missing", "constructor", "toString"])
def test_get_one_unknown(api: Api, cid: str) -> None:
    r = api.get(URL + "/" + cid)
    assert r.status_code == 404
    assert r.json() == {"error": "unknown combo"}


# --- §8.2 PUT: create, replace ---


def test_put_create_zeta_example(api: Api) -> None:
    v = version()
    r = api.put({"id": "zeta", "combo": {"targets": [{"provider": " a ", "model": " m1 "}]}})
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is True
    assert body["id"] == "zeta"
    assert body["model"] == "combo/zeta"
    assert body["combo"] == {
        "strategy": "failover",
        "stickyLimit": 1,
        "defaultEffort": None,
        "targets": [{"provider": "a", "model": "m1", "weight": 1}],
    }
    assert selectors.config_dump()["combos"] == {"zeta": body["combo"]}
    assert version() == v + 1


def test_put_trims_id(api: Api) -> None:
    body = api.put_ok("  spaced  ", {"targets": [{"provider": "a", "model": "m1"}]})
    assert body["id"] == "spaced"
    assert list(selectors.config_dump()["combos"]) == ["spaced"]


def test_put_replace(api: Api) -> None:
    api.put_ok("r", {"targets": [{"provider": "a", "model": "m1"}], "alias": "old-alias"})
    body = api.put_ok(
        "r",
        {
            "targets": [{"provider": "b", "model": "m2", "weight": 4}],
            "strategy": "random",
            "defaultEffort": "low",
        },
    )
    assert body["combo"] == {
        "strategy": "random",
        "stickyLimit": 1,
        "defaultEffort": "low",
        "targets": [{"provider": "b", "model": "m2", "weight": 4}],
    }
    # alias is not a preserved field: omitting it removes it.
    assert selectors.config_dump()["combos"] == {"r": body["combo"]}


def test_put_alias_is_public_model(api: Api) -> None:
    body = api.put_ok("al", {"targets": [{"provider": "a", "model": "m1"}], "alias": "daily-fast"})
    assert body["model"] == "daily-fast"
    assert body["combo"]["alias"] == "daily-fast"


def test_put_native_alias(api: Api) -> None:
    body = api.put_ok(
        "nat",
        {
            "targets": [{"provider": "a", "model": "m1"}],
            "alias": "gpt-5.5",
            "nativeAlias": True,
            "displayName": "Routed 5.5",
        },
    )
    assert body["combo"]["nativeAlias"] is True
    assert body["combo"]["displayName"] == "Routed 5.5"


def test_put_override(api: Api) -> None:
    combo = {
        "targets": [{"provider": "a", "model": "m1"}, {"provider": "b", "model": "m2"}],
        "override": {"target": "b/m2"},
    }
    body = api.put_ok("ov", combo)
    assert body["combo"]["override"] == {"target": "b/m2"}
    assert api.get(URL + "/ov").json()["combo"]["override"] == {"target": "b/m2"}
    # Omitting override keeps the pin while its target remains.
    body = api.put_ok("ov", {"targets": combo["targets"]})
    assert body["combo"]["override"] == {"target": "b/m2"}
    # Explicit null returns to automatic.
    body = api.put_ok("ov", {"targets": combo["targets"], "override": None})
    assert "override" not in body["combo"]
    assert api.get(URL + "/ov").json()["combo"]["override"] is None


def test_put_override_must_name_a_target(api: Api) -> None:
    api.put_ok("ov", {"targets": [{"provider": "a", "model": "m1"}]})
    assert_rejected(
        api,
        {
            "id": "ov",
            "combo": {"targets": [{"provider": "a", "model": "m1"}], "override": {"target": "b/x"}},
        },
        400,
        validate.msg_override_not_target("b/x"),
    )


# --- preserve on omit ---


def test_put_preserves_omitted_fields(api: Api) -> None:
    api.put_ok(
        "keep",
        {
            "targets": [
                {"provider": "a", "model": "m1"},
                {"provider": "b", "model": "m2", "lastResort": True},
            ],
            "cooldownMs": 12000,
            "waitForCooldownMs": 3000,
            "defaultEffort": "medium",
            "defaultEffortMode": "force",
            "reasoningEffortMode": "adaptive",
            "imageInput": "disabled",
            "cooldownWaitPolicy": "before-last-resort",
        },
    )
    body = api.put_ok(
        "keep",
        {
            "targets": [{"provider": " b ", "model": "m2"}, {"provider": "a", "model": "m1"}],
            "defaultEffort": "medium",
        },
    )
    assert body["combo"] == {
        "strategy": "failover",
        "stickyLimit": 1,
        "cooldownMs": 12000,
        "waitForCooldownMs": 3000,
        "cooldownWaitPolicy": "before-last-resort",
        "defaultEffort": "medium",
        "defaultEffortMode": "force",
        "reasoningEffortMode": "adaptive",
        "imageInput": "disabled",
        "targets": [
            {"provider": "b", "model": "m2", "weight": 1, "lastResort": True},
            {"provider": "a", "model": "m1", "weight": 1},
        ],
    }
    assert selectors.config_dump()["combos"]["keep"] == body["combo"]


def test_put_explicit_values_replace_preserved(api: Api) -> None:
    api.put_ok(
        "keep",
        {
            "targets": [{"provider": "a", "model": "m1", "lastResort": True}],
            "cooldownMs": 12000,
            "waitForCooldownMs": 3000,
            "reasoningEffortMode": "adaptive",
            "imageInput": "disabled",
            "cooldownWaitPolicy": "before-last-resort",
        },
    )
    body = api.put_ok(
        "keep",
        {
            "targets": [{"provider": "a", "model": "m1", "lastResort": False}],
            "cooldownMs": 60000,
            "waitForCooldownMs": 0,
            "reasoningEffortMode": "strict",
            "imageInput": "auto",
            "cooldownWaitPolicy": None,
        },
    )
    # waitForCooldownMs 0 disappears; an explicit cooldownMs 60000 is stored as given.
    assert body["combo"] == {
        "strategy": "failover",
        "stickyLimit": 1,
        "cooldownMs": 60000,
        "defaultEffort": None,
        "targets": [{"provider": "a", "model": "m1", "weight": 1}],
    }


def test_put_last_resort_not_carried_to_a_different_target(api: Api) -> None:
    api.put_ok(
        "lr",
        {
            "targets": [
                {"provider": "a", "model": "m1"},
                {"provider": "b", "model": "m2", "lastResort": True},
            ]
        },
    )
    body = api.put_ok(
        "lr", {"targets": [{"provider": "a", "model": "m1"}, {"provider": "b", "model": "m3"}]}
    )
    assert body["combo"]["targets"] == [
        {"provider": "a", "model": "m1", "weight": 1},
        {"provider": "b", "model": "m3", "weight": 1},
    ]


def test_put_force_mode_cleared_with_effort(api: Api) -> None:
    api.put_ok(
        "f",
        {
            "targets": [{"provider": "a", "model": "m1"}],
            "defaultEffort": "high",
            "defaultEffortMode": "force",
        },
    )
    body = api.put_ok("f", {"targets": [{"provider": "a", "model": "m1"}], "defaultEffort": None})
    assert body["combo"]["defaultEffort"] is None
    assert "defaultEffortMode" not in body["combo"]


# --- rename ---


def test_put_rename(api: Api) -> None:
    api.put_ok(
        "old",
        {
            "targets": [{"provider": "a", "model": "m1", "lastResort": True}],
            "cooldownMs": 5000,
            "imageInput": "disabled",
        },
    )
    v = version()
    body = api.put_ok("new", {"targets": [{"provider": "a", "model": "m1"}]}, renameFrom="old")
    assert body["id"] == "new"
    assert body["model"] == "combo/new"
    combos = selectors.config_dump()["combos"]
    assert list(combos) == ["new"]
    # preserve-on-omit reads the rename source
    assert combos["new"]["cooldownMs"] == 5000
    assert combos["new"]["imageInput"] == "disabled"
    assert combos["new"]["targets"] == [
        {"provider": "a", "model": "m1", "weight": 1, "lastResort": True}
    ]
    assert version() == v + 1
    assert api.get(URL + "/old").status_code == 404


def test_put_rename_keeps_own_alias(api: Api) -> None:
    api.put_ok("old", {"targets": [{"provider": "a", "model": "m1"}], "alias": "shared"})
    body = api.put_ok(
        "new", {"targets": [{"provider": "a", "model": "m1"}], "alias": "shared"}, renameFrom="old"
    )
    assert body["model"] == "shared"


@pytest.mark.parametrize(
    ("rename_from", "message"),
    [
        (5, "renameFrom must be a non-empty string"),
        ("", "renameFrom must be a non-empty string"),
        ("   ", "renameFrom must be a non-empty string"),
        (["src"], "renameFrom must be a non-empty string"),
        ("dst", "renameFrom must differ from id"),
        ("ghost", 'combo "ghost" does not exist'),
        ("constructor", 'combo "constructor" does not exist'),
        ("src", 'combo "dst" already exists'),
    ],
)
def test_put_rename_errors(api: Api, rename_from: object, message: str) -> None:
    api.put_ok("src", {"targets": [{"provider": "a", "model": "m1"}]})
    api.put_ok("dst", {"targets": [{"provider": "b", "model": "m2"}]})
    assert_rejected(
        api,
        {
            "id": "dst",
            "combo": {"targets": [{"provider": "a", "model": "m1"}]},
            "renameFrom": rename_from,
        },
        400,
        message,
    )


def test_put_rename_checks_come_before_combo_object_check(api: Api) -> None:
    assert_rejected(
        api, {"id": "x", "combo": None, "renameFrom": "ghost"}, 400, 'combo "ghost" does not exist'
    )


# --- 400s with exact messages, nothing changes ---


@pytest.fixture
def seeded(api: Api) -> Api:
    api.put_ok("base", {"targets": [{"provider": "a", "model": "m1"}], "alias": "taken"})
    return api


def test_invalid_json_body(seeded: Api) -> None:
    assert_rejected(seeded, None, 400, "invalid JSON body", raw="{not json")
    assert_rejected(seeded, None, 400, "invalid JSON body", raw="")
    assert_rejected(seeded, None, 400, "invalid JSON body", raw=b"\xff\xfe{}")


@pytest.mark.parametrize(
    "raw", ["null", "[]", '[{"id": "x"}]', '"text"', "42", "1.5", "true", "false"]
)
def test_body_not_an_object(seeded: Api, raw: str) -> None:
    assert_rejected(seeded, None, 400, "request body must be an object", raw=raw)


@pytest.mark.parametrize(
    "body", [{}, {"id": ""}, {"id": "   "}, {"id": 5}, {"id": None}, {"combo": {}}]
)
def test_id_missing(seeded: Api, body: dict[str, object]) -> None:
    body.setdefault("combo", {"targets": [{"provider": "a", "model": "m1"}]})
    assert_rejected(seeded, body, 400, "id is required and must be a string")


@pytest.mark.parametrize("combo", [None, [], "x", 3, True])
def test_combo_not_an_object(seeded: Api, combo: object) -> None:
    assert_rejected(seeded, {"id": "new", "combo": combo}, 400, "combo must be an object")


def test_combo_missing(seeded: Api) -> None:
    assert_rejected(seeded, {"id": "new"}, 400, "combo must be an object")


def test_unknown_top_level_field(seeded: Api) -> None:
    body = {"id": "new", "combo": {"targets": [{"provider": "a", "model": "m1"}]}, "extra": 1}
    assert_rejected(seeded, body, 400, 'unknown field "extra"')


T = [{"provider": "a", "model": "m1"}]


@pytest.mark.parametrize(
    ("combo_id", "combo", "message"),
    [
        ("-bad", {"targets": T}, validate.MSG_COMBO_ID),
        ("a" * 65, {"targets": T}, validate.MSG_COMBO_ID),
        ("a", {"targets": T}, 'combo id "a" collides with configured provider name "a"'),
        ("new", {}, "targets must be a non-empty array"),
        ("new", {"targets": []}, "targets must be a non-empty array"),
        ("new", {"targets": {"provider": "a"}}, "targets must be a non-empty array"),
        ("new", {"targets": [None]}, "targets[0] must be an object"),
        ("new", {"targets": [{"provider": "", "model": "m"}]}, "targets[0].provider is required"),
        ("new", {"targets": [{"provider": "a", "model": " "}]}, "targets[0].model is required"),
        (
            "new",
            {"targets": [{"provider": "nope", "model": "m1"}]},
            'targets[0].provider "nope" is not configured',
        ),
        (
            "new",
            {"targets": [{"provider": " a ", "model": " m1 "}, {"provider": "a", "model": "m1"}]},
            'duplicate combo target "a/m1"',
        ),
        (
            "new",
            {"targets": [{"provider": "a", "model": "m1", "weight": 0}]},
            "targets[0].weight must be an integer from 1 to 10000",
        ),
        (
            "new",
            {
                "targets": [
                    {"provider": "a", "model": "m1"},
                    {"provider": "b", "model": "m", "weight": 10001},
                ]
            },
            "targets[1].weight must be an integer from 1 to 10000",
        ),
        (
            "new",
            {"targets": [{"provider": "a", "model": "m1", "weight": 1.5}]},
            "targets[0].weight must be an integer from 1 to 10000",
        ),
        (
            "new",
            {"targets": [{"provider": "a", "model": "m1", "weight": "2"}]},
            "targets[0].weight must be an integer from 1 to 10000",
        ),
        (
            "new",
            {"targets": [{"provider": "a", "model": "m1", "lastResort": "yes"}]},
            "targets[0].lastResort must be a boolean",
        ),
        (
            "new",
            {"targets": [{"provider": "a", "model": "m1", "extra": 1}]},
            'unknown field "extra"',
        ),
        ("new", {"targets": T, "strategy": "jev"}, validate.MSG_STRATEGY),
        ("new", {"targets": T, "stickyLimit": 0}, "stickyLimit must be an integer from 1 to 100"),
        ("new", {"targets": T, "stickyLimit": 101}, "stickyLimit must be an integer from 1 to 100"),
        ("new", {"targets": T, "cooldownMs": 0}, "cooldownMs must be an integer from 1 to 600000"),
        (
            "new",
            {"targets": T, "cooldownMs": "5000"},
            "cooldownMs must be an integer from 1 to 600000",
        ),
        (
            "new",
            {"targets": T, "waitForCooldownMs": -1},
            "waitForCooldownMs must be an integer from 0 to 600000",
        ),
        (
            "new",
            {"targets": T, "cooldownWaitPolicy": "always"},
            'cooldownWaitPolicy must be "before-last-resort" when set',
        ),
        (
            "new",
            {"targets": T, "defaultEffort": "turbo"},
            "defaultEffort must be one of: low, medium, high, xhigh, max, ultra",
        ),
        (
            "new",
            {"targets": T, "defaultEffortMode": "force"},
            "defaultEffort is required when defaultEffortMode is force",
        ),
        ("new", {"targets": T, "imageInput": "off"}, 'imageInput must be "auto" or "disabled"'),
        ("new", {"targets": T, "afterCommit": "retry"}, validate.MSG_AFTER_COMMIT),
        ("new", {"targets": T, "maxContinuations": 4}, validate.MSG_MAX_CONTINUATIONS),
        ("new", {"targets": T, "bufferMaxBytes": "4096"}, validate.MSG_BUFFER_MAX_BYTES),
        (
            "new",
            {"targets": T, "reasoningEffortMode": "loose"},
            'reasoningEffortMode must be "strict" or "adaptive"',
        ),
        ("new", {"targets": T, "alias": 5}, "alias must be a string"),
        ("new", {"targets": T, "alias": "a/b/c"}, validate.MSG_ALIAS_GRAMMAR),
        ("new", {"targets": T, "alias": "bad alias"}, validate.MSG_ALIAS_GRAMMAR),
        (
            "new",
            {"targets": T, "alias": "combo/x"},
            'alias must not use the reserved "combo/" namespace',
        ),
        (
            "new",
            {"targets": T, "alias": "combo"},
            'alias must not use the reserved "combo/" namespace',
        ),
        (
            "new",
            {"targets": T, "alias": "gpt-fast"},
            "bare aliases in the OpenAI native family require nativeAlias=true",
        ),
        ("new", {"targets": T, "alias": "taken"}, 'alias "taken" is already used by combo "base"'),
        (
            "new",
            {"targets": T, "alias": " taken "},
            'alias "taken" is already used by combo "base"',
        ),
        (
            "new",
            {"targets": T, "alias": "gpt-5.5", "nativeAlias": True},
            "displayName is required for native aliases",
        ),
        (
            "new",
            {"targets": T, "alias": "gpt-future-preview", "nativeAlias": True, "displayName": "X"},
            validate.MSG_NATIVE_UNSUPPORTED,
        ),
        ("new", {"targets": T, "nativeAlias": "yes"}, "nativeAlias must be a boolean"),
        (
            "new",
            {"targets": T, "displayName": "x" * 129},
            "displayName must be at most 128 characters and contain no control characters",
        ),
        ("new", {"targets": T, "bogus": True}, 'unknown field "bogus"'),
        ("new", {"targets": T, "override": "a/m1"}, validate.MSG_OVERRIDE),
    ],
)
def test_put_validation_error(
    seeded: Api, combo_id: str, combo: dict[str, object], message: str
) -> None:
    assert_rejected(seeded, {"id": combo_id, "combo": combo}, 400, message)


def test_first_issue_only(seeded: Api) -> None:
    combo = {"targets": [{"provider": "nope", "model": "m1"}], "stickyLimit": 0, "alias": "taken"}
    assert_rejected(
        seeded, {"id": "new", "combo": combo}, 400, 'targets[0].provider "nope" is not configured'
    )


def test_all_providers_disabled(seeded: Api) -> None:
    provider("off1", disabled=True)
    provider("off2", disabled=True)
    combo = {"targets": [{"provider": "off1", "model": "m"}, {"provider": "off2", "model": "m"}]}
    assert_rejected(
        seeded,
        {"id": "new", "combo": combo},
        400,
        "targets must include at least one enabled provider",
    )
    # One enabled provider is enough.
    combo["targets"].append({"provider": "a", "model": "m"})  # type: ignore[attr-defined]
    seeded.put_ok("new", combo)


def test_replace_with_invalid_keeps_stored(seeded: Api) -> None:
    assert_rejected(
        seeded,
        {"id": "base", "combo": {"targets": T, "stickyLimit": 1000}},
        400,
        "stickyLimit must be an integer from 1 to 100",
    )


def test_oversized_body(seeded: Api) -> None:
    blob = json.dumps(
        {"id": "big", "combo": {"targets": T, "displayName": "x" * (1024 * 1024 + 10)}}
    )
    before = selectors.config_dump()
    r = seeded.put(None, raw=blob)
    assert r.status_code == 413
    assert r.json() == {"error": "request body too large"}
    assert selectors.config_dump() == before


@pytest.mark.parametrize("method", ["post", "patch"])
def test_post_and_patch_not_allowed(seeded: Api, method: str) -> None:
    before = selectors.config_dump()
    v = version()
    body = json.dumps({"id": "viapost", "combo": {"targets": T}})
    r = getattr(seeded.client, method)(
        URL, data=body, content_type="application/json", **seeded.auth
    )
    assert r.status_code == 405
    assert selectors.config_dump() == before
    assert version() == v


# --- §8.3 DELETE ---


@pytest.mark.parametrize("query", ["", "?id=", "?id=%20%20"])
def test_delete_missing_id(seeded: Api, query: str) -> None:
    before = selectors.config_dump()
    r = seeded.delete(query)
    assert r.status_code == 400
    assert r.json() == {"error": "id query param is required"}
    assert selectors.config_dump() == before


@pytest.mark.parametrize("cid", ["missing", "constructor", "toString", "BASE"])
def test_delete_unknown(seeded: Api, cid: str) -> None:
    before = selectors.config_dump()
    v = version()
    r = seeded.delete(f"?id={cid}")
    assert r.status_code == 404
    assert r.json() == {"error": "unknown combo"}
    assert selectors.config_dump() == before
    assert version() == v


def test_delete_success(seeded: Api) -> None:
    v = version()
    r = seeded.delete("?id=base")
    assert r.status_code == 200
    assert r.json()["success"] is True
    assert r.json()["id"] == "base"
    assert selectors.config_dump()["combos"] == {}
    assert version() == v + 1
    assert seeded.delete("?id=base").status_code == 404


# --- auth ---


def test_no_token(settings: Any, client: Client) -> None:
    settings.OCX_ADMIN_TOKEN = TOKEN
    r = client.get(URL)
    assert r.status_code == 401
    assert r.json() == {"error": "unauthorized"}


@pytest.mark.parametrize(
    "header",
    ["Bearer wrong-token-wrong-token", "Bearer ocxm_nope", "Basic " + TOKEN, "Bearer ", TOKEN],
)
def test_wrong_token(settings: Any, client: Client, header: str) -> None:
    settings.OCX_ADMIN_TOKEN = TOKEN
    before = selectors.config_dump()
    r = client.put(
        URL,
        data=json.dumps({"id": "x", "combo": {"targets": T}}),
        content_type="application/json",
        HTTP_AUTHORIZATION=header,
    )
    assert r.status_code == 401
    assert r.json() == {"error": "unauthorized"}
    assert selectors.config_dump() == before


def test_no_bootstrap_token_configured(settings: Any, client: Client) -> None:
    settings.OCX_ADMIN_TOKEN = None
    r = client.get(URL, HTTP_AUTHORIZATION="Bearer None")
    assert r.status_code == 401


def test_management_token(client: Client) -> None:
    get_user_model().objects.create_user("ops", is_staff=True)  # a viewer reads
    _, secret = access.mgmt_token_create(username="ops")
    assert secret.startswith("ocxm_")
    r = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert r.status_code == 200
    assert r.json() == {"combos": []}


def test_revoked_management_token(client: Client) -> None:
    from django.utils import timezone

    token, secret = access.mgmt_token_create(username="ops")
    token.revoked = timezone.now()
    token.save()
    r = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert r.status_code == 401
    assert r.json() == {"error": "unauthorized"}


def test_non_staff_token_owner(client: Client) -> None:
    # A token acts with its user's rights: a member's token is known (not 401) but may not read.
    token, secret = access.mgmt_token_create(username="ops")
    assert not token.user.is_staff  # `ocx token create` changes no role
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 403


def test_inactive_token_owner(client: Client) -> None:
    token, secret = access.mgmt_token_create(username="ops")
    token.user.is_active = False
    token.user.save()
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401


def test_client_key_is_not_a_management_token(client: Client) -> None:
    _, secret = access.client_key_create(username="dev")
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401


def test_staff_session(client: Client) -> None:
    user = get_user_model().objects.create_user(
        "boss", password="pw", is_staff=True, is_superuser=True
    )
    client.force_login(user)
    provider("a")
    assert client.get(URL).status_code == 200
    r = client.put(
        URL,
        data=json.dumps({"id": "s", "combo": {"targets": T}}),
        content_type="application/json",
    )
    assert r.status_code == 200
    assert list(selectors.config_dump()["combos"]) == ["s"]


def test_non_staff_session(client: Client) -> None:
    user = get_user_model().objects.create_user("dev", password="pw")
    client.force_login(user)
    provider("a")
    before = selectors.config_dump()
    assert client.get(URL).status_code == 403
    r = client.put(
        URL,
        data=json.dumps({"id": "s", "combo": {"targets": T}}),
        content_type="application/json",
    )
    assert r.status_code == 403
    assert r.json() == {
        "error": "forbidden: the member role has no management API access (the portal is /me/)"
    }
    assert selectors.config_dump() == before


# --- more edge cases ---


def test_rename_same_id_checked_before_source_exists(api: Api) -> None:
    body = {"id": "ghost", "combo": {"targets": T}, "renameFrom": " ghost "}
    assert_rejected(api, body, 400, "renameFrom must differ from id")


@pytest.mark.parametrize(
    "raw",
    [
        '{"id": "x", "combo": NaN}',
        '{"id": "x", "combo": {"targets": [{"provider": "a", "model": "m1"}], "stickyLimit": NaN}}',
        '{"id": "x", "combo": {"targets": [{"provider": "a", "model": "m1", "weight": Infinity}]}}',
        '{"id": "x", "combo": {"targets": [], "cooldownMs": -Infinity}}',
    ],
)
def test_non_standard_json_constants_are_invalid_json(seeded: Api, raw: str) -> None:
    # JSON has no NaN/Infinity literals (the reference's JSON.parse rejects them).
    assert_rejected(seeded, None, 400, "invalid JSON body", raw=raw)


def test_body_just_under_the_limit_is_validated_not_refused(seeded: Api) -> None:
    blob = json.dumps({"id": "big", "combo": {"targets": T, "displayName": "x" * (900 * 1024)}})
    assert_rejected(
        seeded,
        None,
        400,
        "displayName must be at most 128 characters and contain no control characters",
        raw=blob,
    )


def test_put_warns_about_a_target_model_its_provider_does_not_declare(api: Api) -> None:
    # Issue 28 item 6: saved (a gateway may serve more than it declares), and said.
    provider_services.provider_set(
        name="gw",
        raw={
            "adapter": "openai-chat",
            "baseUrl": "http://127.0.0.1:9/v1",
            "models": {"m-large": {"contextWindow": 100000}},
        },
    )
    body = {"id": "team", "combo": {"targets": [{"provider": "gw", "model": "m-lrage"}]}}
    r = api.put(body)
    assert r.status_code == 200
    assert r.json()["warnings"] == [
        'Target gw/m-lrage: provider "gw" does not declare model "m-lrage" (declared: m-large); '
        "it is sent upstream as typed, and the combo is left out of the Codex catalog until the "
        "model is declared."
    ]
    body["combo"]["targets"][0]["model"] = "m-large"  # type: ignore[index]
    assert api.put(body).json()["warnings"] == []
