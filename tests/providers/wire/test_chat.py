from __future__ import annotations

import ast
import json
import pathlib
from typing import Any

import pytest

from providers.wire.chat import (
    ChatToResponsesStream,
    ResponsesStreamWriter,
    ResponsesToChatStream,
    chat_request_to_responses,
    chat_response_to_responses,
    chat_usage_to_responses,
    custom_tool_names,
    responses_request_to_chat,
    responses_response_to_chat,
    responses_usage_to_chat,
)
from providers.wire.commit import truncation_failure
from providers.wire.sse import SSEEvent, SSEParser


def parse(raw: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    return [*parser.feed(raw), *parser.finish()]


def payloads(raw: bytes) -> list[Any]:
    return [e.json() if not e.is_done else "[DONE]" for e in parse(raw) if e.has_data]


def types(raw: bytes) -> list[str]:
    return [p["type"] for p in payloads(raw)]


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


CHAT_USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 20,
    "total_tokens": 120,
    "prompt_tokens_details": {"cached_tokens": 60},
    "completion_tokens_details": {"reasoning_tokens": 5},
}
RESP_USAGE = {
    "input_tokens": 100,
    "input_tokens_details": {"cached_tokens": 60},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 5},
    "total_tokens": 120,
}


def test_modules_import_no_framework() -> None:
    for name in ("sse", "commit", "chat"):
        path = pathlib.Path(__file__).parents[3] / "providers" / "wire" / f"{name}.py"
        tree = ast.parse(path.read_text())
        roots = {
            (n.module or "").split(".")[0]
            if isinstance(n, ast.ImportFrom)
            else a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for a in n.names
        }
        assert not roots & {"django", "ninja", "channels"}, name


def test_usage_mapping_both_ways() -> None:
    assert chat_usage_to_responses(CHAT_USAGE) == RESP_USAGE
    assert responses_usage_to_chat(RESP_USAGE) == CHAT_USAGE
    assert chat_usage_to_responses(None) == {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    assert (
        chat_usage_to_responses({"prompt_tokens": 3, "completion_tokens": 4})["total_tokens"] == 7
    )


# --- Responses request → Chat request -------------------------------------------------------

CODEX_REQUEST: dict[str, Any] = {
    "model": "combo/main",
    "instructions": "You are Codex.",
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "perm"}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAA", "detail": "high"},
            ],
        },
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAAB..."},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Running."}],
        },
        {
            "type": "function_call",
            "name": "shell_command",
            "arguments": '{"command":"ls"}',
            "call_id": "call_1",
        },
        {
            "type": "function_call",
            "name": "shell_command",
            "arguments": '{"command":"pwd"}',
            "call_id": "call_2",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "/x"}],
        },
        {
            "type": "custom_tool_call",
            "call_id": "call_3",
            "name": "apply_patch",
            "input": "*** Begin",
        },
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "ok"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "shell_command",
            "description": "Run",
            "strict": False,
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Patch",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"},
        },
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"effort": "high", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1",
    "max_output_tokens": 4096,
}


def test_responses_request_to_chat_full() -> None:
    out = responses_request_to_chat(
        CODEX_REQUEST, model="gpt-4.1", max_tokens_field="max_completion_tokens"
    )
    assert out["model"] == "gpt-4.1"
    assert out["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "system", "content": "perm"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AAA", "detail": "high"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": "Running.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "shell_command", "arguments": '{"command":"ls"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "shell_command", "arguments": '{"command":"pwd"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "call_2", "content": "/x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "ok"},
    ]
    assert out["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "shell_command",
                "description": "Run",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "apply_patch",
                "description": "Patch",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "input": {"type": "string", "description": "The raw tool input."}
                    },
                    "required": ["input"],
                },
            },
        },
    ]
    assert out["tool_choice"] == "auto"
    assert out["parallel_tool_calls"] is True
    assert out["reasoning_effort"] == "high"
    assert out["max_completion_tokens"] == 4096
    assert "max_tokens" not in out
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    for dropped in ("store", "include", "prompt_cache_key", "reasoning", "instructions", "input"):
        assert dropped not in out
    assert custom_tool_names(CODEX_REQUEST) == frozenset({"apply_patch"})


