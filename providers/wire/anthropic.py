"""Responses / Chat Completions ⇄ Anthropic Messages translation, streaming and not.

Request side: `responses_request_to_messages` (and `chat_request_to_messages`, composed through the
Responses form) builds a valid Messages body: `system` from instructions and developer messages,
strictly alternating user/assistant turns, `tool_use`/`tool_result` pairing repaired, images,
tools and `tool_choice`, `reasoning.effort` → a thinking budget (`DEFAULT_EFFORT_BUDGETS`), and
a `max_tokens` that always exceeds the budget. Backend-only ciphertext is stripped first
(`strip_backend_ciphertext`, codex-wire §7).

Response side: `messages_response_to_responses` / `messages_response_to_chat` (non-stream),
`MessagesToResponsesStream` / `MessagesToChatStream` (stream). For the commit rule of an Anthropic
upstream use `AnthropicCommitScanner` (same interface as `commit.CommitScanner`), or the pieces
`classify_anthropic_event` + `anthropic_stream_failure`. HTTP error bodies become OpenAI-shaped
with `anthropic_error_to_openai`. Everything is pure: ids and timestamps are injected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from providers.wire.chat import (
    CUSTOM_TOOL_PARAMETERS,
    ResponsesStreamWriter,
    ResponsesToChatStream,
    chat_request_to_responses,
    custom_tool_names,
    responses_response_to_chat,
)
from providers.wire.commit import (
    MAX_BUFFER_BYTES,
    MAX_BUFFER_CHUNKS,
    CommitScanner,
    EventClass,
    StreamFailure,
    failure_from_error,
    truncation_failure,
)
from providers.wire.sse import SSEEvent, SSEParser

JSON = dict[str, Any]
AnthropicEventClass = Literal["control", "output", "completed", "failure"]

# Effort → thinking budget. Every budget + DEFAULT_MAX_TOKENS headroom stays ≤ 32000, the
# smallest max output of the thinking-capable Claude models (Opus 4 / 4.1).
DEFAULT_EFFORT_BUDGETS: Mapping[str, int] = {
    "minimal": 1024,
    "low": 2048,
    "medium": 8192,
    "high": 16384,
    "xhigh": 24576,
    "max": 27648,
    "ultra": 27648,
}
MIN_THINKING_BUDGET = 1024  # Anthropic's floor for budget_tokens
DEFAULT_MAX_TOKENS = 8192  # Anthropic requires max_tokens; Codex never sends a cap
THINKING_HEADROOM = 4096  # answer tokens on top of the thinking budget when no cap was given

# Anthropic error type → HTTP status (codex-wire §6.2).
ANTHROPIC_ERROR_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_STATUS_ERROR_TYPE: Mapping[int, str] = {v: k for k, v in ANTHROPIC_ERROR_STATUS.items()}

# stop_reason → Responses incomplete reason (None = completed).
_STOP_TO_INCOMPLETE: Mapping[str, str] = {
    "max_tokens": "max_output_tokens",
    "model_context_window_exceeded": "max_output_tokens",
    "refusal": "content_filter",
}

_CIPHERTEXT_ITEM_TYPES = frozenset({"compaction", "compaction_summary", "context_compaction"})
_TOOL_ID_BAD = re.compile(r"[^A-Za-z0-9_-]")
_SAFE_USER_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_DATA_URL = re.compile(r"^data:([^;,]+)((?:;[^;,]*)*);base64,(.*)$", re.DOTALL)
_OVERFLOW_HINTS = ("prompt is too long", "exceed context limit", "exceeds context limit")
_EMPTY_TURN_TEXT = "(continued)"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _id_base(response_id: str) -> str:
    return response_id.removeprefix("resp_")


# ---------------------------------------------------------------------------------------------
# Ciphertext (codex-wire §7)


def strip_backend_ciphertext(input_items: Sequence[Any]) -> list[Any]:
    """Remove OpenAI/ChatGPT backend-only ciphertext from Responses `input` items (codex-wire §7).

    `reasoning` items lose `encrypted_content` (summary kept); `compaction` /
    `compaction_summary` / `context_compaction` items are dropped; `function_call` items lose
    `encrypted_function_args`; `agent_message` items lose `encrypted_content` parts (and are
    dropped when nothing readable is left). The input is not mutated.
    """
    out: list[Any] = []
    for item in input_items:
        if not isinstance(item, Mapping):
            out.append(item)
            continue
        itype = item.get("type")
        if itype in _CIPHERTEXT_ITEM_TYPES:
            continue
        if itype == "reasoning" and "encrypted_content" in item:
            out.append({k: v for k, v in item.items() if k != "encrypted_content"})
        elif itype == "function_call" and "encrypted_function_args" in item:
            out.append({k: v for k, v in item.items() if k != "encrypted_function_args"})
        elif itype == "agent_message" and isinstance(item.get("content"), list):
            parts = [
                p
                for p in item["content"]
                if not (isinstance(p, Mapping) and p.get("type") == "encrypted_content")
            ]
            if parts:
                out.append({**item, "content": parts})
        else:
            out.append(item)
    return out


# ---------------------------------------------------------------------------------------------
# Responses request → Messages request


def _tool_id(value: Any, fallback: str) -> str:
    # Anthropic tool ids must match ^[a-zA-Z0-9_-]+$; the same mapping is applied to results.
    text = str(value or "") or fallback
    return _TOOL_ID_BAD.sub("_", text)


def _image_block(url: Any) -> JSON | None:
    if isinstance(url, Mapping):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        return None
    match = _DATA_URL.match(url)
    if match:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": match.group(1), "data": match.group(3)},
        }
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    return None


def _content_blocks(content: Any) -> list[JSON]:
    """Responses message content (string or parts) → Anthropic text/image blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[JSON] = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, str):
            if part:
                blocks.append({"type": "text", "text": part})
            continue
        if not isinstance(part, Mapping):
            continue
        ptype = part.get("type")
        if ptype in ("input_text", "output_text", "text", "summary_text"):
            text = part.get("text")
            if isinstance(text, str) and text:  # Anthropic rejects empty text blocks
                blocks.append({"type": "text", "text": text})
        elif ptype == "refusal" and isinstance(part.get("refusal"), str) and part["refusal"]:
            blocks.append({"type": "text", "text": part["refusal"]})
        elif ptype in ("input_image", "image_url"):
            image = _image_block(part.get("image_url") or part.get("url"))
            if image is not None:
                blocks.append(image)
    return blocks


