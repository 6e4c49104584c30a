from __future__ import annotations

import ast
import math
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import validate as v
from routing.types import ComboSpec, ConfigSnapshot, ProviderSpec, TargetSpec
from routing.validate import (
    Issue,
    ProviderInfo,
    combo_to_api,
    combo_to_sparse,
    config_to_sparse,
    merge_preserving,
    normalize_combo,
    normalize_config,
    normalize_provider,
    provider_to_sparse,
    resolve_model,
    validate_combo,
    validate_combo_id,
    validate_config,
    validate_provider,
)

PROVIDERS = {
    "a": ProviderInfo("a"),
    "b": ProviderInfo("b"),
    "off": ProviderInfo("off", disabled=True),
    "off2": ProviderInfo("off2", disabled=True),
}


def check(
    raw: object,
    *,
    combo_id: str = "main",
    providers: dict[str, ProviderInfo] | None = None,
    combos: dict[str, object] | None = None,
    exclude: str | None = None,
    require_enabled: bool = False,
) -> list[Issue]:
    return validate_combo(
        combo_id,
        raw,
        providers=PROVIDERS if providers is None else providers,
        combos=combos or {},
        exclude_combo_id=exclude,
        require_enabled_target=require_enabled,
    )


def body(**fields: Any) -> dict[str, Any]:
    return {"targets": [{"provider": "a", "model": "m1"}], **fields}


def test_module_imports_no_framework() -> None:
    for module in (v.__file__, Path(v.__file__).parents[1] / "combos" / "cli_parse.py"):
        tree = ast.parse(Path(str(module)).read_text())
        names = [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        ] + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in {"django", "ninja", "channels"}]


# --- combo id ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "combo_id", ["a", "0", "main", "A.b_c-d", "x" * 64, "constructor", "toString", "9lives"]
)
def test_valid_combo_ids(combo_id: str) -> None:
    assert validate_combo_id(combo_id) is None


@pytest.mark.parametrize(
    "combo_id",
    ["", "-bad", ".bad", "_bad", "combo/ free ", " a", "a b", "a/b", "x" * 65, "é", "a\n", None],
)
def test_invalid_combo_ids(combo_id: Any) -> None:
    assert validate_combo_id(combo_id) == v.MSG_COMBO_ID
    assert v.MSG_COMBO_ID == (
        "combo id must start with a letter/number and use letters, numbers, dot, underscore, "
        "or hyphen (max 64)"
    )


def test_invalid_id_reported_with_empty_path() -> None:
    assert check(body(), combo_id="-bad") == [Issue((), v.MSG_COMBO_ID)]


def test_namespace_collisions() -> None:
    providers = {**PROVIDERS, "main": ProviderInfo("main"), "combo": ProviderInfo("combo")}
    assert [i.message for i in check(body(), providers=providers)] == [
        'provider name "combo" collides with the reserved "combo/" namespace while combos are '
        "configured",
        'combo id "main" collides with configured provider name "main"',
    ]


# --- the §1.3 table, row by row -----------------------------------------------------------------

FIELD_CASES: list[tuple[str, list[Any], list[Any], str]] = [
    (
        "strategy",
        ["failover", "round-robin", "random", "least-used", "reset-window"],
        ["jev", "Failover", "", None, 1],
        'strategy must be "failover", "round-robin", "random", "least-used", or "reset-window"',
    ),
    (
        "stickyLimit",
        [1, 100, 50, 7.0],
        [0, 1.5, 101, math.nan, math.inf, -1, "5", None, True],
        "stickyLimit must be an integer from 1 to 100",
    ),
    (
        "cooldownMs",
        [1, 60000, 600000],
        [0, 1.5, 600001, -1, "5000", None, False, math.inf],
        "cooldownMs must be an integer from 1 to 600000",
    ),
    (
        "waitForCooldownMs",
        [0, 1, 600000],
        [1.5, 600001, -1, "5000", None, math.nan],
        "waitForCooldownMs must be an integer from 0 to 600000",
    ),
    (
        "cooldownWaitPolicy",
        [None, "before-last-resort"],
        ["always", "", "Before-Last-Resort", 1],
        'cooldownWaitPolicy must be "before-last-resort" when set',
    ),
    (
        "defaultEffort",
        [None, "low", "medium", "high", "xhigh", "max", "ultra"],
        ["turbo", "", "HIGH", "none", 3],
        "defaultEffort must be one of: low, medium, high, xhigh, max, ultra",
    ),
    (
        "defaultEffortMode",
        ["fallback"],
        ["Force", "strict", None, ""],
        'defaultEffortMode must be "fallback" or "force"',
    ),
    (
        "reasoningEffortMode",
        ["strict", "adaptive"],
        ["lenient", None, ""],
        'reasoningEffortMode must be "strict" or "adaptive"',
    ),
    (
        "imageInput",
        ["auto", "disabled"],
        ["off", None, False],
        'imageInput must be "auto" or "disabled"',
    ),
    (
        "alias",
        [None, "", "  ", "daily-fast", "team/daily-fast"],
        [1, [], {}],
        "alias must be a string",
    ),
    ("nativeAlias", [False], ["true", 1, None, 0], "nativeAlias must be a boolean"),
    ("displayName", [None, "", "Label", "x" * 128], [1, ["x"]], "displayName must be a string"),
]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [(f, val, msg) for f, _ok, bad, msg in FIELD_CASES for val in bad],
)
def test_field_rejections(field: str, value: Any, message: str) -> None:
    assert check(body(**{field: value})) == [Issue((field,), message)]


