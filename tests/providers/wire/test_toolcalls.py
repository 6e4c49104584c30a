"""Undeclared tool calls (PRODUCT §5.4): declared names per protocol and the calls found in
stream frames and whole answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from providers.wire.chat import ChatToResponsesStream
from providers.wire.sse import SSEParser
from providers.wire.toolcalls import (
    ToolProtocol,
    declared_tools,
    undeclared_at,
    undeclared_in_answer,
    undeclared_in_frame,
)


def frame(payload: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"{head}data: {data}\n\n".encode()


def events(*frames: bytes) -> tuple[Any, ...]:
    return tuple(SSEParser().feed(b"".join(frames)))


RESPONSES_BODY = {
    "tools": [
        {"type": "function", "name": "current_tool", "parameters": {}},
        {"type": "custom", "name": "apply_patch"},
        {"type": "web_search"},
        {"type": "namespace", "name": "mcp", "tools": [{"type": "function", "name": "inner"}]},
    ]
}
CHAT_BODY = {
    "tools": [{"type": "function", "function": {"name": "current_tool", "parameters": {}}}],
    "functions": [{"name": "legacy_fn"}],
}
ANTHROPIC_BODY = {"tools": [{"name": "current_tool", "input_schema": {}}]}


def test_declared_tools_per_protocol() -> None:
    assert declared_tools("responses", RESPONSES_BODY) == {
        "current_tool",
        "apply_patch",
        "mcp",
        "inner",
    }
    assert declared_tools("chat", CHAT_BODY) == {"current_tool", "legacy_fn"}
    assert declared_tools("anthropic", ANTHROPIC_BODY) == {"current_tool"}
    assert declared_tools("chat", {}) == frozenset()  # no tools: every call is undeclared


@pytest.mark.parametrize(
    "body",
    [
        {"tools": [{"type": "tool_search"}]},
        {"tools": [], "input": [{"type": "additional_tools", "tools": []}]},
        {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "tool_search"}]}]},
    ],
)
def test_dynamic_tools_turn_the_check_off(body: dict[str, Any]) -> None:
    assert declared_tools("responses", body) is None
    call = frame({"type": "response.output_item.added", "item": {"type": "function_call"}})
    assert undeclared_at("responses", events(call), None) is None


def responses_call(name: str, kind: str = "function_call") -> bytes:
    item = {"type": kind, "id": "fc_1", "call_id": "c1", "name": name, "arguments": ""}
    etype = "response.output_item.added"
    return frame({"type": etype, "output_index": 0, "item": item}, etype)


def chat_call(name: str) -> bytes:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name}}
    delta = {"role": "assistant", "content": None, "tool_calls": [call]}
    return frame({"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


def chat_args(args: str) -> bytes:
    call = {"index": 0, "function": {"arguments": args}}
    delta = {"tool_calls": [call]}
    return frame({"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


def anthropic_call(name: str) -> bytes:
    block = {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}
    payload = {"type": "content_block_start", "index": 0, "content_block": block}
    return frame(payload, "content_block_start")


@pytest.mark.parametrize(
    ("protocol", "make"),
    [("responses", responses_call), ("chat", chat_call), ("anthropic", anthropic_call)],
)
def test_frame_calls(protocol: ToolProtocol, make: Any) -> None:
    declared = frozenset({"current_tool"})
    (ok,) = events(make("current_tool"))
    (stale,) = events(make("stale_tool"))
    assert undeclared_in_frame(protocol, ok, declared) is None
    assert undeclared_in_frame(protocol, stale, declared) == "stale_tool"
    assert undeclared_in_frame(protocol, stale, None) is None


def test_undeclared_at_gives_the_frame_index() -> None:
    text = frame({"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    batch = events(text, chat_call("current_tool"), chat_args("{}"), chat_call("stale_tool"))
    assert undeclared_at("chat", batch, frozenset({"current_tool"})) == (3, "stale_tool")
    # Argument deltas carry no name: they never count as a call.
    assert undeclared_at("chat", events(chat_args('{"name": 1}')), frozenset()) is None


def test_responses_frames_that_carry_whole_output() -> None:
    declared = frozenset({"current_tool"})
    item = {"type": "custom_tool_call", "name": "stale_tool", "input": ""}
    done = frame({"type": "response.output_item.done", "item": item})
    completed = frame({"type": "response.completed", "response": {"output": [item]}})
    message = frame({"type": "response.output_item.added", "item": {"type": "message"}})
    assert undeclared_at("responses", events(done), declared) == (0, "stale_tool")
    assert undeclared_at("responses", events(completed), declared) == (0, "stale_tool")
    assert undeclared_at("responses", events(message, frame("{not json")), declared) is None


def test_whole_answers() -> None:
    declared = frozenset({"current_tool"})
    responses = {"output": [{"type": "message"}, {"type": "function_call", "name": "stale"}]}
    chat = {
        "choices": [{"message": {"content": "x", "tool_calls": [{"function": {"name": "stale"}}]}}]
    }
    anthropic = {"content": [{"type": "text"}, {"type": "tool_use", "name": "stale"}]}
    assert undeclared_in_answer("responses", responses, declared) == "stale"
    assert undeclared_in_answer("chat", chat, declared) == "stale"
    assert undeclared_in_answer("anthropic", anthropic, declared) == "stale"
    assert undeclared_in_answer("chat", chat, frozenset({"stale"})) is None
    assert undeclared_in_answer("responses", {"output": [{"type": "message"}]}, declared) is None


def test_chat_to_responses_completes_without_done() -> None:
    # A Chat stream that sent finish_reason and usage, then ended with no `[DONE]`.
    t = ChatToResponsesStream(response_id="resp_1", model="m", created_at=1)
    out = t.start()
    for e in events(
        frame({"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
        frame({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        frame({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
    ):
        out += t.feed_event(e)
    out += t.close()
    parsed = [e.json() for e in SSEParser().feed(out)]
    assert parsed[-1]["type"] == "response.completed"
    assert parsed[-1]["response"]["usage"]["input_tokens"] == 3
    assert parsed[-1]["response"]["usage"]["output_tokens"] == 1


def test_chat_to_responses_without_finish_still_fails() -> None:
    t = ChatToResponsesStream(response_id="resp_1", model="m", created_at=1)
    out = t.start()
    (e,) = events(frame({"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}))
    out += t.feed_event(e) + t.close()
    parsed = [e.json() for e in SSEParser().feed(out)]
    assert parsed[-1]["type"] == "response.failed"
