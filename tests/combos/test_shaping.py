from __future__ import annotations

import ast
import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from combos import shaping
from combos.shaping import (
    COMPAT_EFFORT,
    COMPAT_IMAGE,
    COMPAT_USER,
    ENCRYPTED_TASK_CODE,
    ENCRYPTED_TASK_JSON,
    SKIP_ENCRYPTED_TASK,
    build_child,
    child_body,
    compat_hop,
    encrypted_task_body,
    encrypted_task_predicate,
    encrypted_task_rejection,
    has_encrypted_agent_task,
    has_image_input,
    image_rejection,
    invalid_request_body,
)
from routing.classify import Failure, classify, failure_from_response
from routing.types import ComboSpec, ModelSpec, ProviderSpec, TargetSpec

LMH = ("low", "medium", "high")
FERNET = "gAAAAAB" + "x1Y_-" * 30  # 157 url-safe base64 characters
IMG = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
TEXT = {"type": "input_text", "text": "hello"}


def _msg(*parts: Mapping[str, Any], role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": list(parts)}


def _provider(
    adapter: str = "openai-responses",
    ladder: tuple[str, ...] | None = LMH,
    *,
    name: str = "p",
    disabled: bool = False,
) -> ProviderSpec:
    return ProviderSpec(
        name=name,
        adapter=adapter,
        base_url="https://up.example/v1",
        disabled=disabled,
        models={"m": ModelSpec(id="m", reasoning_efforts=ladder)},
    )


def _combo(**kwargs: Any) -> ComboSpec:
    return ComboSpec(id="team", targets=(TargetSpec("p", "m"),), **kwargs)


def _child(
    body: Mapping[str, Any],
    *,
    ladder: tuple[str, ...] | None = LMH,
    adapter: str = "openai-responses",
    protocol: str = "responses",
    compat: frozenset[str] = frozenset(),
    **combo: Any,
) -> dict[str, Any]:
    return child_body(
        body,
        combo=_combo(**combo),
        provider=_provider(adapter, ladder),
        model="m",
        protocol=protocol,
        compat=compat,
    )


# ---------------------------------------------------------------------------------------------
# Image detection and imageInput (§5.3)

SCHEMA_TOOL = {
    "type": "function",
    "name": "view_image",
    "parameters": {"type": "object", "properties": {"type": {"const": "input_image"}}},
}


@pytest.mark.parametrize(
    ("body", "protocol", "expected"),
    [
        ({"input": [_msg(TEXT, IMG)]}, "responses", True),
        ({"input": [IMG]}, "responses", True),  # top level of `input`
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": [IMG]}]},
            "responses",
            True,
        ),
        (
            {"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": [IMG]}]},
            "responses",
            True,
        ),
        ({"input": [_msg(TEXT)]}, "responses", False),
        # Image only inside a tool schema is not an image.
        ({"input": [_msg(TEXT)], "tools": [SCHEMA_TOOL]}, "responses", False),
        ({"input": [_msg(TEXT)], "metadata": {"type": "input_image"}}, "responses", False),
        ({"input": 'look at {"type":"input_image"}'}, "responses", False),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "input_image"}]},
            "responses",
            False,
        ),
        ({"instructions": "input_image", "input": []}, "responses", False),
        # Only `input` counts for Responses, only `messages` for Chat.
        ({"messages": [{"role": "user", "content": [IMG]}]}, "responses", False),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://x/i.png"}}],
                    }
                ]
            },
            "chat",
            True,
        ),
        ({"messages": [{"role": "user", "content": "an image_url"}]}, "chat", False),
        (
            {
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "tools": [{"type": "function", "function": SCHEMA_TOOL}],
            },
            "chat",
            False,
        ),
        ({"input": [_msg(IMG)]}, "chat", False),
    ],
)
def test_has_image_input(body: dict[str, Any], protocol: str, expected: bool) -> None:
    assert has_image_input(body, protocol) is expected


def test_image_rejection_only_when_disabled_and_image_present() -> None:
    body = {"input": [_msg(TEXT, IMG)]}
    disabled = _combo(image_input="disabled")
    assert (
        image_rejection(disabled, body, "responses") == 'Combo "team" does not accept image input'
    )
    assert image_rejection(_combo(), body, "responses") is None  # auto blocks nothing
    schema_only = {"input": [_msg(TEXT)], "tools": [SCHEMA_TOOL]}
    assert image_rejection(disabled, schema_only, "responses") is None


