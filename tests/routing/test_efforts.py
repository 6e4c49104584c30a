from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from routing import efforts
from routing.efforts import (
    combo_ladder,
    default_effort_for,
    picker_default,
    resolve_effort,
    shape_reasoning,
)
from routing.types import ComboSpec, TargetSpec

LMH = ("low", "medium", "high")


def _combo(**kwargs: Any) -> ComboSpec:
    return ComboSpec(id="c", targets=(TargetSpec("a", "m1"),), **kwargs)


@pytest.mark.parametrize(
    ("requested", "ladder", "expected"),
    [
        # Reference §5.2 examples.
        ("max", LMH, "high"),
        ("high", ("low", "medium"), "medium"),
        ("max", ("high", "max"), "max"),
        ("low", ("high", "max"), "high"),
        # Exact rung kept, also unranked ones.
        ("medium", LMH, "medium"),
        ("none", ("none", "low"), "none"),
        # Highest at-or-below, not the nearest above.
        ("xhigh", ("low", "ultra"), "low"),
        ("ultra", ("medium", "xhigh"), "xhigh"),
        # Ladder order does not matter; rank does.
        ("max", ("high", "low", "medium"), "high"),
        ("low", ("max", "high"), "high"),
        # No ranked rung or unranked request not on the ladder: nothing.
        ("high", (), None),
        ("high", ("none", "minimal"), None),
        ("none", LMH, None),
        ("banana", LMH, None),
    ],
)
def test_resolve_effort(requested: str, ladder: tuple[str, ...], expected: str | None) -> None:
    assert resolve_effort(requested, ladder) == expected


@pytest.mark.parametrize(
    ("ladders", "mode", "expected"),
    [
        ([LMH, ("low", "medium")], "strict", ("low", "medium")),
        ([LMH, None], "strict", LMH),  # unknown is a wildcard
        ([None, LMH], "adaptive", LMH),
        ([LMH, ()], "strict", ()),  # one no-effort member empties the picker
        ([LMH, ()], "adaptive", LMH),  # ... unless adaptive
        ([LMH, (), ("medium", "high", "xhigh")], "adaptive", ("medium", "high")),
        ([None, None], "strict", ()),
        ([(), ()], "adaptive", ()),
        ([None, ()], "adaptive", ()),
        ([("high", "low"), LMH], "strict", ("high", "low")),  # first member's order
        ([("low", "high"), ("max",)], "strict", ()),
        ([], "strict", ()),
    ],
)
def test_combo_ladder(
    ladders: list[tuple[str, ...] | None], mode: str, expected: tuple[str, ...]
) -> None:
    assert combo_ladder(ladders, mode=mode) == expected


def test_combo_ladder_garbage_mode_is_strict() -> None:
    assert combo_ladder([LMH, ()], mode="whatever") == ()


@pytest.mark.parametrize(
    ("default", "ladder", "expected"),
    [
        ("high", ("low", "medium"), "medium"),
        ("max", ("high", "max"), "max"),
        (None, LMH, None),
        ("high", (), None),
        ("high", None, None),
        ("high", ("none",), None),
    ],
)
def test_default_effort_for(
    default: str | None, ladder: tuple[str, ...] | None, expected: str | None
) -> None:
    assert default_effort_for(default, ladder) == expected


@pytest.mark.parametrize(
    ("ladder", "derived", "expected"),
    [
        (("low", "medium"), "low", "low"),
        (("low", "medium", "high"), None, "medium"),
        (("low", "high"), None, "high"),
        (("none", "low"), None, "low"),
        (("xhigh", "max"), None, "xhigh"),
        (("none",), None, "none"),
        ((), None, None),
        (("low", "high"), "max", "high"),  # a derived value off the ladder is ignored
    ],
)
def test_picker_default(ladder: tuple[str, ...], derived: str | None, expected: str | None) -> None:
    assert picker_default(ladder, derived) == expected


# --- shape_reasoning: fallback mode ----------------------------------------------------


def test_fallback_injects_when_reasoning_absent() -> None:
    body = {"model": "x", "input": "hi"}
    shaped = shape_reasoning(body, target_ladder=LMH, combo=_combo(default_effort="max"))
    assert shaped.body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert (shaped.effort, shaped.action) == ("high", "injected")
    assert "reasoning" not in body  # never mutates the caller's body


def test_fallback_merges_into_reasoning_without_effort() -> None:
    body = {"reasoning": {"summary": "concise"}}
    shaped = shape_reasoning(
        body, target_ladder=("low", "medium"), combo=_combo(default_effort="high")
    )
    assert shaped.body["reasoning"] == {"summary": "concise", "effort": "medium"}
    assert body["reasoning"] == {"summary": "concise"}


def test_fallback_explicit_caller_effort_wins() -> None:
    shaped = shape_reasoning(
        {"reasoning": {"effort": "low"}}, target_ladder=LMH, combo=_combo(default_effort="max")
    )
    assert shaped.body["reasoning"] == {"effort": "low"}
    assert (shaped.effort, shaped.action) == ("low", "kept")


def test_known_ladder_keeps_caller_effort_as_sent() -> None:
    ladder = ("low", "medium", "high", "xhigh")
    shaped = shape_reasoning(
        {"reasoning": {"effort": "xhigh"}}, target_ladder=ladder, combo=_combo()
    )
    assert shaped.body == {"reasoning": {"effort": "xhigh"}}


