from __future__ import annotations

import ast
import copy
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from routing import catalog
from routing.catalog import (
    CatalogResult,
    ComboCapabilities,
    build_catalog,
    catalog_json,
    combo_capabilities,
    disable_selectors,
    models_list,
    validate_catalog,
)
from routing.types import ComboSpec, ConfigSnapshot, ModelSpec, ProviderSpec, TargetSpec

M1 = ModelSpec(
    id="m1",
    context_window=200_000,
    max_input_tokens=180_000,
    input_modalities=("text", "image"),
    reasoning_efforts=("low", "medium", "high"),
    parallel_tool_calls=True,
)
M2 = ModelSpec(
    id="m2",
    context_window=128_000,
    max_input_tokens=100_000,
    input_modalities=("text",),
    reasoning_efforts=("low", "medium"),
    parallel_tool_calls=False,
)


def _provider(name: str, *models: ModelSpec, disabled: bool = False) -> ProviderSpec:
    return ProviderSpec(
        name=name,
        adapter="openai-responses",
        base_url="https://example.test/v1",
        disabled=disabled,
        models=MappingProxyType({m.id: m for m in models}),
    )


def _combo(cid: str, *keys: str, **kwargs: Any) -> ComboSpec:
    targets = tuple(TargetSpec(key.split("/", 1)[0], key.split("/", 1)[1]) for key in keys)
    return ComboSpec(id=cid, targets=targets, **kwargs)


def _snapshot(
    *combos: ComboSpec,
    providers: tuple[ProviderSpec, ...] | None = None,
    disabled: frozenset[str] = frozenset(),
) -> ConfigSnapshot:
    providers = providers if providers is not None else (_provider("a", M1), _provider("b", M2))
    return ConfigSnapshot(
        version=1,
        providers=MappingProxyType({p.name: p for p in providers}),
        combos=MappingProxyType({c.id: c for c in combos}),
        disabled_models=disabled,
    )


def _rows(result: CatalogResult) -> dict[str, dict[str, Any]]:
    return {row["slug"]: row for row in result.models}


def _build(snapshot: ConfigSnapshot) -> CatalogResult:
    result = build_catalog(snapshot)
    # Every generated catalog must pass the strict schema check, also as written bytes.
    assert validate_catalog({"models": result.models}) == []
    assert validate_catalog(catalog_json(result)) == []
    return result


# --- the reference example (§6.3) ---------------------------------------------------------


def test_reference_mixed_combo_row() -> None:
    result = _build(_snapshot(_combo("mixed", "a/m1", "b/m2", default_effort="high")))
    row = _rows(result)["combo/mixed"]
    assert row["display_name"] == "combo/mixed"
    assert row["context_window"] == 128_000
    assert row["max_context_window"] == 128_000
    assert row["auto_compact_token_limit"] == 100_000
    assert row["input_modalities"] == ["text"]
    assert [level["effort"] for level in row["supported_reasoning_levels"]] == ["low", "medium"]
    assert row["supported_reasoning_levels"][0] == {
        "effort": "low",
        "description": "Fast responses with lighter reasoning",
    }
    assert row["default_reasoning_level"] == "medium"
    assert row["supports_parallel_tool_calls"] is False
    assert row["visibility"] == "list"
    assert row["supported_in_api"] is True
    assert row["shell_type"] == "shell_command"
    assert "combo/mixed" in row["base_instructions"]
    assert result.omitted == []


def test_reference_capabilities() -> None:
    snap = _snapshot()
    caps = combo_capabilities(_combo("mixed", "a/m1", "b/m2", default_effort="high"), snap)
    assert caps == ComboCapabilities(
        context_window=128_000,
        max_input_tokens=100_000,
        input_modalities=("text",),
        reasoning_efforts=("low", "medium"),
        default_effort="medium",
        parallel_tool_calls=False,
    )


