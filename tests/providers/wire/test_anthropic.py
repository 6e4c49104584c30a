from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers.wire.anthropic import (
    DEFAULT_EFFORT_BUDGETS,
    AnthropicCommitScanner,
    MessagesToChatStream,
    MessagesToResponsesStream,
    anthropic_error_to_openai,
    anthropic_stream_failure,
    anthropic_usage_to_responses,
    chat_request_to_messages,
    classify_anthropic_event,
    messages_response_to_chat,
    messages_response_to_responses,
    responses_request_to_messages,
    strip_backend_ciphertext,
    thinking_budget,
)
from providers.wire.commit import EndState, Phase
from providers.wire.sse import SSEEvent, SSEParser, encode_json_event

RID = "resp_abc"
MODEL = "claude-sonnet-4-5"


def frame(payload: dict[str, Any]) -> bytes:
    return encode_json_event(str(payload["type"]), payload)


def ev(payload: dict[str, Any]) -> SSEEvent:
    events = SSEParser().feed(frame(payload))
    assert len(events) == 1
    return events[0]


def message_start(**usage: int) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "usage": {
                "input_tokens": 2100,
                "cache_creation_input_tokens": 100,
                "cache_read_input_tokens": 12000,
                "output_tokens": 1,
                **usage,
            },
        },
    }


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, d: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": d}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(reason: str, output_tokens: int) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


MESSAGE_STOP = {"type": "message_stop"}
PING = {"type": "ping"}

TEXT_STREAM = [
    message_start(),
    PING,
    block_start(0, {"type": "text", "text": ""}),
    delta(0, {"type": "text_delta", "text": "Hello"}),
    delta(0, {"type": "text_delta", "text": " world"}),
    stop(0),
    message_delta("end_turn", 7),
    MESSAGE_STOP,
]

TOOL_STREAM = [
    message_start(),
    block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, {"type": "thinking_delta", "thinking": "Look at tests"}),
    delta(0, {"type": "signature_delta", "signature": "EqQBCkY"}),
    stop(0),
    block_start(1, {"type": "text", "text": ""}),
    delta(1, {"type": "text_delta", "text": "Running."}),
    stop(1),
    block_start(2, {"type": "tool_use", "id": "toolu_01", "name": "shell_command", "input": {}}),
    delta(2, {"type": "input_json_delta", "partial_json": ""}),
    delta(2, {"type": "input_json_delta", "partial_json": '{"command": "py'}),
    delta(2, {"type": "input_json_delta", "partial_json": "test"}),
    delta(2, {"type": "input_json_delta", "partial_json": ' -q"}'}),
    stop(2),
    message_delta("tool_use", 412),
    MESSAGE_STOP,
]


def stream_bytes(payloads: list[dict[str, Any]]) -> bytes:
    return b"".join(frame(p) for p in payloads)


