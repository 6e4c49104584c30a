"""Responses API ⇄ Chat Completions translation, streaming and not.

Forward direction (a Responses client such as Codex, an `openai-chat` upstream):
`responses_request_to_chat`, `chat_response_to_responses`, and `ChatToResponsesStream`, which
turns Chat chunks into the full Responses event sequence Codex needs (created, in_progress,
output_item.added/done, content_part, deltas, function-call arguments, completed with id and
usage). The event building itself lives in `ResponsesStreamWriter`, reusable by any translator
(e.g. Anthropic). Reverse direction (a Chat client, an `openai-responses` upstream):
`chat_request_to_responses`, `responses_response_to_chat`, `ResponsesToChatStream`.
All functions take and return plain JSON-like dicts; ids and timestamps are injected.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from providers.wire.commit import StreamFailure, failure_from_error, truncation_failure
from providers.wire.sse import DONE_FRAME, SSEEvent, encode_json_event

JSON = dict[str, Any]

# Freeform (grammar) tools become a function with one string parameter on Chat upstreams.
CUSTOM_TOOL_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The raw tool input."}},
    "required": ["input"],
}

_CHAT_FINISH_TO_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


# ---------------------------------------------------------------------------------------------
# Usage and errors


def chat_usage_to_responses(usage: Mapping[str, Any] | None) -> JSON:
    """Chat `usage` → Responses `usage` (always with the integer fields Codex requires)."""
    usage = usage or {}
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    pdet = usage.get("prompt_tokens_details")
    cdet = usage.get("completion_tokens_details")
    cached = _int(pdet.get("cached_tokens")) if isinstance(pdet, Mapping) else 0
    reasoning = _int(cdet.get("reasoning_tokens")) if isinstance(cdet, Mapping) else 0
    total = _int(usage.get("total_tokens")) or prompt + completion
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": total,
    }


def responses_usage_to_chat(usage: Mapping[str, Any] | None) -> JSON:
    """Responses `usage` → Chat `usage` (prompt/completion/total plus cached/reasoning details)."""
    usage = usage or {}
    inp = _int(usage.get("input_tokens"))
    out = _int(usage.get("output_tokens"))
    idet = usage.get("input_tokens_details")
    odet = usage.get("output_tokens_details")
    return {
        "prompt_tokens": inp,
        "completion_tokens": out,
        "total_tokens": _int(usage.get("total_tokens")) or inp + out,
        "prompt_tokens_details": {
            "cached_tokens": _int(idet.get("cached_tokens")) if isinstance(idet, Mapping) else 0
        },
        "completion_tokens_details": {
            "reasoning_tokens": _int(odet.get("reasoning_tokens"))
            if isinstance(odet, Mapping)
            else 0
        },
    }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _error_object(failure: StreamFailure) -> JSON:
    return {"type": failure.type, "code": failure.code, "message": failure.message}


# ---------------------------------------------------------------------------------------------
# Responses request → Chat request


def _text_of_parts(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    texts: list[str] = []
    if isinstance(parts, list):
        for part in parts:
            if isinstance(part, Mapping):
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part.get("type") in ("input_image", "image_url"):
                    texts.append("[image omitted]")
            elif isinstance(part, str):
                texts.append(part)
    return "\n".join(texts)


def _responses_content_to_chat(content: Any) -> str | list[JSON]:
    if isinstance(content, str):
        return content
    parts: list[JSON] = []
    has_image = False
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, Mapping):
            continue
        ptype = part.get("type")
        if ptype in ("input_text", "output_text", "text", "summary_text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif ptype == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif ptype == "input_image":
            url = part.get("image_url") or part.get("url")
            if isinstance(url, Mapping):
                url = url.get("url")
            if not isinstance(url, str):
                continue
            image: JSON = {"url": url}
            detail = part.get("detail")
            if detail in ("auto", "low", "high"):
                image["detail"] = detail
            parts.append({"type": "image_url", "image_url": image})
            has_image = True
    if not has_image:
        # Plain strings are the most widely accepted content form on Chat gateways.
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _text_of_parts(output)
    return json.dumps(output, ensure_ascii=False)


def _responses_tools_to_chat(tools: Any) -> list[JSON]:
    out: list[JSON] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, Mapping):
            continue
        if tool.get("type") == "function" and isinstance(tool.get("name"), str):
            fn: JSON = {"name": tool["name"]}
            if tool.get("description"):
                fn["description"] = tool["description"]
            fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            out.append({"type": "function", "function": fn})
        elif tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            fn = {"name": tool["name"], "parameters": dict(CUSTOM_TOOL_PARAMETERS)}
            if tool.get("description"):
                fn["description"] = tool["description"]
            out.append({"type": "function", "function": fn})
        # Hosted tools (web_search, local_shell, image_generation, …) cannot run elsewhere.
    return out


def custom_tool_names(body: Mapping[str, Any]) -> frozenset[str]:
    """Names of freeform (`custom`) tools in a Responses request, for the reverse mapping."""
    tools = body.get("tools")
    return frozenset(
        t["name"]
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, Mapping) and t.get("type") == "custom" and isinstance(t.get("name"), str)
    )


def _responses_input_to_messages(items: Any) -> list[JSON]:
    messages: list[JSON] = []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]

    def open_assistant() -> JSON:
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" not in last:
            last["tool_calls"] = []
            if last.get("content") == "":
                last["content"] = None
            return last
        if last is not None and last["role"] == "assistant":
            return last
        msg: JSON = {"role": "assistant", "content": None, "tool_calls": []}
        messages.append(msg)
        return msg

    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        itype = item.get("type", "message" if "role" in item else None)
        if itype == "message":
            role = item.get("role")
            role = "system" if role == "developer" else role
            if role not in ("system", "user", "assistant"):
                continue
            content = _responses_content_to_chat(item.get("content"))
            if role == "system" and not isinstance(content, str):
                content = _text_of_parts(content)
            messages.append({"role": role, "content": content})
        elif itype in ("function_call", "custom_tool_call"):
            if itype == "function_call":
                args = item.get("arguments")
                arguments = args if isinstance(args, str) else json.dumps(args or {})
            else:
                arguments = json.dumps({"input": item.get("input", "")}, ensure_ascii=False)
            call = {
                "id": str(item.get("call_id") or item.get("id") or ""),
                "type": "function",
                "function": {"name": str(item.get("name", "")), "arguments": arguments},
            }
            open_assistant()["tool_calls"].append(call)
        elif itype in ("function_call_output", "custom_tool_call_output"):
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id", "")),
                    "content": _tool_output_text(item.get("output", "")),
                }
            )
        # reasoning / compaction / hosted-tool items carry backend-only state: dropped.
    return messages


def responses_request_to_chat(
    body: Mapping[str, Any],
    *,
    model: str | None = None,
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
) -> JSON:
    """Translate a Responses request body into a Chat Completions request body.

    `instructions` becomes the leading system message, `developer` messages become system
    messages, function/custom tool calls and outputs become assistant `tool_calls` and `tool`
    messages, `reasoning.effort` → `reasoning_effort`, `max_output_tokens` → `max_tokens_field`,
    `text.format` → `response_format`, and `stream` adds `stream_options.include_usage`.
    Reasoning items (encrypted, backend-only) and hosted tools are dropped.
    """
    messages: list[JSON] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(_responses_input_to_messages(body.get("input", [])))
    out: JSON = {"model": model or body.get("model"), "messages": messages}
    tools = _responses_tools_to_chat(body.get("tools"))
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, str) and choice in ("auto", "none", "required"):
            out["tool_choice"] = choice
        elif isinstance(choice, Mapping) and choice.get("type") in ("function", "custom"):
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        if isinstance(body.get("parallel_tool_calls"), bool):
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and isinstance(reasoning.get("effort"), str):
        out["reasoning_effort"] = reasoning["effort"]
    if isinstance(body.get("max_output_tokens"), int):
        out[max_tokens_field] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "user", "seed", "stop"):
        if body.get(key) is not None:
            out[key] = body[key]
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(fmt, Mapping):
        if fmt.get("type") == "json_schema":
            schema: JSON = {"name": fmt.get("name", "output"), "schema": fmt.get("schema", {})}
            if "strict" in fmt:
                schema["strict"] = fmt["strict"]
            out["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif fmt.get("type") == "json_object":
            out["response_format"] = {"type": "json_object"}
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


# ---------------------------------------------------------------------------------------------
# Chat response → Responses response (non-stream)


def _reasoning_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        for key in ("text", "content"):
            if isinstance(value.get(key), str):
                return str(value[key])
    return ""


def _content_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            str(p.get("text", "")) for p in value if isinstance(p, Mapping) and "text" in p
        )
    return ""


def _id_base(response_id: str) -> str:
    return response_id.removeprefix("resp_")


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str, custom: bool
) -> JSON:
    if custom:
        return {
            "type": "custom_tool_call",
            "id": item_id,
            "call_id": call_id,
            "name": name,
            "input": _custom_input(arguments),
            "status": status,
        }
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _custom_input(arguments: str) -> str:
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    if isinstance(parsed, Mapping) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments


def chat_response_to_responses(
    resp: Mapping[str, Any],
    *,
    response_id: str | None = None,
    created_at: int | None = None,
    model: str | None = None,
    custom_tools: frozenset[str] = frozenset(),
) -> JSON:
    """Translate a non-stream Chat Completion into a Responses response object.

    Output order: reasoning (from `reasoning_content`/`reasoning`), the assistant message, then
    one `function_call` per tool call (`custom_tool_call` for names in `custom_tools`).
    `finish_reason` `length`/`content_filter` give `status: "incomplete"` with the reason.
    """
    rid = response_id or f"resp_{resp.get('id', 'ocx')}"
    base = _id_base(rid)
    choices = resp.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, Mapping) else None
    message = message if isinstance(message, Mapping) else {}
    output: list[JSON] = []
    thinking = _reasoning_text(message.get("reasoning_content") or message.get("reasoning"))
    if thinking:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{base}_{len(output)}",
                "summary": [{"type": "summary_text", "text": thinking}],
            }
        )
    text = _content_text(message.get("content"))
    if text or message.get("refusal"):
        content = [{"type": "output_text", "text": text, "annotations": []}]
        if message.get("refusal"):
            content = [{"type": "refusal", "refusal": str(message["refusal"])}]
        output.append(
            {
                "type": "message",
                "id": f"msg_{base}_{len(output)}",
                "role": "assistant",
                "status": "completed",
                "content": content,
            }
        )
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        fn = _mapping(call.get("function"))
        name = str(fn.get("name", ""))
        output.append(
            _call_item(
                f"fc_{base}_{len(output)}",
                str(call.get("id", "")),
                name,
                str(fn.get("arguments") or ""),
                "completed",
                name in custom_tools,
            )
        )
    finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
    out: JSON = {
        "id": rid,
        "object": "response",
        "created_at": created_at if created_at is not None else _int(resp.get("created")),
        "status": "completed",
        "model": model or resp.get("model"),
        "output": output,
        "usage": chat_usage_to_responses(resp.get("usage")),
    }
    if finish in _CHAT_FINISH_TO_INCOMPLETE:
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": _CHAT_FINISH_TO_INCOMPLETE[str(finish)]}
    return out


# ---------------------------------------------------------------------------------------------
# Responses event writer (shared by every "X stream → Responses stream" translator)


@dataclass
class _Item:
    kind: Literal["message", "reasoning", "call"]
    output_index: int
    item_id: str
    text: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    custom: bool = False
    done: bool = False


class ResponsesStreamWriter:
    """Emits a correct Responses SSE event sequence from deltas; every method returns bytes.

    Call `start()` once, then any mix of `text_delta`, `reasoning_delta`, `start_call` +
    `call_arguments_delta`, and end with exactly one of `complete(usage, …)` or `fail(failure)`.
    Items are opened and closed automatically (reasoning closes when text or a call starts; a
    message closes when a call starts); `output_item.done` always carries the full item, which
    is what Codex records. Sequence numbers, output indices and item ids (`msg_/rs_/fc_<base>_<n>`
    where `base` is the response id without `resp_`) are deterministic.
    """

    def __init__(self, *, response_id: str, model: str, created_at: int) -> None:
        self.response_id = response_id
        self.model = model
        self.created_at = created_at
        self._seq = 0
        self._items: list[_Item] = []
        self._calls: dict[str, _Item] = {}
        self._message: _Item | None = None
        self._reasoning: _Item | None = None
        self._output: list[tuple[int, JSON]] = []  # (output_index, done item)
        self.started = False
        self.finished = False

    @property
    def has_output(self) -> bool:
        return bool(self._items)

    @property
    def has_calls(self) -> bool:
        return bool(self._calls)

    def _event(self, etype: str, **fields: Any) -> bytes:
        payload: JSON = {"type": etype, "sequence_number": self._seq}
        payload.update(fields)
        self._seq += 1
        return encode_json_event(etype, payload)

    def _response(self, status: str, **extra: Any) -> JSON:
        resp: JSON = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
        }
        resp.update(extra)
        return resp

    def start(self) -> bytes:
        """`response.created` + `response.in_progress` (idempotent)."""
        if self.started:
            return b""
        self.started = True
        return self._event(
            "response.created", response=self._response("in_progress", output=[])
        ) + self._event("response.in_progress", response=self._response("in_progress"))

    def _open(self, kind: Literal["message", "reasoning", "call"], prefix: str) -> _Item:
        index = len(self._items)
        item = _Item(kind, index, f"{prefix}_{_id_base(self.response_id)}_{index}")
        self._items.append(item)
        return item

    def reasoning_delta(self, delta: str) -> bytes:
        """Stream reasoning text as a reasoning summary (opens the reasoning item if needed)."""
        if not delta:
            return b""
        out = self.start()
        item = self._reasoning
        if item is None:
            item = self._reasoning = self._open("reasoning", "rs")
            out += self._event(
                "response.output_item.added",
                output_index=item.output_index,
                item={"type": "reasoning", "id": item.item_id, "summary": []},
            )
            out += self._event(
                "response.reasoning_summary_part.added",
                item_id=item.item_id,
                output_index=item.output_index,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            )
        item.text.append(delta)
        return out + self._event(
            "response.reasoning_summary_text.delta",
            item_id=item.item_id,
            output_index=item.output_index,
            summary_index=0,
            delta=delta,
        )

    def text_delta(self, delta: str) -> bytes:
        """Stream assistant text (closes open reasoning; opens the message item if needed)."""
        if not delta:
            return b""
        out = self.start() + self._close_reasoning()
        item = self._message
        if item is None:
            item = self._message = self._open("message", "msg")
            out += self._event(
                "response.output_item.added",
                output_index=item.output_index,
                item={
                    "type": "message",
                    "id": item.item_id,
                    "role": "assistant",
                    "status": "in_progress",
                    "content": [],
                },
            )
            out += self._event(
                "response.content_part.added",
                item_id=item.item_id,
                output_index=item.output_index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        item.text.append(delta)
        return out + self._event(
            "response.output_text.delta",
            item_id=item.item_id,
            output_index=item.output_index,
            content_index=0,
            delta=delta,
        )

    def start_call(self, key: str, call_id: str, name: str, *, custom: bool = False) -> bytes:
        """Open a function call (or a freeform `custom_tool_call`) addressed later by `key`."""
        if key in self._calls:
            return b""
        out = self.start() + self._close_reasoning() + self._close_message()
        item = self._open("call", "fc")
        item.call_id, item.name, item.custom = call_id, name, custom
        self._calls[key] = item
        return out + self._event(
            "response.output_item.added",
            output_index=item.output_index,
            item=_call_item(item.item_id, call_id, name, "", "in_progress", custom),
        )

    def call_arguments_delta(self, key: str, delta: str) -> bytes:
        """Append argument text to the call opened under `key` (ignored for unknown keys)."""
        item = self._calls.get(key)
        if item is None or not delta or item.done:
            return b""
        item.text.append(delta)
        if item.custom:
            # The raw input only exists once the JSON wrapper is complete: sent in output_item.done.
            return b""
        return self._event(
            "response.function_call_arguments.delta",
            item_id=item.item_id,
            output_index=item.output_index,
            delta=delta,
        )

    def _close_reasoning(self) -> bytes:
        item, self._reasoning = self._reasoning, None
        if item is None:
            return b""
        text = "".join(item.text)
        done_item = {
            "type": "reasoning",
            "id": item.item_id,
            "summary": [{"type": "summary_text", "text": text}],
        }
        item.done = True
        self._output.append((item.output_index, done_item))
        common = {"item_id": item.item_id, "output_index": item.output_index, "summary_index": 0}
        return (
            self._event("response.reasoning_summary_text.done", text=text, **common)
            + self._event(
                "response.reasoning_summary_part.done",
                part={"type": "summary_text", "text": text},
                **common,
            )
            + self._event(
                "response.output_item.done", output_index=item.output_index, item=done_item
            )
        )

    def _close_message(self) -> bytes:
        item, self._message = self._message, None
        if item is None:
            return b""
        text = "".join(item.text)
        part = {"type": "output_text", "text": text, "annotations": []}
        done_item = {
            "type": "message",
            "id": item.item_id,
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
        item.done = True
        self._output.append((item.output_index, done_item))
        common = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
        return (
            self._event("response.output_text.done", text=text, **common)
            + self._event("response.content_part.done", part=part, **common)
            + self._event(
                "response.output_item.done", output_index=item.output_index, item=done_item
            )
        )

    def _close_call(self, item: _Item) -> bytes:
        if item.done:
            return b""
        item.done = True
        arguments = "".join(item.text)
        done_item = _call_item(
            item.item_id, item.call_id, item.name, arguments, "completed", item.custom
        )
        self._output.append((item.output_index, done_item))
        out = b""
        if not item.custom:
            out = self._event(
                "response.function_call_arguments.done",
                item_id=item.item_id,
                output_index=item.output_index,
                arguments=arguments,
            )
        return out + self._event(
            "response.output_item.done", output_index=item.output_index, item=done_item
        )

    def close_items(self) -> bytes:
        """Close every open item (in output order)."""
        out = self._close_reasoning() + self._close_message()
        for item in sorted(self._calls.values(), key=lambda i: i.output_index):
            out += self._close_call(item)
        return out

    def complete(
        self, usage: Mapping[str, Any] | None, *, incomplete_reason: str | None = None
    ) -> bytes:
        """Close items and send `response.completed` with the full output and `usage` (already
        in Responses shape). A truncation (`incomplete_reason`) still ends with
        `response.completed` — `response.incomplete` would make Codex blindly re-send (§3.7) —
        but the response carries `status: "incomplete"` and `incomplete_details`."""
        if self.finished:
            return b""
        out = self.start() + self.close_items()
        self.finished = True
        extra: JSON = {"output": [it for _, it in sorted(self._output, key=lambda p: p[0])]}
        if usage is not None:
            extra["usage"] = dict(usage)
        status = "completed"
        if incomplete_reason:
            status = "incomplete"
            extra["incomplete_details"] = {"reason": incomplete_reason}
        return out + self._event("response.completed", response=self._response(status, **extra))

    def fail(self, failure: StreamFailure) -> bytes:
        """End with `response.failed` (open items are not closed: they were never completed)."""
        if self.finished:
            return b""
        self.finished = True
        error = {"code": failure.code, "message": failure.message, "type": failure.type}
        return self.start() + self._event(
            "response.failed", response=self._response("failed", error=error)
        )


# ---------------------------------------------------------------------------------------------
# Chat stream → Responses stream


class ChatToResponsesStream:
    """Stateful translator of a Chat Completions SSE stream into Responses SSE bytes.

    Feed each upstream frame with `feed_event(event)` (or decoded chunks with `feed(chunk)` and
    the sentinel with `feed_done()`); call `close()` at end of stream. Only choice 0 is used.
    A clean end is a `finish_reason` (then `[DONE]` or simply the end of the body) →
    `response.completed` with usage; an `error` chunk, malformed JSON, or a stream that stops
    before any `finish_reason` → `response.failed`.
    """

    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created_at: int,
        custom_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.writer = ResponsesStreamWriter(
            response_id=response_id, model=model, created_at=created_at
        )
        self._custom = custom_tools
        self._finish: str | None = None
        self._usage: Mapping[str, Any] | None = None
        self._index_keys: dict[int, str] = {}

    @property
    def finished(self) -> bool:
        return self.writer.finished

    def start(self) -> bytes:
        return self.writer.start()

    def feed_event(self, event: SSEEvent) -> bytes:
        if self.finished or not event.has_data:
            return b""
        if event.is_done:
            return self.feed_done()
        try:
            chunk = event.json()
        except ValueError:
            return self.fail(truncation_failure("sent malformed stream data"))
        if not isinstance(chunk, Mapping):
            return self.fail(truncation_failure("sent malformed stream data"))
        return self.feed(chunk)

    def feed(self, chunk: Mapping[str, Any]) -> bytes:
        """Translate one decoded Chat chunk."""
        if self.finished:
            return b""
        w = self.writer
        if chunk.get("error") is not None:
            return self.fail(failure_from_error(chunk["error"]))
        out = w.start()
        if isinstance(chunk.get("usage"), Mapping):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                out += w.reasoning_delta(
                    _reasoning_text(delta.get("reasoning_content") or delta.get("reasoning"))
                )
                out += w.text_delta(_content_text(delta.get("content")))
                for call in delta.get("tool_calls") or []:
                    if isinstance(call, Mapping):
                        out += self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish = str(choice["finish_reason"])
        return out

    def _tool_call(self, call: Mapping[str, Any]) -> bytes:
        index = call.get("index")
        call_id = call.get("id")
        fn = _mapping(call.get("function"))
        if isinstance(index, int) and index in self._index_keys:
            key = self._index_keys[index]
        elif isinstance(call_id, str) and call_id:
            key = call_id
        else:
            key = f"index:{index}"
        out = b""
        if isinstance(index, int) and index not in self._index_keys:
            self._index_keys[index] = key
            name = str(fn.get("name") or "")
            out += self.writer.start_call(
                key, str(call_id or self._fallback_call_id(key)), name, custom=name in self._custom
            )
        elif not isinstance(index, int):
            name = str(fn.get("name") or "")
            out += self.writer.start_call(
                key, str(call_id or self._fallback_call_id(key)), name, custom=name in self._custom
            )
        args = fn.get("arguments")
        if isinstance(args, str):
            out += self.writer.call_arguments_delta(key, args)
        return out

    def _fallback_call_id(self, key: str) -> str:
        # Some gateways omit tool-call ids; Codex needs a call_id to pair the output with.
        return f"call_{_id_base(self.writer.response_id)}_{key.removeprefix('index:')}"

    def feed_done(self) -> bytes:
        """The `[DONE]` sentinel: complete if a finish_reason was seen, else a truncation."""
        if self.finished:
            return b""
        if self._finish is None:
            return self.fail(truncation_failure("stream ended without a finish_reason"))
        return self.writer.complete(
            chat_usage_to_responses(self._usage),
            incomplete_reason=_CHAT_FINISH_TO_INCOMPLETE.get(self._finish),
        )

    def close(self) -> bytes:
        """End of the upstream body: complete when a `finish_reason` was seen (a missing `[DONE]`
        trailer is not a cut, PRODUCT §5.4), otherwise `response.failed`."""
        if self.finished:
            return b""
        if self._finish is not None:
            return self.feed_done()
        return self.fail(truncation_failure("stream ended without a finish_reason"))

    def fail(self, failure: StreamFailure) -> bytes:
        return self.writer.fail(failure)


# ---------------------------------------------------------------------------------------------
# Chat request → Responses request


def _chat_content_to_responses(content: Any, role: str) -> list[JSON]:
    text_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    parts: list[JSON] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text":
            parts.append({"type": text_type, "text": str(part.get("text", ""))})
        elif part.get("type") == "image_url":
            img = part.get("image_url")
            url = img.get("url") if isinstance(img, Mapping) else img
            if isinstance(url, str):
                image: JSON = {"type": "input_image", "image_url": url}
                if isinstance(img, Mapping) and img.get("detail"):
                    image["detail"] = img["detail"]
                parts.append(image)
    return parts


def chat_request_to_responses(body: Mapping[str, Any], *, model: str | None = None) -> JSON:
    """Translate a Chat Completions request body into a Responses request body.

    Leading system/developer messages join into `instructions` (later ones become `developer`
    input messages); assistant `tool_calls` → `function_call` items; `tool` messages →
    `function_call_output`; `reasoning_effort` → `reasoning.effort`; `max_tokens` /
    `max_completion_tokens` → `max_output_tokens`; `response_format` → `text.format`.
    `store` is always false (the proxy keeps no upstream state).
    """
    instructions: list[str] = []
    items: list[JSON] = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, Mapping):
            continue
        role = msg.get("role")
        content = msg.get("content")
        if role in ("system", "developer"):
            text = _text_of_parts(content)
            if not items:
                instructions.append(text)
            else:
                items.append(
                    {
                        "type": "message",
                        "role": "developer",
                        "content": [{"type": "input_text", "text": text}],
                    }
                )
        elif role in ("user", "assistant"):
            parts = _chat_content_to_responses(content, str(role))
            if parts and any(p.get("text") != "" or p["type"] == "input_image" for p in parts):
                items.append({"type": "message", "role": role, "content": parts})
            if role == "assistant":
                for call in msg.get("tool_calls") or []:
                    if not isinstance(call, Mapping):
                        continue
                    fn = _mapping(call.get("function"))
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": str(call.get("id", "")),
                            "name": str(fn.get("name", "")),
                            "arguments": str(fn.get("arguments") or ""),
                        }
                    )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(msg.get("tool_call_id", "")),
                    "output": _text_of_parts(content),
                }
            )
    out: JSON = {"model": model or body.get("model")}
    if instructions:
        out["instructions"] = "\n\n".join(instructions)
    out["input"] = items
    tools: list[JSON] = []
    for tool in body.get("tools") or []:
        fn = _mapping(tool.get("function") if isinstance(tool, Mapping) else None)
        if isinstance(fn.get("name"), str):
            t: JSON = {"type": "function", "name": fn["name"]}
            if fn.get("description"):
                t["description"] = fn["description"]
            t["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
            if isinstance(fn.get("strict"), bool):
                t["strict"] = fn["strict"]
            tools.append(t)
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, str):
            out["tool_choice"] = choice
        elif isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
            out["tool_choice"] = {"type": "function", "name": choice["function"].get("name")}
        if isinstance(body.get("parallel_tool_calls"), bool):
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    if isinstance(body.get("reasoning_effort"), str):
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(cap, int):
        out["max_output_tokens"] = cap
    for key in ("temperature", "top_p", "user"):
        if body.get(key) is not None:
            out[key] = body[key]
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping):
        if fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), Mapping):
            js = fmt["json_schema"]
            tf: JSON = {"type": "json_schema", "name": js.get("name", "output")}
            tf["schema"] = js.get("schema", {})
            if "strict" in js:
                tf["strict"] = js["strict"]
            out["text"] = {"format": tf}
        elif fmt.get("type") in ("json_object", "text"):
            out["text"] = {"format": {"type": fmt["type"]}}
    out["store"] = False
    out["stream"] = bool(body.get("stream"))
    return out


# ---------------------------------------------------------------------------------------------
# Responses response → Chat response (non-stream)


def _finish_reason(status: Any, details: Any, has_calls: bool) -> str:
    reason = details.get("reason") if isinstance(details, Mapping) else None
    if reason == "max_output_tokens":
        return "length"
    if reason == "content_filter":
        return "content_filter"
    if has_calls:
        return "tool_calls"
    return "length" if status == "incomplete" else "stop"


def _item_call_arguments(item: Mapping[str, Any]) -> str:
    if item.get("type") == "custom_tool_call":
        return json.dumps({"input": item.get("input", "")}, ensure_ascii=False)
    args = item.get("arguments")
    return args if isinstance(args, str) else json.dumps(args or {})


def responses_response_to_chat(
    resp: Mapping[str, Any], *, chat_id: str | None = None, model: str | None = None
) -> JSON:
    """Translate a non-stream Responses response object into a Chat Completion.

    Message text joins into `content`, reasoning summaries into `reasoning_content`, function
    and custom tool calls into `tool_calls`; `finish_reason` is `tool_calls`, `length`,
    `content_filter` or `stop`; usage maps with cached/reasoning details.
    """
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[JSON] = []
    for item in resp.get("output") or []:
        if not isinstance(item, Mapping):
            continue
        itype = item.get("type")
        if itype == "message":
            for part in item.get("content") or []:
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    texts.append(str(part.get("text", "")))
        elif itype == "reasoning":
            for part in item.get("summary") or []:
                if isinstance(part, Mapping):
                    reasoning.append(str(part.get("text", "")))
        elif itype in ("function_call", "custom_tool_call"):
            calls.append(
                {
                    "id": str(item.get("call_id", "")),
                    "type": "function",
                    "function": {
                        "name": str(item.get("name", "")),
                        "arguments": _item_call_arguments(item),
                    },
                }
            )
    message: JSON = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return {
        "id": chat_id or f"chatcmpl-{_id_base(str(resp.get('id', 'ocx')))}",
        "object": "chat.completion",
        "created": _int(resp.get("created_at")),
        "model": model or resp.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish_reason(
                    resp.get("status"), resp.get("incomplete_details"), bool(calls)
                ),
            }
        ],
        "usage": responses_usage_to_chat(resp.get("usage")),
    }


# ---------------------------------------------------------------------------------------------
# Responses stream → Chat stream


@dataclass
class _ChatCall:
    index: int
    sent_args: list[str] = field(default_factory=list)


class ResponsesToChatStream:
    """Stateful translator of a Responses SSE stream into Chat Completions chunk bytes.

    Feed frames with `feed_event(event)` (or decoded payloads with `feed(payload)`); call
    `close()` at end of stream. `response.completed`/`response.incomplete` end with a
    `finish_reason` chunk, a usage chunk (when `include_usage`) and `data: [DONE]`;
    `response.failed`, an `error` event, malformed data or an early end give an `error` frame
    and no `[DONE]`. Text or arguments present only in `output_item.done` are still delivered.
    """

    def __init__(
        self, *, chat_id: str, model: str, created: int, include_usage: bool = True
    ) -> None:
        self.chat_id = chat_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.finished = False
        self._role_sent = False
        self._calls: dict[str, _ChatCall] = {}  # item id → call
        self._text_sent: dict[str, list[str]] = {}  # message item id → text sent

    def _chunk(self, delta: JSON, finish: str | None = None, **extra: Any) -> bytes:
        payload: JSON = {
            "id": self.chat_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        payload.update(extra)
        return encode_json_event(None, payload)

    def _role(self) -> bytes:
        if self._role_sent:
            return b""
        self._role_sent = True
        return self._chunk({"role": "assistant", "content": ""})

    def feed_event(self, event: SSEEvent) -> bytes:
        if self.finished or not event.has_data or event.is_done:
            return b""
        try:
            payload = event.json()
        except ValueError:
            return self.fail(truncation_failure("sent malformed stream data"))
        if not isinstance(payload, Mapping):
            return self.fail(truncation_failure("sent malformed stream data"))
        return self.feed(payload)

    def feed(self, payload: Mapping[str, Any]) -> bytes:
        """Translate one decoded Responses event."""
        if self.finished:
            return b""
        etype = payload.get("type")
        if etype == "response.created":
            return self._role()
        if etype == "response.output_text.delta":
            item_id = str(payload.get("item_id", ""))
            delta = str(payload.get("delta", ""))
            self._text_sent.setdefault(item_id, []).append(delta)
            return self._role() + self._chunk({"content": delta}) if delta else b""
        if etype in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            delta = str(payload.get("delta", ""))
            return self._role() + self._chunk({"reasoning_content": delta}) if delta else b""
        if etype == "response.output_item.added":
            return self._item_added(payload.get("item"))
        if etype == "response.function_call_arguments.delta":
            call = self._calls.get(str(payload.get("item_id", "")))
            delta = str(payload.get("delta", ""))
            if call is None or not delta:
                return b""
            call.sent_args.append(delta)
            return self._chunk(
                {"tool_calls": [{"index": call.index, "function": {"arguments": delta}}]}
            )
        if etype == "response.output_item.done":
            return self._item_done(payload.get("item"))
        if etype in ("response.completed", "response.incomplete"):
            return self._finish(payload.get("response"))
        if etype in ("response.failed", "error"):
            response = payload.get("response")
            error = response.get("error") if isinstance(response, Mapping) else None
            if error is None:
                error = payload.get("error") or {
                    k: v for k, v in payload.items() if k in ("code", "message")
                }
            return self.fail(failure_from_error(error))
        return b""

    def _item_added(self, item: Any) -> bytes:
        if not isinstance(item, Mapping) or item.get("type") not in (
            "function_call",
            "custom_tool_call",
        ):
            return b""
        key = str(item.get("id") or item.get("call_id"))
        if key in self._calls:
            return b""
        call = self._calls[key] = _ChatCall(index=len(self._calls))
        out = self._role() + self._chunk(
            {
                "tool_calls": [
                    {
                        "index": call.index,
                        "id": str(item.get("call_id", "")),
                        "type": "function",
                        "function": {"name": str(item.get("name", "")), "arguments": ""},
                    }
                ]
            }
        )
        return out

    def _item_done(self, item: Any) -> bytes:
        if not isinstance(item, Mapping):
            return b""
        itype = item.get("type")
        if itype == "message":
            full = "".join(
                str(p.get("text", ""))
                for p in item.get("content") or []
                if isinstance(p, Mapping) and p.get("type") == "output_text"
            )
            sent = "".join(self._text_sent.get(str(item.get("id", "")), []))
            rest = full[len(sent) :] if full.startswith(sent) else ""
            return self._role() + self._chunk({"content": rest}) if rest else b""
        if itype in ("function_call", "custom_tool_call"):
            out = self._item_added(item)
            call = self._calls[str(item.get("id") or item.get("call_id"))]
            full = _item_call_arguments(item)
            sent = "".join(call.sent_args)
            rest = full[len(sent) :] if full.startswith(sent) else ""
            if rest:
                call.sent_args.append(rest)
                out += self._chunk(
                    {"tool_calls": [{"index": call.index, "function": {"arguments": rest}}]}
                )
            return out
        return b""

    def _finish(self, response: Any) -> bytes:
        response = response if isinstance(response, Mapping) else {}
        out = self._role() + self._chunk(
            {},
            _finish_reason(
                response.get("status"), response.get("incomplete_details"), bool(self._calls)
            ),
        )
        if self.include_usage:
            out += encode_json_event(
                None,
                {
                    "id": self.chat_id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": responses_usage_to_chat(response.get("usage")),
                },
            )
        self.finished = True
        return out + DONE_FRAME

    def close(self) -> bytes:
        """End of the upstream body: an `error` frame (no `[DONE]`) unless already finished."""
        if self.finished:
            return b""
        return self.fail(truncation_failure("stream ended before response.completed"))

    def fail(self, failure: StreamFailure) -> bytes:
        if self.finished:
            return b""
        self.finished = True
        return encode_json_event(None, {"error": _error_object(failure)})


def iter_translate(
    translator: ChatToResponsesStream | ResponsesToChatStream, events: Iterable[SSEEvent]
) -> bytes:
    """Feed a batch of frames through a translator and concatenate the output bytes."""
    return b"".join(translator.feed_event(ev) for ev in events)