def test_row_has_exactly_the_superset_fields_of_codex_wire_example() -> None:
    row = _rows(_build(_snapshot(_combo("mixed", "a/m1", "b/m2"))))["combo/mixed"]
    expected = {
        "slug", "display_name", "description", "default_reasoning_level",
        "supported_reasoning_levels", "shell_type", "visibility", "supported_in_api", "priority",
        "availability_nux", "upgrade", "base_instructions", "supports_reasoning_summaries",
        "supports_reasoning_summary_parameter", "default_reasoning_summary", "support_verbosity",
        "default_verbosity", "apply_patch_tool_type", "web_search_tool_type", "truncation_policy",
        "supports_parallel_tool_calls", "supports_image_detail_original", "context_window",
        "max_context_window", "effective_context_window_percent", "experimental_supported_tools",
        "input_modalities", "supports_search_tool", "use_responses_lite", "tool_mode",
        "auto_compact_token_limit",
    }  # fmt: skip
    assert set(row) == expected
    assert row["tool_mode"] == "direct"
    assert row["use_responses_lite"] is False
    assert row["truncation_policy"] == {"mode": "bytes", "limit": 10000}


def test_all_image_members_keep_image_unless_disabled() -> None:
    img = ModelSpec(id="v", context_window=64_000, input_modalities=("image", "text"))
    providers = (_provider("a", M1), _provider("c", img))
    auto = combo_capabilities(_combo("x", "a/m1", "c/v"), _snapshot(providers=providers))
    off = combo_capabilities(
        _combo("x", "a/m1", "c/v", image_input="disabled"), _snapshot(providers=providers)
    )
    assert isinstance(auto, ComboCapabilities) and isinstance(off, ComboCapabilities)
    assert auto.input_modalities == ("text", "image")  # first member's order
    assert off.input_modalities == ("text",)
    # max input falls back to the context window when a member has none.
    assert auto.max_input_tokens == 64_000


def test_exact_ladder_without_synthetic_rungs() -> None:
    big = ModelSpec(id="big", context_window=1000, reasoning_efforts=("medium", "high", "xhigh"))
    snap = _snapshot(_combo("x", "c/big", default_effort="ultra"), providers=(_provider("c", big),))
    row = _rows(_build(snap))["combo/x"]
    assert [lv["effort"] for lv in row["supported_reasoning_levels"]] == ["medium", "high", "xhigh"]
    assert row["default_reasoning_level"] == "xhigh"


# --- strict vs adaptive ladders ----------------------------------------------------------------


NOEFF = ModelSpec(id="n", context_window=100_000, reasoning_efforts=())
UNK = ModelSpec(id="u", context_window=100_000, reasoning_efforts=None)


@pytest.mark.parametrize(
    ("members", "mode", "levels", "default"),
    [
        (("a/m1", "c/u"), "strict", ["low", "medium", "high"], "high"),
        (("a/m1", "c/u"), "adaptive", ["low", "medium", "high"], "high"),
        (("a/m1", "c/n"), "strict", [], None),
        (("a/m1", "c/n"), "adaptive", ["low", "medium", "high"], "high"),
        (("c/u",), "strict", [], None),
        (("c/n", "c/u"), "adaptive", [], None),
    ],
)
def test_ladder_modes_in_catalog(
    members: tuple[str, ...], mode: str, levels: list[str], default: str | None
) -> None:
    providers = (_provider("a", M1), _provider("c", NOEFF, UNK))
    combo = _combo("x", *members, reasoning_effort_mode=mode, default_effort="max")
    row = _rows(_build(_snapshot(combo, providers=providers)))["combo/x"]
    assert [lv["effort"] for lv in row["supported_reasoning_levels"]] == levels
    assert row["default_reasoning_level"] == default
    assert row["supports_reasoning_summaries"] is bool(levels)
    assert row["default_reasoning_summary"] == ("auto" if levels else "none")