@pytest.mark.parametrize(
    ("field", "value"), [(f, val) for f, ok, _bad, _msg in FIELD_CASES for val in ok]
)
def test_field_acceptances(field: str, value: Any) -> None:
    assert check(body(**{field: value})) == []


def test_force_requires_effort() -> None:
    assert check(body(defaultEffortMode="force")) == [
        Issue(("defaultEffort",), "defaultEffort is required when defaultEffortMode is force")
    ]
    assert check(body(defaultEffortMode="force", defaultEffort="turbo")) == [
        Issue(("defaultEffort",), v.MSG_EFFORT),
        Issue(("defaultEffort",), v.MSG_EFFORT_REQUIRED),
    ]
    assert check(body(defaultEffortMode="force", defaultEffort="high")) == []


@pytest.mark.parametrize("value", ["x" * 129, "a\x00b", "a\x1fb", "bad\x7f!", "mid\nline"])
def test_display_name_bounds(value: str) -> None:
    assert check(body(displayName=value)) == [
        Issue(
            ("displayName",),
            "displayName must be at most 128 characters and contain no control characters",
        )
    ]


def test_display_name_is_trimmed_before_bounds() -> None:
    assert check(body(displayName="  " + "x" * 128 + "\n")) == []


@pytest.mark.parametrize("raw", [None, [], "x", 3, True])
def test_non_object_body_stops(raw: object) -> None:
    assert check(raw) == [Issue((), "combo must be an object")]


@pytest.mark.parametrize("targets", [None, [], {}, "a/m", 0])
def test_targets_must_be_non_empty_array_and_stops(targets: object) -> None:
    raw = {"targets": targets, "strategy": "bogus", "stickyLimit": 0}
    assert check(raw) == [Issue(("targets",), "targets must be a non-empty array")]
    assert check({"strategy": "bogus"}) == [Issue(("targets",), v.MSG_TARGETS)]


# --- targets (§1.4) -------------------------------------------------------------------------------


def test_target_rules_with_paths_and_order() -> None:
    raw = {
        "targets": [
            None,
            {"provider": "  ", "model": "m"},
            {"provider": "ghost", "model": ""},
            {"provider": "a", "model": "m", "weight": 0, "lastResort": "yes"},
            {"provider": "a", "model": "qwen/qwen3-coder-plus", "weight": 10000},
            {"provider": "b", "model": "m", "weight": 10001, "lastResort": 1, "extra": 1},
        ]
    }
    assert check(raw) == [
        Issue(("targets", 0), "targets[0] must be an object"),
        Issue(("targets", 1, "provider"), "targets[1].provider is required"),
        Issue(("targets", 2, "provider"), 'targets[2].provider "ghost" is not configured'),
        Issue(("targets", 2, "model"), "targets[2].model is required"),
        Issue(("targets", 3, "weight"), "targets[3].weight must be an integer from 1 to 10000"),
        Issue(("targets", 3, "lastResort"), "targets[3].lastResort must be a boolean"),
        Issue(("targets", 5, "weight"), "targets[5].weight must be an integer from 1 to 10000"),
        Issue(("targets", 5, "lastResort"), "targets[5].lastResort must be a boolean"),
        Issue(("targets", 5, "extra"), 'unknown field "extra"'),
    ]


@pytest.mark.parametrize("weight", [0, 10001, 1.5, "2", None, True, math.nan])
def test_target_weight_rejections(weight: object) -> None:
    raw = {"targets": [{"provider": "a", "model": "m", "weight": weight}]}
    assert [i.message for i in check(raw)] == [
        "targets[0].weight must be an integer from 1 to 10000"
    ]


def test_duplicate_targets_after_trimming() -> None:
    raw = {"targets": [{"provider": " a ", "model": " m1 "}, {"provider": "a", "model": "m1"}]}
    assert check(raw) == [Issue(("targets", 1), 'duplicate combo target "a/m1"')]
    # Same model on another provider is fine.
    assert (
        check({"targets": [{"provider": "a", "model": "m"}, {"provider": "b", "model": "m"}]}) == []
    )


def test_require_enabled_target() -> None:
    all_off = {"targets": [{"provider": "off", "model": "m"}, {"provider": "off2", "model": "m"}]}
    assert check(all_off) == []
    assert check(all_off, require_enabled=True) == [
        Issue(("targets",), "targets must include at least one enabled provider")
    ]
    one_on = {"targets": [{"provider": "off", "model": "m"}, {"provider": "a", "model": "m"}]}
    assert check(one_on, require_enabled=True) == []
    # An unconfigured provider is its own error, not "all disabled".
    with_ghost = {"targets": [{"provider": "off", "model": "m"}, {"provider": "zz", "model": "m"}]}
    assert [i.message for i in check(with_ghost, require_enabled=True)] == [
        'targets[1].provider "zz" is not configured'
    ]


def test_unknown_fields_reported_last_and_jev_fields_unknown() -> None:
    raw = body(stickylimit=3, decisionProvider="x", strategy="nope")
    assert check(raw) == [
        Issue(("strategy",), v.MSG_STRATEGY),
        Issue(("stickylimit",), 'unknown field "stickylimit"'),
        Issue(("decisionProvider",), 'unknown field "decisionProvider"'),
    ]


def test_get_shape_echo_fields_accepted() -> None:
    spec = normalize_combo("main", body(alias="team/x"))
    assert check(combo_to_api(spec)) == []