def test_invalid_request_body_shape() -> None:
    assert invalid_request_body("nope") == {
        "error": {"type": "invalid_request_error", "code": None, "message": "nope"}
    }


# ---------------------------------------------------------------------------------------------
# Encrypted v2 agent tasks (§3.6)


def _agent(*parts: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "agent_message", "author": "parent", "recipient": "w", "content": list(parts)}


def _enc(value: str) -> dict[str, str]:
    return {"type": "encrypted_content", "encrypted_content": value}


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([_agent(_enc(FERNET))], True),
        ([_msg(TEXT), _agent(_enc(FERNET), _enc(FERNET))], True),
        # A readable text part next to the ciphertext: the worker still has a task.
        ([_agent({"type": "input_text", "text": "do X"}, _enc(FERNET))], False),
        # Plaintext in the ciphertext slot (older Codex builds) is readable.
        ([_agent(_enc("Please refactor module foo"))], False),
        # Too short to be a Fernet token.
        ([_agent(_enc("gAAAAABshort"))], False),
        # Other backend ciphertext is stripped, not a task.
        ([{"type": "reasoning", "summary": [], "encrypted_content": FERNET}], False),
        ([{"type": "compaction", "encrypted_content": FERNET}], False),
        ([], False),
    ],
)
def test_has_encrypted_agent_task(items: list[Any], expected: bool) -> None:
    assert has_encrypted_agent_task({"input": items}) is expected


def test_encrypted_task_body_is_byte_exact() -> None:
    expected = (
        '{"error":{"type":"invalid_request_error","code":"unreadable_encrypted_agent_task",'
        '"message":"Routed V2 worker task is encrypted for the native ChatGPT backend and cannot '
        "be read by the selected provider. Use plaintext V2 agent-message delivery or select a "
        'native ChatGPT model."}}'
    )
    assert ENCRYPTED_TASK_JSON == expected.encode()
    body = encrypted_task_body()
    assert body["error"]["code"] == ENCRYPTED_TASK_CODE
    body["error"]["code"] = "mutated"
    assert encrypted_task_body()["error"]["code"] == ENCRYPTED_TASK_CODE


def test_encrypted_task_predicate_allows_only_enabled_chatgpt() -> None:
    providers = {
        "cg": _provider("chatgpt", name="cg"),
        "cgoff": _provider("chatgpt", name="cgoff", disabled=True),
        "oa": _provider("openai-responses", name="oa"),
        "an": _provider("anthropic", name="an"),
    }
    allowed = encrypted_task_predicate(providers)
    assert allowed(TargetSpec("cg", "m")) is None
    assert allowed(TargetSpec("cgoff", "m")) == SKIP_ENCRYPTED_TASK
    assert allowed(TargetSpec("oa", "m")) == SKIP_ENCRYPTED_TASK
    assert allowed(TargetSpec("an", "m")) == SKIP_ENCRYPTED_TASK
    assert allowed(TargetSpec("missing", "m")) == SKIP_ENCRYPTED_TASK


def test_encrypted_task_rejection_before_dispatch() -> None:
    providers = {"cg": _provider("chatgpt", name="cg"), "an": _provider("anthropic", name="an")}
    encrypted = {"input": [_agent(_enc(FERNET))]}
    plain = {"input": [_agent({"type": "input_text", "text": "task"})]}
    no_chatgpt = ComboSpec(id="c", targets=(TargetSpec("an", "m"),))
    mixed = ComboSpec(id="c", targets=(TargetSpec("an", "m"), TargetSpec("cg", "m")))
    assert encrypted_task_rejection(no_chatgpt, providers, encrypted) == json.loads(
        ENCRYPTED_TASK_JSON
    )
    assert encrypted_task_rejection(mixed, providers, encrypted) is None
    assert encrypted_task_rejection(no_chatgpt, providers, plain) is None


# ---------------------------------------------------------------------------------------------
# Child body (§5.2)