def _text_of(content: Any) -> str:
    return "\n".join(b["text"] for b in _content_blocks(content) if b["type"] == "text")


def _tool_input(arguments: Any) -> JSON:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {"input": arguments}
    return parsed if isinstance(parsed, dict) else {"input": parsed}


def _tool_result_content(output: Any) -> str | list[JSON]:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        blocks = _content_blocks(output)
        return blocks if blocks else ""
    return json.dumps(output, ensure_ascii=False)


class _Turns:
    """Accumulates Anthropic turns, merging adjacent same-role content (roles must alternate)."""

    def __init__(self) -> None:
        self.turns: list[JSON] = []

    def add(self, role: str, blocks: list[JSON]) -> None:
        if not blocks:
            return
        if self.turns and self.turns[-1]["role"] == role:
            self.turns[-1]["content"].extend(blocks)
        else:
            self.turns.append({"role": role, "content": list(blocks)})


def _repair_tool_pairing(turns: list[JSON]) -> list[JSON]:
    """Every tool_use must be answered by a tool_result in the very next user turn and every
    tool_result must answer a tool_use of the turn just before; tool_results come first."""
    out: list[JSON] = []
    pending: list[str] = []
    for turn in turns:
        blocks: list[JSON] = turn["content"]
        if turn["role"] == "assistant":
            if pending:
                out.append({"role": "user", "content": _missing_results(pending)})
            pending = [b["id"] for b in blocks if b["type"] == "tool_use"]
            out.append(turn)
            continue
        results: list[JSON] = []
        others: list[JSON] = []
        answered: set[str] = set()
        for block in blocks:
            if block["type"] == "tool_result":
                tid = block["tool_use_id"]
                if tid in pending and tid not in answered:
                    answered.add(tid)
                    results.append(block)
                else:
                    others.append(_orphan_result_text(block))
            else:
                others.append(block)
        results.extend(_missing_results([t for t in pending if t not in answered]))
        pending = []
        out.append({"role": "user", "content": results + others})
    if pending:
        out.append({"role": "user", "content": _missing_results(pending)})
    return out


def _missing_results(ids: list[str]) -> list[JSON]:
    return [
        {
            "type": "tool_result",
            "tool_use_id": tid,
            "content": "No output was recorded for this tool call.",
            "is_error": True,
        }
        for tid in ids
    ]


