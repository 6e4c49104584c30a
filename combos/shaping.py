"""Per-request and per-target request shaping for combos (PRODUCT §5.7).

Implements combos-behaviour.md §5 (request-local compatibility, child bodies, `imageInput`) and
§3.6 (encrypted v2 agent tasks, codex-wire §7). Everything is a pure function of JSON-like
bodies and frozen config; nothing here does I/O. Call order in the proxy, per request:
`image_rejection` and `encrypted_task_rejection` before any pick (400 on a hit), then pass
`encrypted_task_predicate` to every pick/hop when `has_encrypted_agent_task`, then per attempt
`child_body`, and after a failed attempt `compat_hop` to grow the request's compat set.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from providers.wire.anthropic import strip_backend_ciphertext
from routing.classify import Failure, classify
from routing.efforts import shape_reasoning
from routing.types import ComboSpec, ProviderSpec, TargetSpec

Protocol = Literal["responses", "chat"]

# Adapters whose backend minted (and can read) OpenAI/ChatGPT ciphertext (codex-wire §7).
CIPHERTEXT_ADAPTERS: frozenset[str] = frozenset({"openai-responses", "chatgpt"})

# Request-local compatibility flags returned by `compat_hop` and consumed by `child_body`.
COMPAT_USER = "user"
COMPAT_EFFORT = "reasoning_effort"
COMPAT_IMAGE = "image"
_REASON_FLAG: Mapping[str, str] = MappingProxyType(
    {
        "unsupported_user_param": COMPAT_USER,
        "unsupported_effort": COMPAT_EFFORT,
        "image_unsupported": COMPAT_IMAGE,
    }
)

# §3.6: the exact 400 answer when an encrypted agent task has no native ChatGPT target.
ENCRYPTED_TASK_STATUS = 400
ENCRYPTED_TASK_CODE = "unreadable_encrypted_agent_task"
ENCRYPTED_TASK_MESSAGE = (
    "Routed V2 worker task is encrypted for the native ChatGPT backend and cannot be read by the "
    "selected provider. Use plaintext V2 agent-message delivery or select a native ChatGPT model."
)
# The body as compact JSON bytes, byte-identical to the reference text.
ENCRYPTED_TASK_JSON: bytes = json.dumps(
    {
        "error": {
            "type": "invalid_request_error",
            "code": ENCRYPTED_TASK_CODE,
            "message": ENCRYPTED_TASK_MESSAGE,
        }
    },
    separators=(",", ":"),
).encode()
# Skip reason recorded for non-ChatGPT targets while routing an encrypted task.
SKIP_ENCRYPTED_TASK = "encrypted_task"

IMAGE_REJECTION_STATUS = 400

# ChatGPT/OpenAI ciphertext is a Fernet token: url-safe base64 of >= 73 bytes starting with
# version byte 0x80 ("gAAAAA"). Heuristic only (codex-wire §7).
_FERNET_RE = re.compile(r"gAAAAA[A-Za-z0-9_\-]{90,}={0,2}")
_IMAGE_PART_TYPES: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "responses": frozenset({"input_image"}),
        "chat": frozenset({"image_url", "input_image"}),
    }
)
_TOOL_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


# ---------------------------------------------------------------------------------------------
# Errors


def invalid_request_body(message: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error envelope ``{"error": {"type": "invalid_request_error", ...}}``."""
    return {"error": {"type": "invalid_request_error", "code": code, "message": message}}


def encrypted_task_body() -> dict[str, Any]:
    """A fresh dict of the §3.6 400 body (`ENCRYPTED_TASK_JSON`, status `ENCRYPTED_TASK_STATUS`)."""
    body: dict[str, Any] = json.loads(ENCRYPTED_TASK_JSON)
    return body


# ---------------------------------------------------------------------------------------------
# Images (§5.3)


def has_image_input(body: Mapping[str, Any], protocol: Protocol | str = "responses") -> bool:
    """True when the request carries an image the model would see (behaviour §5.3).

    Responses: only the `input` list is searched — a top-level item of type `input_image`, an
    `input_image` part in an item's `content` array, or in a `function_call_output` /
    `custom_tool_call_output` `output` array. Chat: `image_url` / `input_image` parts in any
    message's `content` array. Tool schemas, `metadata`, `instructions` and a string `input`
    never count, even when they mention `input_image`.
    """
    kinds = _IMAGE_PART_TYPES["chat" if protocol == "chat" else "responses"]
    items = body.get("messages" if protocol == "chat" else "input")
    if not isinstance(items, list):
        return False
    for item in items:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") in kinds:
            return True
        if _has_part(item.get("content"), kinds):
            return True
        if item.get("type") in _TOOL_OUTPUT_TYPES and _has_part(item.get("output"), kinds):
            return True
    return False