# --- omissions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("combo", "providers", "reason"),
    [
        (_combo("x"), None, "no_targets"),
        (_combo("x", "a/m1", "a/m1"), None, "duplicate_target"),
        (_combo("x", "a/m1", "a/nope"), None, "missing_member"),
        (_combo("x", "a/m1", "zz/m1"), None, "missing_member"),
        (
            _combo("x", "a/m1", "c/u"),
            (_provider("a", M1), _provider("c", ModelSpec(id="u"))),
            "incomplete_metadata",
        ),
        (
            _combo("x", "a/m1", "c/u"),
            (_provider("a", M1), _provider("c", ModelSpec(id="u", context_window=0))),
            "incomplete_metadata",
        ),
        (
            _combo("x", "a/m1", "c/v"),
            (
                _provider("a", M1),
                _provider("c", ModelSpec(id="v", context_window=9, input_modalities=("audio",))),
            ),
            "incompatible_modalities",
        ),
        (
            _combo("x", "c/v", image_input="disabled"),
            (
                _provider("a", M1),
                _provider("c", ModelSpec(id="v", context_window=9, input_modalities=("image",))),
            ),
            "incompatible_modalities",
        ),
    ],
)
def test_omitted_combos_report_reason(
    combo: ComboSpec, providers: tuple[ProviderSpec, ...] | None, reason: str
) -> None:
    result = _build(_snapshot(combo, _combo("ok", "a/m1"), providers=providers))
    assert result.omitted == [("x", reason)]
    assert "combo/x" not in _rows(result)
    assert "combo/ok" in _rows(result)
    assert result.warnings[0].startswith('Combo "x" is omitted from the catalog because ')
    # Still routable, so still in /v1/models.
    ids = [item["id"] for item in models_list(_snapshot(combo, providers=providers))["data"]]
    assert "combo/x" in ids


def test_missing_modalities_count_as_text() -> None:
    bare = ModelSpec(id="t", context_window=50_000)
    snap = _snapshot(
        _combo("x", "a/m1", "c/t"), providers=(_provider("a", M1), _provider("c", bare))
    )
    assert _rows(_build(snap))["combo/x"]["input_modalities"] == ["text"]


def test_omission_message_lists_sorted_target_keys() -> None:
    result = build_catalog(_snapshot(_combo("x", "b/m2", "a/zz")))
    assert result.warnings == [
        'Combo "x" is omitted from the catalog because a member is not a configured provider '
        "model: a/zz, b/m2."
    ]


def test_disabled_provider_members_still_count_for_capabilities() -> None:
    providers = (_provider("a", M1), _provider("b", M2, disabled=True))
    rows = _rows(_build(_snapshot(_combo("x", "a/m1", "b/m2"), providers=providers)))
    assert rows["combo/x"]["context_window"] == 128_000
    assert "b/m2" not in rows  # disabled provider has no rows of its own


# --- provider rows, order, aliases ----------------------------------------------------------


def test_provider_rows_and_priorities() -> None:
    named = ModelSpec(id="q", display_name="Qwen Coder", reasoning_efforts=None)
    providers = (_provider("b", M2), _provider("a", M1, named))
    result = _build(_snapshot(_combo("z", "a/m1"), _combo("y", "b/m2"), providers=providers))
    assert [(r["slug"], r["priority"]) for r in result.models] == [
        ("combo/y", 1),
        ("combo/z", 2),
        ("a/m1", 3),
        ("a/q", 4),
        ("b/m2", 5),
    ]
    rows = _rows(result)
    assert rows["a/q"]["display_name"] == "Qwen Coder"
    assert rows["a/q"]["supported_reasoning_levels"] == []
    assert rows["a/q"]["default_reasoning_level"] is None
    assert rows["a/q"]["input_modalities"] == ["text"]
    assert "context_window" not in rows["a/q"]  # unknown: omitted, never null
    assert rows["a/m1"]["input_modalities"] == ["text", "image"]
    assert rows["a/m1"]["supports_parallel_tool_calls"] is True
    assert rows["a/m1"]["auto_compact_token_limit"] == 180_000
    assert rows["a/m1"]["display_name"] == "a/m1"


def test_alias_slug_and_display_name() -> None:
    combo = _combo("mixed", "a/m1", alias="team/fast", display_name="Team fast")
    rows = _rows(_build(_snapshot(combo)))
    assert rows["team/fast"]["display_name"] == "Team fast"
    assert "combo/mixed" not in rows