# --- aliases (§6.1, §1.5) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        ("a/b/c", v.MSG_ALIAS_GRAMMAR),
        ("team/", v.MSG_ALIAS_GRAMMAR),
        ("/x", v.MSG_ALIAS_GRAMMAR),
        ("-x", v.MSG_ALIAS_GRAMMAR),
        ("team/-x", v.MSG_ALIAS_GRAMMAR),
        ("has space", v.MSG_ALIAS_GRAMMAR),
        ("x" * 65, v.MSG_ALIAS_GRAMMAR),
        ("combo", v.MSG_ALIAS_RESERVED),
        ("combo/other", v.MSG_ALIAS_RESERVED),
        ("gpt-5.6-sol", v.MSG_ALIAS_NATIVE_FAMILY),
        ("o1-mini", v.MSG_ALIAS_NATIVE_FAMILY),
        ("o3-pro", v.MSG_ALIAS_NATIVE_FAMILY),
        ("o4-mini", v.MSG_ALIAS_NATIVE_FAMILY),
        ("codex-mini", v.MSG_ALIAS_NATIVE_FAMILY),
    ],
)
def test_alias_grammar(alias: str, message: str) -> None:
    assert check(body(alias=alias)) == [Issue(("alias",), message)]


def test_alias_messages_are_exact() -> None:
    assert v.MSG_ALIAS_GRAMMAR == (
        'alias must use letters, numbers, dot, underscore, or hyphen, with at most one "/" segment'
    )
    assert v.MSG_ALIAS_RESERVED == 'alias must not use the reserved "combo/" namespace'
    assert v.MSG_ALIAS_NATIVE_FAMILY == (
        "bare aliases in the OpenAI native family require nativeAlias=true"
    )


@pytest.mark.parametrize(
    "alias", ["team/gpt-5.5", "x" * 64 + "/" + "y" * 64, " daily-fast ", "gpt5"]
)
def test_alias_accepted(alias: str) -> None:
    assert check(body(alias=alias)) == []


def test_alias_uniqueness_against_combos() -> None:
    combos: dict[str, object] = {
        "main": {"alias": "fast"},  # itself: excluded
        "old": {"alias": "fast"},
        "other": normalize_combo("other", body(alias="team/x")),
    }
    assert check(body(alias=" fast "), combos=combos) == [
        Issue(("alias",), 'alias "fast" is already used by combo "old"')
    ]
    assert check(body(alias="fast"), combos=combos, exclude="old") == []
    assert check(body(alias="team/x"), combos=combos) == [
        Issue(("alias",), 'alias "team/x" is already used by combo "other"')
    ]
    # Case-sensitive among combos.
    assert check(body(alias="Fast"), combos=combos, exclude="old") == []


def test_alias_uniqueness_against_provider_aliases() -> None:
    providers = {
        **PROVIDERS,
        "p": ProviderInfo("p", alias="Team/Fast", model_aliases=(("m9", "quick"),)),
    }
    assert check(body(alias="team/fast"), providers=providers) == [
        Issue(("alias",), 'alias "team/fast" is already used by provider "p"')
    ]
    assert check(body(alias="QUICK"), providers=providers) == [
        Issue(("alias",), 'alias "QUICK" is already used by model "p/m9"')
    ]


def test_native_alias_rules() -> None:
    ok = body(alias="gpt-5.6-sol", nativeAlias=True, displayName="Nova1 - codex-gpt-5.6-sol")
    assert check(ok) == []
    for slug in ("gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.5"):
        assert slug in v.NATIVE_ALIAS_SLUGS
    assert check({**ok, "alias": "gpt-future-preview"}) == [
        Issue(
            ("nativeAlias",),
            "nativeAlias requires a currently supported bare OpenAI-native model alias",
        )
    ]
    assert check({**ok, "alias": "team/gpt-5.5"}) == [
        Issue(("nativeAlias",), v.MSG_NATIVE_UNSUPPORTED)
    ]
    assert check({**ok, "alias": None}) == [Issue(("nativeAlias",), v.MSG_NATIVE_UNSUPPORTED)]
    assert check({**ok, "displayName": "  "}) == [
        Issue(("displayName",), "displayName is required for native aliases")
    ]
    no_display = dict(ok)
    del no_display["displayName"]
    assert check(no_display) == [Issue(("displayName",), v.MSG_DISPLAY_REQUIRED)]
    # nativeAlias false with a native slug: the family rule fires.
    assert check({**ok, "nativeAlias": False}) == [Issue(("alias",), v.MSG_ALIAS_NATIVE_FAMILY)]


# --- override (ocx) ---


def test_override_rules() -> None:
    assert check(body(override=None)) == []
    assert check(body(override={"target": " a/m1 "})) == []
    assert check(body(override={"target": "b/m1"})) == [
        Issue(("override", "target"), 'override target "b/m1" is not one of this combo\'s targets')
    ]
    assert check(body(override="a/m1")) == [Issue(("override",), v.MSG_OVERRIDE)]
    assert check(body(override={"target": "a/m1", "x": 1})) == [
        Issue(("override", "x"), 'unknown field "x"')
    ]


# --- normalization (§1.6) ---


def test_pinned_normalized_output() -> None:
    raw = {"targets": [{"provider": "a", "model": "m1", "weight": 2}], "defaultEffort": "high"}
    spec = normalize_combo("main", raw)
    assert spec == ComboSpec(
        id="main",
        targets=(TargetSpec("a", "m1", weight=2, last_resort=False),),
        strategy="failover",
        sticky_limit=1,
        cooldown_ms=None,
        wait_for_cooldown_ms=0,
        cooldown_wait_policy=None,
        default_effort="high",
        default_effort_mode="fallback",
        reasoning_effort_mode="strict",
        image_input="auto",
        alias=None,
        native_alias=False,
        display_name=None,
    )
    assert combo_to_api(spec) == {
        "id": "main",
        "model": "combo/main",
        "strategy": "failover",
        "stickyLimit": 1,
        "defaultEffort": "high",
        "alias": None,
        "nativeAlias": False,
        "displayName": None,
        "override": None,
        "targets": [{"provider": "a", "model": "m1", "weight": 2, "lastResort": False}],
    }