def _has_part(parts: Any, kinds: frozenset[str]) -> bool:
    if not isinstance(parts, list):
        return False
    return any(isinstance(part, Mapping) and part.get("type") in kinds for part in parts)


def image_rejection(
    combo: ComboSpec, body: Mapping[str, Any], protocol: Protocol | str = "responses"
) -> str | None:
    """The 400 message when `combo` has ``imageInput: "disabled"`` and the (expanded) request
    has an image, else None. Answer it with `IMAGE_REJECTION_STATUS` and
    ``invalid_request_body(message)`` before any target is called."""
    if combo.image_input != "disabled" or not has_image_input(body, protocol):
        return None
    return f'Combo "{combo.id}" does not accept image input'


# ---------------------------------------------------------------------------------------------
# Encrypted v2 agent tasks (§3.6, codex-wire §7)


def _is_fernet(value: Any) -> bool:
    return isinstance(value, str) and _FERNET_RE.fullmatch(value) is not None


def _is_unreadable_agent_message(item: Mapping[str, Any]) -> bool:
    parts = item.get("content")
    if item.get("type") != "agent_message" or not isinstance(parts, list):
        return False
    ciphertext = False
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "encrypted_content":
            value = part.get("encrypted_content")
            if _is_fernet(value):
                ciphertext = True
            elif isinstance(value, str) and value.strip():
                return False  # plaintext in the ciphertext slot (codex-relay#60) is readable
        else:
            text = part.get("text")
            if isinstance(text, str) and text.strip():
                return False
    return ciphertext


def has_encrypted_agent_task(body: Mapping[str, Any]) -> bool:
    """True when the Responses `input` holds an `agent_message` that only the native ChatGPT
    backend can read: at least one `encrypted_content` part holding a Fernet token (`gAAAAA…`,
    ≥ 96 chars) and no readable text part (plaintext placed in the `encrypted_content` slot by
    older Codex builds counts as readable)."""
    items = body.get("input")
    if not isinstance(items, list):
        return False
    return any(isinstance(i, Mapping) and _is_unreadable_agent_message(i) for i in items)


def encrypted_task_predicate(
    providers: Mapping[str, ProviderSpec],
) -> Callable[[TargetSpec], str | None]:
    """The selection predicate for a request with an encrypted agent task (§3.6).

    Accepts (None) only targets whose provider exists, is enabled and uses the `chatgpt`
    adapter; every other target gets the skip reason `SKIP_ENCRYPTED_TASK`. Pass it to the
    initial pick and to every hop of the request.
    """

    def predicate(target: TargetSpec) -> str | None:
        provider = providers.get(target.provider)
        if provider is None or provider.disabled or provider.adapter != "chatgpt":
            return SKIP_ENCRYPTED_TASK
        return None

    return predicate