def _orphan_result_text(block: Mapping[str, Any]) -> JSON:
    content = block.get("content")
    text = content if isinstance(content, str) else _text_of(content)
    return {"type": "text", "text": f"[tool result {block.get('tool_use_id')}]\n{text}"}


def _tool_blocks_as_text(turns: list[JSON]) -> None:
    # Anthropic rejects tool_use/tool_result blocks in a request that declares no tools.
    for turn in turns:
        new: list[JSON] = []
        for block in turn["content"]:
            if block["type"] == "tool_use":
                args = json.dumps(block["input"], ensure_ascii=False)
                new.append({"type": "text", "text": f"[tool call {block['name']}] {args}"})
            elif block["type"] == "tool_result":
                new.append(_orphan_result_text(block))
            else:
                new.append(block)
        turn["content"] = new


def _anthropic_tools(tools: Any) -> list[JSON]:
    out: list[JSON] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            continue
        if tool.get("type") == "function":
            schema = tool.get("parameters") or {"type": "object", "properties": {}}
        elif tool.get("type") == "custom":
            schema = dict(CUSTOM_TOOL_PARAMETERS)
        else:
            continue  # hosted tools cannot run on Anthropic
        entry: JSON = {"name": tool["name"]}
        if isinstance(tool.get("description"), str) and tool["description"]:
            entry["description"] = tool["description"]
        entry["input_schema"] = schema
        out.append(entry)
    return out


def _tool_choice(choice: Any, parallel: Any) -> JSON | None:
    mapped: JSON | None = None
    if choice in (None, "auto"):
        mapped = {"type": "auto"}
    elif choice == "required":
        mapped = {"type": "any"}
    elif choice == "none":
        return {"type": "none"}
    elif isinstance(choice, Mapping) and isinstance(choice.get("name"), str):
        mapped = {"type": "tool", "name": choice["name"]}
    elif isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        mapped = {"type": "tool", "name": str(choice["function"].get("name", ""))}
    if mapped is not None and parallel is False:
        mapped["disable_parallel_tool_use"] = True
    return mapped


def _final_tool_turn_lacks_thinking(turns: list[JSON]) -> bool:
    # With thinking on, the last assistant turn of an active tool loop must start with a signed
    # thinking block, which we cannot reproduce; such a request must go without thinking.
    for turn in reversed(turns):
        if turn["role"] == "assistant":
            blocks = turn["content"]
            has_tool = any(b["type"] == "tool_use" for b in blocks)
            starts_thinking = bool(blocks) and blocks[0]["type"] in (
                "thinking",
                "redacted_thinking",
            )
            return has_tool and not starts_thinking
    return False


def _safe_user_id(body: Mapping[str, Any]) -> str | None:
    meta = _mapping(body.get("metadata"))
    for value in (meta.get("user_id"), meta.get("user"), body.get("user")):
        # Opaque ids only: no e-mail addresses, spaces or other likely PII.
        if isinstance(value, str) and _SAFE_USER_ID.match(value):
            return value
    return None


def thinking_budget(
    effort: Any, effort_budgets: Mapping[str, int] = DEFAULT_EFFORT_BUDGETS
) -> int | None:
    """The thinking budget for a Responses `reasoning.effort` (None = no thinking: `none`,
    unknown or missing efforts)."""
    if not isinstance(effort, str):
        return None
    budget = effort_budgets.get(effort.lower())
    return max(budget, MIN_THINKING_BUDGET) if budget else None