def test_responses_request_to_chat_minimal_and_options() -> None:
    out = responses_request_to_chat(
        {
            "model": "m",
            "input": "hi",
            "tool_choice": {"type": "function", "name": "f"},
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "o",
                    "schema": {"type": "object"},
                    "strict": True,
                }
            },
            "max_output_tokens": 10,
            "temperature": 0.2,
        }
    )
    assert out == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "temperature": 0.2,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "o", "schema": {"type": "object"}, "strict": True},
        },
    }
    with_tools = responses_request_to_chat(
        {
            "model": "m",
            "input": [],
            "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": "f"},
        }
    )
    assert with_tools["tool_choice"] == {"type": "function", "function": {"name": "f"}}


# --- Chat stream → Responses stream ---------------------------------------------------------


def test_chat_stream_text_answer_exact_sequence() -> None:
    t = ChatToResponsesStream(response_id="resp_abc", model="m", created_at=1767225600)
    raw = t.feed(chat_chunk({"role": "assistant", "content": ""}))
    raw += t.feed(chat_chunk({"content": "Hel"}))
    raw += t.feed(chat_chunk({"content": "lo"}))
    raw += t.feed(chat_chunk({}, "stop"))
    raw += t.feed({"id": "c1", "choices": [], "usage": CHAT_USAGE})
    raw += t.feed_done()
    assert t.finished
    assert t.close() == b""
    events = parse(raw)
    assert [e.event for e in events] == [p["type"] for p in payloads(raw)]
    ps = payloads(raw)
    assert types(raw) == [
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
    assert [p["sequence_number"] for p in ps] == list(range(10))
    assert ps[0]["response"] == {
        "id": "resp_abc",
        "object": "response",
        "created_at": 1767225600,
        "status": "in_progress",
        "model": "m",
        "output": [],
    }
    assert ps[2]["item"] == {
        "type": "message",
        "id": "msg_abc_0",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    assert [p["delta"] for p in ps[4:6]] == ["Hel", "lo"]
    message = {
        "type": "message",
        "id": "msg_abc_0",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
    }
    assert ps[8] == {
        "type": "response.output_item.done",
        "sequence_number": 8,
        "output_index": 0,
        "item": message,
    }
    assert ps[9]["response"] == {
        "id": "resp_abc",
        "object": "response",
        "created_at": 1767225600,
        "status": "completed",
        "model": "m",
        "output": [message],
        "usage": RESP_USAGE,
    }


def test_chat_stream_reasoning_then_tool_call_exact_sequence() -> None:
    t = ChatToResponsesStream(response_id="resp_x", model="m", created_at=1)
    raw = t.feed(chat_chunk({"role": "assistant", "reasoning_content": "Think"}))
    raw += t.feed(
        chat_chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "shell_command", "arguments": ""},
                    }
                ]
            }
        )
    )
    raw += t.feed(
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command":'}}]})
    )
    raw += t.feed(chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}))
    raw += t.feed(chat_chunk({}, "tool_calls"))
    raw += t.feed_done()
    ps = payloads(raw)
    assert types(raw) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert ps[7]["item"] == {
        "type": "reasoning",
        "id": "rs_x_0",
        "summary": [{"type": "summary_text", "text": "Think"}],
    }
    assert ps[8]["item"] == {
        "type": "function_call",
        "id": "fc_x_1",
        "call_id": "call_9",
        "name": "shell_command",
        "arguments": "",
        "status": "in_progress",
    }
    call = {
        "type": "function_call",
        "id": "fc_x_1",
        "call_id": "call_9",
        "name": "shell_command",
        "arguments": '{"command":"ls"}',
        "status": "completed",
    }
    assert ps[11]["arguments"] == call["arguments"]
    assert ps[12]["item"] == call and ps[12]["output_index"] == 1
    assert ps[13]["response"]["output"][1] == call
    assert ps[13]["response"]["usage"]["input_tokens"] == 0  # no usage chunk: zeros, still valid