def test_normalization_of_corrupt_values() -> None:
    raw = {
        "targets": [
            {"provider": " a ", "model": " m1 ", "lastResort": "yes"},
            {"provider": "b", "model": "m2", "lastResort": 1, "weight": 0},
            {"provider": "b", "model": "m3", "lastResort": True, "weight": 5.0},
            None,
        ],
        "strategy": "jev",
        "stickyLimit": 500,
        "cooldownWaitPolicy": "always",
        "defaultEffort": "turbo",
        "defaultEffortMode": "force",
        "reasoningEffortMode": "garbage",
        "imageInput": "DISABLED",
        "alias": "   ",
        "nativeAlias": "true",
        "displayName": "  Label  ",
        "override": {"target": "zz/m"},
    }
    spec = normalize_combo("c", raw)
    assert spec.targets == (
        TargetSpec("a", "m1", 1, False),
        TargetSpec("b", "m2", 1, False),
        TargetSpec("b", "m3", 5, True),
    )
    assert (spec.strategy, spec.sticky_limit, spec.cooldown_wait_policy) == ("failover", 1, None)
    assert (spec.default_effort, spec.default_effort_mode) == (None, "fallback")
    assert (spec.reasoning_effort_mode, spec.image_input) == ("strict", "auto")
    assert (spec.alias, spec.native_alias, spec.display_name) == (None, False, "Label")
    assert spec.override is None


def test_normalization_of_set_values() -> None:
    raw = body(
        strategy="round-robin",
        stickyLimit=3,
        cooldownMs=60000,
        waitForCooldownMs=250,
        cooldownWaitPolicy="before-last-resort",
        defaultEffort="max",
        defaultEffortMode="force",
        reasoningEffortMode="adaptive",
        imageInput="disabled",
        alias=" team/x ",
        override={"target": "a/m1"},
    )
    spec = normalize_combo("c", raw)
    assert spec.public_id == "team/x"
    assert combo_to_sparse(spec) == {
        "strategy": "round-robin",
        "stickyLimit": 3,
        "cooldownMs": 60000,
        "waitForCooldownMs": 250,
        "cooldownWaitPolicy": "before-last-resort",
        "defaultEffort": "max",
        "defaultEffortMode": "force",
        "reasoningEffortMode": "adaptive",
        "imageInput": "disabled",
        "alias": "team/x",
        "override": {"target": "a/m1"},
        "targets": [{"provider": "a", "model": "m1", "weight": 1}],
    }


# --- sparse output (§8.1, §8.2) -------------------------------------------------------------------


def test_sparse_create_example() -> None:
    spec = normalize_combo("zeta", {"targets": [{"provider": " a ", "model": " m1 "}]})
    assert combo_to_sparse(spec) == {
        "strategy": "failover",
        "stickyLimit": 1,
        "defaultEffort": None,
        "targets": [{"provider": "a", "model": "m1", "weight": 1}],
    }
    assert spec.public_id == "combo/zeta"


def test_sparse_last_resort_and_native() -> None:
    raw = {
        "targets": [
            {"provider": "a", "model": "m1"},
            {"provider": "b", "model": "m2", "lastResort": True},
        ],
        "alias": "gpt-5.5",
        "nativeAlias": True,
        "displayName": "X",
        "waitForCooldownMs": 0,
        "defaultEffortMode": "fallback",
    }
    sparse = combo_to_sparse(normalize_combo("c", raw))
    assert sparse["targets"] == [
        {"provider": "a", "model": "m1", "weight": 1},
        {"provider": "b", "model": "m2", "weight": 1, "lastResort": True},
    ]
    assert (sparse["alias"], sparse["nativeAlias"], sparse["displayName"]) == ("gpt-5.5", True, "X")
    for absent in (
        "waitForCooldownMs",
        "defaultEffortMode",
        "cooldownMs",
        "imageInput",
        "override",
    ):
        assert absent not in sparse
    api = combo_to_api(normalize_combo("c", raw))
    assert api["model"] == "gpt-5.5"
    targets: Any = api["targets"]
    assert [t["lastResort"] for t in targets] == [False, True]


def test_sparse_is_normalization_fixed_point() -> None:
    raw = body(strategy="random", cooldownMs=1, imageInput="disabled", displayName=" d ")
    spec = normalize_combo("c", raw)
    assert normalize_combo("c", combo_to_sparse(spec)) == spec
    assert normalize_combo("c", combo_to_api(spec)) == spec


# --- preserve on omit (§8.2 step 6) ---------------------------------------------------------------