def responses_request_to_messages(
    body: Mapping[str, Any],
    *,
    model: str,
    effort_budgets: Mapping[str, int] = DEFAULT_EFFORT_BUDGETS,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    cache_control: bool = True,
) -> JSON:
    """Translate a Responses request body into an Anthropic Messages request body.

    `instructions` and `developer`/`system` messages → `system` text blocks; user/assistant
    messages, `function_call`/`custom_tool_call` (→ assistant `tool_use`, arguments parsed into
    `input`) and their outputs (→ user `tool_result`) become alternating turns with tool pairing
    repaired (a missing output gets an `is_error` placeholder, an orphan output becomes text);
    ciphertext and reasoning items are dropped. `reasoning.effort` → `thinking.budget_tokens`
    via `effort_budgets`; thinking is left off when the cap is too small, a tool is forced, or
    the last tool-loop assistant turn has no signed thinking. `max_tokens` is
    `max_output_tokens` (budget clamped below it) or `max(default_max_tokens, budget + 4096)`.
    With `cache_control` the last system block and the last message block get ephemeral
    prompt-cache breakpoints.
    """
    system: list[str] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        system.append(body["instructions"])
    raw_input = body.get("input", [])
    items = (
        [raw_input]
        if isinstance(raw_input, str)
        else strip_backend_ciphertext(raw_input if isinstance(raw_input, list) else [])
    )
    turns = _Turns()
    for n, item in enumerate(items):
        if isinstance(item, str):
            turns.add("user", _content_blocks(item))
            continue
        if not isinstance(item, Mapping):
            continue
        itype = item.get("type", "message" if "role" in item else None)
        if itype == "message":
            role = item.get("role")
            if role in ("developer", "system"):
                text = _text_of(item.get("content"))
                if text:
                    system.append(text)
            elif role in ("user", "assistant"):
                turns.add(str(role), _content_blocks(item.get("content")))
        elif itype in ("function_call", "custom_tool_call"):
            if itype == "function_call":
                tool_input = _tool_input(item.get("arguments"))
            else:
                tool_input = {"input": str(item.get("input", ""))}
            block: JSON = {
                "type": "tool_use",
                "id": _tool_id(item.get("call_id") or item.get("id"), f"call_{n}"),
                "name": str(item.get("name", "")),
                "input": tool_input,
            }
            turns.add("assistant", [block])
        elif itype in ("function_call_output", "custom_tool_call_output"):
            block = {
                "type": "tool_result",
                "tool_use_id": _tool_id(item.get("call_id"), f"call_{n}"),
                "content": _tool_result_content(item.get("output", "")),
            }
            turns.add("user", [block])
        # reasoning (unsigned), hosted-tool and other backend items cannot be replayed.
    messages = _repair_tool_pairing(turns.turns)
    tools = _anthropic_tools(body.get("tools"))
    if not tools:
        _tool_blocks_as_text(messages)
    if not messages or messages[0]["role"] != "user":
        opener: JSON = {"role": "user", "content": [{"type": "text", "text": _EMPTY_TURN_TEXT}]}
        messages.insert(0, opener)

    out: JSON = {"model": model}
    cap = body.get("max_output_tokens")
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    budget = thinking_budget(_mapping(body.get("reasoning")).get("effort"), effort_budgets)
    if budget is not None and cap is not None:
        # The cap covers thinking too (as Responses' max_output_tokens covers reasoning).
        budget = min(budget, cap - MIN_THINKING_BUDGET)
        if budget < MIN_THINKING_BUDGET:
            budget = None
    if budget is not None and tools and choice is not None and choice["type"] in ("any", "tool"):
        budget = None  # forced tool use is incompatible with extended thinking
    if budget is not None and _final_tool_turn_lacks_thinking(messages):
        budget = None
    if cap is not None:
        out["max_tokens"] = cap
    elif budget is not None:
        out["max_tokens"] = max(default_max_tokens, budget + THINKING_HEADROOM)
    else:
        out["max_tokens"] = default_max_tokens
    if system:
        out["system"] = [{"type": "text", "text": text} for text in system]
    out["messages"] = messages
    if tools:
        out["tools"] = tools
        if choice is not None:
            out["tool_choice"] = choice
    if budget is not None:
        out["thinking"] = {"type": "enabled", "budget_tokens": budget}
    else:
        # Anthropic's temperature range is 0..1, and recent models accept only one of the two.
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        if isinstance(temperature, int | float) and not isinstance(temperature, bool):
            out["temperature"] = min(max(float(temperature), 0.0), 1.0)
        elif isinstance(top_p, int | float) and not isinstance(top_p, bool):
            out["top_p"] = min(max(float(top_p), 0.0), 1.0)
    user_id = _safe_user_id(body)
    if user_id is not None:
        out["metadata"] = {"user_id": user_id}
    if body.get("stream"):
        out["stream"] = True
    if cache_control:
        if "system" in out:
            out["system"][-1]["cache_control"] = {"type": "ephemeral"}
        last = messages[-1]["content"]
        if last:
            last[-1] = {**last[-1], "cache_control": {"type": "ephemeral"}}
    return out


