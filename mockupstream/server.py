"""Scriptable fake LLM upstream (``ocx mock-upstream``), on raw asyncio streams.

Speaks the OpenAI Responses API (``/v1/responses``), Chat Completions (``/v1/chat/completions``)
and Anthropic Messages (``/v1/messages``), streaming and not, over a minimal HTTP/1.1 server with
keep-alive and Content-Length/chunked request bodies. Per model name, ``POST /_mock/script``
queues behaviours (status codes, headers, cuts, stalls, resets, malformed chunks, ...) consumed
one per attempt; every attempt is recorded in an attempt log (``GET /_mock/log``). The format is
documented in ``docs/mock-upstream.md``. Entry points: :func:`main` (CLI) and :func:`serve`
(in-process, returns the listening ``asyncio.Server``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

JSON = dict[str, Any]

_dumps = json.JSONEncoder(separators=(",", ":")).encode

RESPONSES_PATHS = frozenset({"/v1/responses", "/responses"})
CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
MESSAGES_PATHS = frozenset({"/v1/messages", "/messages"})

#: Case-insensitive substring of the last user message that makes the mock call a tool.
TOOL_TRIGGER = "call a tool"

DEFAULT_DELTAS = 3
_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet")
_MAX_HEADER_BYTES = 64 * 1024
_STREAM_LIMIT = 1024 * 1024

BEHAVIOUR_KEYS = frozenset(
    {
        "status",
        "headers",
        "body",
        "usage_limit",
        "rate_limits",
        "fail",
        "event",
        "error",
        "cut_after_events",
        "stall_after_events",
        "stall_ms",
        "delay_first_byte_ms",
        "no_response",
        "reset",
        "malformed_after_events",
        "omit_done",
        "omit_terminal",
        "done_sentinel",
        "lead_text",
        "split_events",
        "deltas",
        "delta_ms",
        "usage",
        "text",
        "tool_call",
        "stall_close",
        "refuse_prefill",
    }
)
_INT_KEYS = (
    "status",
    "cut_after_events",
    "stall_after_events",
    "stall_ms",
    "delay_first_byte_ms",
    "malformed_after_events",
    "deltas",
    "delta_ms",
)


class BehaviourError(ValueError):
    """A scripted behaviour is malformed (unknown key or wrong type)."""


def validate_behaviour(behaviour: object) -> JSON:
    """Check one behaviour object and return it; raise :class:`BehaviourError` if invalid."""
    if not isinstance(behaviour, dict):
        raise BehaviourError("a behaviour must be a JSON object")
    unknown = sorted(set(behaviour) - BEHAVIOUR_KEYS)
    if unknown:
        raise BehaviourError(f"unknown behaviour keys: {', '.join(unknown)}")
    for key in _INT_KEYS:
        value = behaviour.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BehaviourError(f"{key} must be an integer")
        if isinstance(value, int) and value < 0:
            raise BehaviourError(f"{key} must be >= 0")
    if "deltas" in behaviour and behaviour["deltas"] < 1:
        raise BehaviourError("deltas must be >= 1")
    if "fail" in behaviour and behaviour["fail"] not in ("before_output", "after_output"):
        raise BehaviourError("fail must be 'before_output' or 'after_output'")
    for key in ("headers", "usage", "error", "rate_limits", "tool_call"):
        if key in behaviour and not isinstance(behaviour[key], dict):
            raise BehaviourError(f"{key} must be an object")
    if "usage_limit" in behaviour and not isinstance(behaviour["usage_limit"], dict | bool):
        raise BehaviourError("usage_limit must be true or an object")
    for key in (
        "split_events",
        "omit_done",
        "omit_terminal",
        "done_sentinel",
        "stall_close",
        "refuse_prefill",
    ):
        if key in behaviour and not isinstance(behaviour[key], bool):
            raise BehaviourError(f"{key} must be true or false")
    if "lead_text" in behaviour and not isinstance(behaviour["lead_text"], str):
        raise BehaviourError("lead_text must be a string")
    return behaviour


@dataclass
class Script:
    """Queued behaviours of one model: ``steps`` first (one per attempt), then ``then``."""

    steps: deque[JSON] = field(default_factory=deque)
    then: JSON | None = None


@dataclass
class MockState:
    """Scripts, attempt log and options shared by all connections of one mock server."""

    require_keys: frozenset[str] = frozenset()
    log_limit: int = 10_000
    scripts: dict[str, Script] = field(default_factory=dict)
    log: deque[JSON] = field(default_factory=deque)
    seq: int = 0
    started: float = field(default_factory=time.monotonic)
    connections: set[asyncio.Task[Any]] = field(default_factory=set)

    def set_script(self, model: str, steps: Iterable[JSON], then: JSON | None) -> None:
        """Replace the script of ``model`` (``"*"`` scripts every model without its own)."""
        self.scripts[model] = Script(deque(steps), then)

    def reset(self) -> None:
        """Forget all scripts and the attempt log (sequence numbers restart at 1)."""
        self.scripts.clear()
        self.log.clear()
        self.seq = 0

    def next_behaviour(self, model: str) -> JSON:
        """Consume the behaviour of the next attempt for ``model`` ({} = default reply)."""
        script = self.scripts.get(model) or self.scripts.get("*")
        if script is None:
            return {}
        if script.steps:
            return script.steps.popleft()
        return script.then or {}

    def record(
        self,
        path: str,
        model: str,
        stream: bool,
        headers: dict[str, str],
        behaviour: JSON,
        body: object,
    ) -> JSON:
        """Append one attempt to the log and return the entry."""
        self.seq += 1
        entry: JSON = {
            "seq": self.seq,
            "t_ms": int((time.monotonic() - self.started) * 1000),
            "path": path,
            "model": model,
            "stream": stream,
            "headers": headers,
            "behaviour": behaviour,
            "body": body,
        }
        self.log.append(entry)
        while len(self.log) > self.log_limit:
            self.log.popleft()
        return entry

    def cancel_connections(self) -> None:
        """Cancel every open connection handler (stalled and no-response ones included)."""
        for task in list(self.connections):
            task.cancel()


# --------------------------------------------------------------------------------------------
# HTTP/1.1 plumbing


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class _BadRequest(Exception):
    pass


_REASONS: dict[int, bytes] = {s.value: s.phrase.encode() for s in HTTPStatus}


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError as exc:
        raise _BadRequest("bad request line") from exc
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest("bad header line")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError as exc:
            raise _BadRequest("bad content-length") from exc
        body = await reader.readexactly(length) if length else b""
    else:
        body = b""
    connection = headers.get("connection", "").lower()
    if version == "HTTP/1.0":
        keep_alive = "keep-alive" in connection
    else:
        keep_alive = "close" not in connection
    split = urlsplit(target)
    return Request(method, split.path, parse_qs(split.query), headers, body, keep_alive)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise _BadRequest("bad chunk size") from exc
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers are ignored
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _head(status: int, headers: Sequence[tuple[str, str]], keep_alive: bool) -> bytes:
    out = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    for name, value in headers:
        out.append(f"{name}: {value}\r\n".encode("latin-1"))
    out.append(b"connection: keep-alive\r\n\r\n" if keep_alive else b"connection: close\r\n\r\n")
    return b"".join(out)


def _json_response(
    status: int,
    payload: object,
    keep_alive: bool,
    extra: Sequence[tuple[str, str]] = (),
    ctype: str | None = None,
) -> bytes:
    # Raw bytes are sent as they are (text/plain unless told otherwise); anything else as JSON.
    body = payload if isinstance(payload, bytes) else _dumps(payload).encode()
    ctype = ctype or ("text/plain" if isinstance(payload, bytes) else "application/json")
    headers = [("content-type", ctype), ("content-length", str(len(body))), *extra]
    return _head(status, headers, keep_alive) + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# --------------------------------------------------------------------------------------------
# Reply construction


@dataclass(frozen=True)
class Reply:
    """What the mock answers: either text or one function call."""

    text: str | None
    tool_name: str | None
    tool_args: str
    pieces: tuple[str, ...]
    usage: JSON


def split_text(text: str, n: int) -> list[str]:
    """Split ``text`` into exactly ``n`` word-aligned deltas, padding with filler words."""
    words = text.split(" ")
    i = 0
    while len(words) < n:
        words.append(_FILLER[i % len(_FILLER)])
        i += 1
    pieces: list[str] = []
    total = len(words)
    for k in range(n):
        group = words[k * total // n : (k + 1) * total // n]
        pieces.append((" " if k else "") + " ".join(group))
    return pieces


def _split_even(s: str, n: int) -> list[str]:
    n = max(1, min(n, len(s) or 1))
    return [s[k * len(s) // n : (k + 1) * len(s) // n] for k in range(n)]


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _last_turn(protocol: str, body: JSON) -> tuple[str, str]:
    """Return ("user", text) | ("tool", "") | ("other", "") for the last input item."""
    if protocol == "responses":
        items = body.get("input")
        if isinstance(items, str):
            return "user", items
        if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
            return "other", ""
        last = items[-1]
        kind = last.get("type", "message")
        if kind in ("function_call_output", "custom_tool_call_output"):
            return "tool", ""
        if kind == "message" and last.get("role") == "user":
            return "user", _text_of(last.get("content"))
        return "other", ""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return "other", ""
    last = messages[-1]
    if last.get("role") == "tool":
        return "tool", ""
    if last.get("role") == "user":
        content = last.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") == "tool_result" for p in content
        ):
            return "tool", ""
        return "user", _text_of(content)
    return "other", ""


def _joined_text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def prefill_of(protocol: str, body: JSON) -> str | None:
    """The text of a final assistant message (an assistant prefill the reply continues), or
    None when the last input is not one."""
    key = "input" if protocol == "responses" else "messages"
    items = body.get(key)
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return None
    last = items[-1]
    if last.get("role") != "assistant" or last.get("type", "message") != "message":
        return None
    return _joined_text(last.get("content"))


def _function_tools(protocol: str, body: JSON) -> list[tuple[str, JSON]]:
    tools = body.get("tools")
    out: list[tuple[str, JSON]] = []
    if not isinstance(tools, list):
        return out
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if protocol == "chat" and isinstance(tool.get("function"), dict):
            fn = tool["function"]
            out.append((str(fn.get("name", "")), fn.get("parameters") or {}))
        elif protocol == "responses" and tool.get("type") == "function":
            out.append((str(tool.get("name", "")), tool.get("parameters") or {}))
        elif protocol == "messages" and "name" in tool:
            out.append((str(tool["name"]), tool.get("input_schema") or {}))
    return out


def _default_args(schema: JSON) -> JSON:
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return {}
    args: JSON = {}
    if "command" in props:
        args["command"] = "echo mock"
    for name in schema.get("required") or []:
        args.setdefault(name, "mock")
    return args


def build_reply(protocol: str, body: JSON, behaviour: JSON, request_bytes: int) -> Reply:
    """Decide the deterministic reply (text or tool call) and its usage for one request."""
    model = str(body.get("model", ""))
    n = int(behaviour.get("deltas", DEFAULT_DELTAS))
    turn, user_text = _last_turn(protocol, body)
    tools = _function_tools(protocol, body)
    tool_name: str | None = None
    tool_args = ""
    forced = behaviour.get("tool_call")
    if isinstance(forced, dict):
        tool_name = str(forced.get("name") or (tools[0][0] if tools else "mock_tool"))
        tool_args = _dumps(forced.get("arguments", {}))
    elif tools and turn == "user" and TOOL_TRIGGER in user_text.lower():
        tool_name, schema = tools[0]
        tool_args = _dumps(_default_args(schema))
    text: str | None = None
    prefill = prefill_of(protocol, body)
    if tool_name is not None:
        pieces = tuple(_split_even(tool_args, n))
    elif prefill is not None:
        # A continuation: the rest of the canonical text after the prefill (all of it when the
        # prefill is not its start), in up to N pieces with no filler.
        whole = str(behaviour["text"]) if "text" in behaviour else f"mock reply from {model}"
        text = whole[len(prefill) :] if whole.startswith(prefill) else whole
        pieces = tuple(_split_even(text, n))
    else:
        if "text" in behaviour:
            text = str(behaviour["text"])
        elif turn == "tool":
            text = f"mock reply from {model}: tool output received"
        else:
            text = f"mock reply from {model}"
        pieces = tuple(split_text(text, n))
        text = "".join(pieces)
    usage_in = behaviour.get("usage") or {}
    input_tokens = _figure(usage_in.get("input_tokens", max(1, request_bytes // 4)))
    output_tokens = _figure(usage_in.get("output_tokens", len(pieces)))
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": _figure(usage_in.get("cached_tokens", 0)),
        "cache_creation_tokens": _figure(usage_in.get("cache_creation_tokens", 0)),
        "reasoning_tokens": _figure(usage_in.get("reasoning_tokens", 0)),
        # `omit`: the answer reports no usage at all (an upstream that never does).
        "omit": bool(usage_in.get("omit", False)),
    }
    return Reply(text, tool_name, tool_args, pieces, usage)


def _figure(value: object) -> Any:
    """A scripted usage figure as the upstream sends it: a number as an integer; anything else
    (`"lots"`, `-1e9`, `null`) as given, so tests can send usage no upstream should."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return int(value) if float(value).is_integer() else value