def test_child_body_sets_model_and_never_mutates_the_original() -> None:
    body = {
        "model": "combo/team",
        "input": [_msg(TEXT), {"type": "reasoning", "summary": [], "encrypted_content": FERNET}],
        "reasoning": {"summary": "concise"},
        "user": "u1",
    }
    original = copy.deepcopy(body)
    out = _child(body, adapter="anthropic", default_effort="max", compat=frozenset({COMPAT_USER}))
    assert out["model"] == "m"
    assert out["reasoning"] == {"summary": "concise", "effort": "high"}
    assert "user" not in out
    assert "encrypted_content" not in out["input"][1]
    assert body == original
    out["input"][0]["content"].append(IMG)
    assert body == original  # deep copy: nested lists are not shared


def test_child_body_copies_every_nested_container_and_keeps_other_values() -> None:
    # The copy walks dicts and lists itself (`copy.deepcopy` was 410 µs of a Codex turn's
    # attempt); a value JSON does not produce is still copied deeply, keeping its type.
    marker = ("a", ["b"])
    body: dict[str, Any] = {
        "model": "combo/team",
        "input": [{"type": "message", "content": [{"type": "input_text", "text": "x"}]}],
        "metadata": {"nested": {"deeper": [1, 2.5, True, None]}},
        "odd": marker,
    }
    original = copy.deepcopy(body)
    out = _child(body, adapter="openai-responses")
    assert out == {**original, "model": "m"}
    out["input"][0]["content"][0]["text"] = "changed"
    out["metadata"]["nested"]["deeper"].append("more")
    assert body == original
    assert out["odd"] == marker and out["odd"].__class__ is tuple
    assert out["odd"] is not marker and out["odd"][1] is not marker[1]


@pytest.mark.parametrize(
    ("reasoning", "ladder", "combo", "expected"),
    [
        # Fallback: `max` on [low, medium, high] → high, injected with summary auto.
        (None, LMH, {"default_effort": "max"}, {"effort": "high", "summary": "auto"}),
        (
            {"summary": "concise"},
            LMH,
            {"default_effort": "max"},
            {"summary": "concise", "effort": "high"},
        ),
        ({"effort": "low"}, LMH, {"default_effort": "max"}, {"effort": "low"}),  # caller wins
        (None, ("high", "max"), {"default_effort": "low"}, {"effort": "high", "summary": "auto"}),
        # Force: medium becomes max on [low, high, max] and high on [low, high].
        (
            {"effort": "medium"},
            ("low", "high", "max"),
            {"default_effort": "max", "default_effort_mode": "force"},
            {"effort": "max"},
        ),
        (
            {"effort": "medium", "summary": "auto"},
            ("low", "high"),
            {"default_effort": "max", "default_effort_mode": "force"},
            {"effort": "high", "summary": "auto"},
        ),
        (  # malformed caller effort is not repaired
            {"effort": "banana"},
            LMH,
            {"default_effort": "max", "default_effort_mode": "force"},
            {"effort": "banana"},
        ),
        # Known non-empty ladder keeps the caller's effort as sent.
        ({"effort": "xhigh"}, ("low", "medium", "high", "xhigh"), {}, {"effort": "xhigh"}),
        ({"effort": "xhigh"}, LMH, {}, {"effort": "xhigh"}),
        # Empty ladder keeps reasoning.summary only.
        ({"effort": "xhigh", "summary": "concise"}, (), {}, {"summary": "concise"}),
        (
            {"effort": "xhigh", "summary": "concise"},
            (),
            {"default_effort": "max"},
            {"summary": "concise"},
        ),
        # Unknown ladder: strict never injects and keeps the caller's controls.
        (None, None, {"default_effort": "max"}, None),
        ({"effort": "xhigh"}, None, {"default_effort": "max"}, {"effort": "xhigh"}),
        # Unknown ladder in adaptive mode strips like an empty ladder.
        (
            {"effort": "xhigh", "summary": "auto"},
            None,
            {"reasoning_effort_mode": "adaptive"},
            {"summary": "auto"},
        ),
    ],
)
def test_child_body_effort_rules(
    reasoning: dict[str, Any] | None,
    ladder: tuple[str, ...] | None,
    combo: dict[str, Any],
    expected: dict[str, Any] | None,
) -> None:
    body: dict[str, Any] = {"model": "combo/team", "input": []}
    if reasoning is not None:
        body["reasoning"] = reasoning
    out = _child(body, ladder=ladder, **combo)
    assert out.get("reasoning") == expected


