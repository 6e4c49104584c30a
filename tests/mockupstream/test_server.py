"""Tests of the scriptable fake upstream, driven over real sockets with httpx."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from mockupstream import server as mock_upstream
from mockupstream.server import MockState, serve, split_text

ROOT = Path(__file__).resolve().parents[2]
SHELL_TOOL = {
    "type": "function",
    "name": "shell_command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}


class Mock:
    def __init__(self, base: str, state: MockState, client: httpx.AsyncClient) -> None:
        self.base = base
        self.state = state
        self.client = client

    async def script(self, model: str, steps: list[dict[str, Any]], then: Any = None) -> None:
        r = await self.client.post(
            "/_mock/script", json={"model": model, "steps": steps, "then": then}
        )
        assert r.status_code == 200, r.text

    async def log(self, **params: str) -> list[dict[str, Any]]:
        r = await self.client.get("/_mock/log", params=params)
        assert r.status_code == 200
        result: list[dict[str, Any]] = r.json()
        return result


@pytest_asyncio.fixture
async def mock() -> AsyncIterator[Mock]:
    state = MockState(require_keys=frozenset())
    server = await serve("127.0.0.1", 0, state)
    port = server.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        yield Mock(base, state, client)
    server.close()
    state.cancel_connections()
    await server.wait_closed()


def sse_events(raw: str) -> list[tuple[str | None, str]]:
    """Split an SSE body into (event name, data) pairs."""
    out: list[tuple[str | None, str]] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        event: str | None = None
        data = ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((event, data))
    return out


def responses_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m1",
        "stream": True,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        ],
    }
    body.update(extra)
    return body


async def stream_text(mock: Mock, path: str, body: dict[str, Any]) -> tuple[httpx.Response, str]:
    r = await mock.client.post(path, json=body)
    return r, r.text


# ---------------------------------------------------------------------------------- protocols


async def test_responses_stream_events_and_completed(mock: Mock) -> None:
    r, raw = await stream_text(mock, "/v1/responses", responses_body())
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    events = sse_events(raw)
    datas = [json.loads(d) for _, d in events]
    assert [e for e, _ in events] == [d["type"] for d in datas]
    assert datas[0]["type"] == "response.created"
    assert datas[-1]["type"] == "response.completed"
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    deltas = [d["delta"] for d in datas if d["type"] == "response.output_text.delta"]
    assert len(deltas) == 3
    assert "".join(deltas) == "mock reply from m1"
    done = [d for d in datas if d["type"] == "response.output_item.done"][0]
    assert done["item"]["content"][0]["text"] == "mock reply from m1"
    completed = datas[-1]["response"]
    assert completed["id"] == "resp_mock_1"
    usage = completed["usage"]
    assert usage["output_tokens"] == 3
    assert usage["total_tokens"] == usage["input_tokens"] + 3
    assert usage["input_tokens_details"] == {"cached_tokens": 0}


async def test_responses_short_path_and_non_stream(mock: Mock) -> None:
    r = await mock.client.post("/responses", json=responses_body(stream=False))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "response"
    assert body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "mock reply from m1"
    assert body["usage"]["output_tokens"] == 3


async def test_chat_stream_finish_usage_done(mock: Mock) -> None:
    body = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    r, raw = await stream_text(mock, "/v1/chat/completions", body)
    events = sse_events(raw)
    assert all(e is None for e, _ in events)
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "mock reply from gpt-x"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_chat_non_stream(mock: Mock) -> None:
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
    r = await mock.client.post("/chat/completions", json=body)
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "mock reply from gpt-x"}
    assert choice["finish_reason"] == "stop"
    assert r.json()["usage"]["total_tokens"] == r.json()["usage"]["prompt_tokens"] + 3


async def test_messages_stream_event_lines(mock: Mock) -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    r, raw = await stream_text(mock, "/v1/messages", body)
    events = sse_events(raw)
    names = [e for e, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    datas = [json.loads(d) for _, d in events]
    assert [d["type"] for d in datas] == names
    assert "".join(d["delta"]["text"] for d in datas[2:5]) == "mock reply from claude-x"
    assert datas[6]["delta"]["stop_reason"] == "end_turn"
    assert datas[6]["usage"]["output_tokens"] == 3


async def test_messages_non_stream_and_cache_usage(mock: Mock) -> None:
    await mock.script("claude-x", [{"usage": {"input_tokens": 100, "cached_tokens": 60}}])
    body = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    r = await mock.client.post("/v1/messages", json=body)
    out = r.json()
    assert out["content"] == [{"type": "text", "text": "mock reply from claude-x"}]
    assert out["usage"]["input_tokens"] == 40
    assert out["usage"]["cache_read_input_tokens"] == 60


async def test_messages_requires_max_tokens(mock: Mock) -> None:
    body = {"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}
    r = await mock.client.post("/v1/messages", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("n", [1, 2, 7, 20])
async def test_deltas_count(mock: Mock, n: int) -> None:
    await mock.script("m1", [{"deltas": n}])
    _, raw = await stream_text(mock, "/v1/responses", responses_body())
    datas = [json.loads(d) for _, d in sse_events(raw)]
    deltas = [d["delta"] for d in datas if d["type"] == "response.output_text.delta"]
    assert len(deltas) == n
    final = datas[-1]["response"]["output"][0]["content"][0]["text"]
    assert "".join(deltas) == final
    assert final.startswith("mock reply")


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("a b c d", 2, ["a b", " c d"]),
        ("a b c", 1, ["a b c"]),
        ("a", 3, ["a", " lorem", " ipsum"]),
    ],
)
def test_split_text(text: str, n: int, expected: list[str]) -> None:
    assert split_text(text, n) == expected


class CountingPieces(tuple[str, ...]):
    """A reply's pieces that count how many were read."""

    read = 0

    def __iter__(self) -> Any:
        for piece in super().__iter__():
            type(self).read += 1
            yield piece