def _total(u: JSON) -> Any:
    a, b = u["input_tokens"], u["output_tokens"]
    return a + b if isinstance(a, int) and isinstance(b, int) else None


def _sse(event: str | None, payload: object) -> bytes:
    data = payload if isinstance(payload, bytes) else _dumps(payload).encode()
    if event is None:
        return b"data: %s\n\n" % data
    return b"event: %s\ndata: %s\n\n" % (event.encode(), data)


def _error_obj(behaviour: JSON, default_code: str) -> JSON:
    err = dict(behaviour.get("error") or {})
    err.setdefault("code", default_code)
    err.setdefault("message", f"mock failure ({err['code']})")
    return err


def _responses_events(model: str, rid: str, reply: Reply, behaviour: JSON) -> Iterator[bytes]:
    seq = 0

    def ev(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        payload = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return _sse(kind, payload)

    created = int(time.time())
    yield ev(
        "response.created",
        response={
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "in_progress",
            "model": model,
            "output": [],
        },
    )
    yield ev(
        "response.in_progress",
        response={"id": rid, "object": "response", "status": "in_progress"},
    )
    fail = behaviour.get("fail")
    failure_kind = str(behaviour.get("event", "response.failed"))

    def failure() -> bytes:
        if failure_kind == "response.incomplete":
            return ev(
                failure_kind,
                response={
                    "id": rid,
                    "object": "response",
                    "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"},
                },
            )
        return ev(
            failure_kind,
            response={
                "id": rid,
                "object": "response",
                "status": "failed",
                "error": _error_obj(behaviour, "server_error"),
            },
        )

    if fail == "before_output":
        yield failure()
        return
    lead = behaviour.get("lead_text")
    if reply.tool_name is not None and lead:
        # Visible text before the call (a message item of its own).
        lead_item = {"type": "message", "id": "msg_mock_0", "role": "assistant", "content": []}
        yield ev("response.output_item.added", output_index=0, item=lead_item)
        yield ev(
            "response.output_text.delta",
            item_id="msg_mock_0",
            output_index=0,
            content_index=0,
            delta=lead,
        )
    if reply.tool_name is not None:
        item: JSON = {
            "type": "function_call",
            "id": "fc_mock_1",
            "call_id": "call_mock_1",
            "name": reply.tool_name,
            "arguments": "",
            "status": "in_progress",
        }
        yield ev("response.output_item.added", output_index=0, item=item)
        for k, piece in enumerate(reply.pieces):
            yield ev(
                "response.function_call_arguments.delta",
                item_id="fc_mock_1",
                output_index=0,
                delta=piece,
            )
            if fail == "after_output" and k == 0:
                yield failure()
                return
        yield ev(
            "response.function_call_arguments.done",
            item_id="fc_mock_1",
            output_index=0,
            arguments=reply.tool_args,
        )
        done_item = {**item, "arguments": reply.tool_args, "status": "completed"}
    else:
        item = {
            "type": "message",
            "id": "msg_mock_1",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        yield ev("response.output_item.added", output_index=0, item=item)
        yield ev(
            "response.content_part.added",
            item_id="msg_mock_1",
            output_index=0,
            content_index=0,
            part={"type": "output_text", "text": "", "annotations": []},
        )
        for k, piece in enumerate(reply.pieces):
            yield ev(
                "response.output_text.delta",
                item_id="msg_mock_1",
                output_index=0,
                content_index=0,
                delta=piece,
            )
            if fail == "after_output" and k == 0:
                yield failure()
                return
        part: JSON = {"type": "output_text", "text": reply.text, "annotations": []}
        yield ev(
            "response.output_text.done",
            item_id="msg_mock_1",
            output_index=0,
            content_index=0,
            text=reply.text,
        )
        yield ev(
            "response.content_part.done",
            item_id="msg_mock_1",
            output_index=0,
            content_index=0,
            part=part,
        )
        done_item = {**item, "status": "completed", "content": [part]}
    yield ev("response.output_item.done", output_index=0, item=done_item)
    if not (behaviour.get("omit_done") or behaviour.get("omit_terminal")):
        yield ev(
            "response.completed",
            response=_responses_body(model, rid, created, done_item, reply),
        )
        if behaviour.get("done_sentinel"):
            yield b"data: [DONE]\n\n"


def _responses_usage(reply: Reply) -> JSON:
    u = reply.usage
    return {
        "input_tokens": u["input_tokens"],
        "input_tokens_details": {"cached_tokens": u["cached_tokens"]},
        "output_tokens": u["output_tokens"],
        "output_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
        "total_tokens": _total(u),
    }


def _usage_field(usage: JSON, reply: Reply) -> JSON:
    return {} if reply.usage["omit"] else {"usage": usage}


def _responses_body(model: str, rid: str, created: int, item: JSON, reply: Reply) -> JSON:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": [item],
        **_usage_field(_responses_usage(reply), reply),
    }