def test_merge_preserves_omitted_fields() -> None:
    stored = {
        "strategy": "failover",
        "stickyLimit": 1,
        "cooldownMs": 60000,
        "waitForCooldownMs": 500,
        "defaultEffort": "high",
        "defaultEffortMode": "force",
        "reasoningEffortMode": "adaptive",
        "imageInput": "disabled",
        "cooldownWaitPolicy": "before-last-resort",
        "alias": "old-alias",
        "override": {"target": "a/m1"},
        "targets": [
            {"provider": "a", "model": "m1", "weight": 1},
            {"provider": "b", "model": "m2", "weight": 1, "lastResort": True},
        ],
    }
    incoming = {
        "defaultEffort": "low",
        "targets": [{"provider": " b ", "model": "m2"}, {"provider": "a", "model": "m1"}],
    }
    merged = merge_preserving(stored, incoming)
    assert merged == {
        "defaultEffort": "low",
        "cooldownMs": 60000,
        "waitForCooldownMs": 500,
        "defaultEffortMode": "force",
        "reasoningEffortMode": "adaptive",
        "imageInput": "disabled",
        "cooldownWaitPolicy": "before-last-resort",
        "override": {"target": "a/m1"},
        "targets": [
            {"provider": " b ", "model": "m2", "lastResort": True},
            {"provider": "a", "model": "m1"},
        ],
    }
    assert "alias" not in merged  # alias is not preserved: omission clears it
    assert incoming["targets"][0] == {"provider": " b ", "model": "m2"}  # not mutated


def test_merge_explicit_values_replace() -> None:
    stored = {
        "waitForCooldownMs": 500,
        "imageInput": "disabled",
        "targets": [{"provider": "a", "model": "m1", "lastResort": True}],
    }
    incoming = {
        "waitForCooldownMs": 0,
        "imageInput": "auto",
        "targets": [{"provider": "a", "model": "m1", "lastResort": False}],
    }
    merged = merge_preserving(stored, incoming)
    assert merged == incoming
    assert "waitForCooldownMs" not in combo_to_sparse(normalize_combo("c", merged))
    assert merge_preserving(None, incoming) == incoming


def test_merge_drops_force_without_effort_and_stale_override() -> None:
    stored = {
        "defaultEffort": "high",
        "defaultEffortMode": "force",
        "override": {"target": "a/m1"},
        "targets": [{"provider": "a", "model": "m1"}],
    }
    merged = merge_preserving(
        stored, {"defaultEffort": None, "targets": [{"provider": "b", "model": "x"}]}
    )
    assert merged == {"defaultEffort": None, "targets": [{"provider": "b", "model": "x"}]}
    assert check(merged) == []


# --- providers ------------------------------------------------------------------------------------

GOOD_PROVIDER: dict[str, Any] = {
    "adapter": "openai-chat",
    "baseUrl": "https://api.example.com/v1/",
    "apiKeyEnv": "EXAMPLE_API_KEY",
    "headers": {"X-Team": "core"},
    "disabled": False,
    "timeouts": {"connectMs": 1000, "idleMs": 60000},
    "models": {
        "qwen3:4b": {
            "contextWindow": 128000,
            "maxInputTokens": 100000,
            "inputModalities": ["text"],
            "reasoningEfforts": [],
            "displayName": "Qwen",
            "parallelToolCalls": True,
        },
        "vendor/model-x": {
            "reasoningEfforts": ["low", "high"],
            "inputModalities": ["text", "image"],
        },
        "bare": {},
    },
}


def test_good_provider() -> None:
    assert validate_provider("openai", GOOD_PROVIDER, combo_ids=["main"]) == []