def test_chat_stream_parallel_calls_custom_tool_and_missing_id() -> None:
    t = ChatToResponsesStream(
        response_id="resp_p", model="m", created_at=1, custom_tools=frozenset({"apply_patch"})
    )
    raw = t.feed(
        chat_chunk(
            {
                "tool_calls": [
                    {"index": 0, "function": {"name": "shell_command", "arguments": "{}"}},
                    {
                        "index": 1,
                        "id": "call_b",
                        "function": {"name": "apply_patch", "arguments": '{"input":'},
                    },
                ]
            }
        )
    )
    raw += t.feed(
        chat_chunk(
            {"tool_calls": [{"index": 1, "function": {"arguments": '"*** Begin"}'}}]}, "tool_calls"
        )
    )
    raw += t.feed_done()
    done = [p["item"] for p in payloads(raw) if p["type"] == "response.output_item.done"]
    assert done == [
        {
            "type": "function_call",
            "id": "fc_p_0",
            "call_id": "call_p_0",
            "name": "shell_command",
            "arguments": "{}",
            "status": "completed",
        },
        {
            "type": "custom_tool_call",
            "id": "fc_p_1",
            "call_id": "call_b",
            "name": "apply_patch",
            "input": "*** Begin",
            "status": "completed",
        },
    ]


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_chat_stream_truncation_still_completes(finish: str, reason: str) -> None:
    t = ChatToResponsesStream(response_id="resp_l", model="m", created_at=1)
    raw = t.feed(chat_chunk({"content": "part"}, finish)) + t.feed_done()
    last = payloads(raw)[-1]
    assert last["type"] == "response.completed"
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": reason}


def test_chat_stream_failures() -> None:
    t = ChatToResponsesStream(response_id="resp_f", model="m", created_at=1)
    raw = t.feed(chat_chunk({"content": "once"}))
    raw += t.feed({"error": {"message": "Overloaded", "code": "server_is_overloaded"}})
    assert t.finished
    assert t.feed(chat_chunk({"content": "more"})) == b"" and t.feed_done() == b""
    assert types(raw)[-1] == "response.failed"
    assert types(raw).count("response.output_text.delta") == 1
    assert "response.completed" not in types(raw)
    assert payloads(raw)[-1]["response"]["error"]["code"] == "server_is_overloaded"

    cut = ChatToResponsesStream(response_id="resp_c", model="m", created_at=1)
    raw = cut.feed(chat_chunk({"content": "x"})) + cut.close()
    assert payloads(raw)[-1]["response"]["error"]["code"] == "upstream_stream_truncated"

    no_finish = ChatToResponsesStream(response_id="resp_n", model="m", created_at=1)
    raw = no_finish.feed(chat_chunk({"content": "x"})) + no_finish.feed_done()
    assert types(raw)[-1] == "response.failed"

    bad = ChatToResponsesStream(response_id="resp_b", model="m", created_at=1)
    (ev,) = parse(b"data: {oops\n\n")
    assert types(bad.feed_event(ev))[-1] == "response.failed"


def test_chat_stream_via_sse_events_and_done() -> None:
    body = (
        b"".join(
            b"data: " + json.dumps(c).encode() + b"\n\n"
            for c in [chat_chunk({"content": "a"}), chat_chunk({}, "stop")]
        )
        + b": ping\n\ndata: [DONE]\n\n"
    )
    t = ChatToResponsesStream(response_id="resp_s", model="m", created_at=1)
    raw = b"".join(t.feed_event(e) for e in parse(body))
    assert types(raw)[-1] == "response.completed"


def test_writer_fail_and_idempotence() -> None:
    w = ResponsesStreamWriter(response_id="resp_w", model="m", created_at=1)
    assert types(w.start()) == ["response.created", "response.in_progress"]
    assert w.start() == b""
    raw = w.fail(truncation_failure("cut"))
    assert payloads(raw) == [
        {
            "type": "response.failed",
            "sequence_number": 2,
            "response": {
                "id": "resp_w",
                "object": "response",
                "created_at": 1,
                "status": "failed",
                "model": "m",
                "error": {
                    "code": "upstream_stream_truncated",
                    "message": "Upstream cut",
                    "type": "upstream_error",
                },
            },
        }
    ]
    assert w.complete(None) == b""