def test_no_default_no_effort_is_untouched() -> None:
    shaped = shape_reasoning({"input": "x"}, target_ladder=LMH, combo=_combo())
    assert shaped.body == {"input": "x"}
    assert (shaped.effort, shaped.action, shaped.skipped_default) == (None, "none", None)


@pytest.mark.parametrize(("ladder", "capability"), [(None, "unknown"), ((), "unsupported")])
def test_unknown_or_empty_ladder_never_injects(
    ladder: tuple[str, ...] | None, capability: str
) -> None:
    shaped = shape_reasoning(
        {"input": "x"}, target_ladder=ladder, combo=_combo(default_effort="high")
    )
    assert "reasoning" not in shaped.body
    assert shaped.skipped_default == capability


# --- force mode -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ladder", "expected"),
    [(("low", "high", "max"), "max"), (("low", "high"), "high")],
)
def test_force_replaces_valid_caller_effort(ladder: tuple[str, ...], expected: str) -> None:
    combo = _combo(default_effort="max", default_effort_mode="force")
    body = {"reasoning": {"effort": "medium", "summary": "auto"}}
    shaped = shape_reasoning(body, target_ladder=ladder, combo=combo)
    assert shaped.body["reasoning"] == {"effort": expected, "summary": "auto"}
    assert shaped.action == "forced"
    assert body["reasoning"]["effort"] == "medium"


def test_force_does_not_repair_malformed_effort() -> None:
    combo = _combo(default_effort="max", default_effort_mode="force")
    shaped = shape_reasoning({"reasoning": {"effort": "banana"}}, target_ladder=LMH, combo=combo)
    assert shaped.body["reasoning"] == {"effort": "banana"}
    assert shaped.action == "kept"


def test_force_injects_when_caller_sent_none() -> None:
    combo = _combo(default_effort="xhigh", default_effort_mode="force")
    shaped = shape_reasoning({}, target_ladder=LMH, combo=combo)
    assert shaped.body["reasoning"] == {"effort": "high", "summary": "auto"}


def test_force_without_valid_default_raises() -> None:
    combo = _combo(default_effort=None, default_effort_mode="force")
    with pytest.raises(ValueError, match="force combo default effort requires a valid"):
        shape_reasoning({}, target_ladder=LMH, combo=combo)


# --- removal of unsupported controls ------------------------------------------------------


@pytest.mark.parametrize("mode", ["strict", "adaptive"])
def test_empty_ladder_strips_effort_keeps_summary(mode: str) -> None:
    body = {
        "reasoning": {"effort": "xhigh", "summary": "concise"},
        "reasoning_effort": "high",
        "thinking_budget": 1024,
        "thinking": {"type": "enabled"},
        "input": "x",
    }
    shaped = shape_reasoning(
        body, target_ladder=(), combo=_combo(reasoning_effort_mode=mode, default_effort="high")
    )
    assert shaped.body == {"reasoning": {"summary": "concise"}, "input": "x"}
    assert (shaped.effort, shaped.action) == (None, "stripped")
    assert body["reasoning"] == {"effort": "xhigh", "summary": "concise"}


@pytest.mark.parametrize(
    "reasoning", [{"effort": ""}, {"effort": "banana"}, {"effort": None}, {"effort": "high"}]
)
def test_empty_ladder_leaves_reasoning_undefined_when_only_effort(
    reasoning: dict[str, Any],
) -> None:
    shaped = shape_reasoning({"reasoning": reasoning}, target_ladder=(), combo=_combo())
    assert "reasoning" not in shaped.body


def test_empty_ladder_keeps_null_reasoning() -> None:
    shaped = shape_reasoning({"reasoning": None}, target_ladder=[], combo=_combo())
    assert shaped.body == {"reasoning": None}


def test_unknown_ladder_adaptive_strips() -> None:
    body = {"reasoning": {"effort": "high", "summary": "auto"}, "reasoning_effort": "high"}
    shaped = shape_reasoning(
        body, target_ladder=None, combo=_combo(reasoning_effort_mode="adaptive")
    )
    assert shaped.body == {"reasoning": {"summary": "auto"}}


def test_unknown_ladder_strict_passes_through() -> None:
    body = {"reasoning": {"effort": "ultra"}, "thinking": {"budget_tokens": 5}}
    shaped = shape_reasoning(
        body, target_ladder=None, combo=_combo(default_effort="low", default_effort_mode="force")
    )
    assert shaped.body == body
    assert (shaped.effort, shaped.action, shaped.skipped_default) == (
        "ultra",
        "passthrough",
        "unknown",
    )


# --- chat wire -------------------------------------------------------------------------------


def test_chat_wire_injects_top_level_reasoning_effort() -> None:
    shaped = shape_reasoning(
        {"messages": []}, target_ladder=LMH, combo=_combo(default_effort="max"), wire="chat"
    )
    assert shaped.body == {"messages": [], "reasoning_effort": "high"}


def test_chat_wire_force_replaces_reasoning_effort() -> None:
    combo = _combo(default_effort="low", default_effort_mode="force")
    shaped = shape_reasoning(
        {"reasoning_effort": "high"}, target_ladder=("medium", "high"), combo=combo, wire="chat"
    )
    assert shaped.body == {"reasoning_effort": "medium"}


def test_module_is_framework_free() -> None:
    tree = ast.parse(Path(efforts.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not any(name.split(".")[0] in {"django", "ninja", "channels"} for name in imported)