def translate(payloads: list[dict[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    t = MessagesToResponsesStream(RID, MODEL, 1767225600, **kw)
    out = b"".join(t.feed_event(e) for e in SSEParser().feed(stream_bytes(payloads)))
    out += t.close()
    return decode(out)


def decode(data: bytes) -> list[dict[str, Any]]:
    events = SSEParser().feed(data)
    payloads = [e.json() for e in events]
    for e, p in zip(events, payloads, strict=True):
        assert e.event == p["type"]
    return payloads


# ---------------------------------------------------------------------------------------------
# Stream → Responses


def test_text_stream_exact_sequence() -> None:
    out = translate(TEXT_STREAM)
    assert [p["type"] for p in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [p["sequence_number"] for p in out] == list(range(10))
    assert [p["delta"] for p in out if p["type"] == "response.output_text.delta"] == [
        "Hello",
        " world",
    ]
    done = out[8]["item"]
    assert done == {
        "type": "message",
        "id": "msg_abc_0",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Hello world", "annotations": []}],
    }
    resp = out[-1]["response"]
    assert resp["id"] == RID and resp["status"] == "completed"
    assert resp["output"] == [done]
    assert resp["usage"] == {
        "input_tokens": 14200,
        "input_tokens_details": {"cached_tokens": 12000},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 14207,
    }


def test_tool_stream_exact_sequence() -> None:
    out = translate(TOOL_STREAM)
    assert [p["type"] for p in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # function_call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    dones = [p["item"] for p in out if p["type"] == "response.output_item.done"]
    assert dones[0] == {
        "type": "reasoning",
        "id": "rs_abc_0",
        "summary": [{"type": "summary_text", "text": "Look at tests"}],
    }
    assert "EqQBCkY" not in json.dumps(out)  # the signature never reaches the client
    assert dones[2] == {
        "type": "function_call",
        "id": "fc_abc_2",
        "call_id": "toolu_01",
        "name": "shell_command",
        "arguments": '{"command": "pytest -q"}',
        "status": "completed",
    }
    completed = out[-1]["response"]
    assert completed["id"] == RID
    assert completed["output"] == dones
    assert completed["usage"]["output_tokens"] == 412
    assert completed["usage"]["input_tokens"] == 14200


def test_tool_without_streamed_input_gets_start_input_or_empty_object() -> None:
    payloads = [
        message_start(),
        block_start(0, {"type": "tool_use", "id": "toolu_a", "name": "list", "input": {}}),
        stop(0),
        block_start(1, {"type": "tool_use", "id": "toolu_b", "name": "x", "input": {"k": 1}}),
        stop(1),
        message_delta("tool_use", 5),
        MESSAGE_STOP,
    ]
    out = translate(payloads)
    dones = [p["item"] for p in out if p["type"] == "response.output_item.done"]
    assert [d["arguments"] for d in dones] == ["{}", '{"k": 1}']


def test_custom_tool_stream_becomes_custom_tool_call() -> None:
    payloads = [
        message_start(),
        block_start(0, {"type": "tool_use", "id": "toolu_p", "name": "apply_patch", "input": {}}),
        delta(0, {"type": "input_json_delta", "partial_json": '{"input": "*** Begin'}),
        delta(0, {"type": "input_json_delta", "partial_json": ' Patch"}'}),
        stop(0),
        message_delta("tool_use", 5),
        MESSAGE_STOP,
    ]
    out = translate(payloads, custom_tools=frozenset({"apply_patch"}))
    done = [p["item"] for p in out if p["type"] == "response.output_item.done"][0]
    assert done["type"] == "custom_tool_call"
    assert done["input"] == "*** Begin Patch"


@pytest.mark.parametrize(
    ("stop_reason", "status", "details"),
    [
        ("end_turn", "completed", None),
        ("tool_use", "completed", None),
        ("stop_sequence", "completed", None),
        ("pause_turn", "completed", None),
        ("max_tokens", "incomplete", {"reason": "max_output_tokens"}),
        ("model_context_window_exceeded", "incomplete", {"reason": "max_output_tokens"}),
        ("refusal", "incomplete", {"reason": "content_filter"}),
    ],
)
def test_stop_reasons(stop_reason: str, status: str, details: dict[str, str] | None) -> None:
    payloads = [*TEXT_STREAM[:-2], message_delta(stop_reason, 3), MESSAGE_STOP]
    out = translate(payloads)
    # Even a truncation ends with response.completed: response.incomplete makes Codex re-send.
    assert out[-1]["type"] == "response.completed"
    assert out[-1]["response"]["status"] == status
    assert out[-1]["response"].get("incomplete_details") == details
    resp = messages_response_to_responses(
        {"content": [{"type": "text", "text": "x"}], "stop_reason": stop_reason, "usage": {}},
        response_id=RID,
        created_at=1,
        model=MODEL,
    )
    assert resp["status"] == status
    assert resp.get("incomplete_details") == details


def test_post_output_error_event_gives_response_failed() -> None:
    payloads = [
        *TEXT_STREAM[:4],
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ]
    out = translate(payloads)
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["id"] == RID
    assert out[-1]["response"]["error"] == {
        "code": "overloaded_error",
        "message": "Overloaded",
        "type": "overloaded_error",
    }
    assert not any(p["type"] == "response.completed" for p in out)


def test_early_end_and_malformed_data_give_response_failed() -> None:
    out = translate(TEXT_STREAM[:5])  # no message_stop
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["error"]["code"] == "upstream_stream_truncated"
    t = MessagesToResponsesStream(RID, MODEL, 1)
    data = t.feed_event(ev(message_start()))
    data += t.feed_event(SSEParser().feed(b"event: content_block_delta\ndata: {oops\n\n")[0])
    assert decode(data)[-1]["type"] == "response.failed"
    assert t.finished and t.close() == b""


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces: list[bytes] = []
    last = 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=25))
def test_split_stream_gives_identical_output(cuts: list[int]) -> None:
    data = stream_bytes(TOOL_STREAM).replace(b"\n", b"\r\n")
    expected = translate(TOOL_STREAM)
    t = MessagesToResponsesStream(RID, MODEL, 1767225600)
    parser = SSEParser()
    out = b""
    for piece in chunked(data, cuts):
        for e in parser.feed(piece):
            out += t.feed_event(e)
    for e in parser.finish():
        out += t.feed_event(e)
    out += t.close()
    assert decode(out) == expected


# ---------------------------------------------------------------------------------------------
# Commit rule


@pytest.mark.parametrize(
    ("payload", "cls"),
    [
        (message_start(), "control"),
        (PING, "control"),
        (block_start(0, {"type": "text", "text": ""}), "control"),
        (block_start(0, {"type": "thinking", "thinking": ""}), "control"),
        (block_start(0, {"type": "tool_use", "id": "t", "name": "n", "input": {}}), "output"),
        (delta(0, {"type": "text_delta", "text": "a"}), "output"),
        (delta(0, {"type": "input_json_delta", "partial_json": "{"}), "output"),
        (stop(0), "control"),
        (message_delta("end_turn", 1), "control"),
        (MESSAGE_STOP, "completed"),
        ({"type": "error", "error": {"type": "api_error", "message": "x"}}, "failure"),
        ({"type": "some_future_event"}, "control"),
    ],
)
def test_classify_anthropic_event(payload: dict[str, Any], cls: str) -> None:
    assert classify_anthropic_event(ev(payload)) == cls


def test_classify_comment_and_malformed() -> None:
    assert classify_anthropic_event(SSEParser().feed(b": keep-alive\n\n")[0]) == "control"
    assert classify_anthropic_event(SSEParser().feed(b"data: {nope\n\n")[0]) == "failure"


@pytest.mark.parametrize(
    ("etype", "status"),
    [
        ("overloaded_error", 529),
        ("rate_limit_error", 429),
        ("api_error", 500),
        ("invalid_request_error", 400),
        ("authentication_error", 401),
        ("permission_error", 403),
        ("not_found_error", 404),
        ("request_too_large", 413),
        ("mystery_error", 502),
    ],
)
def test_anthropic_stream_failure_status(etype: str, status: int) -> None:
    failure = anthropic_stream_failure(
        ev({"type": "error", "error": {"type": etype, "message": "m"}})
    )
    assert failure.status == status
    assert failure.code == etype
    assert failure.message == "m"


def test_scanner_pre_output_overloaded_fails_with_529() -> None:
    scanner = AnthropicCommitScanner()
    assert scanner.feed(frame(message_start())).phase is Phase.BUFFERING
    assert scanner.feed(frame(PING)).phase is Phase.BUFFERING
    assert (
        scanner.feed(frame(block_start(0, {"type": "text", "text": ""}))).phase is Phase.BUFFERING
    )
    err = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    decision = scanner.feed(frame(err))
    assert decision.phase is Phase.FAILED
    assert decision.failure is not None
    assert decision.failure.status == 529
    assert decision.failure.code == "overloaded_error"
    assert scanner.failure == decision.failure


def test_scanner_commits_on_first_delta_and_tracks_clean_end() -> None:
    scanner = AnthropicCommitScanner()
    payloads = TEXT_STREAM
    phases = [scanner.feed(frame(p)).phase for p in payloads]
    assert phases[:3] == [Phase.BUFFERING] * 3
    assert phases[3:] == [Phase.COMMITTED] * (len(payloads) - 3)
    assert len(scanner.buffered()) == 4
    assert [classify_anthropic_event(e) for e in scanner.buffered_events()][-1] == "output"
    assert scanner.finish().phase is Phase.COMMITTED
    assert scanner.end_state() is EndState.COMPLETED
    assert scanner.failure is None


def test_scanner_post_commit_error_and_truncation() -> None:
    scanner = AnthropicCommitScanner()
    for p in TEXT_STREAM[:4]:
        scanner.feed(frame(p))
    scanner.feed(frame({"type": "error", "error": {"type": "api_error", "message": "boom"}}))
    scanner.finish()
    assert scanner.end_state() is EndState.FAILED
    assert scanner.failure is not None and scanner.failure.status == 500

    cut = AnthropicCommitScanner()
    for p in TEXT_STREAM[:5]:
        cut.feed(frame(p))
    assert cut.finish().phase is Phase.COMMITTED
    assert cut.end_state() is EndState.TRUNCATED


def test_scanner_end_without_output_fails_and_buffer_cap_commits() -> None:
    scanner = AnthropicCommitScanner()
    scanner.feed(frame(message_start()))
    decision = scanner.finish()
    assert decision.phase is Phase.FAILED
    assert decision.failure is not None and decision.failure.status == 502

    capped = AnthropicCommitScanner(max_chunks=2)
    assert capped.feed(frame(PING)).phase is Phase.BUFFERING
    assert capped.feed(frame(PING)).phase is Phase.BUFFERING
    assert capped.feed(frame(PING)).phase is Phase.COMMITTED


def test_scanner_empty_answer_commits_at_message_stop() -> None:
    scanner = AnthropicCommitScanner()
    for p in (message_start(), message_delta("end_turn", 1)):
        assert scanner.feed(frame(p)).phase is Phase.BUFFERING
    assert scanner.feed(frame(MESSAGE_STOP)).phase is Phase.COMMITTED
    assert scanner.end_state() is EndState.COMPLETED


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {"type": "overloaded_error", "code": "overloaded_error", "message": "Overloaded"},
        ),
        (
            429,
            b'{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}',
            {"type": "rate_limit_error", "code": "rate_limit_error", "message": "slow"},
        ),
        (
            400,
            '{"type":"error","error":{"type":"invalid_request_error",'
            '"message":"prompt is too long: 210000 tokens > 200000 maximum"}}',
            {
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
                "message": "prompt is too long: 210000 tokens > 200000 maximum "
                "(exceeds the context window)",
            },
        ),
        (
            529,
            b"<html>bad gateway</html>",
            {
                "type": "overloaded_error",
                "code": "overloaded_error",
                "message": "<html>bad gateway</html>",
            },
        ),
        (
            503,
            b"",
            {"type": "api_error", "code": "api_error", "message": "Provider error 503"},
        ),
    ],
)
def test_anthropic_error_to_openai(status: int, body: Any, expected: dict[str, str]) -> None:
    assert anthropic_error_to_openai(status, body) == {"error": expected}