@pytest.mark.parametrize(
    ("reasoning", "expected"),
    [
        (None, {"reasoning": None}),  # reasoning: null stays null
        ({"effort": ""}, {}),
        ({"effort": "banana"}, {}),
        ({"effort": None}, {}),
    ],
)
def test_empty_ladder_edge_cases(reasoning: Any, expected: dict[str, Any]) -> None:
    out = _child({"input": [], "reasoning": reasoning}, ladder=())
    assert {k: v for k, v in out.items() if k == "reasoning"} == expected


def test_empty_ladder_strips_all_effort_and_thinking_controls() -> None:
    body = {
        "input": [],
        "reasoning": {"effort": "high", "summary": "concise"},
        "reasoning_effort": "high",
        "thinking_budget": 4096,
        "thinking": {"type": "enabled"},
    }
    out = _child(body, ladder=())
    assert out == {"input": [], "model": "m", "reasoning": {"summary": "concise"}}


def test_unknown_model_means_unknown_ladder() -> None:
    combo = _combo(default_effort="max")
    out = child_body(
        {"input": []}, combo=combo, provider=_provider(), model="other", protocol="responses"
    )
    assert out == {"input": [], "model": "other"}


def test_chat_protocol_uses_top_level_reasoning_effort() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    out = _child(body, protocol="chat", default_effort="max")
    assert out["reasoning_effort"] == "high"
    assert "reasoning" not in out


def test_build_child_reports_skipped_default() -> None:
    result = build_child(
        {"input": []},
        combo=_combo(default_effort="high"),
        provider=_provider(ladder=()),
        model="m",
    )
    assert (result.action, result.effort, result.skipped_default) == (
        "stripped",
        None,
        "unsupported",
    )


def test_force_without_valid_default_raises() -> None:
    with pytest.raises(ValueError, match="requires a valid defaultEffort"):
        _child({"input": [], "reasoning": {"effort": "low"}}, default_effort_mode="force")


CIPHER_INPUT: list[dict[str, Any]] = [
    _msg(TEXT),
    {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "s"}],
        "encrypted_content": FERNET,
    },
    {"type": "compaction", "encrypted_content": FERNET},
    {
        "type": "function_call",
        "name": "f",
        "arguments": "{}",
        "call_id": "c1",
        "encrypted_function_args": [FERNET],
    },
]


@pytest.mark.parametrize("adapter", ["anthropic", "openai-chat"])
def test_ciphertext_stripped_for_non_openai_targets(adapter: str) -> None:
    out = _child({"input": CIPHER_INPUT}, adapter=adapter)
    assert out["input"] == [
        _msg(TEXT),
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"},
    ]


@pytest.mark.parametrize("adapter", ["openai-responses", "chatgpt"])
def test_ciphertext_kept_for_openai_targets(adapter: str) -> None:
    out = _child({"input": CIPHER_INPUT}, adapter=adapter)
    assert out["input"] == CIPHER_INPUT


def test_plaintext_task_in_ciphertext_slot_is_rescued_for_other_targets() -> None:
    body = {"input": [_agent(_enc("Refactor foo"), _enc(FERNET))]}
    out = _child(body, adapter="anthropic")
    assert out["input"][0]["content"] == [{"type": "input_text", "text": "Refactor foo"}]
    assert _child(body, adapter="chatgpt")["input"] == body["input"]


def test_user_field_compat_and_chatgpt_preventive_removal() -> None:
    body = {"input": [], "user": "claude-code-session"}
    assert _child(body)["user"] == "claude-code-session"  # public Responses API keeps it
    assert "user" not in _child(body, compat=frozenset({COMPAT_USER}))
    assert "user" not in _child(body, adapter="chatgpt")


def test_effort_and_image_compat_flags_do_not_rewrite_the_request() -> None:
    # §5.1: the effort is never rewritten; the next target receives the same request.
    body = {"input": [_msg(TEXT, IMG)], "reasoning": {"effort": "none"}}
    out = _child(body, ladder=("none", *LMH), compat=frozenset({COMPAT_EFFORT, COMPAT_IMAGE}))
    assert out["reasoning"] == {"effort": "none"}
    assert out["input"] == body["input"]