def chat_request_to_messages(
    body: Mapping[str, Any],
    *,
    model: str,
    effort_budgets: Mapping[str, int] = DEFAULT_EFFORT_BUDGETS,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    cache_control: bool = True,
) -> JSON:
    """Translate a Chat Completions request body into a Messages body (via the Responses form:
    `chat_request_to_responses` then `responses_request_to_messages`)."""
    return responses_request_to_messages(
        chat_request_to_responses(body, model=model),
        model=model,
        effort_budgets=effort_budgets,
        default_max_tokens=default_max_tokens,
        cache_control=cache_control,
    )


# ---------------------------------------------------------------------------------------------
# Usage, stop reasons, errors


def anthropic_usage_to_responses(usage: Mapping[str, Any] | None) -> JSON:
    """Anthropic usage → Responses usage: `input_tokens` = uncached + cache read + cache
    creation, `cached_tokens` = cache read (codex-wire §3.5), reasoning tokens unreported (0)."""
    usage = usage or {}
    uncached = _int(usage.get("input_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    created = _int(usage.get("cache_creation_input_tokens"))
    output = _int(usage.get("output_tokens"))
    total_in = uncached + read + created
    return {
        "input_tokens": total_in,
        "input_tokens_details": {"cached_tokens": read},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total_in + output,
    }


def incomplete_reason(stop_reason: Any) -> str | None:
    """Responses `incomplete_details.reason` for an Anthropic `stop_reason` (None = completed):
    `max_tokens` / `model_context_window_exceeded` → `max_output_tokens`, `refusal` →
    `content_filter`; `end_turn`, `tool_use`, `stop_sequence`, `pause_turn` complete."""
    return _STOP_TO_INCOMPLETE.get(stop_reason) if isinstance(stop_reason, str) else None


def _normalized_error(error: Any, status: int | None = None) -> JSON:
    """An Anthropic error object → `{type, code, message}` with OpenAI-style codes where the
    shared classifier needs them (context overflow)."""
    err = _mapping(error)
    etype = err.get("type")
    if not isinstance(etype, str) or not etype:
        etype = _STATUS_ERROR_TYPE.get(status or 0, "api_error" if (status or 500) >= 500 else "")
        etype = etype or "invalid_request_error"
    message = err.get("message")
    message = message if isinstance(message, str) else f"Provider error {status or 'unknown'}"
    code = etype
    lowered = message.lower()
    if any(hint in lowered for hint in _OVERFLOW_HINTS):
        # Anthropic words overflow as "prompt is too long: N tokens > M maximum".
        code = "context_length_exceeded"
        message = f"{message} (exceeds the context window)"
    return {"type": etype, "code": code, "message": message}


def anthropic_error_to_openai(status: int, body: Any) -> JSON:
    """An Anthropic HTTP error body (`{"type":"error","error":{"type","message"}}`, as a mapping,
    bytes or text) → `{"error": {"type", "code", "message"}}`. The Anthropic error type becomes
    the code (`overloaded_error`, `rate_limit_error`, …) so the shared classifier sees it; a
    "prompt is too long" overflow becomes `context_length_exceeded`. An unparseable body gets
    the type implied by `status`."""
    if isinstance(body, bytes | bytearray):
        body = bytes(body).decode("utf-8", errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            body = {"error": {"message": body.strip()[:500]}} if body.strip() else {}
    error = _mapping(body).get("error")
    return {"error": _normalized_error(error, status)}


def anthropic_stream_failure(event: SSEEvent | Mapping[str, Any]) -> StreamFailure:
    """The `StreamFailure` for an Anthropic `error` event (or a malformed frame): status from
    the error type (`overloaded_error` 529, `rate_limit_error` 429, `api_error` 500,
    `invalid_request_error` 400, …; 502 when unknown)."""
    payload: Any = event
    if isinstance(event, SSEEvent):
        try:
            payload = event.json()
        except ValueError:
            return truncation_failure("sent malformed stream data")
    error = _mapping(payload).get("error")
    if not isinstance(error, Mapping):
        return truncation_failure("sent an error event without an error object")
    norm = _normalized_error(error)
    status = ANTHROPIC_ERROR_STATUS.get(norm["type"])
    return failure_from_error(norm, status=status)


# ---------------------------------------------------------------------------------------------
# Messages response → Responses / Chat response (non-stream)


def messages_response_to_responses(
    resp: Mapping[str, Any],
    *,
    response_id: str,
    created_at: int,
    model: str,
    custom_tools: frozenset[str] = frozenset(),
) -> JSON:
    """Translate a non-stream Anthropic message into a Responses response object.

    Blocks map in order: `thinking` → `reasoning` item with the thinking as summary text (the
    signature is not exposed), consecutive `text` blocks → one assistant `message`, `tool_use` →
    `function_call` (arguments = JSON of `input`; `custom_tool_call` for `custom_tools`).
    Item ids follow `ResponsesStreamWriter` (`rs_/msg_/fc_<base>_<n>`). A `stop_reason` of
    `max_tokens` / `refusal` gives `status: "incomplete"` with the reason.
    """
    base = _id_base(response_id)
    output: list[JSON] = []
    texts: list[str] = []

    def flush_text() -> None:
        if texts:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{base}_{len(output)}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "".join(texts), "annotations": []}],
                }
            )
            texts.clear()

    for block in resp.get("content") or []:
        if not isinstance(block, Mapping):
            continue
        btype = block.get("type")
        if btype == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif btype == "thinking" and isinstance(block.get("thinking"), str):
            flush_text()
            output.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{base}_{len(output)}",
                    "summary": [{"type": "summary_text", "text": block["thinking"]}],
                }
            )
        elif btype == "tool_use":
            flush_text()
            name = str(block.get("name", ""))
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            item_id = f"fc_{base}_{len(output)}"
            call_id = str(block.get("id", ""))
            if name in custom_tools:
                raw = _mapping(block.get("input")).get("input")
                output.append(
                    {
                        "type": "custom_tool_call",
                        "id": item_id,
                        "call_id": call_id,
                        "name": name,
                        "input": raw if isinstance(raw, str) else arguments,
                        "status": "completed",
                    }
                )
            else:
                output.append(
                    {
                        "type": "function_call",
                        "id": item_id,
                        "call_id": call_id,
                        "name": name,
                        "arguments": arguments,
                        "status": "completed",
                    }
                )
        # redacted_thinking and server tool blocks have no Responses counterpart.
    flush_text()
    out: JSON = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "completed",
        "model": model,
        "output": output,
        "usage": anthropic_usage_to_responses(_mapping(resp.get("usage"))),
    }
    reason = incomplete_reason(resp.get("stop_reason"))
    if reason is not None:
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": reason}
    return out