def _chat_usage(reply: Reply) -> JSON:
    u = reply.usage
    return {
        "prompt_tokens": u["input_tokens"],
        "completion_tokens": u["output_tokens"],
        "total_tokens": _total(u),
        "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]},
        "completion_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
    }


def _chat_events(model: str, cid: str, reply: Reply, behaviour: JSON) -> Iterator[bytes]:
    created = int(time.time())

    def chunk(choices: list[JSON], **extra: Any) -> bytes:
        return _sse(
            None,
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": choices,
                **extra,
            },
        )

    def failure() -> bytes:
        return _sse(
            None, {"error": {**_error_obj(behaviour, "server_error"), "type": "server_error"}}
        )

    fail = behaviour.get("fail")
    if fail == "before_output":
        yield failure()
        return
    lead = behaviour.get("lead_text")
    if reply.tool_name is not None and lead:
        yield chunk(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": lead},
                    "finish_reason": None,
                }
            ]
        )
    if reply.tool_name is not None:
        call = {
            "index": 0,
            "id": "call_mock_1",
            "type": "function",
            "function": {"name": reply.tool_name, "arguments": ""},
        }
        yield chunk(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": None,
                }
            ]
        )
        for k, piece in enumerate(reply.pieces):
            delta_call = {
                "index": 0,
                "id": "call_mock_1",
                "type": "function",
                "function": {"arguments": piece},
            }
            yield chunk(
                [{"index": 0, "delta": {"tool_calls": [delta_call]}, "finish_reason": None}]
            )
            if fail == "after_output" and k == 0:
                yield failure()
                return
        finish = "tool_calls"
    else:
        yield chunk(
            [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
        )
        for k, piece in enumerate(reply.pieces):
            yield chunk([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
            if fail == "after_output" and k == 0:
                yield failure()
                return
        finish = "stop"
    if behaviour.get("omit_terminal"):
        return  # no finish_reason, no usage, no [DONE]: a stream that just stops
    yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}])
    if not reply.usage["omit"]:
        yield chunk([], usage=_chat_usage(reply))
    if not behaviour.get("omit_done"):
        yield b"data: [DONE]\n\n"