# ---------------------------------------------------------------------------------------------
# Request translation


def test_multi_turn_history_with_tools_alternates_roles() -> None:
    body = {
        "model": "ocx-combo",
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "P"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ctx"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix"}]},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "t"}],
                "encrypted_content": "gAAAAABsecret",
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Running."}],
            },
            {"type": "function_call", "name": "sh", "arguments": '{"cmd":"ls"}', "call_id": "c1"},
            {"type": "function_call", "name": "sh", "arguments": "", "call_id": "c.2"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
            {"type": "function_call_output", "call_id": "c.2", "output": "b.py"},
            {"type": "custom_tool_call", "name": "apply_patch", "input": "*** P", "call_id": "c3"},
            {"type": "custom_tool_call_output", "call_id": "c3", "output": "ok"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go"}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "sh",
                "description": "Run",
                "parameters": {"type": "object"},
            },
            {"type": "custom", "name": "apply_patch", "description": "Patch"},
            {"type": "web_search"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "stream": True,
    }
    out = responses_request_to_messages(body, model=MODEL, cache_control=False)
    assert out["model"] == MODEL
    assert out["stream"] is True
    assert out["max_tokens"] == 8192
    assert out["system"] == [
        {"type": "text", "text": "You are Codex."},
        {"type": "text", "text": "P"},
    ]
    assert out["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "ctx"}, {"type": "text", "text": "Fix"}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Running."},
                {"type": "tool_use", "id": "c1", "name": "sh", "input": {"cmd": "ls"}},
                {"type": "tool_use", "id": "c_2", "name": "sh", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "a.py"},
                {"type": "tool_result", "tool_use_id": "c_2", "content": "b.py"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "c3", "name": "apply_patch", "input": {"input": "*** P"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c3", "content": "ok"},
                {"type": "text", "text": "Go"},
            ],
        },
    ]
    roles = [m["role"] for m in out["messages"]]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))
    assert [t["name"] for t in out["tools"]] == ["sh", "apply_patch"]
    assert out["tools"][0] == {
        "name": "sh",
        "description": "Run",
        "input_schema": {"type": "object"},
    }
    assert out["tools"][1]["input_schema"]["required"] == ["input"]
    assert out["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert "gAAAA" not in json.dumps(out)


def test_tool_pairing_repair() -> None:
    body = {
        "input": [
            {"type": "function_call", "name": "sh", "arguments": "{}", "call_id": "a"},
            {"type": "message", "role": "user", "content": "next"},
            {"type": "function_call_output", "call_id": "zzz", "output": "late"},
        ],
        "tools": [{"type": "function", "name": "sh"}],
    }
    out = responses_request_to_messages(body, model=MODEL, cache_control=False)
    msgs = out["messages"]
    assert msgs[0] == {"role": "user", "content": [{"type": "text", "text": "(continued)"}]}
    assert msgs[1]["role"] == "assistant"
    assert msgs[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "a",
        "content": "No output was recorded for this tool call.",
        "is_error": True,
    }
    assert msgs[2]["content"][1:] == [
        {"type": "text", "text": "next"},
        {"type": "text", "text": "[tool result zzz]\nlate"},
    ]


def test_tool_blocks_become_text_without_tools() -> None:
    body = {
        "input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "name": "sh", "arguments": '{"a":1}', "call_id": "a"},
            {"type": "function_call_output", "call_id": "a", "output": "r"},
        ]
    }
    out = responses_request_to_messages(body, model=MODEL, cache_control=False)
    assert out["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": '[tool call sh] {"a": 1}'}],
    }
    assert out["messages"][2]["content"] == [{"type": "text", "text": "[tool result a]\nr"}]
    assert "tools" not in out and "tool_choice" not in out