def messages_response_to_chat(
    resp: Mapping[str, Any], *, chat_id: str, created: int, model: str
) -> JSON:
    """Translate a non-stream Anthropic message into a Chat Completion (via the Responses
    form): text → `content`, thinking → `reasoning_content`, tool_use → `tool_calls`,
    `finish_reason` `tool_calls` / `length` / `content_filter` / `stop`."""
    responses = messages_response_to_responses(
        resp, response_id=f"resp_{chat_id}", created_at=created, model=model
    )
    return responses_response_to_chat(responses, chat_id=chat_id, model=model)


# ---------------------------------------------------------------------------------------------
# Stream classification and the commit scanner


def _event_payload(event: SSEEvent) -> Mapping[str, Any] | None:
    try:
        payload = event.json()
    except ValueError:
        return None
    return payload if isinstance(payload, Mapping) else None


def classify_anthropic_event(event: SSEEvent) -> AnthropicEventClass:
    """Classify one Anthropic SSE frame for the commit rule: `message_start`, `ping`,
    `content_block_start` of text/thinking, `content_block_stop`, `message_delta`, comments and
    unknown types are replayable `control`; any `content_block_delta` and a `tool_use` block
    start are `output`; `message_stop` is `completed`; an `error` event or malformed data is a
    `failure` (hop before output)."""
    if not event.has_data:
        return "control"
    payload = _event_payload(event)
    if payload is None:
        return "failure"
    etype = payload.get("type", event.event)
    if etype == "error":
        return "failure"
    if etype == "message_stop":
        return "completed"
    if etype == "content_block_delta":
        return "output"
    if etype == "content_block_start":
        block = _mapping(payload.get("content_block"))
        if block.get("type") == "tool_use":
            return "output"
        if block.get("text") or block.get("thinking"):
            return "output"
    return "control"


_EVENT_CLASSES: Mapping[str, EventClass] = {
    "control": EventClass.CONTROL,
    "output": EventClass.OUTPUT,
    "completed": EventClass.COMPLETED,
    "failure": EventClass.FAILURE,
}


