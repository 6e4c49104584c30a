"""End-to-end agent turns and request shaping through a real `ocx serve` and a real mock.

PRODUCT §5.2 (context overflow), §5.7 (shaping, encrypted agent tasks, compaction recall),
§6 (a full Codex agent turn against Anthropic and Chat Completions upstreams);
combos-behaviour.md §3.6, §5, §7; codex-wire.md §3, §6, §7.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events

KEYS = {
    "p1": "sk-test-primary-aaaaaaaaaaaaaaaaaaaa",
    "p2": "sk-test-backup-bbbbbbbbbbbbbbbbbbbbb",
    "p3": "sk-test-third-cccccccccccccccccccccc",
}
INSTRUCTIONS = "You are Codex, a coding agent. Be precise."
DEVELOPER = "<permissions instructions>sandbox: workspace-write</permissions instructions>"
# The `shell` function tool as Codex declares it (codex-wire §3.3).
SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "number"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
CHAT_SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": SHELL_TOOL["description"],
        "parameters": SHELL_TOOL["parameters"],
    },
}
TOOL_RESULT = "exit code 0\nmock\n"


def fernet() -> str:
    """A token shaped like OpenAI/ChatGPT backend ciphertext (Fernet: 0x80 + zero timestamp)."""
    raw = b"\x80\x00\x00\x00\x00" + os.urandom(120)
    return base64.urlsafe_b64encode(raw).decode()


# ---------------------------------------------------------------------------------------------
# Helpers


def sync(server: Server) -> None:
    server.http.get("/v1/models")
    server.wait_synced()


def setup_combo(
    server: Server,
    mock: Mock,
    targets: list[tuple[str, str]],
    *,
    adapters: dict[str, str] | None = None,
    models: dict[str, dict[str, Any]] | None = None,
    **combo: Any,
) -> tuple[str, str]:
    """Providers p1, p2, p3 on the mock (own key each, `chatgpt` without one), a fresh combo
    over `targets`; `models` gives per-model settings (default contextWindow 100000).
    Returns (combo id, ocx client key)."""
    key = server.create_key()
    by_provider: dict[str, list[str]] = {}
    for name, model in targets:
        by_provider.setdefault(name, []).append(model)
    for name, names_ in by_provider.items():
        spec: dict[str, Any] = {
            "adapter": (adapters or {}).get(name, "openai-responses"),
            "baseUrl": mock.url + "/v1",
            "timeouts": {"firstByteMs": 2000, "idleMs": 2000},
            "models": {m: {"contextWindow": 100000, **(models or {}).get(m, {})} for m in names_},
        }
        if spec["adapter"] != "chatgpt":
            spec["apiKey"] = KEYS[name]
        server.put_provider(name, spec)
    combo_id = "t" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id, {"targets": [{"provider": p, "model": m} for p, m in targets], **combo}
    )
    sync(server)
    return combo_id, key


def auth(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def post_responses(
    server: Server, key: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    return server.http.post("/v1/responses", json=body, headers=auth(key, **headers))


def post_chat(server: Server, key: str, body: dict[str, Any]) -> httpx.Response:
    return server.http.post("/v1/chat/completions", json=body, headers=auth(key))


def names(events: list[tuple[str | None, Any]]) -> list[str | None]:
    return [
        e if e is not None else (d.get("type") if isinstance(d, dict) else d) for e, d in events
    ]


def payloads(events: list[tuple[str | None, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for e, d in events if e == kind]


def one(events: list[tuple[str | None, Any]], kind: str) -> dict[str, Any]:
    found = payloads(events, kind)
    assert len(found) == 1, (kind, names(events))
    return found[0]


def codex_request(model: str, input_items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A Responses request shaped like the one Codex sends (codex-wire §3.1)."""
    return {
        "model": model,
        "instructions": INSTRUCTIONS,
        "input": input_items,
        "tools": [SHELL_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "store": False,
        "stream": True,
        "include": [],
        **extra,
    }


def developer_item() -> dict[str, Any]:
    return {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": DEVELOPER}],
    }


def user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def check_sequence_numbers(events: list[tuple[str | None, Any]]) -> None:
    for event, data in events:
        assert isinstance(data, dict), (event, data)
        assert data["type"] == event  # the `event:` line matches the payload type
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))