def test_images_and_tool_output_parts() -> None:
    body = {
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "see"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K"},
                    {"type": "input_image", "image_url": "https://x.test/a.jpg", "detail": "high"},
                    {"type": "input_image", "image_url": "file:///etc/passwd"},
                    {"type": "input_text", "text": ""},
                ],
            },
            {"type": "function_call", "name": "view_image", "arguments": "{}", "call_id": "v"},
            {
                "type": "function_call_output",
                "call_id": "v",
                "output": [
                    {"type": "input_text", "text": "img:"},
                    {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/"},
                ],
            },
        ],
        "tools": [{"type": "function", "name": "view_image"}],
    }
    out = responses_request_to_messages(body, model=MODEL, cache_control=False)
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "see"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
        },
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
    ]
    assert out["messages"][2]["content"][0]["content"] == [
        {"type": "text", "text": "img:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
    ]


@pytest.mark.parametrize(
    ("effort", "cap", "budget", "max_tokens"),
    [
        ("minimal", None, 1024, 8192),
        ("low", None, 2048, 8192),
        ("medium", None, 8192, 12288),
        ("high", None, 16384, 20480),
        ("xhigh", None, 24576, 28672),
        ("max", None, 27648, 31744),
        ("none", None, None, 8192),
        ("banana", None, None, 8192),
        ("high", 10000, 8976, 10000),  # budget clamped below the caller's cap
        ("high", 2048, 1024, 2048),
        ("high", 2047, None, 2047),  # no room for the 1024 minimum budget
    ],
)
def test_effort_to_thinking_budget(
    effort: str, cap: int | None, budget: int | None, max_tokens: int
) -> None:
    body: dict[str, Any] = {"input": "hi", "reasoning": {"effort": effort}, "temperature": 0.5}
    if cap is not None:
        body["max_output_tokens"] = cap
    out = responses_request_to_messages(body, model=MODEL)
    assert out["max_tokens"] == max_tokens
    if budget is None:
        assert "thinking" not in out
        assert out["temperature"] == 0.5
    else:
        assert out["thinking"] == {"type": "enabled", "budget_tokens": budget}
        assert out["max_tokens"] > budget
        assert "temperature" not in out  # not allowed together with thinking


def test_thinking_budget_table_is_monotonic_and_valid() -> None:
    order = ["minimal", "low", "medium", "high", "xhigh", "max"]
    budgets = [thinking_budget(e) for e in order]
    assert budgets == sorted(budgets)  # type: ignore[type-var]
    assert all(b is not None and b >= 1024 for b in budgets)
    assert thinking_budget("HIGH") == DEFAULT_EFFORT_BUDGETS["high"]
    assert thinking_budget(None) is None
    assert thinking_budget("low", {"low": 10}) == 1024


def test_thinking_dropped_for_forced_tool_and_unsigned_tool_loop() -> None:
    tools = [{"type": "function", "name": "sh"}]
    forced = responses_request_to_messages(
        {"input": "hi", "reasoning": {"effort": "high"}, "tools": tools, "tool_choice": "required"},
        model=MODEL,
    )
    assert "thinking" not in forced and forced["tool_choice"] == {"type": "any"}
    loop = {
        "input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "name": "sh", "arguments": "{}", "call_id": "a"},
            {"type": "function_call_output", "call_id": "a", "output": "r"},
        ],
        "reasoning": {"effort": "high"},
        "tools": tools,
    }
    # The last assistant turn of the tool loop has no signed thinking block: must run without.
    assert "thinking" not in responses_request_to_messages(loop, model=MODEL)
    loop["input"] = [
        *loop["input"],
        {"type": "message", "role": "assistant", "content": "done"},
        {"type": "message", "role": "user", "content": "again"},
    ]
    assert responses_request_to_messages(loop, model=MODEL)["thinking"]["budget_tokens"] == 16384