# --- Chat non-stream → Responses ------------------------------------------------------------


CHAT_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "gpt-4.1",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Running.",
                "reasoning_content": "plan",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "shell_command", "arguments": '{"command":"ls"}'},
                    }
                ],
            },
        }
    ],
    "usage": CHAT_USAGE,
}


def test_chat_response_to_responses() -> None:
    out = chat_response_to_responses(CHAT_COMPLETION, response_id="resp_1", model="combo/main")
    assert out == {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "model": "combo/main",
        "output": [
            {
                "type": "reasoning",
                "id": "rs_1_0",
                "summary": [{"type": "summary_text", "text": "plan"}],
            },
            {
                "type": "message",
                "id": "msg_1_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Running.", "annotations": []}],
            },
            {
                "type": "function_call",
                "id": "fc_1_2",
                "call_id": "call_1",
                "name": "shell_command",
                "arguments": '{"command":"ls"}',
                "status": "completed",
            },
        ],
        "usage": RESP_USAGE,
    }
    length = dict(
        CHAT_COMPLETION,
        choices=[
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": "x"},
            }
        ],
    )
    cut = chat_response_to_responses(length, response_id="resp_2")
    assert (cut["status"], cut["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )


def test_non_stream_round_trip_chat_to_responses_to_chat() -> None:
    back = responses_response_to_chat(
        chat_response_to_responses(CHAT_COMPLETION, response_id="resp_1"), chat_id="chatcmpl-1"
    )
    assert back == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-4.1",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Running.",
                    "reasoning_content": "plan",
                    "tool_calls": CHAT_COMPLETION["choices"][0]["message"]["tool_calls"],
                },
            }
        ],
        "usage": CHAT_USAGE,
    }


def test_request_round_trip_chat_to_responses_to_chat() -> None:
    chat_req: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": "https://x/i.png", "detail": "low"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a":1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            {"role": "system", "content": "late rule"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "reasoning_effort": "low",
        "max_completion_tokens": 50,
        "response_format": {"type": "json_object"},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp_req = chat_request_to_responses(chat_req)
    assert resp_req == {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "hi"},
                    {"type": "input_image", "image_url": "https://x/i.png", "detail": "low"},
                ],
            },
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a":1}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "late rule"}],
            },
        ],
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
        ],
        "tool_choice": {"type": "function", "name": "f"},
        "reasoning": {"effort": "low"},
        "max_output_tokens": 50,
        "text": {"format": {"type": "json_object"}},
        "store": False,
        "stream": True,
    }
    again = responses_request_to_chat(resp_req)
    assert again["messages"] == [
        {"role": "system", "content": "Be brief."},
        chat_req["messages"][1],
        chat_req["messages"][2],
        chat_req["messages"][3],
        chat_req["messages"][4],
    ]
    assert again["tools"] == chat_req["tools"]
    assert again["tool_choice"] == chat_req["tool_choice"]
    assert again["reasoning_effort"] == "low"
    assert again["max_tokens"] == 50
    assert again["response_format"] == {"type": "json_object"}


# --- Responses stream → Chat stream ---------------------------------------------------------


def rev(events: list[dict[str, Any]], include_usage: bool = True) -> list[Any]:
    t = ResponsesToChatStream(
        chat_id="chatcmpl-r", model="m", created=5, include_usage=include_usage
    )
    raw = b"".join(t.feed(e) for e in events) + t.close()
    return payloads(raw)