def test_alias_shadows_provider_row() -> None:
    result = _build(_snapshot(_combo("shadow", "b/m2", alias="a/m1")))
    slugs = [row["slug"] for row in result.models]
    assert slugs.count("a/m1") == 1
    assert _rows(result)["a/m1"]["context_window"] == 128_000  # the combo row, not provider a's
    assert any("shadowed" in w for w in result.warnings)
    listed = [d for d in models_list(_snapshot(_combo("shadow", "b/m2", alias="a/m1")))["data"]]
    assert [d for d in listed if d["id"] == "a/m1"] == [
        {"id": "a/m1", "object": "model", "created": 0, "owned_by": "combo"}
    ]


def test_native_alias_row_is_bare_and_single() -> None:
    combo = _combo(
        "sol", "a/m1", alias="gpt-5.5", native_alias=True, display_name="GPT-5.5 via team proxy"
    )
    rows = _rows(_build(_snapshot(combo)))
    assert rows["gpt-5.5"]["display_name"] == "GPT-5.5 via team proxy"
    assert [slug for slug in rows if "gpt-5.5" in slug] == ["gpt-5.5"]
    assert "combo/sol" not in rows


def test_native_alias_fills_missing_member_metadata_from_native_model() -> None:
    native = MappingProxyType(
        {"gpt-5.5": ModelSpec(id="gpt-5.5", context_window=400_000, reasoning_efforts=("low",))}
    )
    bare = ModelSpec(id="t", max_input_tokens=90_000)
    combo = _combo("sol", "c/t", alias="gpt-5.5", native_alias=True, display_name="GPT")
    snap = _snapshot(combo, providers=(_provider("c", bare),))
    result = build_catalog(snap, native_models=native)
    row = _rows(result)["gpt-5.5"]
    assert row["context_window"] == 400_000
    assert row["auto_compact_token_limit"] == 90_000  # explicit target limit wins
    assert [lv["effort"] for lv in row["supported_reasoning_levels"]] == ["low"]
    # Without native metadata the same combo is omitted.
    assert build_catalog(snap).omitted == [("sol", "incomplete_metadata")]


# --- disabledModels ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("combo", "disabled", "hidden"),
    [
        (_combo("x", "a/m1"), {"combo/x"}, True),
        (_combo("x", "a/m1", alias="fast"), {"combo/x"}, True),
        (_combo("x", "a/m1", alias="fast"), {"fast"}, True),
        (_combo("x", "a/m1", alias="fast"), {"x"}, False),
        (
            _combo("x", "a/m1", alias="gpt-5.5", native_alias=True, display_name="N"),
            {"combo/x"},
            True,
        ),
        (
            _combo("x", "a/m1", alias="gpt-5.5", native_alias=True, display_name="N"),
            {"gpt-5.5"},
            False,
        ),
    ],
)
def test_disabled_selectors(combo: ComboSpec, disabled: set[str], hidden: bool) -> None:
    snap = _snapshot(combo, disabled=frozenset(disabled))
    row = _rows(_build(snap))[combo.public_id]
    assert row["visibility"] == ("hide" if hidden else "list")
    ids = [item["id"] for item in models_list(snap)["data"]]
    assert (combo.public_id not in ids) is hidden


def test_disable_selectors_values() -> None:
    assert disable_selectors(_combo("x", "a/m1", alias="team/fast")) == {"combo/x", "team/fast"}
    native = _combo("x", "a/m1", alias="gpt-5.5", native_alias=True, display_name="N")
    assert disable_selectors(native) == {"combo/x"}


def test_disabled_provider_model_is_hidden() -> None:
    snap = _snapshot(disabled=frozenset({"b/m2"}))
    assert _rows(_build(snap))["b/m2"]["visibility"] == "hide"
    assert [item["id"] for item in models_list(snap)["data"]] == ["a/m1"]


# --- /v1/models --------------------------------------------------------------------------------


def test_models_list_shape() -> None:
    snap = _snapshot(
        _combo("mixed", "a/m1", "b/m2"),
        providers=(_provider("a", M1), _provider("b", M2), _provider("off", M2, disabled=True)),
    )
    assert models_list(snap, created=1_700_000_000) == {
        "object": "list",
        "data": [
            {"id": "combo/mixed", "object": "model", "created": 1_700_000_000, "owned_by": "combo"},
            {"id": "a/m1", "object": "model", "created": 1_700_000_000, "owned_by": "a"},
            {"id": "b/m2", "object": "model", "created": 1_700_000_000, "owned_by": "b"},
        ],
    }