class AnthropicCommitScanner(CommitScanner):
    """The commit scanner of `commit.CommitScanner` with `classify_anthropic_event` as the rule.

    Because an Anthropic stream is translated rather than passed through, `buffered_events()`
    returns the frames parsed before (and including) the committing chunk; feed them, then the
    `Decision.events` of every later chunk, to a `MessagesToResponsesStream`.
    """

    def __init__(
        self,
        *,
        max_bytes: int = MAX_BUFFER_BYTES,
        max_chunks: int = MAX_BUFFER_CHUNKS,
        max_frame_bytes: int = MAX_BUFFER_BYTES,
    ) -> None:
        super().__init__(
            "anthropic",
            max_bytes=max_bytes,
            max_chunks=max_chunks,
            max_frame_bytes=max_frame_bytes,
        )

    def classify(self, event: SSEEvent) -> EventClass:
        cls = _EVENT_CLASSES[classify_anthropic_event(event)]
        if cls is EventClass.FAILURE and event.has_data and not event.is_done:
            try:
                event.json()  # already decoded by the classifier: this only reads the result
            except ValueError:
                # Counted like the other protocols' MALFORMED frames (a translated stream's
                # caller searches a batch for one only when this count went up).
                self.malformed += 1
        return cls

    def failure_of(self, event: SSEEvent) -> StreamFailure:
        return anthropic_stream_failure(event)


# ---------------------------------------------------------------------------------------------
# Messages stream → Responses stream / Chat stream


@dataclass
class _Block:
    kind: str
    key: str = ""
    args_seen: bool = False
    initial_input: Any = None


class MessagesToResponsesStream:
    """Stateful translator of an Anthropic Messages SSE stream into Responses SSE bytes.

    Feed each frame with `feed_event(event)` (or decoded payloads with `feed(payload)`); call
    `close()` at end of stream. `text_delta` → output text, `thinking_delta` → reasoning summary
    (signatures and `redacted_thinking` are dropped), `tool_use` + `input_json_delta` → a
    function call (a `custom_tool_call` for `custom_tools`). `message_stop` ends with
    `response.completed` carrying the id, the full output and usage (status `incomplete` with
    the reason for `max_tokens`/`refusal`); an `error` event, malformed data or an early end
    gives `response.failed`.
    """

    def __init__(
        self,
        response_id: str,
        model: str,
        created_at: int,
        *,
        custom_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.writer = ResponsesStreamWriter(
            response_id=response_id, model=model, created_at=created_at
        )
        self._custom = custom_tools
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, Any] = {}
        self._stop_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.writer.finished

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def usage(self) -> JSON:
        """The usage seen so far, in Responses shape."""
        return anthropic_usage_to_responses(self._usage)

    def start(self) -> bytes:
        return self.writer.start()

    def feed_event(self, event: SSEEvent) -> bytes:
        if self.finished or not event.has_data:
            return b""
        payload = _event_payload(event)
        if payload is None:
            return self.fail(truncation_failure("sent malformed stream data"))
        if "type" not in payload and event.event:
            payload = {**payload, "type": event.event}
        return self.feed(payload)

    def feed(self, payload: Mapping[str, Any]) -> bytes:
        """Translate one decoded Anthropic stream event."""
        if self.finished:
            return b""
        w = self.writer
        etype = payload.get("type")
        if etype == "message_start":
            message = _mapping(payload.get("message"))
            self._merge_usage(message.get("usage"))
            return w.start()
        if etype == "content_block_start":
            return self._block_start(payload)
        if etype == "content_block_delta":
            return self._block_delta(payload)
        if etype == "content_block_stop":
            return self._block_stop(payload)
        if etype == "message_delta":
            delta = _mapping(payload.get("delta"))
            if isinstance(delta.get("stop_reason"), str):
                self._stop_reason = delta["stop_reason"]
            self._merge_usage(payload.get("usage"))
            return b""
        if etype == "message_stop":
            return w.complete(self.usage(), incomplete_reason=incomplete_reason(self._stop_reason))
        if etype == "error":
            return self.fail(anthropic_stream_failure(payload))
        return b""  # ping and future event types

    def _merge_usage(self, usage: Any) -> None:
        for key, value in _mapping(usage).items():
            if isinstance(value, int) and not isinstance(value, bool):
                self._usage[key] = value

    def _block_start(self, payload: Mapping[str, Any]) -> bytes:
        index = _int(payload.get("index"))
        block = _mapping(payload.get("content_block"))
        btype = str(block.get("type", ""))
        entry = self._blocks[index] = _Block(btype)
        if btype == "text":
            return self.writer.text_delta(str(block.get("text") or ""))
        if btype == "thinking":
            return self.writer.reasoning_delta(str(block.get("thinking") or ""))
        if btype == "tool_use":
            entry.key = f"block:{index}"
            entry.initial_input = block.get("input")
            name = str(block.get("name", ""))
            return self.writer.start_call(
                entry.key, str(block.get("id", "")), name, custom=name in self._custom
            )
        return b""

    def _block_delta(self, payload: Mapping[str, Any]) -> bytes:
        index = _int(payload.get("index"))
        delta = _mapping(payload.get("delta"))
        dtype = delta.get("type")
        if dtype == "text_delta":
            return self.writer.text_delta(str(delta.get("text") or ""))
        if dtype == "thinking_delta":
            return self.writer.reasoning_delta(str(delta.get("thinking") or ""))
        if dtype == "input_json_delta":
            block = self._blocks.get(index)
            partial = delta.get("partial_json")
            if block is None or block.kind != "tool_use" or not isinstance(partial, str):
                return b""
            if partial:
                block.args_seen = True
            return self.writer.call_arguments_delta(block.key, partial)
        return b""  # signature_delta, citations_delta

    def _block_stop(self, payload: Mapping[str, Any]) -> bytes:
        block = self._blocks.get(_int(payload.get("index")))
        if block is None or block.kind != "tool_use" or block.args_seen:
            return b""
        # A call with no streamed input: its arguments are the start block's input (or {}).
        block.args_seen = True
        initial = block.initial_input if isinstance(block.initial_input, Mapping) else {}
        return self.writer.call_arguments_delta(block.key, json.dumps(initial, ensure_ascii=False))

    def close(self) -> bytes:
        """End of the upstream body: `response.failed` unless already terminated."""
        if self.finished:
            return b""
        return self.fail(truncation_failure("stream ended before message_stop"))

    def fail(self, failure: StreamFailure) -> bytes:
        return self.writer.fail(failure)