@pytest.mark.parametrize(
    ("patch", "path", "message"),
    [
        ({"adapter": "google"}, ("adapter",), v.MSG_ADAPTER),
        ({"adapter": None}, ("adapter",), v.MSG_ADAPTER),
        ({"baseUrl": "ftp://x"}, ("baseUrl",), "baseUrl must be an http(s) URL"),
        ({"baseUrl": "https://"}, ("baseUrl",), v.MSG_BASE_URL),
        ({"baseUrl": "http://h:99999"}, ("baseUrl",), v.MSG_BASE_URL),
        ({"baseUrl": " https://h"}, ("baseUrl",), v.MSG_BASE_URL),
        ({"baseUrl": "https://h/a b"}, ("baseUrl",), v.MSG_BASE_URL),
        ({"apiKeyEnv": "1BAD"}, ("apiKeyEnv",), v.MSG_API_KEY_ENV),
        ({"apiKeyEnv": "A-B"}, ("apiKeyEnv",), v.MSG_API_KEY_ENV),
        ({"apiKeyEnv": ""}, ("apiKeyEnv",), v.MSG_API_KEY_ENV),
        ({"apiKey": ""}, ("apiKey",), v.MSG_API_KEY),
        ({"apiKey": "sk\nx"}, ("apiKey",), v.MSG_API_KEY),
        ({"headers": []}, ("headers",), v.MSG_HEADERS),
        ({"headers": {"X-A": 1}}, ("headers", "X-A"), v.msg_header_value("X-A")),
        ({"headers": {"X-A": "a\r\nX-Evil: 1"}}, ("headers", "X-A"), v.msg_header_value("X-A")),
        ({"headers": {"Bad Name": "v"}}, ("headers", "Bad Name"), v.msg_header_name("Bad Name")),
        (
            {"headers": {"Authorization": "x"}},
            ("headers", "Authorization"),
            v.msg_header_forbidden("Authorization"),
        ),
        (
            {"headers": {"x-api-key": "x"}},
            ("headers", "x-api-key"),
            v.msg_header_forbidden("x-api-key"),
        ),
        ({"headers": {"X-A": "1", "x-a": "2"}}, ("headers", "x-a"), v.msg_header_duplicate("x-a")),
        ({"disabled": "no"}, ("disabled",), "disabled must be a boolean"),
        ({"timeouts": 5}, ("timeouts",), v.MSG_TIMEOUTS),
        (
            {"timeouts": {"connectMs": 0}},
            ("timeouts", "connectMs"),
            "timeouts.connectMs must be a positive integer",
        ),
        ({"timeouts": {"totalMs": 1.5}}, ("timeouts", "totalMs"), v.msg_timeout("totalMs")),
        ({"timeouts": {"readMs": 5}}, ("timeouts", "readMs"), 'unknown field "readMs"'),
        ({"maxConnections": 0}, ("maxConnections",), v.MSG_MAX_CONNECTIONS),
        ({"maxConnections": "64"}, ("maxConnections",), v.MSG_MAX_CONNECTIONS),
        ({"maxConnections": 2.5}, ("maxConnections",), v.MSG_MAX_CONNECTIONS),
        ({"maxConnections": True}, ("maxConnections",), v.MSG_MAX_CONNECTIONS),
        ({"maxConnections": 1_000_001}, ("maxConnections",), v.MSG_MAX_CONNECTIONS),
        ({"models": []}, ("models",), v.MSG_MODELS),
        ({"models": {"a b": {}}}, ("models", "a b"), v.MSG_MODEL_ID),
        ({"models": {"m": None}}, ("models", "m"), v.msg_model_object("m")),
        (
            {"models": {"m": {"contextWindow": 0}}},
            ("models", "m", "contextWindow"),
            v.msg_model_positive("m", "contextWindow"),
        ),
        (
            {"models": {"m": {"maxInputTokens": "9"}}},
            ("models", "m", "maxInputTokens"),
            v.msg_model_positive("m", "maxInputTokens"),
        ),
        (
            {"models": {"m": {"contextWindow": 10, "maxInputTokens": 11}}},
            ("models", "m", "maxInputTokens"),
            v.msg_model_input_exceeds("m"),
        ),
        (
            {"models": {"m": {"inputModalities": []}}},
            ("models", "m", "inputModalities"),
            v.msg_model_modalities("m"),
        ),
        (
            {"models": {"m": {"inputModalities": ["audio"]}}},
            ("models", "m", "inputModalities"),
            v.msg_model_modalities("m"),
        ),
        (
            {"models": {"m": {"inputModalities": ["text", "text"]}}},
            ("models", "m", "inputModalities"),
            v.msg_model_modalities("m"),
        ),
        (
            {"models": {"m": {"reasoningEfforts": ["turbo"]}}},
            ("models", "m", "reasoningEfforts"),
            v.msg_model_efforts("m"),
        ),
        (
            {"models": {"m": {"reasoningEfforts": ["low", "low"]}}},
            ("models", "m", "reasoningEfforts"),
            v.msg_model_efforts("m"),
        ),
        (
            {"models": {"m": {"reasoningEfforts": "low"}}},
            ("models", "m", "reasoningEfforts"),
            v.msg_model_efforts("m"),
        ),
        (
            {"models": {"m": {"displayName": 5}}},
            ("models", "m", "displayName"),
            v.msg_model_display("m"),
        ),
        (
            {"models": {"m": {"parallelToolCalls": "yes"}}},
            ("models", "m", "parallelToolCalls"),
            v.msg_model_parallel("m"),
        ),
        ({"models": {"m": {"context": 5}}}, ("models", "m", "context"), 'unknown field "context"'),
        ({"apikey": "x"}, ("apikey",), 'unknown field "apikey"'),
    ],
)
def test_provider_rejections(patch: dict[str, Any], path: tuple[Any, ...], message: str) -> None:
    assert validate_provider("p", {**GOOD_PROVIDER, **patch}, combo_ids=[]) == [
        Issue(path, message)
    ]


def test_provider_required_fields_and_names() -> None:
    assert validate_provider("p", {}, combo_ids=[]) == [
        Issue(("adapter",), v.MSG_ADAPTER),
        Issue(("baseUrl",), v.MSG_BASE_URL),
    ]
    assert validate_provider("p", None, combo_ids=[]) == [Issue((), "provider must be an object")]
    good = {"adapter": "anthropic", "baseUrl": "http://localhost:8790"}
    assert validate_provider("-x", good, combo_ids=[]) == [Issue((), v.MSG_PROVIDER_NAME)]
    assert validate_provider("combo", good, combo_ids=[]) == []
    assert validate_provider("combo", good, combo_ids=["main"]) == [
        Issue((), v.MSG_PROVIDER_COMBO_RESERVED)
    ]
    assert validate_provider("main", good, combo_ids=["main"]) == [
        Issue((), 'combo id "main" collides with configured provider name "main"')
    ]


def test_provider_normalize_and_sparse() -> None:
    spec = normalize_provider("openai", GOOD_PROVIDER, api_key="sk-secret")
    assert spec.base_url == "https://api.example.com/v1"
    assert spec.api_key == "sk-secret"
    assert "sk-secret" not in repr(spec)
    assert spec.timeouts.connect_ms == 1000 and spec.timeouts.first_byte_ms == 20000
    assert spec.models["qwen3:4b"].reasoning_efforts == ()
    assert spec.models["bare"].reasoning_efforts is None
    assert spec.models["vendor/model-x"].input_modalities == ("text", "image")
    sparse = provider_to_sparse(spec)
    assert sparse == {
        "adapter": "openai-chat",
        "baseUrl": "https://api.example.com/v1",
        "apiKeyEnv": "EXAMPLE_API_KEY",
        "headers": {"X-Team": "core"},
        "timeouts": {"connectMs": 1000},
        "models": {
            "qwen3:4b": {
                "contextWindow": 128000,
                "maxInputTokens": 100000,
                "inputModalities": ["text"],
                "reasoningEfforts": [],
                "displayName": "Qwen",
                "parallelToolCalls": True,
            },
            "vendor/model-x": {
                "inputModalities": ["text", "image"],
                "reasoningEfforts": ["low", "high"],
            },
            "bare": {},
        },
    }
    assert "sk-secret" not in str(sparse)
    with_body_key = normalize_provider("p", {**GOOD_PROVIDER, "apiKey": "sk-body"})
    assert with_body_key.api_key == "sk-body"
    assert "apiKey" not in provider_to_sparse(with_body_key)
    assert normalize_provider("p", provider_to_sparse(spec)) == normalize_provider(
        "p", GOOD_PROVIDER
    )


