"""A translated stream decodes each upstream frame once: the commit scanner, the usage scan, the
malformed-frame and undeclared-tool checks and the translator share `SSEEvent.json()`."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import pytest

from providers import upstream
from providers.wire import sse
from providers.wire.anthropic import AnthropicCommitScanner
from routing.types import TargetSpec

CHAT_FRAMES = [
    {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]},
    {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ]
                },
            }
        ],
    },
    {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
]


class Sink:
    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""

    async def commit(self, status: int, headers: list[tuple[bytes, bytes]], target: Any) -> None:
        self.status = status

    async def write(self, data: bytes) -> None:
        self.body += data


def run_stream(body: bytes, sink: Sink) -> Any:
    async def go() -> Any:
        resp = httpx.Response(200, stream=httpx.ByteStream(body))
        return await upstream._stream(
            resp,
            "responses",
            "chat",
            TargetSpec("p", "m"),
            sink,
            upstream.Caller({}, "req1"),
            5000,
            5000,
            declared=frozenset({"f"}),
        )

    return asyncio.run(go())


def test_each_frame_of_a_translated_stream_is_decoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    datas = [json.dumps(f) for f in CHAT_FRAMES]
    decoded: Counter[str] = Counter()
    real_loads = json.loads

    def counting_loads(s: Any, *args: Any, **kwargs: Any) -> Any:
        if s in datas:
            decoded[s] += 1
        return real_loads(s, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting_loads)
    body = b"".join(f"data: {d}\n\n".encode() for d in datas) + b"data: [DONE]\n\n"
    sink = Sink()
    outcome = run_stream(body, sink)
    assert outcome.committed and outcome.failure is None and outcome.malformed == 0
    assert (outcome.usage.input, outcome.usage.output) == (3, 2)
    assert sink.status == 200 and b"response.completed" in sink.body
    assert b'"name":"f"' in sink.body or b'"name": "f"' in sink.body
    assert decoded == Counter(datas)  # every frame exactly once


def test_a_malformed_frame_still_cuts_a_translated_stream() -> None:
    good = [json.dumps(f) for f in CHAT_FRAMES[:1]]
    body = f"data: {good[0]}\n\ndata: {{not json\n\n".encode()
    sink = Sink()
    outcome = run_stream(body, sink)
    assert outcome.committed and outcome.malformed == 1
    assert b"malformed stream data" in sink.body


def test_event_json_is_decoded_once_and_errors_repeat() -> None:
    event = sse.SSEEvent(None, '{"a": [1]}', b'data: {"a": [1]}\n\n')
    assert event.json() is event.json() and event.json() == {"a": [1]}
    assert event == sse.SSEEvent(None, '{"a": [1]}', b'data: {"a": [1]}\n\n')  # cache not compared
    bad = sse.SSEEvent(None, "{nope", b"data: {nope\n\n")
    for _ in range(2):
        with pytest.raises(ValueError, match="Expecting property name"):
            bad.json()


def test_anthropic_scanner_counts_malformed_frames() -> None:
    scanner = AnthropicCommitScanner()
    start = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}
    scanner.feed(f"event: content_block_delta\ndata: {json.dumps(start)}\n\n".encode())
    assert scanner.malformed == 0
    scanner.feed(b'data: {cut\n\ndata: [1]\n\nevent: error\ndata: {"type": "error"}\n\n')
    assert scanner.malformed == 1  # only the undecodable frame, not an error event or a list