def _chat_body(model: str, cid: str, reply: Reply) -> JSON:
    message: JSON = {"role": "assistant", "content": reply.text}
    if reply.tool_name is not None:
        message["tool_calls"] = [
            {
                "id": "call_mock_1",
                "type": "function",
                "function": {"name": reply.tool_name, "arguments": reply.tool_args},
            }
        ]
    finish = "tool_calls" if reply.tool_name is not None else "stop"
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        **_usage_field(_chat_usage(reply), reply),
    }


def _anthropic_usage(reply: Reply) -> JSON:
    u = reply.usage
    figures = (u["input_tokens"], u["cached_tokens"], u["cache_creation_tokens"])
    fresh = u["input_tokens"]
    if all(isinstance(f, int) for f in figures) and fresh >= 0:
        fresh = max(0, fresh - u["cached_tokens"] - u["cache_creation_tokens"])
    return {
        "input_tokens": fresh,
        "cache_creation_input_tokens": u["cache_creation_tokens"],
        "cache_read_input_tokens": u["cached_tokens"],
        "output_tokens": u["output_tokens"],
    }


def _messages_events(model: str, mid: str, reply: Reply, behaviour: JSON) -> Iterator[bytes]:
    usage = _anthropic_usage(reply)
    start_usage = {**usage, "output_tokens": 1}
    yield _sse(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": mid,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                **_usage_field(start_usage, reply),
            },
        },
    )

    def failure() -> bytes:
        err = dict(behaviour.get("error") or {})
        err.setdefault("type", "overloaded_error")
        err.setdefault("message", "Overloaded")
        return _sse(str(behaviour.get("event", "error")), {"type": "error", "error": err})

    fail = behaviour.get("fail")
    if fail == "before_output":
        yield failure()
        return
    index = 0
    lead = behaviour.get("lead_text")
    if reply.tool_name is not None and lead:
        text_block = {"type": "text", "text": ""}
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": text_block},
        )
        yield _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": lead},
            },
        )
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    if reply.tool_name is not None:
        block: JSON = {
            "type": "tool_use",
            "id": "toolu_mock_1",
            "name": reply.tool_name,
            "input": {},
        }
        delta_type, delta_key, stop = "input_json_delta", "partial_json", "tool_use"
    else:
        block = {"type": "text", "text": ""}
        delta_type, delta_key, stop = "text_delta", "text", "end_turn"
    yield _sse(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )
    for k, piece in enumerate(reply.pieces):
        yield _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": delta_type, delta_key: piece},
            },
        )
        if fail == "after_output" and k == 0:
            yield failure()
            return
    yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            **_usage_field({"output_tokens": usage["output_tokens"]}, reply),
        },
    )
    if not (behaviour.get("omit_done") or behaviour.get("omit_terminal")):
        yield _sse("message_stop", {"type": "message_stop"})