# --- whole config ---------------------------------------------------------------------------------

RICH_CONFIG: dict[str, Any] = {
    "providers": {
        "openai": GOOD_PROVIDER,
        "anthropic": {
            "adapter": "anthropic",
            "baseUrl": "https://api.anthropic.com",
            "apiKey": "sk-ant-secret",
            "disabled": True,
            "timeouts": {"firstByteMs": 30000, "totalMs": 900000},
        },
        "chatgpt": {"adapter": "chatgpt", "baseUrl": "https://chatgpt.com/backend-api/codex"},
    },
    "combos": {
        "main": {
            "targets": [
                {"provider": "anthropic", "model": "claude-opus-4-8", "weight": 2},
                {"provider": "openai", "model": "qwen3:4b", "lastResort": True},
            ],
            "strategy": "round-robin",
            "stickyLimit": 2,
            "defaultEffort": "high",
            "alias": "team/balanced",
            "cooldownWaitPolicy": "before-last-resort",
            "waitForCooldownMs": 0,
        },
        "nova": {
            "targets": [{"provider": "chatgpt", "model": "gpt-5.6-sol"}],
            "alias": "gpt-5.6-sol",
            "nativeAlias": True,
            "displayName": "Nova",
            "override": {"target": "chatgpt/gpt-5.6-sol"},
        },
        "all-off": {"targets": [{"provider": "anthropic", "model": "x"}]},
    },
    "disabledModels": ["combo/all-off", "openai/bare"],
}


def test_rich_config_valid_and_load_dump_load_fixed_point() -> None:
    assert validate_config(RICH_CONFIG) == []
    first = normalize_config(RICH_CONFIG, api_keys={"openai": "sk-x"})
    assert first.providers["anthropic"].api_key == "sk-ant-secret"
    dumped = config_to_sparse(first)
    assert "secret" not in str(dumped) and "sk-x" not in str(dumped)
    assert list(dumped["combos"]) == ["all-off", "main", "nova"]  # type: ignore[call-overload]
    assert validate_config(dumped) == []
    second = normalize_config(dumped)
    assert config_to_sparse(second) == dumped
    assert second.combos == first.combos
    assert second.disabled_models == first.disabled_models
    # Only the secrets differ.
    for name, spec in first.providers.items():
        assert second.providers[name] == ProviderSpec(**{**spec.__dict__, "api_key": None})
    assert dumped["combos"]["main"] == {  # type: ignore[index]
        "strategy": "round-robin",
        "stickyLimit": 2,
        "cooldownWaitPolicy": "before-last-resort",
        "defaultEffort": "high",
        "alias": "team/balanced",
        "targets": [
            {"provider": "anthropic", "model": "claude-opus-4-8", "weight": 2},
            {"provider": "openai", "model": "qwen3:4b", "weight": 1, "lastResort": True},
        ],
    }


def test_config_require_enabled_target_only_when_asked() -> None:
    assert [str(i) for i in validate_config(RICH_CONFIG, require_enabled_target=True)] == [
        "combos.all-off.targets: targets must include at least one enabled provider"
    ]


def test_config_errors_listed_with_paths() -> None:
    raw = {
        "providers": {
            "combo": {"adapter": "openai-chat", "baseUrl": "https://x"},
            "main": {"adapter": "nope", "baseUrl": "https://x"},
        },
        "combos": {
            "main": {"targets": [{"provider": "combo", "model": "m"}], "alias": "dup"},
            "second": {"targets": [{"provider": "ghost", "model": "m"}], "alias": "dup"},
            "-bad": {"targets": []},
        },
        "disabledModels": ["ok", "", 3],
        "extra": True,
    }
    assert [(i.path, i.message) for i in validate_config(raw)] == [
        (("providers", "combo"), v.MSG_PROVIDER_COMBO_RESERVED),
        (("providers", "main", "adapter"), v.MSG_ADAPTER),
        (("combos", "main"), 'combo id "main" collides with configured provider name "main"'),
        (
            ("combos", "second", "targets", 0, "provider"),
            'targets[0].provider "ghost" is not configured',
        ),
        (("combos", "second", "alias"), 'alias "dup" is already used by combo "main"'),
        (("combos", "-bad"), v.MSG_COMBO_ID),
        (("combos", "-bad", "targets"), v.MSG_TARGETS),
        (("disabledModels", 1), "disabledModels[1] must be a non-empty string"),
        (("disabledModels", 2), "disabledModels[2] must be a non-empty string"),
        (("extra",), 'unknown field "extra"'),
    ]


@pytest.mark.parametrize("combos", [[], "x", None, 1])
def test_config_combos_must_be_object(combos: object) -> None:
    assert validate_config({"combos": combos}) == [Issue(("combos",), "combos must be an object")]