@pytest.mark.parametrize(
    ("protocol", "make"),
    [
        ("chat", mock_upstream._chat_events),
        ("responses", mock_upstream._responses_events),
        ("messages", mock_upstream._messages_events),
    ],
)
def test_a_streams_events_are_made_as_they_are_sent(protocol: str, make: Any) -> None:
    """A paced stream of many deltas must not be encoded whole before its first byte: 1,024
    such streams opening at once cost the mock seconds before any first event (issue 24)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
    reply = mock_upstream.build_reply(protocol, body, {"deltas": 500}, 10)
    CountingPieces.read = 0
    pieces = CountingPieces(reply.pieces)
    events = make("m", "id-1", mock_upstream.Reply(**{**vars(reply), "pieces": pieces}), {})
    first = [next(events) for _ in range(4)]
    assert CountingPieces.read <= 4  # not the 500 an up-front list reads
    rest = list(events)
    assert CountingPieces.read == 500
    text = b"".join(first + rest)
    assert text.count(b"delta") >= 500


# ---------------------------------------------------------------------------------- tools


async def test_responses_tool_call_then_text(mock: Mock) -> None:
    body = responses_body("please call a tool now", tools=[SHELL_TOOL])
    _, raw = await stream_text(mock, "/v1/responses", body)
    datas = [json.loads(d) for _, d in sse_events(raw)]
    arg_deltas = [
        d["delta"] for d in datas if d["type"] == "response.function_call_arguments.delta"
    ]
    assert "".join(arg_deltas) == '{"command":"echo mock"}'
    done = [d["item"] for d in datas if d["type"] == "response.output_item.done"]
    assert done == [
        {
            "type": "function_call",
            "id": "fc_mock_1",
            "call_id": "call_mock_1",
            "name": "shell_command",
            "arguments": '{"command":"echo mock"}',
            "status": "completed",
        }
    ]
    follow = responses_body("please call a tool now", tools=[SHELL_TOOL])
    follow["input"] += [
        {"type": "function_call", "name": "shell_command", "arguments": "{}", "call_id": "c"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"},
    ]
    _, raw2 = await stream_text(mock, "/v1/responses", follow)
    last = json.loads(sse_events(raw2)[-1][1])
    assert last["response"]["output"][0]["type"] == "message"
    assert last["response"]["output"][0]["content"][0]["text"].endswith("tool output received")


async def test_no_tool_call_without_tools(mock: Mock) -> None:
    _, raw = await stream_text(mock, "/v1/responses", responses_body("call a tool"))
    last = json.loads(sse_events(raw)[-1][1])
    assert last["response"]["output"][0]["type"] == "message"


async def test_chat_tool_call_stream(mock: Mock) -> None:
    body = {
        "model": "gpt-x",
        "stream": True,
        "messages": [{"role": "user", "content": "Call a tool please"}],
        "tools": [{"type": "function", "function": {"name": "shell", "parameters": {}}}],
    }
    _, raw = await stream_text(mock, "/v1/chat/completions", body)
    chunks = [json.loads(d) for _, d in sse_events(raw)[:-1]]
    calls = [
        tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert {tc["id"] for tc in calls} == {"call_mock_1"}
    assert calls[0]["function"]["name"] == "shell"
    assert "".join(tc["function"]["arguments"] for tc in calls) == "{}"
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_messages_tool_use_and_tool_result(mock: Mock) -> None:
    tools = [{"name": "shell_command", "input_schema": SHELL_TOOL["parameters"]}]
    base = {"model": "claude-x", "max_tokens": 9, "tools": tools}
    r = await mock.client.post(
        "/v1/messages", json={**base, "messages": [{"role": "user", "content": "call a tool"}]}
    )
    out = r.json()
    assert out["stop_reason"] == "tool_use"
    assert out["content"][0]["input"] == {"command": "echo mock"}
    messages = [
        {"role": "user", "content": "call a tool"},
        {"role": "assistant", "content": [out["content"][0]]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_mock_1"}]},
    ]
    r2 = await mock.client.post("/v1/messages", json={**base, "messages": messages})
    assert r2.json()["stop_reason"] == "end_turn"


async def test_forced_tool_call_behaviour(mock: Mock) -> None:
    await mock.script("m1", [{"tool_call": {"name": "apply", "arguments": {"a": 1}}}])
    r = await mock.client.post("/v1/responses", json=responses_body(stream=False))
    item = r.json()["output"][0]
    assert (item["name"], item["arguments"]) == ("apply", '{"a":1}')


# ---------------------------------------------------------------------------------- scripting


async def test_steps_then_and_default(mock: Mock) -> None:
    await mock.script(
        "m1",
        [{"status": 429, "headers": {"Retry-After": "2"}}, {"status": 500}],
        then={"status": 503},
    )
    codes = []
    for _ in range(4):
        r = await mock.client.post("/v1/responses", json=responses_body(stream=False))
        codes.append(r.status_code)
        if r.status_code == 429:
            assert r.headers["retry-after"] == "2"
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert codes == [429, 500, 503, 503]
    other = await mock.client.post("/v1/responses", json=responses_body(model="m2"))
    assert other.status_code == 200
    await mock.script("m1", [{"status": 400}])
    codes2 = [
        (await mock.client.post("/v1/responses", json=responses_body(stream=False))).status_code
        for _ in range(2)
    ]
    assert codes2 == [400, 200]


async def test_wildcard_script_and_custom_body(mock: Mock) -> None:
    body = {"error": {"code": "context_length_exceeded", "message": "too long"}}
    await mock.script("*", [{"status": 400, "body": body}])
    r = await mock.client.post("/v1/responses", json=responses_body(model="anything"))
    assert (r.status_code, r.json()) == (400, body)


async def test_anthropic_error_body_shape(mock: Mock) -> None:
    await mock.script("claude-x", [{"status": 529}])
    body = {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    r = await mock.client.post("/v1/messages", json=body)
    assert r.status_code == 529
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "overloaded_error"


async def test_usage_limit_429(mock: Mock) -> None:
    await mock.script("m1", [{"usage_limit": {"resets_in_seconds": 600, "plan_type": "pro"}}])
    before = int(time.time())
    r = await mock.client.post("/v1/responses", json=responses_body())
    assert r.status_code == 429
    err = r.json()["error"]
    assert err["type"] == "usage_limit_reached"
    assert err["plan_type"] == "pro"
    assert err["resets_in_seconds"] == 600
    assert before + 600 <= err["resets_at"] <= int(time.time()) + 600
    assert r.headers["x-codex-primary-used-percent"] == "100"
    assert r.headers["x-codex-primary-reset-at"] == str(err["resets_at"])
    assert r.headers["x-codex-active-limit"] == "codex"


async def test_rate_limit_headers_on_success(mock: Mock) -> None:
    limits = {
        "primary": {"used_percent": 22, "window_minutes": 300, "reset_at": 1790000000},
        "secondary": {"used_percent": 40, "window_minutes": 10080, "reset_after_seconds": 5},
    }
    await mock.script("m1", [{"rate_limits": limits, "headers": {"x-extra": "1"}}])
    r = await mock.client.post("/v1/responses", json=responses_body())
    assert r.status_code == 200
    assert r.headers["x-codex-primary-used-percent"] == "22"
    assert r.headers["x-codex-primary-window-minutes"] == "300"
    assert r.headers["x-codex-primary-reset-at"] == "1790000000"
    assert r.headers["x-codex-secondary-window-minutes"] == "10080"
    assert r.headers["x-codex-secondary-reset-after-seconds"] == "5"
    assert r.headers["x-extra"] == "1"


async def test_invalid_script_rejected(mock: Mock) -> None:
    r = await mock.client.post("/_mock/script", json={"model": "m1", "steps": [{"stauts": 1}]})
    assert r.status_code == 400
    assert "stauts" in r.json()["error"]
    r2 = await mock.client.post("/_mock/script", json={"model": "m1", "steps": [{"deltas": "x"}]})
    assert r2.status_code == 400
    ok = await mock.client.post("/v1/responses", json=responses_body(stream=False))
    assert ok.status_code == 200


async def test_split_events_sends_each_frame_in_two_reads(mock: Mock) -> None:
    r = await mock.client.post(
        "/_mock/script", json={"model": "m1", "steps": [{"split_events": 1}]}
    )
    assert r.status_code == 400 and "split_events" in r.json()["error"]
    _, whole = await stream_text(mock, "/v1/responses", responses_body())
    await mock.script("m1", [{"split_events": True}])
    reads: list[bytes] = []
    async with mock.client.stream("POST", "/v1/responses", json=responses_body()) as resp:
        async for chunk in resp.aiter_raw():
            reads.append(chunk)
    body = b"".join(reads)
    # The same frames (ids and timestamps aside), and reads that end inside a frame (one such
    # read is enough: a loaded machine may join the two halves of some frames).
    assert len(sse_events(body.decode())) == len(sse_events(whole))
    assert not all(chunk.endswith(b"\n\n") for chunk in reads)


# ---------------------------------------------------------------------------------- faults


async def test_fail_before_output_responses(mock: Mock) -> None:
    await mock.script("m1", [{"fail": "before_output", "error": {"code": "server_is_overloaded"}}])
    _, raw = await stream_text(mock, "/v1/responses", responses_body())
    types = [json.loads(d)["type"] for _, d in sse_events(raw)]
    assert types == ["response.created", "response.in_progress", "response.failed"]
    failed = json.loads(sse_events(raw)[-1][1])
    assert failed["response"]["error"]["code"] == "server_is_overloaded"


async def test_fail_after_output_and_incomplete(mock: Mock) -> None:
    await mock.script("m1", [{"fail": "after_output", "event": "response.incomplete"}])
    _, raw = await stream_text(mock, "/v1/responses", responses_body())
    types = [json.loads(d)["type"] for _, d in sse_events(raw)]
    assert types.count("response.output_text.delta") == 1
    assert types[-1] == "response.incomplete"
    assert "response.completed" not in types


async def test_fail_messages_and_chat(mock: Mock) -> None:
    await mock.script("claude-x", [{"fail": "before_output"}])
    await mock.script("gpt-x", [{"fail": "before_output"}])
    body = {"model": "claude-x", "max_tokens": 5, "stream": True, "messages": []}
    _, raw = await stream_text(mock, "/v1/messages", body)
    assert [e for e, _ in sse_events(raw)] == ["message_start", "error"]
    chat = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    _, raw2 = await stream_text(mock, "/v1/chat/completions", chat)
    events = sse_events(raw2)
    assert len(events) == 1
    assert "error" in json.loads(events[0][1])


async def read_events_until_error(
    mock: Mock, body: dict[str, Any], timeout: float
) -> tuple[list[str], BaseException | None]:
    lines: list[str] = []
    error: BaseException | None = None
    try:
        async with mock.client.stream(
            "POST", "/v1/responses", json=body, timeout=httpx.Timeout(5, read=timeout)
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
    except httpx.TransportError as exc:
        error = exc
    return lines, error


async def test_cut_after_events(mock: Mock) -> None:
    await mock.script("m1", [{"cut_after_events": 4}])
    lines, error = await read_events_until_error(mock, responses_body(), timeout=2)
    assert isinstance(error, httpx.RemoteProtocolError)
    assert len(lines) == 4
    # The next attempt gets a complete stream again.
    _, raw = await stream_text(mock, "/v1/responses", responses_body())
    assert json.loads(sse_events(raw)[-1][1])["type"] == "response.completed"


async def test_cut_non_stream(mock: Mock) -> None:
    await mock.script("m1", [{"cut_after_events": 0}])
    with pytest.raises(httpx.TransportError):
        await mock.client.post("/v1/responses", json=responses_body(stream=False))


async def test_stall_without_end_times_out(mock: Mock) -> None:
    await mock.script("m1", [{"stall_after_events": 2}])
    t0 = time.monotonic()
    lines, error = await read_events_until_error(mock, responses_body(), timeout=0.3)
    assert isinstance(error, httpx.ReadTimeout)
    assert len(lines) == 2
    assert time.monotonic() - t0 < 2


async def test_stall_with_stall_ms_resumes(mock: Mock) -> None:
    await mock.script("m1", [{"stall_after_events": 2, "stall_ms": 150}])
    t0 = time.monotonic()
    lines, error = await read_events_until_error(mock, responses_body(), timeout=2)
    assert error is None
    assert json.loads(lines[-1])["type"] == "response.completed"
    assert time.monotonic() - t0 >= 0.15


async def test_delay_first_byte(mock: Mock) -> None:
    await mock.script("m1", [{"delay_first_byte_ms": 150}])
    t0 = time.monotonic()
    r = await mock.client.post("/v1/responses", json=responses_body(stream=False))
    assert r.status_code == 200
    assert time.monotonic() - t0 >= 0.15
    with pytest.raises(httpx.ReadTimeout):
        await mock.script("m1", [{"delay_first_byte_ms": 500}])
        await mock.client.post("/v1/responses", json=responses_body(), timeout=0.1)


async def test_delta_pacing(mock: Mock) -> None:
    await mock.script("m1", [{"deltas": 2, "delta_ms": 20}])
    t0 = time.monotonic()
    _, raw = await stream_text(mock, "/v1/responses", responses_body())
    n_events = len(sse_events(raw))
    assert time.monotonic() - t0 >= (n_events - 1) * 0.02


async def test_no_response_times_out(mock: Mock) -> None:
    await mock.script("m1", [{"no_response": True}])
    with pytest.raises(httpx.ReadTimeout):
        await mock.client.post("/v1/responses", json=responses_body(), timeout=0.3)
    assert len(await mock.log(model="m1")) == 1


async def test_reset_raises_transport_error(mock: Mock) -> None:
    await mock.script("m1", [{"reset": True}])
    with pytest.raises(httpx.TransportError):
        await mock.client.post("/v1/responses", json=responses_body())
    r = await mock.client.post("/v1/responses", json=responses_body())
    assert r.status_code == 200


async def test_malformed_after_events(mock: Mock) -> None:
    await mock.script("m1", [{"malformed_after_events": 2}])
    _, raw = await stream_text(mock, "/v1/responses", responses_body())
    datas = [d for _, d in sse_events(raw)]
    assert datas[2] == "{not json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(datas[2])
    assert json.loads(datas[-1])["type"] == "response.completed"


async def test_omit_done(mock: Mock) -> None:
    await mock.script("gpt-x", [{"omit_done": True}])
    chat = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    _, raw = await stream_text(mock, "/v1/chat/completions", chat)
    datas = [d for _, d in sse_events(raw)]
    assert "[DONE]" not in datas
    assert "usage" in json.loads(datas[-1])
    await mock.script("m1", [{"omit_done": True}])
    _, raw2 = await stream_text(mock, "/v1/responses", responses_body())
    types = [json.loads(d)["type"] for _, d in sse_events(raw2)]
    assert types[-1] == "response.output_item.done"


# ---------------------------------------------------------------------------------- log, auth


async def test_attempt_log_and_filter_and_reset(mock: Mock) -> None:
    await mock.script("m1", [{"status": 429}])
    headers = {"Authorization": "Bearer sk-one", "X-Custom": "A"}
    await mock.client.post("/v1/responses", json=responses_body(), headers=headers)
    await mock.client.post("/v1/responses", json=responses_body(), headers=headers)
    await mock.client.post(
        "/v1/chat/completions",
        json={"model": "gpt-x", "messages": []},
        headers={"authorization": "Bearer sk-two"},
    )
    log = await mock.log()
    assert [e["seq"] for e in log] == [1, 2, 3]
    assert [e["model"] for e in log] == ["m1", "m1", "gpt-x"]
    assert [e["path"] for e in log] == ["/v1/responses", "/v1/responses", "/v1/chat/completions"]
    assert [e["stream"] for e in log] == [True, True, False]
    assert log[0]["behaviour"] == {"status": 429}
    assert log[1]["behaviour"] == {}
    assert log[0]["headers"]["authorization"] == "Bearer sk-one"
    assert log[0]["headers"]["x-custom"] == "A"
    assert log[2]["headers"]["authorization"] == "Bearer sk-two"
    assert log[0]["t_ms"] <= log[1]["t_ms"] <= log[2]["t_ms"]
    assert log[2]["body"] == {"model": "gpt-x", "messages": []}
    assert [e["seq"] for e in await mock.log(model="m1")] == [1, 2]
    assert [e["seq"] for e in await mock.log(since="2")] == [3]
    assert await mock.log(model="nope") == []
    assert (await mock.client.post("/_mock/reset")).status_code == 200
    assert await mock.log() == []
    r = await mock.client.post("/v1/responses", json=responses_body(stream=False))
    assert r.status_code == 200  # the script was cleared too
    assert [e["seq"] for e in await mock.log()] == [1]


async def test_require_key() -> None:
    state = MockState(require_keys=frozenset({"good"}))
    server = await serve("127.0.0.1", 0, state)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            await c.post("/_mock/script", json={"model": "m1", "steps": [{"status": 500}]})
            bad = await c.post(
                "/v1/responses", json=responses_body(), headers={"authorization": "Bearer bad"}
            )
            assert bad.status_code == 401
            ok = await c.post(
                "/v1/responses", json=responses_body(), headers={"authorization": "Bearer good"}
            )
            assert ok.status_code == 500  # the 401 did not consume the scripted step
            msg = {"model": "c", "max_tokens": 1, "messages": []}
            assert (
                await c.post("/v1/messages", json=msg, headers={"x-api-key": "good"})
            ).status_code == 200
            assert (await c.post("/v1/messages", json=msg)).status_code == 401
            log = (await c.get("/_mock/log")).json()
            assert [e["behaviour"].get("auth") for e in log] == ["rejected", None, None, "rejected"]
    finally:
        server.close()
        state.cancel_connections()


# ---------------------------------------------------------------------------------- raw HTTP


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head:
        return head, await reader.readuntil(b"\r\n0\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, await reader.readexactly(length)


async def test_keep_alive_and_chunked_request_body(mock: Mock) -> None:
    port = int(mock.base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        payload = json.dumps(responses_body(stream=False)).encode()
        plain = b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (
            len(payload),
            payload,
        )
        half = len(payload) // 2
        chunked = (
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n" % (half, payload[:half])
            + b"%x;ext=1\r\n%s\r\n" % (len(payload) - half, payload[half:])
            + b"0\r\n\r\n"
        )
        streaming = json.dumps(responses_body()).encode()
        stream_req = b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (
            len(streaming),
            streaming,
        )
        for req in (plain, chunked, stream_req, plain):
            writer.write(req)
            head, body = await _read_response(reader)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"connection: keep-alive" in head
            assert b"mock reply from m1" in body
        writer.write(b"GET /_mock/log HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        head, body = await _read_response(reader)
        assert b"connection: close" in head
        assert [e["seq"] for e in json.loads(body)] == [1, 2, 3, 4]
        assert await reader.read() == b""  # server closed after "connection: close"
    finally:
        writer.close()


async def test_unknown_route_and_bad_json(mock: Mock) -> None:
    assert (await mock.client.get("/nope")).status_code == 404
    r = await mock.client.post("/v1/responses", content=b"{not json")
    assert r.status_code == 400
    assert (await mock.client.get("/v1/responses")).status_code == 405


# ---------------------------------------------------------------------------------- process


def test_main_subprocess_port_line_and_sigterm() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mockupstream", "--port", "0", "--require-key", "k"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("mock-upstream listening on http://127.0.0.1:")
        base = line.rsplit(" ", 1)[1]
        r = httpx.post(
            f"{base}/v1/responses",
            json=responses_body(stream=False),
            headers={"authorization": "Bearer k"},
        )
        assert r.status_code == 200
        # A connection held open by no_response must not block shutdown.
        httpx.post(f"{base}/_mock/script", json={"model": "m1", "steps": [{"no_response": True}]})
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{base}/v1/responses",
                json=responses_body(),
                headers={"x-api-key": "k"},
                timeout=0.2,
            )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_main_bad_script_file(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"model": "m", "steps": [{"nope": 1}]}))
    assert mock_upstream.main(["--port", "0", "--script", str(script)]) == 1


PROTOCOL_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", responses_body()),
    ("/v1/chat/completions", {"model": "m1", "stream": True, "messages": []}),
    ("/v1/messages", {"model": "m1", "stream": True, "max_tokens": 5, "messages": []}),
]


@pytest.mark.parametrize(("path", "body"), PROTOCOL_BODIES)
async def test_cut_and_malformed_every_protocol(
    mock: Mock, path: str, body: dict[str, Any]
) -> None:
    await mock.script("m1", [{"cut_after_events": 2}, {"malformed_after_events": 1}])
    received: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        async with mock.client.stream("POST", path, json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    received.append(line[6:])
    assert len(received) == 2
    _, raw = await stream_text(mock, path, body)
    datas = [d for _, d in sse_events(raw)]
    assert datas[1] == "{not json"
    assert len(datas) > 3


async def test_malformed_non_stream(mock: Mock) -> None:
    await mock.script("m1", [{"malformed_after_events": 0}])
    r = await mock.client.post("/v1/responses", json=responses_body(stream=False))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        r.json()


async def test_stall_non_stream_times_out(mock: Mock) -> None:
    await mock.script("m1", [{"stall_after_events": 0}])
    with pytest.raises(httpx.ReadTimeout):
        await mock.client.post("/v1/responses", json=responses_body(stream=False), timeout=0.2)


def test_module_is_framework_free() -> None:
    source = Path(mock_upstream.__file__).read_text()
    assert "django" not in source
    assert "from __future__ import annotations" in source


async def test_omit_terminal_done_sentinel_and_lead_text(mock: Mock) -> None:
    chat = {"model": "gpt-t", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    await mock.script("gpt-t", [{"omit_terminal": True}])
    _, raw = await stream_text(mock, "/v1/chat/completions", chat)
    datas = [json.loads(d) for _, d in sse_events(raw)]  # no [DONE] to fail json.loads
    assert all(c["choices"] and not c["choices"][0].get("finish_reason") for c in datas)
    assert not any("usage" in c for c in datas)

    await mock.script("m1", [{"done_sentinel": True}])
    _, raw = await stream_text(mock, "/v1/responses", responses_body())
    datas = [d for _, d in sse_events(raw)]
    assert datas[-1] == "[DONE]" and json.loads(datas[-2])["type"] == "response.completed"

    await mock.script("gpt-t", [{"tool_call": {"name": "stale_tool"}, "lead_text": "Sure."}])
    _, raw = await stream_text(mock, "/v1/chat/completions", chat)
    chunks = [json.loads(d) for _, d in sse_events(raw) if d != "[DONE]"]
    assert chunks[0]["choices"][0]["delta"]["content"] == "Sure."
    call = chunks[1]["choices"][0]["delta"]["tool_calls"][0]
    assert call["function"]["name"] == "stale_tool"

    messages = {
        "model": "m2",
        "stream": True,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "x"}],
    }
    await mock.script("m2", [{"tool_call": {"name": "t"}, "lead_text": "Sure."}])
    _, raw = await stream_text(mock, "/v1/messages", messages)
    starts = [json.loads(d) for e, d in sse_events(raw) if e == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "text"),
        (1, "tool_use"),
    ]


async def test_new_flags_are_validated(mock: Mock) -> None:
    for bad in ({"omit_terminal": 1}, {"done_sentinel": "yes"}, {"lead_text": 3}):
        r = await mock.client.post("/_mock/script", json={"model": "x", "steps": [bad]})
        assert r.status_code == 400, bad


# ------------------------------------------------------------- rescue scenarios (issue #29)

PREFILL_BODIES: list[tuple[str, dict[str, Any], str]] = [
    (
        "/v1/responses",
        {
            "model": "m1",
            "input": [
                {"type": "message", "role": "user", "content": "hi"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "one two"}],
                },
            ],
        },
        "responses",
    ),
    (
        "/v1/chat/completions",
        {
            "model": "m1",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "one two"},
            ],
        },
        "chat",
    ),
    (
        "/v1/messages",
        {
            "model": "m1",
            "max_tokens": 50,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "one two"}]},
            ],
        },
        "messages",
    ),
]
WHOLE = "one two three four"


def _answer_text(protocol: str, body: dict[str, Any]) -> str:
    if protocol == "responses":
        return str(body["output"][0]["content"][0]["text"])
    if protocol == "chat":
        return str(body["choices"][0]["message"]["content"])
    return str(body["content"][0]["text"])


def _streamed_text(protocol: str, raw: str) -> str:
    out = []
    for _, data in sse_events(raw):
        if not data.startswith("{"):
            continue
        d = json.loads(data)
        if protocol == "responses" and d.get("type") == "response.output_text.delta":
            out.append(d["delta"])
        elif protocol == "chat" and d.get("choices"):
            out.append(d["choices"][0]["delta"].get("content") or "")
        elif protocol == "messages" and d.get("type") == "content_block_delta":
            out.append(d["delta"].get("text", ""))
    return "".join(out)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("path", "body", "protocol"), PREFILL_BODIES)
async def test_a_prefill_is_continued(
    mock: Mock, path: str, body: dict[str, Any], protocol: str, stream: bool
) -> None:
    await mock.script("m1", [], {"text": WHOLE, "deltas": 3})
    r = await mock.client.post(path, json={**body, "stream": stream})
    assert r.status_code == 200
    got = _streamed_text(protocol, r.text) if stream else _answer_text(protocol, r.json())
    assert got == " three four"  # the rest of the canonical text after the prefill


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("path", "body", "protocol"), PREFILL_BODIES)
async def test_refuse_prefill(
    mock: Mock, path: str, body: dict[str, Any], protocol: str, stream: bool
) -> None:
    await mock.script("m1", [], {"refuse_prefill": True})
    r = await mock.client.post(path, json={**body, "stream": stream})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_prefill"
    # A request without a prefill is answered as usual.
    plain = {**body, "stream": False}
    key = "input" if protocol == "responses" else "messages"
    plain[key] = plain[key][:1]
    ok = await mock.client.post(path, json=plain)
    assert ok.status_code == 200


async def test_anthropic_refuses_a_prefill_ending_in_whitespace(mock: Mock) -> None:
    body = dict(PREFILL_BODIES[2][1])
    body["messages"] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "one two "},
    ]
    r = await mock.client.post("/v1/messages", json=body)
    assert r.status_code == 400
    assert "trailing whitespace" in r.json()["error"]["message"]


@pytest.mark.parametrize(("path", "body"), PROTOCOL_BODIES)
async def test_stall_then_close_every_protocol(mock: Mock, path: str, body: dict[str, Any]) -> None:
    await mock.script("m1", [{"stall_after_events": 2, "stall_ms": 150, "stall_close": True}])
    received: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        async with mock.client.stream("POST", path, json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    received.append(line[6:])
    assert len(received) == 2
    assert time.monotonic() - t0 >= 0.15


@pytest.mark.parametrize(("path", "body"), PROTOCOL_BODIES)
async def test_stall_then_close_non_stream(mock: Mock, path: str, body: dict[str, Any]) -> None:
    await mock.script("m1", [{"stall_after_events": 0, "stall_ms": 100, "stall_close": True}])
    with pytest.raises(httpx.TransportError):
        await mock.client.post(path, json={**body, "stream": False})


async def test_rescue_keys_are_validated(mock: Mock) -> None:
    r = await mock.client.post(
        "/_mock/script", json={"model": "m1", "steps": [{"refuse_prefill": "yes"}]}
    )
    assert r.status_code == 400
    assert "refuse_prefill must be true or false" in r.text