def _messages_body(model: str, mid: str, reply: Reply) -> JSON:
    if reply.tool_name is not None:
        content: list[JSON] = [
            {
                "type": "tool_use",
                "id": "toolu_mock_1",
                "name": reply.tool_name,
                "input": json.loads(reply.tool_args or "{}"),
            }
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": reply.text}]
        stop = "end_turn"
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        **_usage_field(_anthropic_usage(reply), reply),
    }


def error_body(protocol: str, status: int, message: str | None = None) -> JSON:
    """Default JSON error body of ``protocol`` for an HTTP ``status``."""
    if protocol == "messages":
        kinds = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }
        kind = kinds.get(status, "api_error")
        return {
            "type": "error",
            "error": {"type": kind, "message": message or f"mock {kind}"},
            "request_id": "req_mock",
        }
    kinds = {
        400: "invalid_request_error",
        401: "invalid_api_key",
        403: "permission_denied",
        404: "not_found",
        429: "rate_limit_exceeded",
        503: "server_is_overloaded",
    }
    code = kinds.get(status, "server_error")
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {
        "error": {
            "message": message or f"mock error {status}",
            "type": kind,
            "code": code,
            "param": None,
        }
    }


def prefill_refusal(protocol: str, prefill: str) -> JSON:
    """The 400 for a final assistant message the model does not take: the protocol's error
    shape with code `invalid_prefill` (Anthropic's body has the code beside its `type`)."""
    if prefill != prefill.rstrip():
        message = "final assistant content cannot end with trailing whitespace"
    else:
        message = "This model does not support assistant message prefill"
    body = error_body(protocol, 400, message)
    body["error"]["code"] = "invalid_prefill"
    return body