# --- serialization and validation -----------------------------------------------------------------


def test_catalog_json_is_utf8_without_bom_and_deterministic() -> None:
    combo = _combo("x", "a/m1", display_name="Équipe → rapide")
    first = catalog_json(build_catalog(_snapshot(combo)))
    assert not first.startswith(b"\xef\xbb\xbf")
    assert "Équipe → rapide".encode() in first
    assert first == catalog_json(build_catalog(_snapshot(combo)))
    parsed = json.loads(first)
    assert list(parsed) == ["models"]
    assert list(parsed["models"][0])[:3] == ["slug", "display_name", "description"]


def _valid() -> dict[str, Any]:
    return {"models": build_catalog(_snapshot(_combo("x", "a/m1"))).models}


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda m: m["models"][0].pop("slug"), "slug is required"),
        (lambda m: m["models"][0].update(display_name=None), "display_name must be a string"),
        (lambda m: m["models"][0].update(priority=True), "priority must be an integer"),
        (lambda m: m["models"][0].update(supported_in_api=False), "supported_in_api must be true"),
        (lambda m: m["models"][0].pop("base_instructions"), "base_instructions is required"),
        (lambda m: m["models"][0].update(base_instructions=" "), "real system prompt"),
        (lambda m: m["models"][0].update(shell_type="bash"), "shell_type 'bash'"),
        (lambda m: m["models"][0].update(visibility=None), "visibility must be a string"),
        (lambda m: m["models"][0].update(tool_mode=None), "tool_mode must be a string"),
        (lambda m: m["models"][0].update(input_modalities=["video"]), "input_modalities"),
        (lambda m: m["models"][0].update(context_window="1"), "context_window must be"),
        (lambda m: m["models"][0].update(apply_patch_tool_type="function"), "apply_patch"),
        (
            lambda m: m["models"][0].update(supported_reasoning_levels=[{"effort": "low"}]),
            "needs effort and description",
        ),
        (
            lambda m: m["models"][0].update(default_reasoning_level="ultra"),
            "not a supported level",
        ),
        (
            lambda m: m["models"][0].update(truncation_policy={"mode": "lines", "limit": 1}),
            "truncation_policy",
        ),
        (lambda m: m["models"].append(copy.deepcopy(m["models"][0])), "is duplicated"),
        (lambda m: m["models"].clear(), "at least one model"),
        (lambda m: m.pop("models"), '"models" array'),
    ],
)
def test_validate_catalog_rejects(mutate: Any, needle: str) -> None:
    obj = _valid()
    assert validate_catalog(obj) == []
    mutate(obj)
    errors = validate_catalog(obj)
    assert any(needle in error for error in errors), errors


def test_validate_catalog_null_allowed_only_for_option_fields() -> None:
    obj = _valid()
    obj["models"][0].update(description=None, context_window=None, default_verbosity=None)
    assert validate_catalog(obj) == []


def test_validate_catalog_raw_bytes() -> None:
    good = catalog_json(build_catalog(_snapshot()))
    assert validate_catalog(good) == []
    assert validate_catalog(b"\xef\xbb\xbf" + good) == ["file starts with a UTF-8 BOM"]
    assert validate_catalog(b"{nope")[0].startswith("not valid UTF-8 JSON")


def test_empty_snapshot_fails_validation() -> None:
    empty = build_catalog(_snapshot(providers=()))
    assert empty.models == []
    assert validate_catalog(catalog_json(empty)) == ["catalog must contain at least one model"]


def test_module_is_framework_free() -> None:
    tree = ast.parse(Path(catalog.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not any(name.split(".")[0] in {"django", "ninja", "channels"} for name in imported)


def test_duplicate_public_id_keeps_first_combo_by_id() -> None:
    snap = _snapshot(_combo("b", "b/m2", alias="fast"), _combo("a", "a/m1", alias="fast"))
    result = _build(snap)
    assert result.omitted == [("b", "duplicate_slug")]
    assert _rows(result)["fast"]["context_window"] == 200_000
    assert [d["id"] for d in models_list(snap)["data"]].count("fast") == 1