# ---------------------------------------------------------------------------------------------
# Request-local compatibility hops (§5.1)

USER_MSG = "Unsupported parameter: user"
EFFORT_MSG = "Unsupported value: 'none' is not supported with the 'gpt-5.5' model."
IMAGE_MSG = "Model 'gpt-5.3-codex-spark' does not support image inputs."
SENT = {
    "input": [_msg(TEXT, IMG)],
    "reasoning": {"effort": "none"},
    "user": "u1",
}


def _err(
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    etype: str = "invalid_request_error",
    status: int = 400,
) -> Failure:
    err: dict[str, Any] = {"message": message, "type": etype, "param": param, "code": code}
    return failure_from_response(status, {}, json.dumps({"error": err}).encode())


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (_err(USER_MSG, param="user"), COMPAT_USER),
        (_err(USER_MSG), COMPAT_USER),
        (_err(USER_MSG, code="unsupported_parameter", param="user"), COMPAT_USER),
        (_err(EFFORT_MSG, code="unsupported_value", param="reasoning.effort"), COMPAT_EFFORT),
        (_err(EFFORT_MSG, code="unsupported_value", param="reasoning_effort"), COMPAT_EFFORT),
        (_err(IMAGE_MSG, param="input"), COMPAT_IMAGE),
        (_err(IMAGE_MSG, code="invalid_request_error", param="input"), COMPAT_IMAGE),
        # Wrapped once by a proxy, body not parsed: still an intact envelope.
        (
            Failure(
                status=400,
                message="Provider error 400: "
                + json.dumps({"error": {"message": USER_MSG, "type": "invalid_request_error"}}),
            ),
            COMPAT_USER,
        ),
    ],
)
def test_compat_hop_recognises_rejections(failure: Failure, expected: str) -> None:
    assert compat_hop(failure, SENT) == expected
    decision = classify(failure)
    assert decision.hop and decision.request_local
    assert decision.scope == "none" and not decision.cool  # never cools the target


@pytest.mark.parametrize(
    "failure",
    [
        _err(USER_MSG, code="unsupported_value", param="user"),  # wrong code for `user`
        _err(USER_MSG, param="metadata"),
        _err("Your prompt said: Unsupported parameter: user", param="user"),  # echoed text
        _err(USER_MSG, param="user", status=500),
        _err(USER_MSG, param="user", etype="server_error"),
        _err(EFFORT_MSG, code="invalid_request_error", param="reasoning.effort"),
        _err(EFFORT_MSG, code="unsupported_value", param="model"),
        _err(
            "Unsupported value: 'none' for reasoning.effort",
            code="unsupported_value",
            param="reasoning.effort",
        ),
        _err(IMAGE_MSG, param="messages"),
        _err(IMAGE_MSG, code="unsupported_value", param="input"),
        _err("Model 'it's' does not support image inputs.", param="input"),
        _err(USER_MSG + " " + "x" * 16_384, param="user"),  # oversized envelope message
    ],
)
def test_compat_hop_strict_envelope(failure: Failure) -> None:
    assert compat_hop(failure, SENT) is None


def test_compat_hop_needs_the_field_in_the_sent_body() -> None:
    plain = {"input": [_msg(TEXT)]}
    assert compat_hop(_err(USER_MSG, param="user"), plain) is None
    assert (
        compat_hop(_err(EFFORT_MSG, code="unsupported_value", param="reasoning_effort"), plain)
        is None
    )
    assert compat_hop(_err(IMAGE_MSG, param="input"), plain) is None
    chat = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert compat_hop(_err(IMAGE_MSG, param="input"), chat, protocol="chat") == COMPAT_IMAGE
    assert (
        compat_hop(
            _err(EFFORT_MSG, code="unsupported_value", param="reasoning_effort"),
            {"messages": [], "reasoning_effort": "none"},
            protocol="chat",
        )
        == COMPAT_EFFORT
    )


def test_module_is_framework_free() -> None:
    tree = ast.parse(Path(shaping.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not any(name.split(".")[0] in {"django", "ninja", "channels"} for name in imported)