def check_usage(usage: dict[str, Any]) -> None:
    # codex-wire §3.5: integers, details with their required keys, total = input + output.
    for field in ("input_tokens", "output_tokens", "total_tokens"):
        assert isinstance(usage[field], int), usage
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], usage
    assert isinstance(usage["input_tokens_details"]["cached_tokens"], int), usage
    assert isinstance(usage["output_tokens_details"]["reasoning_tokens"], int), usage


def assert_function_call_turn(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    """The exact Responses event sequence of a streamed function call; returns the done item."""
    check_sequence_numbers(events)
    kinds = names(events)
    n = kinds.count("response.function_call_arguments.delta")
    assert n >= 1, kinds
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * n,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    created = one(events, "response.created")["response"]
    assert created["status"] == "in_progress"
    added = one(events, "response.output_item.added")
    assert added["output_index"] == 0
    assert added["item"]["type"] == "function_call"
    assert added["item"]["name"] == "shell"
    item_id = added["item"]["id"]
    call_id = added["item"]["call_id"]
    assert isinstance(call_id, str) and call_id
    args_deltas = payloads(events, "response.function_call_arguments.delta")
    assert all(d["item_id"] == item_id and d["output_index"] == 0 for d in args_deltas)
    arguments = "".join(d["delta"] for d in args_deltas)
    args_done = one(events, "response.function_call_arguments.done")
    assert args_done["item_id"] == item_id
    assert args_done["arguments"] == arguments
    done = one(events, "response.output_item.done")
    assert done["output_index"] == 0
    item = done["item"]
    # The done item is authoritative for Codex: full arguments as a JSON string.
    assert item["type"] == "function_call"
    assert item["id"] == item_id
    assert item["call_id"] == call_id
    assert item["name"] == "shell"
    assert item["arguments"] == arguments
    assert item["status"] == "completed"
    assert json.loads(item["arguments"]) == {"command": "echo mock"}
    completed = one(events, "response.completed")["response"]
    assert completed["id"] == created["id"]
    assert isinstance(completed["id"], str) and completed["id"]
    assert completed["status"] == "completed"
    assert completed["output"] == [item]
    check_usage(completed["usage"])
    return item


def assert_text_turn(events: list[tuple[str | None, Any]], expected: str) -> None:
    """A streamed final text answer: every added item is done, then `response.completed`."""
    check_sequence_numbers(events)
    kinds = names(events)
    n = kinds.count("response.output_text.delta")
    assert n >= 1, kinds
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * n,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    added = one(events, "response.output_item.added")["item"]
    assert added["type"] == "message" and added["role"] == "assistant"
    text = "".join(d["delta"] for d in payloads(events, "response.output_text.delta"))
    assert text == expected
    assert one(events, "response.output_text.done")["text"] == expected
    done = one(events, "response.output_item.done")["item"]
    assert done["id"] == added["id"]
    assert done["type"] == "message" and done["role"] == "assistant"
    assert done["status"] == "completed"
    assert [p["text"] for p in done["content"] if p["type"] == "output_text"] == [expected]
    completed = one(events, "response.completed")["response"]
    assert completed["id"] == one(events, "response.created")["response"]["id"]
    assert completed["status"] == "completed"
    assert completed["output"] == [done]
    check_usage(completed["usage"])


def run_codex_turn(
    server: Server, key: str, model: str, upstream_model: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Request 1 (tool call) and request 2 (tool result → final text); returns the function
    call item and the history sent in request 2."""
    first_input = [developer_item(), user_item("please call a tool")]
    r1 = post_responses(server, key, codex_request(model, first_input))
    assert r1.status_code == 200, r1.text
    assert r1.headers["content-type"].startswith("text/event-stream")
    call = assert_function_call_turn(sse_events(r1.text))

    # Codex replays the call from `output_item.done` (ids stripped) plus the tool output.
    history = [
        *first_input,
        {
            "type": "function_call",
            "name": call["name"],
            "arguments": call["arguments"],
            "call_id": call["call_id"],
        },
        {"type": "function_call_output", "call_id": call["call_id"], "output": TOOL_RESULT},
    ]
    r2 = post_responses(server, key, codex_request(model, history))
    assert r2.status_code == 200, r2.text
    assert_text_turn(sse_events(r2.text), f"mock reply from {upstream_model}: tool output received")
    return call, history


def block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


def assert_messages_roles(messages: list[dict[str, Any]]) -> None:
    roles = [m["role"] for m in messages]
    assert roles[0] == "user", roles
    assert all(r in ("user", "assistant") for r in roles), roles
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False)), roles


def blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


# ---------------------------------------------------------------------------------------------
# 1. A full Codex agent turn against an Anthropic target


def test_codex_turn_against_anthropic(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(server, mock, [("p1", "claude-turn")], adapters={"p1": "anthropic"})

    call, _ = run_codex_turn(server, key, f"combo/{combo_id}", "claude-turn")
    assert call["call_id"] == "toolu_mock_1"

    log = mock.log("claude-turn")
    assert [e["path"] for e in log] == ["/v1/messages", "/v1/messages"]
    for entry in log:
        body = entry["body"]
        assert entry["headers"]["x-api-key"] == KEYS["p1"]
        assert "authorization" not in entry["headers"]
        assert entry["headers"]["anthropic-version"]
        assert body["model"] == "claude-turn"
        assert body["stream"] is True
        assert isinstance(body["max_tokens"], int) and body["max_tokens"] > 0
        # `instructions` (and the developer message) become `system`, never a message.
        system = body["system"]
        system_text = block_text(system)
        assert system_text.startswith(INSTRUCTIONS), system
        assert DEVELOPER in system_text
        assert_messages_roles(body["messages"])
        assert INSTRUCTIONS not in json.dumps(body["messages"])
        assert body["tools"] == [
            {
                "name": "shell",
                "description": SHELL_TOOL["description"],
                "input_schema": SHELL_TOOL["parameters"],
            }
        ]
        assert "parameters" not in body["tools"][0]
        assert body["messages"][0]["role"] == "user"
        assert "please call a tool" in block_text(body["messages"][0]["content"])

    first, second = (e["body"] for e in log)
    assert len(first["messages"]) == 1
    # Request 2: user, assistant tool_use, user tool_result with the same id.
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    (tool_use,) = [b for b in blocks(second["messages"][1]) if b["type"] == "tool_use"]
    assert tool_use["id"] == call["call_id"]
    assert tool_use["name"] == "shell"
    assert tool_use["input"] == {"command": "echo mock"}  # an object, not a JSON string
    (tool_result,) = [b for b in blocks(second["messages"][2]) if b["type"] == "tool_result"]
    assert tool_result["tool_use_id"] == tool_use["id"]
    assert block_text(tool_result["content"]) == TOOL_RESULT
    assert tool_result.get("is_error", False) is False


APPLY_PATCH_TOOL: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"},
}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch\n"


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("adapter", ["anthropic", "openai-chat"])
def test_codex_freeform_tool_turn(server: Server, mock: Mock, adapter: str, stream: bool) -> None:
    """A freeform (`custom`) tool goes upstream as a one-string-parameter function and its call
    comes back to Codex as a `custom_tool_call` with the raw input (codex-wire §3.3)."""
    model_name = f"patch-{adapter}-{int(stream)}"
    combo_id, key = setup_combo(server, mock, [("p1", model_name)], adapters={"p1": adapter})
    mock.script(model_name, [{"tool_call": {"name": "apply_patch", "arguments": {"input": PATCH}}}])
    first_input = [developer_item(), user_item("please call a tool")]
    body = codex_request(f"combo/{combo_id}", first_input, stream=stream)
    body["tools"] = [SHELL_TOOL, APPLY_PATCH_TOOL]

    r1 = post_responses(server, key, body)
    assert r1.status_code == 200, r1.text
    if stream:
        events = sse_events(r1.text)
        assert names(events)[-1] == "response.completed"
        added = one(events, "response.output_item.added")["item"]
        assert added["type"] == "custom_tool_call"
        item = one(events, "response.output_item.done")["item"]
        assert one(events, "response.completed")["response"]["output"] == [item]
    else:
        (item,) = r1.json()["output"]
    assert item["type"] == "custom_tool_call", item
    assert item["name"] == "apply_patch"
    assert item["input"] == PATCH
    call_id = item["call_id"]

    history = [
        *first_input,
        {"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": call_id, "output": "Success. Updated a.txt"},
    ]
    r2 = post_responses(server, key, {**body, "input": history})
    assert r2.status_code == 200, r2.text
    expected = f"mock reply from {model_name}: tool output received"
    if stream:
        assert_text_turn(sse_events(r2.text), expected)
    else:
        assert r2.json()["output"][0]["content"][0]["text"] == expected

    first, second = (e["body"] for e in mock.log(model_name))
    if adapter == "anthropic":
        patch_tool = next(t for t in first["tools"] if t["name"] == "apply_patch")
        assert patch_tool["input_schema"]["properties"]["input"]["type"] == "string"
        (tool_use,) = [b for b in blocks(second["messages"][1]) if b["type"] == "tool_use"]
        (tool_result,) = [b for b in blocks(second["messages"][2]) if b["type"] == "tool_result"]
        assert tool_use["id"] == tool_result["tool_use_id"] == call_id
        assert tool_use["input"] == {"input": PATCH}
        assert block_text(tool_result["content"]) == "Success. Updated a.txt"
    else:
        patch_tool = next(t for t in first["tools"] if t["function"]["name"] == "apply_patch")
        assert patch_tool["function"]["parameters"]["properties"]["input"]["type"] == "string"
        (assistant,) = [m for m in second["messages"] if m["role"] == "assistant"]
        (tool_call,) = assistant["tool_calls"]
        assert tool_call["id"] == call_id
        assert json.loads(tool_call["function"]["arguments"]) == {"input": PATCH}
        assert second["messages"][-1]["role"] == "tool"
        assert second["messages"][-1]["tool_call_id"] == call_id


# ---------------------------------------------------------------------------------------------
# 2. The same turn against a Chat Completions target; a Chat client against Anthropic


def test_codex_turn_against_chat_target(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(server, mock, [("p1", "chat-turn")], adapters={"p1": "openai-chat"})

    call, _ = run_codex_turn(server, key, f"combo/{combo_id}", "chat-turn")
    assert call["call_id"] == "call_mock_1"

    log = mock.log("chat-turn")
    assert [e["path"] for e in log] == ["/v1/chat/completions", "/v1/chat/completions"]
    assert log[0]["headers"]["authorization"] == f"Bearer {KEYS['p1']}"
    first, second = (e["body"] for e in log)
    for body in (first, second):
        assert body["model"] == "chat-turn"
        assert body["stream"] is True
        assert body["messages"][0]["role"] in ("system", "developer")
        assert INSTRUCTIONS in block_text(body["messages"][0]["content"])
        (tool,) = body["tools"]
        assert tool["type"] == "function"
        assert tool["function"]["name"] == "shell"
        assert tool["function"]["parameters"] == SHELL_TOOL["parameters"]
    msgs = second["messages"]
    (assistant,) = [m for m in msgs if m["role"] == "assistant"]
    (tool_call,) = assistant["tool_calls"]
    assert tool_call["id"] == call["call_id"]
    assert tool_call["type"] == "function"
    assert tool_call["function"]["name"] == "shell"
    assert json.loads(tool_call["function"]["arguments"]) == {"command": "echo mock"}
    assert msgs[-1]["role"] == "tool"
    assert msgs[-1]["tool_call_id"] == call["call_id"]
    assert block_text(msgs[-1]["content"]) == TOOL_RESULT
    assert msgs.index(assistant) == len(msgs) - 2


def chat_tool_request(model: str, stream: bool, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": model, "stream": stream, "tools": [CHAT_SHELL_TOOL], "messages": messages}


def chat_stream_chunks(text: str) -> list[dict[str, Any]]:
    data = [d for _, d in sse_events(text)]
    assert data[-1] == "[DONE]", data[-3:]
    chunks = data[:-1]
    assert all(isinstance(c, dict) and "error" not in c for c in chunks), chunks
    return chunks


@pytest.mark.parametrize("stream", [True, False])
def test_chat_client_turn_against_anthropic(server: Server, mock: Mock, stream: bool) -> None:
    model_name = f"claude-chat-{int(stream)}"
    combo_id, key = setup_combo(server, mock, [("p1", model_name)], adapters={"p1": "anthropic"})
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "please call a tool"},
    ]

    first = chat_tool_request(f"combo/{combo_id}", stream, messages)
    if stream:
        # The usage chunk only for a client that asks (PRODUCT §9.5).
        first["stream_options"] = {"include_usage": True}
    r1 = post_chat(server, key, first)
    assert r1.status_code == 200, r1.text
    if stream:
        chunks = chat_stream_chunks(r1.text)
        assert len({c["id"] for c in chunks}) == 1
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        calls: dict[int, dict[str, Any]] = {}
        finish = None
        for chunk in chunks:
            for choice in chunk.get("choices", []):
                finish = choice.get("finish_reason") or finish
                for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                    slot = calls.setdefault(tc["index"], {"id": None, "name": "", "args": ""})
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["args"] += fn.get("arguments") or ""
        assert finish == "tool_calls"
        assert list(calls) == [0]
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["args"]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert usage and usage[-1]["prompt_tokens"] > 0 and usage[-1]["completion_tokens"] > 0
    else:
        data = r1.json()
        assert data["object"] == "chat.completion"
        (choice,) = data["choices"]
        assert choice["finish_reason"] == "tool_calls"
        (tc,) = choice["message"]["tool_calls"]
        assert tc["type"] == "function"
        call_id, name, arguments = tc["id"], tc["function"]["name"], tc["function"]["arguments"]
        assert data["usage"]["prompt_tokens"] > 0
        assert data["usage"]["total_tokens"] == (
            data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"]
        )
    assert call_id == "toolu_mock_1"
    assert name == "shell"
    assert json.loads(arguments) == {"command": "echo mock"}

    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT},
    ]
    r2 = post_chat(server, key, chat_tool_request(f"combo/{combo_id}", stream, messages))
    assert r2.status_code == 200, r2.text
    expected = f"mock reply from {model_name}: tool output received"
    if stream:
        chunks = chat_stream_chunks(r2.text)
        text = "".join(
            (c.get("delta") or {}).get("content") or ""
            for chunk in chunks
            for c in chunk.get("choices", [])
        )
        finishes = [c.get("finish_reason") for ch in chunks for c in ch.get("choices", [])]
        assert "stop" in finishes
    else:
        (choice,) = r2.json()["choices"]
        text = choice["message"]["content"]
        assert choice["finish_reason"] == "stop"
    assert text == expected

    log = mock.log(model_name)
    assert [e["path"] for e in log] == ["/v1/messages", "/v1/messages"]
    for entry in log:
        body = entry["body"]
        assert isinstance(body["max_tokens"], int) and body["max_tokens"] > 0
        assert block_text(body["system"]) == INSTRUCTIONS
        assert_messages_roles(body["messages"])
        assert body.get("stream", False) is stream
        assert body["tools"][0]["name"] == "shell"
        assert body["tools"][0]["input_schema"] == SHELL_TOOL["parameters"]
    second = log[1]["body"]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    (tool_use,) = [b for b in blocks(second[1]) if b["type"] == "tool_use"]
    (tool_result,) = [b for b in blocks(second[2]) if b["type"] == "tool_result"]
    assert tool_use["id"] == tool_result["tool_use_id"] == call_id
    assert tool_use["input"] == {"command": "echo mock"}
    assert block_text(tool_result["content"]) == TOOL_RESULT


# ---------------------------------------------------------------------------------------------
# 3. Anthropic overloaded_error fails over to an OpenAI Responses backup

OVERLOADED = {"type": "overloaded_error", "message": "Overloaded"}


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_529_fails_over(server: Server, mock: Mock, stream: bool) -> None:
    primary, backup = f"ov529-{int(stream)}", f"ov529b-{int(stream)}"
    mock.script(primary, [{"status": 529, "body": {"type": "error", "error": OVERLOADED}}])
    combo_id, key = setup_combo(
        server, mock, [("p1", primary), ("p2", backup)], adapters={"p1": "anthropic"}
    )

    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "hi", "stream": stream})

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == f"p2/{backup}"
    assert r.headers["x-ocx-attempts"] == "2"
    if stream:
        events = sse_events(r.text)
        kinds = names(events)
        assert kinds.count("response.created") == 1
        assert "response.failed" not in kinds
        assert kinds[-1] == "response.completed"
    else:
        assert r.json()["output"][0]["content"][0]["text"] == f"mock reply from {backup}"
    assert mock.hits(primary) == 1
    assert mock.hits(backup) == 1
    assert mock.log(primary)[0]["path"] == "/v1/messages"
    assert mock.log(backup)[0]["path"] == "/v1/responses"

    # Overloaded cools the Anthropic target (scope `target`): the next request skips it.
    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "hi", "stream": stream})
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == f"p2/{backup}"
    assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits(primary) == 1


def test_anthropic_in_stream_overload_before_output_fails_over(server: Server, mock: Mock) -> None:
    mock.script("ovbo", [{"fail": "before_output", "error": OVERLOADED}])
    combo_id, key = setup_combo(
        server, mock, [("p1", "ovbo"), ("p2", "ovbo-b")], adapters={"p1": "anthropic"}
    )

    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "hi", "stream": True})

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/ovbo-b"
    assert r.headers["x-ocx-attempts"] == "2"
    events = sse_events(r.text)
    kinds = names(events)
    assert kinds.count("response.created") == 1  # the failed attempt's lifecycle is not replayed
    assert "response.failed" not in kinds and "error" not in kinds
    assert kinds[-1] == "response.completed"
    text = "".join(d["delta"] for d in payloads(events, "response.output_text.delta"))
    assert text == "mock reply from ovbo-b"
    assert mock.hits("ovbo") == 1
    assert mock.hits("ovbo-b") == 1

    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "hi", "stream": True})
    assert r.headers["x-ocx-target"] == "p2/ovbo-b"  # the overloaded target was cooled
    assert mock.hits("ovbo") == 1


def test_anthropic_in_stream_overload_after_output_is_final(server: Server, mock: Mock) -> None:
    mock.script("ovao", [{"fail": "after_output", "deltas": 4, "error": OVERLOADED}])
    combo_id, key = setup_combo(
        server, mock, [("p1", "ovao"), ("p2", "ovao-b")], adapters={"p1": "anthropic"}
    )

    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "hi", "stream": True})

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/ovao"
    events = sse_events(r.text)
    kinds = names(events)
    assert kinds[0] == "response.created"
    assert kinds.count("response.output_text.delta") == 1  # what was sent before the error
    assert "response.completed" not in kinds
    assert kinds[-1] == "response.failed", kinds
    final = events[-1][1]
    assert final["response"]["status"] == "failed"
    assert final["response"]["error"]["message"]
    assert mock.hits("ovao") == 1
    assert mock.hits("ovao-b") == 0  # a committed target is never replayed


# ---------------------------------------------------------------------------------------------
# 4. Request shaping end to end (PRODUCT §5.7, reference §5)


def sent_body(mock: Mock, model: str) -> dict[str, Any]:
    (entry,) = mock.log(model)
    return entry["body"]


def test_default_effort_fallback_resolves_on_target_ladder(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", "eff-fb")],
        models={"eff-fb": {"reasoningEfforts": ["low", "medium"]}},
        defaultEffort="high",
    )

    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "hi"})
    assert r.status_code == 200, r.text
    assert sent_body(mock, "eff-fb")["reasoning"] == {"effort": "medium", "summary": "auto"}

    # An explicit caller effort wins in fallback mode; other reasoning keys are kept.
    body = {"model": f"combo/{combo_id}", "input": "hi", "reasoning": {"effort": "low"}}
    mock.reset()
    assert post_responses(server, key, body).status_code == 200
    assert sent_body(mock, "eff-fb")["reasoning"] == {"effort": "low"}

    body = {"model": f"combo/{combo_id}", "input": "hi", "reasoning": {"summary": "concise"}}
    mock.reset()
    assert post_responses(server, key, body).status_code == 200
    assert sent_body(mock, "eff-fb")["reasoning"] == {"effort": "medium", "summary": "concise"}


def test_default_effort_force_overrides_caller(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", "eff-force")],
        models={"eff-force": {"reasoningEfforts": ["low", "medium", "high"]}},
        defaultEffort="high",
        defaultEffortMode="force",
    )
    body = {
        "model": f"combo/{combo_id}",
        "input": "hi",
        "reasoning": {"effort": "low", "summary": "concise"},
    }

    r = post_responses(server, key, body)

    assert r.status_code == 200, r.text
    assert sent_body(mock, "eff-force")["reasoning"] == {"effort": "high", "summary": "concise"}


def test_empty_ladder_strips_effort_keeps_summary(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", "eff-none"), ("p2", "eff-none-a")],
        adapters={"p2": "anthropic"},
        models={"eff-none": {"reasoningEfforts": []}, "eff-none-a": {"reasoningEfforts": []}},
        defaultEffort="high",
    )
    mock.script("eff-none", [{"status": 500}])  # hop to the Anthropic target as well
    body = {
        "model": f"combo/{combo_id}",
        "input": "hi",
        "reasoning": {"effort": "xhigh", "summary": "concise"},
    }

    r = post_responses(server, key, body)

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/eff-none-a"
    assert sent_body(mock, "eff-none")["reasoning"] == {"summary": "concise"}
    messages_body = sent_body(mock, "eff-none-a")
    assert "thinking" not in messages_body  # no effort left to map to a thinking budget


def image_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                ],
            }
        ],
    }


def test_image_input_disabled(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(server, mock, [("p1", "img-off")], imageInput="disabled")

    for stream in (False, True):
        r = post_responses(server, key, {**image_request(f"combo/{combo_id}"), "stream": stream})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"] == f'Combo "{combo_id}" does not accept image input'
    assert mock.hits("img-off") == 0

    # An image only mentioned in a tool schema is not an image input.
    tool = {
        "type": "function",
        "name": "view_image",
        "description": "Attach an input_image to the conversation",
        "parameters": {
            "type": "object",
            "properties": {"type": {"type": "string", "enum": ["input_image"]}},
        },
    }
    body = {"model": f"combo/{combo_id}", "input": "describe input_image", "tools": [tool]}
    r = post_responses(server, key, body)
    assert r.status_code == 200, r.text
    assert mock.hits("img-off") == 1


@pytest.mark.parametrize(
    ("adapter", "path", "kept"),
    [
        ("anthropic", "/v1/messages", False),
        ("openai-chat", "/v1/chat/completions", False),
        ("openai-responses", "/v1/responses", True),
    ],
)
def test_encrypted_reasoning_only_to_openai(
    server: Server, mock: Mock, adapter: str, path: str, kept: bool
) -> None:
    model_name = f"enc-{adapter}"
    combo_id, key = setup_combo(server, mock, [("p1", model_name)], adapters={"p1": adapter})
    token = fernet()
    reasoning = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Thinking about it"}],
        "encrypted_content": token,
    }
    body = {
        "model": f"combo/{combo_id}",
        "input": [
            user_item("first question"),
            reasoning,
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "first answer"}],
            },
            user_item("second question"),
        ],
        "stream": True,
    }

    r = post_responses(server, key, body)

    assert r.status_code == 200, r.text
    assert names(sse_events(r.text))[-1] == "response.completed"
    (entry,) = mock.log(model_name)
    assert entry["path"] == path
    sent = json.dumps(entry["body"])
    assert "second question" in sent
    if kept:
        assert reasoning in entry["body"]["input"]  # verbatim for the backend that minted it
    else:
        assert token not in sent
        assert "gAAAAA" not in sent
        assert "encrypted_content" not in sent


def encrypted_task_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "input": [
            developer_item(),
            {
                "type": "agent_message",
                "content": [{"type": "encrypted_content", "encrypted_content": fernet()}],
            },
        ],
        "stream": True,
    }


def test_encrypted_agent_task_without_chatgpt_target(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(
        server, mock, [("p1", "et-a"), ("p2", "et-b")], adapters={"p2": "anthropic"}
    )

    r = post_responses(server, key, encrypted_task_request(f"combo/{combo_id}"))

    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {
            "type": "invalid_request_error",
            "code": "unreadable_encrypted_agent_task",
            "message": (
                "Routed V2 worker task is encrypted for the native ChatGPT backend and cannot be "
                "read by the selected provider. Use plaintext V2 agent-message delivery or select "
                "a native ChatGPT model."
            ),
        }
    }
    assert mock.log() == []


def test_encrypted_agent_task_goes_only_to_chatgpt(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", "et-c"), ("p2", "et-d"), ("p3", "et-g")],
        adapters={"p2": "anthropic", "p3": "chatgpt"},
    )
    caller_token = "caller-chatgpt-token-yyyyyyyyyyyyyy"
    body = encrypted_task_request(f"combo/{combo_id}")
    headers = {"x-ocx-key": key, "Authorization": f"Bearer {caller_token}"}

    r = server.http.post("/v1/responses", json=body, headers=headers)

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p3/et-g"
    assert r.headers["x-ocx-attempts"] == "1"
    assert names(sse_events(r.text))[-1] == "response.completed"
    (entry,) = mock.log()
    assert entry["model"] == "et-g"
    assert entry["path"] == "/v1/responses"
    assert entry["headers"]["authorization"] == f"Bearer {caller_token}"
    assert entry["body"]["input"] == body["input"]  # the ciphertext reaches its own backend

    # A plaintext task uses the normal strategy (first target).
    plain = {**body, "input": [user_item("do the task")]}
    r = server.http.post("/v1/responses", json=plain, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p1/et-c"


# ---------------------------------------------------------------------------------------------
# 5. Context overflow (PRODUCT §5.2)

OVERFLOW = {
    "error": {
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
        "message": "This model's maximum context length is 100000 tokens. "
        "However, your messages resulted in 150000 tokens.",
    }
}


@pytest.mark.parametrize("stream", [False, True])
def test_context_overflow_hops_to_larger_window_without_cooling(
    server: Server, mock: Mock, stream: bool
) -> None:
    a, b = f"ctx-a-{int(stream)}", f"ctx-b-{int(stream)}"
    mock.script(a, [{"status": 400, "body": OVERFLOW}])
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", a), ("p2", b)],
        models={a: {"contextWindow": 100000}, b: {"contextWindow": 200000}},
    )
    body = {"model": f"combo/{combo_id}", "input": "a long conversation", "stream": stream}

    r = post_responses(server, key, body)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == f"p2/{b}"
    assert r.headers["x-ocx-attempts"] == "2"
    assert mock.hits(a) == 1 and mock.hits(b) == 1

    # A was not cooled: the next request goes to A first again.
    r = post_responses(server, key, body)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == f"p1/{a}"
    assert mock.hits(a) == 2 and mock.hits(b) == 1


def test_context_overflow_same_window_returns_error(server: Server, mock: Mock) -> None:
    mock.script("ctx-c", [{"status": 400, "body": OVERFLOW}])
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", "ctx-c"), ("p2", "ctx-d")],
        models={"ctx-c": {"contextWindow": 100000}, "ctx-d": {"contextWindow": 100000}},
    )

    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "long"})

    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length" in error["message"]
    assert mock.hits("ctx-c") == 1
    assert mock.hits("ctx-d") == 0

    # Still not cooled: the next request tries A again.
    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "short"})
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p1/ctx-c"


def test_anthropic_prompt_too_long_hops_to_larger_window(server: Server, mock: Mock) -> None:
    too_long = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 150000 tokens > 100000 maximum",
        },
    }
    mock.script("ctx-ant", [{"status": 400, "body": too_long}])
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", "ctx-ant"), ("p2", "ctx-big")],
        adapters={"p1": "anthropic"},
        models={"ctx-ant": {"contextWindow": 100000}, "ctx-big": {"contextWindow": 200000}},
    )

    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "long"})

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/ctx-big"
    r = post_responses(server, key, {"model": f"combo/{combo_id}", "input": "short"})
    assert r.headers["x-ocx-target"] == "p1/ctx-ant"


# ---------------------------------------------------------------------------------------------
# 6. Compaction recall (PRODUCT §5.7, reference §7)


# How the session lane reaches ocx: Codex sends the `session_id` header and the same value as the
# body's `prompt_cache_key` (codex-wire §2.5, §3.1); other clients use `session-id` and friends.
LANE_CARRIERS = [
    # Daphne drops underscore headers; server.daphne_main renames exactly this one.
    "session_id",
    "session-id",
    "thread-id",
    "prompt_cache_key",
]


def with_lane(
    carrier: str, lane: str, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    if carrier == "prompt_cache_key":
        return {**body, "prompt_cache_key": lane}, {}
    return body, {carrier: lane}


@pytest.mark.parametrize("carrier", LANE_CARRIERS)
def test_compaction_recall_routes_bare_name_through_combo(
    server: Server, mock: Mock, carrier: str
) -> None:
    other_key = server.create_key(user="someone-else")
    combo_id, key = setup_combo(server, mock, [("p1", "m-recall")])  # syncs both keys
    lane = f"019a3c5e-{uuid.uuid4().hex[:12]}"

    def ask(model: str, lane_id: str | None, client_key: str = key) -> httpx.Response:
        body: dict[str, Any] = {"model": model, "input": "hi", "stream": True}
        headers: dict[str, str] = {}
        if lane_id is not None:
            body, headers = with_lane(carrier, lane_id, body)
        return server.http.post("/v1/responses", json=body, headers=auth(client_key, **headers))

    # Before any combo response on this lane the bare name is unknown.
    r = ask("m-recall", lane)
    assert r.status_code == 404, r.text

    r = ask(f"combo/{combo_id}", lane)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-combo"] == combo_id
    assert one(sse_events(r.text), "response.completed")["response"]["model"] == "m-recall"

    # Compaction with the bare upstream name on the same session: back through the combo.
    r = ask("m-recall", lane)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-combo"] == combo_id
    assert r.headers["x-ocx-target"] == "p1/m-recall"
    assert names(sse_events(r.text))[-1] == "response.completed"

    # Another session of the same key, no session at all, or another key: not recalled.
    for response in (
        ask("m-recall", "other-lane"),
        ask("m-recall", None),
        ask("m-recall", lane, other_key),
    ):
        assert response.status_code == 404, response.text
        assert "x-ocx-combo" not in response.headers
        assert response.json()["error"]["code"] == "model_not_found"
    assert mock.hits("m-recall") == 2