def test_config_shapes() -> None:
    assert validate_config([]) == [Issue((), "config must be an object")]
    assert validate_config({}) == []
    assert validate_config({"providers": []}) == [
        Issue(("providers",), v.MSG_PROVIDERS_MUST_BE_OBJECT)
    ]
    assert validate_config({"disabledModels": "x"}) == [
        Issue(("disabledModels",), v.MSG_DISABLED_MODELS)
    ]
    # A provider named combo is fine while no combos exist.
    legacy = {
        "providers": {"combo": {"adapter": "openai-chat", "baseUrl": "https://x"}},
        "combos": {},
    }
    assert validate_config(legacy) == []


def test_issue_str() -> None:
    assert str(Issue(("combos", "main", "targets", 0, "provider"), "m")) == (
        "combos.main.targets[0].provider: m"
    )
    assert str(Issue((), "m")) == "m"


_ids = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
_target = st.fixed_dictionaries(
    {"provider": st.sampled_from(["PA", "PB"]), "model": _ids},
    optional={"weight": st.integers(1, 10000), "lastResort": st.booleans()},
)
_combo = st.fixed_dictionaries(
    {
        "targets": st.lists(
            _target, min_size=1, max_size=4, unique_by=lambda t: (t["provider"], t["model"])
        )
    },
    optional={
        "strategy": st.sampled_from(
            ["failover", "round-robin", "random", "least-used", "reset-window"]
        ),
        "stickyLimit": st.integers(1, 100),
        "cooldownMs": st.integers(1, 600000),
        "waitForCooldownMs": st.integers(0, 600000),
        "cooldownWaitPolicy": st.sampled_from([None, "before-last-resort"]),
        "defaultEffort": st.sampled_from([None, "low", "high", "ultra"]),
        "reasoningEffortMode": st.sampled_from(["strict", "adaptive"]),
        "imageInput": st.sampled_from(["auto", "disabled"]),
        "displayName": st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
    },
)


@settings(max_examples=75, deadline=None)
@given(combos=st.dictionaries(_ids, _combo, max_size=4))
def test_config_round_trip_property(combos: dict[str, Any]) -> None:
    raw = {
        "providers": {
            "PA": {"adapter": "openai-responses", "baseUrl": "https://a.example"},
            "PB": {"adapter": "anthropic", "baseUrl": "http://b.example:8080/", "disabled": True},
        },
        "combos": combos,
    }
    assert validate_config(raw) == []
    dumped = config_to_sparse(normalize_config(raw))
    assert validate_config(dumped) == []
    assert config_to_sparse(normalize_config(dumped)) == dumped
    assert normalize_config(dumped).combos == normalize_config(raw).combos


# --- resolution (§6.2) ----------------------------------------------------------------------------


def _snapshot(
    combos: dict[str, ComboSpec], providers: tuple[str, ...] = ("a", "openai")
) -> ConfigSnapshot:
    return ConfigSnapshot(
        version=1,
        providers=MappingProxyType(
            {
                p: ProviderSpec(name=p, adapter="openai-chat", base_url="https://x")
                for p in providers
            }
        ),
        combos=MappingProxyType(combos),
    )


def test_resolve_model() -> None:
    snap = _snapshot(
        {
            "main": normalize_combo("main", body()),
            "shadow": normalize_combo("shadow", body(alias="a/m1")),
            "other": normalize_combo("other", body(alias="team/x")),
            "nova": normalize_combo(
                "nova", body(alias="gpt-5.6-sol", nativeAlias=True, displayName="N")
            ),
        }
    )
    R = v.Resolution
    assert resolve_model("combo/main", snap) == R("combo", combo_id="main")
    assert resolve_model("combo/shadow", snap) == R("combo", combo_id="shadow")
    assert resolve_model("combo/  free  ", snap) == R("unknown_combo", combo_id="  free  ")
    assert resolve_model("combo/constructor", snap) == R("unknown_combo", combo_id="constructor")
    assert resolve_model("team/x", snap) == R("combo", combo_id="other", via_alias=True)
    assert resolve_model("Team/x", snap) == R("unresolved")
    assert resolve_model("a/m1", snap) == R("combo", combo_id="shadow", via_alias=True)
    assert resolve_model("a/m2", snap) == R("target", provider="a", model="m2")
    assert resolve_model("gpt-5.6-sol", snap) == R("combo", combo_id="nova", via_alias=True)
    assert resolve_model("openai/gpt-5.6-sol", snap) == R(
        "target", provider="openai", model="gpt-5.6-sol"
    )
    assert resolve_model("main/gpt-5.6-sol", snap) == R("unresolved")
    assert resolve_model("openai/vendor/model", snap) == R(
        "target", provider="openai", model="vendor/model"
    )
    assert resolve_model("combo/", snap) == R("unresolved")
    assert resolve_model("gpt-5.5", snap) == R("unresolved")


def test_resolve_legacy_combo_provider() -> None:
    legacy = _snapshot({}, providers=("combo",))
    assert resolve_model("combo/m", legacy) == v.Resolution("target", provider="combo", model="m")
    assert resolve_model("combo/m", _snapshot({})) == v.Resolution("unknown_combo", combo_id="m")


def test_provider_max_connections_round_trips_and_defaults_to_none() -> None:
    base = {"adapter": "openai-chat", "baseUrl": "http://h/v1"}
    assert v.validate_provider("p", {**base, "maxConnections": 2000}, combo_ids=[]) == []
    assert v.validate_provider("p", {**base, "maxConnections": None}, combo_ids=[]) == []
    spec = v.normalize_provider("p", {**base, "maxConnections": 2000})
    assert spec.max_connections == 2000
    assert v.provider_to_sparse(spec)["maxConnections"] == 2000
    plain = v.normalize_provider("p", base)
    assert plain.max_connections is None and "maxConnections" not in v.provider_to_sparse(plain)