def rate_limit_headers(spec: JSON, now: float) -> list[tuple[str, str]]:
    """``x-codex-{primary,secondary}-*`` headers from ``{"primary": {...}, ...}`` windows."""
    out: list[tuple[str, str]] = []
    for window in ("primary", "secondary"):
        w = spec.get(window)
        if not isinstance(w, dict):
            continue
        after = int(w.get("reset_after_seconds", 3600))
        prefix = f"x-codex-{window}-"
        out += [
            (prefix + "used-percent", str(w.get("used_percent", 0))),
            (prefix + "window-minutes", str(w.get("window_minutes", 300))),
            (prefix + "reset-at", str(int(w.get("reset_at", int(now) + after)))),
            (prefix + "reset-after-seconds", str(after)),
        ]
    if out:
        out.insert(0, ("x-codex-active-limit", "codex"))
    return out


def usage_limit_response(spec: JSON, now: float) -> tuple[JSON, list[tuple[str, str]]]:
    """The HTTP 429 ``usage_limit_reached`` body and ``x-codex-*`` headers (codex-wire §4.4)."""
    after = int(spec.get("resets_in_seconds", 3600))
    resets_at = int(spec.get("resets_at", int(now) + after))
    body = {
        "error": {
            "type": str(spec.get("type", "usage_limit_reached")),
            "message": "The usage limit has been reached",
            "plan_type": str(spec.get("plan_type", "plus")),
            "resets_at": resets_at,
            "resets_in_seconds": after,
        }
    }
    window = str(spec.get("window", "primary"))
    minutes = int(spec.get("window_minutes", 300 if window == "primary" else 10080))
    headers = rate_limit_headers(
        {
            window: {
                "used_percent": 100,
                "window_minutes": minutes,
                "reset_at": resets_at,
                "reset_after_seconds": after,
            }
        },
        now,
    )
    return body, headers


# --------------------------------------------------------------------------------------------
# Connection handling


class _Close(Exception):
    """Raised by a handler to end the connection without further response bytes."""


async def _sleep_ms(ms: int) -> None:
    if ms > 0:
        await asyncio.sleep(ms / 1000)


async def _wait_for_eof(reader: asyncio.StreamReader) -> None:
    # Hold the connection open and idle until the client gives up.
    while await reader.read(65536):
        pass


