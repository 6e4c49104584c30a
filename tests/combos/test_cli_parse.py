from __future__ import annotations

import pytest

from combos import cli_parse as c
from combos.cli_parse import (
    CliUsageError,
    build_set_request,
    parse_effort,
    parse_mode,
    parse_sticky,
    parse_strategy,
    parse_targets,
    require_yes,
    resolve_subcommand,
)


def usage_error(func: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(CliUsageError) as info:
        func(*args, **kwargs)  # type: ignore[operator]
    assert str(info.value) == info.value.message
    return info.value.message


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("ollama/qwen3:4b", [{"provider": "ollama", "model": "qwen3:4b"}]),
        ("a/m:3", [{"provider": "a", "model": "m", "weight": 3}]),
        ("a/m:10000", [{"provider": "a", "model": "m", "weight": 10000}]),
        ("a/m:1", [{"provider": "a", "model": "m", "weight": 1}]),
        (
            "openrouter/qwen/qwen3-coder-plus",
            [{"provider": "openrouter", "model": "qwen/qwen3-coder-plus"}],
        ),
        ("ollama/qwen3:4b:2", [{"provider": "ollama", "model": "qwen3:4b", "weight": 2}]),
        ("a/m:", [{"provider": "a", "model": "m:"}]),
        ("a/m:1.5", [{"provider": "a", "model": "m:1.5"}]),
        (
            " anthropic/claude-opus-4-8:2 , openai/gpt-5.6-sol:1 ,",
            [
                {"provider": "anthropic", "model": "claude-opus-4-8", "weight": 2},
                {"provider": "openai", "model": "gpt-5.6-sol", "weight": 1},
            ],
        ),
        ("Nova1/codex/gpt-5.6-sol", [{"provider": "Nova1", "model": "codex/gpt-5.6-sol"}]),
    ],
)
def test_parse_targets(arg: str, expected: list[dict[str, object]]) -> None:
    assert parse_targets(arg) == expected


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("nomodel", 'invalid target "nomodel"; use provider/model[:weight]'),
        ("a:3", 'invalid target "a:3"; use provider/model[:weight]'),
        ("/m", 'invalid target "/m"; use provider/model[:weight]'),
        ("a/", 'invalid target "a/"; use provider/model[:weight]'),
        ("a/:3", 'invalid target "a/:3"; use provider/model[:weight]'),
        ("ok/m, bad", 'invalid target "bad"; use provider/model[:weight]'),
        ("a/m:0", "target weight must be 1-10000: a/m:0"),
        ("a/m:10001", "target weight must be 1-10000: a/m:10001"),
        ("a/m:-1", "target weight must be 1-10000: a/m:-1"),
        ("", "--targets requires at least one provider/model"),
        (" , ,", "--targets requires at least one provider/model"),
    ],
)
def test_parse_targets_errors(arg: str, message: str) -> None:
    assert usage_error(parse_targets, arg) == message


def test_targets_required() -> None:
    assert usage_error(parse_targets, None) == "--targets is required"


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("100", 100), (" 7 ", 7)])
def test_sticky_ok(value: str, expected: int) -> None:
    assert parse_sticky(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("101", "--sticky must be <= 100"),
        ("0", c.MSG_STICKY_MIN),
        ("-3", c.MSG_STICKY_MIN),
        ("x", c.MSG_STICKY_MIN),
        ("1.5", c.MSG_STICKY_MIN),
    ],
)
def test_sticky_errors(value: str, message: str) -> None:
    assert usage_error(parse_sticky, value) == message


def test_strategy_and_effort() -> None:
    assert parse_strategy(None) == "failover"
    assert parse_strategy("reset-window") == "reset-window"
    assert usage_error(parse_strategy, "jev") == c.MSG_STRATEGY
    assert parse_effort("-") is None
    assert parse_effort("xhigh") == "xhigh"
    assert usage_error(parse_effort, "turbo") == c.MSG_EFFORT


def test_subcommands_and_remove() -> None:
    assert resolve_subcommand(None) == "list"
    assert [resolve_subcommand(x) for x in ("create", "update", "set")] == ["set"] * 3
    assert resolve_subcommand("delete") == "remove"
    assert usage_error(resolve_subcommand, "frobnicate") == "unknown combo command frobnicate"
    assert usage_error(require_yes, False) == "remove requires --yes"
    require_yes(True)


def test_parse_mode() -> None:
    assert parse_mode("auto") == {"override": None}
    assert parse_mode("pin", " a/qwen3:4b ") == {"override": {"target": "a/qwen3:4b"}}
    assert usage_error(parse_mode, "pin") == c.MSG_MODE
    assert usage_error(parse_mode, "pin", "a/m:2") == c.MSG_MODE
    assert usage_error(parse_mode, "manual", "a/m") == c.MSG_MODE


def test_build_set_request_minimal() -> None:
    assert build_set_request("main", targets="a/m1,b/m2:3") == {
        "id": "main",
        "combo": {
            "targets": [
                {"provider": "a", "model": "m1"},
                {"provider": "b", "model": "m2", "weight": 3},
            ],
            "strategy": "failover",
        },
    }


def test_build_set_request_flags() -> None:
    req = build_set_request(
        " nova ",
        targets="Nova1/codex/gpt-5.6-sol",
        strategy="round-robin",
        sticky="4",
        effort="-",
        alias="gpt-5.6-sol",
        native_alias=True,
        display_name="Nova1 - codex-gpt-5.6-sol",
        rename_from="old",
        current={"imageInput": "disabled", "cooldownMs": 5},
    )
    assert req == {
        "id": "nova",
        "combo": {
            "targets": [{"provider": "Nova1", "model": "codex/gpt-5.6-sol"}],
            "strategy": "round-robin",
            "stickyLimit": 4,
            "defaultEffort": None,
            "alias": "gpt-5.6-sol",
            "nativeAlias": True,
            "displayName": "Nova1 - codex-gpt-5.6-sol",
            "imageInput": "disabled",
        },
        "renameFrom": "old",
    }


def test_build_set_request_clears_and_sticky_only_for_round_robin() -> None:
    req = build_set_request("m", targets="a/m", sticky="5", alias="-", display_name="-")
    assert req["combo"] == {
        "targets": [{"provider": "a", "model": "m"}],
        "strategy": "failover",
        "alias": "",
        "displayName": "",
    }
    assert (
        usage_error(build_set_request, "m", targets="a/m", sticky="101")
        == "--sticky must be <= 100"
    )
    assert usage_error(build_set_request, None, targets="a/m") == "combo id is required"
    assert usage_error(build_set_request, "  ", targets="a/m") == "combo id is required"
    assert usage_error(build_set_request, "m", targets=None) == "--targets is required"
    assert build_set_request("m", targets="a/m", current={"imageInput": "auto"})["combo"] == {
        "targets": [{"provider": "a", "model": "m"}],
        "strategy": "failover",
    }