def test_cache_control_metadata_and_sampling() -> None:
    body = {
        "instructions": "sys",
        "input": "hi",
        "user": "user-123",
        "temperature": 1.7,
        "top_p": 0.9,
    }
    out = responses_request_to_messages(body, model=MODEL)
    assert out["system"] == [
        {"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}
    ]
    assert out["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    assert out["metadata"] == {"user_id": "user-123"}
    assert out["temperature"] == 1.0 and "top_p" not in out
    assert "stream" not in out
    unsafe = responses_request_to_messages(
        {"input": "hi", "user": "alice@example.com", "top_p": 0.9}, model=MODEL
    )
    assert "metadata" not in unsafe
    assert unsafe["top_p"] == 0.9
    empty = responses_request_to_messages({"input": []}, model=MODEL, cache_control=False)
    assert empty["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "(continued)"}]}
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ({"type": "function", "name": "sh"}, {"type": "tool", "name": "sh"}),
    ],
)
def test_tool_choice_mapping(choice: Any, expected: dict[str, Any]) -> None:
    body = {"input": "hi", "tools": [{"type": "function", "name": "sh"}], "tool_choice": choice}
    assert responses_request_to_messages(body, model=MODEL)["tool_choice"] == expected


def test_strip_backend_ciphertext() -> None:
    items = [
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAAB"},
        {"type": "compaction", "encrypted_content": "gAAAAAC"},
        {"type": "compaction_summary", "encrypted_content": "gAAAAAD"},
        {"type": "function_call", "name": "f", "encrypted_function_args": ["gAAAAAE"]},
        {
            "type": "agent_message",
            "content": [{"type": "encrypted_content", "encrypted_content": "x"}],
        },
        {
            "type": "agent_message",
            "content": [
                {"type": "encrypted_content", "encrypted_content": "x"},
                {"type": "input_text", "text": "task"},
            ],
        },
        {"type": "message", "role": "user", "content": "keep"},
    ]
    original = json.dumps(items)
    out = strip_backend_ciphertext(items)
    assert out == [
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "name": "f"},
        {"type": "agent_message", "content": [{"type": "input_text", "text": "task"}]},
        {"type": "message", "role": "user", "content": "keep"},
    ]
    assert json.dumps(items) == original  # input not mutated


