"""What a request used when the upstream did not say, or said nonsense (PRODUCT §9.7). Pure.

Every served request is charged (issue 42). When the client leaves a stream before its final
usage event, when an upstream breaks after output, or when its usage figures fail the checks
(`checked`), the request log gets ocx's estimate instead, flagged `usage_estimated`:

* **input**: one token per `CHARS_PER_TOKEN` characters of the request's text — every string
  value of the body except the `model` name and a few switches (`INPUT_SKIP`), rounded up;
* **output**: what was relayed to the client: one token per SSE frame it received, or one per
  `CHARS_PER_TOKEN` bytes beyond `FRAME_OVERHEAD` bytes of framing per frame, whichever is
  more (a frame usually carries one token's delta in about 100-200 bytes of JSON; the larger
  count keeps a frame with a long delta from being charged as one token).

A figure is trusted when it is a whole number from 0 up to the model's context window (when
it is declared) and never above `USAGE_CAP` (10 million tokens) either way; cached and
reasoning tokens are checked the same way. One bad figure replaces the whole
usage by the estimate: a record is never lost to a bad number, and a counter never goes down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

CHARS_PER_TOKEN = 4
FRAME_OVERHEAD = 100
# The largest figure trusted for a model without a declared context window.
USAGE_CAP = 10_000_000
# Body fields that are switches or names, not text the model reads.
INPUT_SKIP = frozenset(
    {
        "model",
        "stream",
        "store",
        "user",
        "service_tier",
        "previous_response_id",
        "prompt_cache_key",
        "safety_identifier",
        "metadata",
        "stream_options",
        "include",
    }
)
# Walking a body stops after this many values (a pathological body cannot cost unbounded CPU).
MAX_VALUES = 200_000


class Entry(Protocol):
    """The usage fields of a request-log entry (`usage.requestlog.RequestEntry`)."""

    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    usage_estimated: bool


class Relayed:
    """What a request's client was sent of the answer: bytes and SSE frames (`count`)."""

    __slots__ = ("bytes", "frames")

    def __init__(self) -> None:
        self.bytes = 0
        self.frames = 0

    def count(self, data: bytes) -> None:
        self.bytes += len(data)
        self.frames += data.count(b"\n\n")


def input_estimate(request: Mapping[str, Any] | None) -> int:
    """Tokens of a request body's text: its characters / CHARS_PER_TOKEN, rounded up, at least 1."""
    if not request:
        return 1
    chars = 0
    seen = 0
    stack: list[Any] = [v for k, v in request.items() if k not in INPUT_SKIP]
    while stack and seen < MAX_VALUES:
        value = stack.pop()
        seen += 1
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def output_estimate(relayed: Relayed | None) -> int:
    """Tokens of what was relayed (the module's rule); 0 when nothing was."""
    if relayed is None or not relayed.bytes:
        return 0
    text = max(0, relayed.bytes - FRAME_OVERHEAD * relayed.frames)
    return max(relayed.frames, math.ceil(text / CHARS_PER_TOKEN))


def _fine(value: object, cap: int) -> bool:
    return value is None or (
        isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= cap
    )


def checked(entry: Entry, *, cap: int | None, bad: bool = False) -> bool:
    """Whether the entry's figures may be trusted: whole numbers from 0 to `cap` (the model's
    context window, else USAGE_CAP); `bad`: the upstream sent a figure that was no integer."""
    limit = min(cap, USAGE_CAP) if cap else USAGE_CAP
    return (
        not bad
        and _fine(entry.input_tokens, limit)
        and _fine(entry.output_tokens, limit)
        and _fine(entry.cached_tokens, limit)
        and _fine(entry.reasoning_tokens, limit)
    )


def estimate(entry: Entry, *, request: Mapping[str, Any] | None, relayed: Relayed | None) -> None:
    """Replace the entry's usage by the estimate (the module's rules) and flag it."""
    entry.input_tokens = input_estimate(request)
    entry.output_tokens = output_estimate(relayed)
    entry.cached_tokens = None
    entry.reasoning_tokens = None
    entry.usage_estimated = True


def settle(
    entry: Entry,
    *,
    request: Mapping[str, Any] | None,
    relayed: Relayed | None,
    cut_short: bool,
    cap: int | None,
    bad: bool = False,
) -> None:
    """The usage to record and charge for a served request, decided once at its end.

    `cut_short`: the answer did not run to its end (the client left, the upstream broke after
    output); a missing figure is then estimated. `bad`: the upstream sent a non-integer figure.
    Reported figures that fail `checked` are replaced by the estimate as a whole."""
    if not checked(entry, cap=cap, bad=bad):
        estimate(entry, request=request, relayed=relayed)
        return
    if not cut_short:
        return
    if entry.input_tokens is None:
        entry.input_tokens = input_estimate(request)
        entry.usage_estimated = True
    if entry.output_tokens is None:
        entry.output_tokens = output_estimate(relayed)
        entry.usage_estimated = True


def context_window(snapshot: Any, target: str) -> int | None:
    """The declared context window of `target` ("provider/model") in a config snapshot."""
    provider, _, model = target.partition("/")
    spec = snapshot.providers.get(provider) if snapshot is not None else None
    declared = spec.models.get(model) if spec is not None else None
    return declared.context_window if declared is not None else None