class MessagesToChatStream:
    """Stateful translator of an Anthropic Messages SSE stream into Chat Completions chunk bytes,
    composed as `MessagesToResponsesStream` → `ResponsesToChatStream`. A clean `message_stop`
    ends with a `finish_reason` chunk, a usage chunk (`include_usage`) and `data: [DONE]`; an
    error or early end gives an `error` frame and no `[DONE]`."""

    def __init__(
        self, *, chat_id: str, model: str, created: int, include_usage: bool = True
    ) -> None:
        self._inner = MessagesToResponsesStream(f"resp_{chat_id}", model, created)
        self._outer = ResponsesToChatStream(
            chat_id=chat_id, model=model, created=created, include_usage=include_usage
        )
        self._parser = SSEParser()

    @property
    def finished(self) -> bool:
        return self._outer.finished

    def _relay(self, data: bytes) -> bytes:
        if not data:
            return b""
        return b"".join(self._outer.feed_event(ev) for ev in self._parser.feed(data))

    def feed_event(self, event: SSEEvent) -> bytes:
        return self._relay(self._inner.feed_event(event))

    def feed(self, payload: Mapping[str, Any]) -> bytes:
        return self._relay(self._inner.feed(payload))

    def close(self) -> bytes:
        return self._relay(self._inner.close()) + self._outer.close()

    def fail(self, failure: StreamFailure) -> bytes:
        return self._relay(self._inner.fail(failure)) + self._outer.fail(failure)


__all__ = [
    "ANTHROPIC_ERROR_STATUS",
    "DEFAULT_EFFORT_BUDGETS",
    "DEFAULT_MAX_TOKENS",
    "AnthropicCommitScanner",
    "MessagesToChatStream",
    "MessagesToResponsesStream",
    "anthropic_error_to_openai",
    "anthropic_stream_failure",
    "anthropic_usage_to_responses",
    "chat_request_to_messages",
    "classify_anthropic_event",
    "custom_tool_names",
    "incomplete_reason",
    "messages_response_to_chat",
    "messages_response_to_responses",
    "responses_request_to_messages",
    "strip_backend_ciphertext",
    "thinking_budget",
]