# ---------------------------------------------------------------------------------------------
# Non-stream response, usage, Chat paths


def test_messages_response_to_responses() -> None:
    resp = {
        "id": "msg_01",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "SIG"},
            {"type": "redacted_thinking", "data": "REDACTED"},
            {"type": "text", "text": "A"},
            {"type": "text", "text": "B"},
            {"type": "tool_use", "id": "toolu_1", "name": "sh", "input": {"c": "ls"}},
        ],
        "stop_reason": "tool_use",
        "usage": {
            "input_tokens": 10,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5,
            "output_tokens": 20,
        },
    }
    out = messages_response_to_responses(resp, response_id=RID, created_at=9, model=MODEL)
    assert out["output"] == [
        {
            "type": "reasoning",
            "id": "rs_abc_0",
            "summary": [{"type": "summary_text", "text": "hmm"}],
        },
        {
            "type": "message",
            "id": "msg_abc_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "AB", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_abc_2",
            "call_id": "toolu_1",
            "name": "sh",
            "arguments": '{"c": "ls"}',
            "status": "completed",
        },
    ]
    assert out["status"] == "completed" and out["id"] == RID and out["created_at"] == 9
    assert out["usage"] == {
        "input_tokens": 115,
        "input_tokens_details": {"cached_tokens": 100},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 135,
    }
    assert "SIG" not in json.dumps(out) and "REDACTED" not in json.dumps(out)


