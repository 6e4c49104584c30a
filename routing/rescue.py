"""After-commit rescue: the pure decisions behind a combo's `afterCommit` policy.

A stream that breaks after its first output ends with an explicit error by default ("error").
With "continue", a break (a cut or a stall past the idle timeout) after **text only** is handed
to a target whose model takes an assistant prefill, asked to continue the text so far; with
"buffer", nothing reaches the client until the answer is complete, so a break restarts the
request on the next target like a failure before commit. The stream splicing lives in
`gateway.rescue`; this module decides what may be continued, by whom, and with what body.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from routing.classify import Failure
from routing.types import ComboSpec, ProviderSpec, TargetSpec

# The code `providers.wire.commit.truncation_failure` gives a stream that broke after commit.
TRUNCATED = "upstream_stream_truncated"
# Truncations that are faults of the data rather than of the connection: not continued.
_NOT_A_BREAK = ("malformed",)


def is_break(failure: Failure | None) -> bool:
    """Whether a failure after commit is a break of the stream (a cut connection, a stall past
    the idle timeout, an end without a terminal): the cases "continue" may rescue. An upstream's
    own failure event, an undeclared tool call or malformed data is not."""
    if failure is None or failure.error_code != TRUNCATED:
        return False
    message = failure.message or ""
    return not any(word in message for word in _NOT_A_BREAK)


def prefill_capable(providers: Mapping[str, ProviderSpec], target: TargetSpec) -> bool:
    """Whether the target's model metadata says it continues a final assistant message."""
    provider = providers.get(target.provider)
    model = None if provider is None else provider.models.get(target.model)
    return model is not None and model.prefill is True


def continuation_targets(
    combo: ComboSpec,
    providers: Mapping[str, ProviderSpec],
    *,
    broken: str,
    attempted: Sequence[str] = (),
    eligible: Callable[[TargetSpec], bool] = lambda _t: True,
) -> list[TargetSpec]:
    """Who may continue a stream `broken` (a target key) broke: the combo's other targets in
    order after it (wrapping round), skipping those already tried in this request, the
    ineligible ones (cooling, no credential, disabled) and those whose model does not take a
    prefill; the broken target itself only when it is the combo's only target."""
    targets = combo.targets
    keys = [t.key for t in targets]
    if len(targets) == 1:
        only = targets[0]
        return [only] if prefill_capable(providers, only) and eligible(only) else []
    start = keys.index(broken) + 1 if broken in keys else 0
    ordered = [*targets[start:], *targets[:start]]
    skip = {broken, *attempted}
    return [
        t for t in ordered if t.key not in skip and prefill_capable(providers, t) and eligible(t)
    ]


@dataclass(frozen=True)
class Prefill:
    """The assistant prefill sent for a continuation. `text` has no trailing whitespace
    (Anthropic refuses a final assistant message that ends in it); `trailing` is the
    whitespace the client already has, dropped again from the start of the continuation."""

    text: str
    trailing: str


def prefill_for(text: str) -> Prefill:
    stripped = text.rstrip()
    return Prefill(stripped, text[len(stripped) :])


def seam(piece: str, pending: str) -> tuple[str, str]:
    """Drop from the start of a continuation `piece` the whitespace the client already has
    (`pending`, what is left of `Prefill.trailing`): (the piece to send, what is still pending).
    Whitespace the model does not repeat is simply not dropped."""
    n = 0
    while n < len(pending) and n < len(piece) and piece[n] == pending[n]:
        n += 1
    if n < len(piece):
        return piece[n:], ""  # the first other character ends the seam
    return "", pending[n:]


def continuation_body(
    request: Mapping[str, Any], inbound: Literal["responses", "chat"], prefill: str
) -> dict[str, Any]:
    """The original request with the text so far as a final assistant message: a Chat
    `{"role": "assistant"}` message, a Responses assistant output item (the upstream wire
    translates either: an Anthropic upstream gets it as the assistant prefill)."""
    body = dict(request)
    if inbound == "chat":
        messages = body.get("messages")
        said = list(messages) if isinstance(messages, list) else []
        body["messages"] = [*said, {"role": "assistant", "content": prefill}]
        return body
    items = body.get("input")
    if isinstance(items, str):
        history: list[Any] = [{"type": "message", "role": "user", "content": items}]
    else:
        history = list(items) if isinstance(items, list) else []
    body["input"] = [
        *history,
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": prefill}],
        },
    ]
    return body