def encrypted_task_rejection(
    combo: ComboSpec, providers: Mapping[str, ProviderSpec], body: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The 400 body (`encrypted_task_body()`) when `body` has an encrypted agent task and no
    target of `combo` passes `encrypted_task_predicate`; None otherwise (route normally, with
    the predicate when the task is encrypted). Cooling is not considered here: a qualifying
    but cooling target leads to the ordinary 503/wait path instead."""
    if not has_encrypted_agent_task(body):
        return None
    allowed = encrypted_task_predicate(providers)
    if any(allowed(target) is None for target in combo.targets):
        return None
    return encrypted_task_body()


# ---------------------------------------------------------------------------------------------
# Child body (§5.2)


@dataclass(frozen=True)
class ChildBody:
    """Outcome of `build_child`: `body` is the new request for the target; `effort`, `action`
    and `skipped_default` are copied from `efforts.ShapedReasoning` (log the skipped default
    once per (target, effort) at debug level)."""

    body: dict[str, Any]
    effort: str | None
    action: str
    skipped_default: str | None = None


def build_child(
    body: Mapping[str, Any],
    *,
    combo: ComboSpec,
    provider: ProviderSpec,
    model: str,
    protocol: Protocol | str = "responses",
    compat: Collection[str] = frozenset(),
) -> ChildBody:
    """`child_body` plus the effort outcome; see `child_body`."""
    out: dict[str, Any] = _copy_json(dict(body))
    out["model"] = model
    spec = provider.models.get(model)
    ladder = spec.reasoning_efforts if spec is not None else None
    shaped = shape_reasoning(out, target_ladder=ladder, combo=combo, wire=protocol)
    out = shaped.body
    if COMPAT_USER in compat or provider.adapter == "chatgpt":
        # §5.1: a target refused `user`; the canonical ChatGPT backend always does.
        out.pop("user", None)
    if (
        protocol != "chat"
        and provider.adapter not in CIPHERTEXT_ADAPTERS
        and isinstance(out.get("input"), list)
    ):
        out["input"] = strip_backend_ciphertext(_rescue_plaintext_tasks(out["input"]))
    return ChildBody(out, shaped.effort, shaped.action, shaped.skipped_default)


def _copy_json(value: Any) -> Any:
    """A deep copy of parsed JSON: dicts and lists copied, strings and numbers shared (they
    are immutable), anything else through `copy.deepcopy`. A Codex turn's body (80 KB, 120
    input items) took `copy.deepcopy` 410 µs per attempt; this takes 185 µs (bench/README.md,
    fourteenth run)."""
    kind = value.__class__
    if kind is dict:
        return {k: _copy_json(v) for k, v in value.items()}
    if kind is list:
        return [_copy_json(v) for v in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    return copy.deepcopy(value)


def child_body(
    body: Mapping[str, Any],
    *,
    combo: ComboSpec,
    provider: ProviderSpec,
    model: str,
    protocol: Protocol | str = "responses",
    compat: Collection[str] = frozenset(),
) -> dict[str, Any]:
    """Build the request body for one target `provider`/`model` of `combo` (behaviour §5.2).

    Deep-copies `body` (never mutated), sets `model` to the target's upstream model id, applies
    `efforts.shape_reasoning` with the ladder of ``provider.models[model]`` (missing model =
    unknown ladder): `defaultEffort` fallback/force, empty-ladder stripping (keeps
    `reasoning.summary`), `reasoningEffortMode`. `protocol` is the ingress wire of `body`.
    For a target adapter other than `openai-responses`/`chatgpt`, Responses `input` loses
    backend-only ciphertext (`providers.wire.anthropic.strip_backend_ciphertext`; plaintext
    that older Codex builds put in an `agent_message` ciphertext slot becomes `input_text`).
    `compat` is the request's accumulated `compat_hop` flags: `COMPAT_USER` removes the
    top-level `user` (also always removed for `chatgpt` targets). `COMPAT_EFFORT` and
    `COMPAT_IMAGE` deliberately change nothing: §5.1 says the effort is never rewritten and the
    next target receives the same request (a later target may support the effort or images).
    Raises ValueError for force mode without a valid default (validation prevents that).
    """
    return build_child(
        body, combo=combo, provider=provider, model=model, protocol=protocol, compat=compat
    ).body


def _rescue_plaintext_tasks(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        parts = item.get("content") if isinstance(item, Mapping) else None
        if not (
            isinstance(item, Mapping)
            and item.get("type") == "agent_message"
            and isinstance(parts, list)
        ):
            out.append(item)
            continue
        fixed: list[Any] = []
        for part in parts:
            value = part.get("encrypted_content") if isinstance(part, Mapping) else None
            if (
                isinstance(part, Mapping)
                and part.get("type") == "encrypted_content"
                and isinstance(value, str)
                and value.strip()
                and not _is_fernet(value)
            ):
                fixed.append({"type": "input_text", "text": value})
            else:
                fixed.append(part)
        out.append({**item, "content": fixed})
    return out


# ---------------------------------------------------------------------------------------------
# Request-local compatibility (§5.1)


def _has_effort(body: Mapping[str, Any]) -> bool:
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") is not None:
        return True
    return body.get("reasoning_effort") is not None


def compat_hop(
    failure: Failure, body: Mapping[str, Any], *, protocol: Protocol | str = "responses"
) -> str | None:
    """The compat flag a request-local compatibility rejection adds (behaviour §5.1), or None.

    Uses `classify(failure)` so it agrees with the hop decision: only a hop with scope `none`
    and `request_local` whose reason is the unsupported-`user` (`COMPAT_USER`), unsupported
    effort (`COMPAT_EFFORT`) or model image refusal (`COMPAT_IMAGE`) counts — the strict intact
    envelope checks live in `classify`. `body` is the body sent to the failing target; the flag
    is only returned when that body actually had the field (`user`, an effort, an image).
    None never changes the hop: the hop, and that it does not cool, is `classify`'s decision.
    """
    decision = classify(failure)
    if not (decision.hop and decision.request_local and decision.scope == "none"):
        return None
    flag = _REASON_FLAG.get(decision.reason)
    if flag == COMPAT_USER and "user" in body:
        return flag
    if flag == COMPAT_EFFORT and _has_effort(body):
        return flag
    if flag == COMPAT_IMAGE and has_image_input(body, protocol):
        return flag
    return None