def test_usage_message_delta_overrides_start() -> None:
    assert anthropic_usage_to_responses(None)["total_tokens"] == 0
    payloads = [
        *TEXT_STREAM[:-2],
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"input_tokens": 3000, "cache_read_input_tokens": 0, "output_tokens": 9},
        },
        MESSAGE_STOP,
    ]
    usage = translate(payloads)[-1]["response"]["usage"]
    assert usage["input_tokens"] == 3100  # 3000 + cache creation 100 from message_start
    assert usage["input_tokens_details"] == {"cached_tokens": 0}
    assert usage["output_tokens"] == 9


def test_chat_request_to_messages() -> None:
    body = {
        "model": "x",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "out"},
        ],
        "tools": [{"type": "function", "function": {"name": "sh", "parameters": {}}}],
        "reasoning_effort": "low",
        "max_tokens": 5000,
        "stream": True,
    }
    out = chat_request_to_messages(body, model=MODEL, cache_control=False)
    assert out["system"] == [{"type": "text", "text": "sys"}]
    assert out["max_tokens"] == 5000
    assert out["stream"] is True
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]
    assert out["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "out"}
    ]
    assert out["tools"][0]["input_schema"] == {"type": "object", "properties": {}}


def chat_frames(data: bytes) -> list[Any]:
    return [e.data if e.is_done else e.json() for e in SSEParser().feed(data)]


def test_messages_to_chat_stream_tool_call() -> None:
    t = MessagesToChatStream(chat_id="chatcmpl-1", model=MODEL, created=5)
    data = b"".join(t.feed_event(e) for e in SSEParser().feed(stream_bytes(TOOL_STREAM)))
    data += t.close()
    frames = chat_frames(data)
    assert frames[-1] == "[DONE]"
    deltas = [f["choices"][0]["delta"] for f in frames[:-1] if f.get("choices")]
    assert {"reasoning_content": "Look at tests"} in deltas
    assert {"content": "Running."} in deltas
    args = "".join(
        d["tool_calls"][0]["function"].get("arguments", "") for d in deltas if "tool_calls" in d
    )
    assert args == '{"command": "pytest -q"}'
    finish = [f["choices"][0]["finish_reason"] for f in frames[:-1] if f.get("choices")]
    assert finish[-1] == "tool_calls"
    usage = frames[-2]["usage"]
    assert usage["prompt_tokens"] == 14200 and usage["completion_tokens"] == 412
    assert usage["prompt_tokens_details"] == {"cached_tokens": 12000}


def test_messages_to_chat_stream_error_has_no_done() -> None:
    t = MessagesToChatStream(chat_id="chatcmpl-1", model=MODEL, created=5)
    payloads = [*TEXT_STREAM[:4], {"type": "error", "error": {"type": "api_error", "message": "x"}}]
    data = b"".join(t.feed_event(e) for e in SSEParser().feed(stream_bytes(payloads)))
    data += t.close()
    frames = chat_frames(data)
    assert "[DONE]" not in frames
    assert frames[-1] == {"error": {"type": "api_error", "code": "api_error", "message": "x"}}
    t2 = MessagesToChatStream(chat_id="c", model=MODEL, created=5)
    cut = b"".join(t2.feed_event(e) for e in SSEParser().feed(stream_bytes(TEXT_STREAM[:4])))
    cut += t2.close()
    assert "[DONE]" not in chat_frames(cut)
    assert "error" in chat_frames(cut)[-1]


def test_messages_response_to_chat() -> None:
    resp = {
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }
    out = messages_response_to_chat(resp, chat_id="chatcmpl-9", created=3, model=MODEL)
    assert out["id"] == "chatcmpl-9"
    assert out["choices"][0]["message"]["content"] == "hi"
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["total_tokens"] == 3


def test_module_is_framework_free() -> None:
    src = Path(__file__).resolve().parents[3] / "providers" / "wire" / "anthropic.py"
    tree = ast.parse(src.read_text())
    names = [
        alias.name if isinstance(node, ast.Import) else (node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [node.names[0]])
    ]
    assert not any(n.split(".")[0] in ("django", "ninja", "channels") for n in names)