def test_responses_stream_text_to_chat_exact() -> None:
    out = rev(
        [
            {"type": "response.created", "response": {"id": "resp_1", "output": []}},
            {"type": "response.in_progress"},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {"type": "message", "id": "msg_1"},
            },
            {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Hel"},
            {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "lo"},
            {
                "type": "response.output_item.done",
                "item": {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello"}],
                },
            },
            {
                "type": "response.completed",
                "response": {"id": "resp_1", "status": "completed", "usage": RESP_USAGE},
            },
        ]
    )
    base = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 5, "model": "m"}

    def c(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    assert out == [
        c({"role": "assistant", "content": ""}),
        c({"content": "Hel"}),
        c({"content": "lo"}),
        c({}, "stop"),
        {**base, "choices": [], "usage": CHAT_USAGE},
        "[DONE]",
    ]


def test_responses_stream_tool_call_to_chat_exact() -> None:
    out = rev(
        [
            {"type": "response.created", "response": {"id": "resp_1"}},
            {"type": "response.reasoning_summary_text.delta", "delta": "hmm"},
            {
                "type": "response.output_item.added",
                "item": {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "sh",
                    "arguments": "",
                },
            },
            {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": '{"a"'},
            {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": ":1}"},
            {
                "type": "response.function_call_arguments.done",
                "item_id": "fc_1",
                "arguments": '{"a":1}',
            },
            {
                "type": "response.output_item.done",
                "item": {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "sh",
                    "arguments": '{"a":1}',
                },
            },
            # A second call that only arrives whole in output_item.done.
            {
                "type": "response.output_item.done",
                "item": {
                    "type": "function_call",
                    "id": "fc_2",
                    "call_id": "call_2",
                    "name": "sh",
                    "arguments": "{}",
                },
            },
            {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}},
        ],
        include_usage=False,
    )
    deltas = [p["choices"][0]["delta"] for p in out[:-2]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "hmm"},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "sh", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]},
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "sh", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
    ]
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1] == "[DONE]"


@pytest.mark.parametrize(
    ("events", "code"),
    [
        (
            [
                {"type": "response.output_text.delta", "item_id": "m", "delta": "once"},
                {
                    "type": "response.failed",
                    "response": {"error": {"code": "server_error", "message": "boom"}},
                },
            ],
            "server_error",
        ),
        (
            [
                {"type": "response.output_text.delta", "item_id": "m", "delta": "once"},
                {"type": "error", "code": "rate_limit_exceeded", "message": "slow"},
            ],
            "rate_limit_exceeded",
        ),
        (
            [{"type": "response.output_text.delta", "item_id": "m", "delta": "once"}],
            "upstream_stream_truncated",
        ),
    ],
)
def test_responses_stream_failure_to_chat_has_error_and_no_done(
    events: list[dict[str, Any]], code: str
) -> None:
    out = rev(events)
    assert "[DONE]" not in out
    assert out[-1]["error"]["code"] == code
    assert (
        sum(
            1
            for p in out
            if isinstance(p, dict)
            and "choices" in p
            and p["choices"][0]["delta"].get("content") == "once"
        )
        == 1
    )


def test_responses_stream_incomplete_to_chat_length() -> None:
    out = rev(
        [
            {"type": "response.output_text.delta", "item_id": "m", "delta": "x"},
            {
                "type": "response.incomplete",
                "response": {
                    "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"},
                },
            },
        ],
        include_usage=False,
    )
    assert out[-2]["choices"][0]["finish_reason"] == "length"
    assert out[-1] == "[DONE]"


def test_full_loop_chat_stream_through_both_translators() -> None:
    fwd = ChatToResponsesStream(response_id="resp_z", model="m", created_at=1)
    raw = fwd.feed(chat_chunk({"content": "Hi"}))
    raw += fwd.feed(
        chat_chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}
                ]
            },
            "tool_calls",
        )
    )
    raw += fwd.feed({"id": "c1", "choices": [], "usage": CHAT_USAGE})
    raw += fwd.feed_done()
    back = ResponsesToChatStream(chat_id="c", model="m", created=1)
    chat_raw = b"".join(back.feed_event(e) for e in parse(raw))
    out = payloads(chat_raw)
    content = "".join(p["choices"][0]["delta"].get("content") or "" for p in out[:-2])
    assert content == "Hi"
    assert out[-2]["usage"] == CHAT_USAGE
    assert out[-3]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1] == "[DONE]"