def _hard_reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Handler:
    def __init__(self, state: MockState) -> None:
        self.state = state

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.state.connections.add(task)
        try:
            while True:
                try:
                    req = await _read_request(reader, writer)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                except _BadRequest as exc:
                    writer.write(_json_response(400, {"error": str(exc)}, False))
                    return
                keep = await self.dispatch(req, reader, writer)
                if not keep or not req.keep_alive:
                    await writer.drain()
                    return
                if writer.transport.get_write_buffer_size() > 65536:
                    await writer.drain()
        except (_Close, ConnectionError, asyncio.CancelledError):
            return
        finally:
            if task is not None:
                self.state.connections.discard(task)
            if not writer.transport.is_closing():
                writer.transport.close()

    async def dispatch(
        self, req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        path = req.path
        if path in RESPONSES_PATHS:
            return await self.model_call("responses", req, reader, writer)
        if path in CHAT_PATHS:
            return await self.model_call("chat", req, reader, writer)
        if path in MESSAGES_PATHS:
            return await self.model_call("messages", req, reader, writer)
        if path.startswith("/_mock/"):
            writer.write(self.control(req))
            return True
        writer.write(_json_response(404, {"error": f"no route {path}"}, req.keep_alive))
        return True

    def control(self, req: Request) -> bytes:
        ka = req.keep_alive
        if req.path == "/_mock/log" and req.method == "GET":
            entries: Iterable[JSON] = self.state.log
            models = req.query.get("model")
            if models:
                entries = [e for e in entries if e["model"] in models]
            since = req.query.get("since")
            if since:
                entries = [e for e in entries if e["seq"] > int(since[0])]
            return _json_response(200, list(entries), ka)
        if req.path == "/_mock/health" and req.method == "GET":
            return _json_response(200, {"ok": True}, ka)
        if req.path == "/_mock/reset" and req.method == "POST":
            self.state.reset()
            return _json_response(200, {"ok": True}, ka)
        if req.path == "/_mock/script" and req.method == "POST":
            try:
                spec = json.loads(req.body or b"{}")
                scripts = spec if isinstance(spec, list) else [spec]
                parsed = []
                for s in scripts:
                    if not isinstance(s, dict) or not isinstance(s.get("model"), str):
                        raise BehaviourError("each script needs a string 'model'")
                    steps = s.get("steps", [])
                    if not isinstance(steps, list):
                        raise BehaviourError("steps must be a list")
                    then = s.get("then")
                    parsed.append(
                        (
                            s["model"],
                            [validate_behaviour(b) for b in steps],
                            None if then is None else validate_behaviour(then),
                        )
                    )
            except (ValueError, BehaviourError) as exc:
                return _json_response(400, {"error": str(exc)}, ka)
            for model, steps, then in parsed:
                self.state.set_script(model, steps, then)
            return _json_response(200, {"ok": True, "models": [p[0] for p in parsed]}, ka)
        return _json_response(404, {"error": f"no control route {req.method} {req.path}"}, ka)

    def _authorised(self, headers: dict[str, str]) -> bool:
        if not self.state.require_keys:
            return True
        auth = headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        return bearer in self.state.require_keys or (
            headers.get("x-api-key") in self.state.require_keys
        )

    async def model_call(
        self,
        protocol: str,
        req: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        ka = req.keep_alive
        if req.method != "POST":
            writer.write(_json_response(405, error_body(protocol, 405, "use POST"), ka))
            return True
        try:
            body = json.loads(req.body)
            if not isinstance(body, dict):
                raise ValueError("body must be an object")
        except ValueError:
            writer.write(_json_response(400, error_body(protocol, 400, "invalid JSON body"), ka))
            return True
        model = str(body.get("model", ""))
        stream = bool(body.get("stream", False))
        if not self._authorised(req.headers):
            self.state.record(
                req.path, model, stream, req.headers, {"status": 401, "auth": "rejected"}, body
            )
            writer.write(_json_response(401, error_body(protocol, 401, "invalid api key"), ka))
            return True
        behaviour = self.state.next_behaviour(model)
        self.state.record(req.path, model, stream, req.headers, behaviour, body)

        if behaviour.get("reset"):
            _hard_reset(writer)
            raise _Close
        if behaviour.get("no_response"):
            await _wait_for_eof(reader)
            raise _Close
        await _sleep_ms(int(behaviour.get("delay_first_byte_ms", 0)))

        now = time.time()
        extra: list[tuple[str, str]] = []
        if isinstance(behaviour.get("rate_limits"), dict):
            extra += rate_limit_headers(behaviour["rate_limits"], now)
        if behaviour.get("usage_limit"):
            spec = behaviour["usage_limit"] if isinstance(behaviour["usage_limit"], dict) else {}
            ul_body, ul_headers = usage_limit_response(spec, now)
            extra += ul_headers
            extra += [(str(k), str(v)) for k, v in (behaviour.get("headers") or {}).items()]
            writer.write(
                _json_response(
                    int(behaviour.get("status", 429)), behaviour.get("body", ul_body), ka, extra
                )
            )
            return True
        extra += [(str(k), str(v)) for k, v in (behaviour.get("headers") or {}).items()]
        status = int(behaviour.get("status", 200))
        if status != 200 or "body" in behaviour:
            payload = behaviour.get("body", error_body(protocol, status))
            if isinstance(payload, str):
                payload = payload.encode()
            writer.write(_json_response(status, payload, ka, extra))
            return True
        prefill = prefill_of(protocol, body)
        if prefill is not None and (
            behaviour.get("refuse_prefill")
            or (protocol == "messages" and prefill != prefill.rstrip())
        ):
            # A model that takes no assistant prefill (or Anthropic's trailing-whitespace rule).
            writer.write(_json_response(400, prefill_refusal(protocol, prefill), ka, extra))
            return True
        if protocol == "messages" and "max_tokens" not in body:
            writer.write(
                _json_response(400, error_body(protocol, 400, "max_tokens: Field required"), ka)
            )
            return True

        reply = build_reply(protocol, body, behaviour, len(req.body))
        seq = self.state.seq
        if not stream:
            return await self._send_plain(
                protocol, model, seq, reply, behaviour, reader, writer, ka, extra
            )
        if protocol == "responses":
            events = _responses_events(model, f"resp_mock_{seq}", reply, behaviour)
        elif protocol == "chat":
            events = _chat_events(model, f"chatcmpl-mock-{seq}", reply, behaviour)
        else:
            events = _messages_events(model, f"msg_mock_{seq}", reply, behaviour)
        return await self._send_stream(events, behaviour, reader, writer, ka, extra)

    async def _send_plain(
        self,
        protocol: str,
        model: str,
        seq: int,
        reply: Reply,
        behaviour: JSON,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        ka: bool,
        extra: list[tuple[str, str]],
    ) -> bool:
        if behaviour.get("fail"):
            writer.write(_json_response(500, error_body(protocol, 500), ka, extra))
            return True
        if protocol == "responses":
            item: JSON
            if reply.tool_name is not None:
                item = {
                    "type": "function_call",
                    "id": "fc_mock_1",
                    "call_id": "call_mock_1",
                    "name": reply.tool_name,
                    "arguments": reply.tool_args,
                    "status": "completed",
                }
            else:
                item = {
                    "type": "message",
                    "id": "msg_mock_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            payload = _responses_body(model, f"resp_mock_{seq}", int(time.time()), item, reply)
        elif protocol == "chat":
            payload = _chat_body(model, f"chatcmpl-mock-{seq}", reply)
        else:
            payload = _messages_body(model, f"msg_mock_{seq}", reply)
        data = _dumps(payload).encode()
        faulty = any(
            k in behaviour
            for k in ("cut_after_events", "stall_after_events", "malformed_after_events")
        )
        if not faulty:
            writer.write(_json_response(200, payload, ka, extra))
            return True
        # Non-streaming faults act on the middle of the body.
        if "malformed_after_events" in behaviour:
            data = data[: len(data) // 2]
            writer.write(_json_response(200, data, ka, extra, "application/json"))
            return True
        headers = [("content-type", "application/json"), ("content-length", str(len(data))), *extra]
        half = len(data) // 2
        writer.write(_head(200, headers, ka) + data[:half])
        await writer.drain()
        if "cut_after_events" in behaviour:
            raise _Close
        await self._stall(behaviour, reader)
        if behaviour.get("stall_close"):
            raise _Close
        writer.write(data[half:])
        return True

    async def _stall(self, behaviour: JSON, reader: asyncio.StreamReader) -> None:
        if "stall_ms" in behaviour:
            await _sleep_ms(int(behaviour["stall_ms"]))
            if behaviour.get("stall_close"):
                # Socket open and silent for stall_ms, then closed without the rest.
                raise _Close
        else:
            await _wait_for_eof(reader)
            raise _Close

    async def _send_stream(
        self,
        events: Iterable[bytes],
        behaviour: JSON,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        ka: bool,
        extra: list[tuple[str, str]],
    ) -> bool:
        headers = [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            ("transfer-encoding", "chunked"),
            *extra,
        ]
        cut = behaviour.get("cut_after_events")
        stall = behaviour.get("stall_after_events")
        malformed = behaviour.get("malformed_after_events")
        delta_ms = int(behaviour.get("delta_ms", 0))
        if malformed is not None:
            listed = list(events)
            events = [*listed[:malformed], b"data: {not json\n\n", *listed[malformed:]]
        split = bool(behaviour.get("split_events"))
        simple = cut is None and stall is None and delta_ms == 0 and not split
        if simple:
            # Fast path: the whole stream in one write.
            writer.write(_head(200, headers, ka) + b"".join(map(_chunk, events)) + b"0\r\n\r\n")
            return True
        writer.write(_head(200, headers, ka))
        # The events are made as they are sent (a generator): a paced stream of 500 deltas
        # encoded up front cost the mock ~4 ms before its first byte, per stream.
        sent = 0
        for i, event in enumerate(events):
            sent = i + 1
            if i == cut:
                if split:
                    writer.write(_chunk(event[: len(event) // 2]))  # closes mid-frame
                await writer.drain()
                raise _Close
            if i == stall:
                await writer.drain()
                await self._stall(behaviour, reader)
            elif i and delta_ms:
                await writer.drain()
                await _sleep_ms(delta_ms)
            if split:
                # Each frame in two reads, so the client must reassemble frames across reads.
                writer.write(_chunk(event[: len(event) // 2]))
                await writer.drain()
                await _sleep_ms(2)
                writer.write(_chunk(event[len(event) // 2 :]))
            else:
                writer.write(_chunk(event))
        if cut is not None and cut >= sent:
            await writer.drain()
            raise _Close
        if stall is not None and stall >= sent:
            await writer.drain()
            await self._stall(behaviour, reader)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def serve(
    host: str = "127.0.0.1", port: int = 8790, state: MockState | None = None
) -> asyncio.Server:
    """Start the mock on ``host:port`` (0 = ephemeral) in the running loop and return the server.

    Pass your own :class:`MockState` to inspect or script it in-process; on shutdown call
    ``server.close()`` and ``state.cancel_connections()`` (stalled handlers never end by
    themselves). The bound port is ``server.sockets[0].getsockname()[1]``.
    """
    handler = _Handler(state or MockState())
    return await asyncio.start_server(
        handler.connection, host, port, limit=_STREAM_LIMIT, backlog=1024
    )


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of ``ocx mock-upstream``."""
    parser = argparse.ArgumentParser(prog="ocx mock-upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790, help="0 = ephemeral port")
    parser.add_argument(
        "--require-key",
        action="append",
        default=[],
        metavar="KEY",
        help="answer 401 unless the bearer/x-api-key is KEY (repeatable)",
    )
    parser.add_argument(
        "--script", metavar="FILE", help="JSON file with one script object or a list of them"
    )
    parser.add_argument(
        "--log-limit", type=int, default=10_000, help="keep at most this many attempts in the log"
    )
    return parser


def _load_scripts(state: MockState, path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    for s in spec if isinstance(spec, list) else [spec]:
        then = s.get("then")
        state.set_script(
            str(s["model"]),
            [validate_behaviour(b) for b in s.get("steps", [])],
            None if then is None else validate_behaviour(then),
        )


async def _run(args: argparse.Namespace) -> int:
    state = MockState(require_keys=frozenset(args.require_key), log_limit=args.log_limit)
    if args.script:
        _load_scripts(state, args.script)
    server = await serve(args.host, args.port, state)
    port = server.sockets[0].getsockname()[1]
    shown = args.host if ":" not in args.host else f"[{args.host}]"
    print(f"mock-upstream listening on http://{shown}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    state.cancel_connections()
    await asyncio.sleep(0)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of ``ocx mock-upstream``; returns the exit code (0 on SIGTERM/SIGINT)."""
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (OSError, ValueError, KeyError) as exc:
        print(f"mock-upstream: {exc}", file=sys.stderr)
        return 1
