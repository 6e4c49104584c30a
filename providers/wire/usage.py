"""Token usage from any upstream payload shape (Responses, Chat Completions, Anthropic)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
    input: int | None = None
    output: int | None = None
    cached: int | None = None
    reasoning: int | None = None
    # A figure was there but not a whole number (a string, a float, a boolean): the usage
    # cannot be trusted (`usage.estimate` replaces it with ocx's estimate).
    bad: bool = False

    def merge(self, other: Usage) -> Usage:
        """Later values win field by field (Anthropic reports input first, output last)."""
        return Usage(
            input=other.input if other.input is not None else self.input,
            output=other.output if other.output is not None else self.output,
            cached=other.cached if other.cached is not None else self.cached,
            reasoning=other.reasoning if other.reasoning is not None else self.reasoning,
            bad=self.bad or other.bad,
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_FIGURES = (
    "input_tokens",
    "output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def _bad(u: Mapping[str, Any]) -> bool:
    """A top-level figure present but not an integer (null counts as absent)."""
    return any(u.get(name) is not None and _int(u.get(name)) is None for name in _FIGURES)


def _detail(u: Mapping[str, Any], holder: str, name: str) -> int | None:
    details = u.get(holder)
    return _int(details.get(name)) if isinstance(details, Mapping) else None


def _from_usage(u: Mapping[str, Any]) -> Usage:
    if "input_tokens" in u or "output_tokens" in u:
        details = u.get("input_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
        read = _int(u.get("cache_read_input_tokens"))
        created = _int(u.get("cache_creation_input_tokens"))
        inp = _int(u.get("input_tokens"))
        if read is not None or created is not None:
            # Anthropic counts cache reads and writes outside input_tokens.
            inp = (inp or 0) + (read or 0) + (created or 0)
            cached = read
        reasoning = _detail(u, "output_tokens_details", "reasoning_tokens")
        return Usage(inp, _int(u.get("output_tokens")), cached, reasoning, _bad(u))
    return Usage(
        _int(u.get("prompt_tokens")),
        _int(u.get("completion_tokens")),
        _detail(u, "prompt_tokens_details", "cached_tokens"),
        _detail(u, "completion_tokens_details", "reasoning_tokens"),
        _bad(u),
    )


def extract_usage(payload: Mapping[str, Any]) -> Usage | None:
    """The usage a payload reports, or None: a Responses response or `response.*` event, a
    Chat completion or chunk, an Anthropic message, `message_start` or `message_delta`."""
    for holder in (payload, payload.get("response"), payload.get("message")):
        if isinstance(holder, Mapping):
            usage = holder.get("usage")
            if isinstance(usage, Mapping):
                return _from_usage(usage)
    return None
