"""What a route's outcome says: the request log's attempts and usage, and the client's error when
no target served (its status, message, Retry-After)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from combos.status import label as status_label
from gateway import refusals
from gateway.exchange import HTTPFailure
from gateway.rescue import Role
from routing.attempts import AttemptRecord, Outcome, RouteResult
from routing.classify import Failure, classify, redact
from routing.eligibility import (
    SKIP_CREDENTIAL,
    TargetState,
)
from routing.types import ComboSpec, TargetSpec
from usage.requestlog import RequestEntry


def _now_ms() -> int:
    return int(time.time() * 1000)


# Retry-After of a 503 `ocx_overloaded`: long streams free pool slots within seconds.
OVERLOAD_RETRY_AFTER_S = 5


def note_usage(entry: RequestEntry, usage: Any) -> None:
    if usage is not None:
        entry.input_tokens = usage.input
        entry.output_tokens = usage.output
        entry.cached_tokens = usage.cached
        entry.reasoning_tokens = usage.reasoning
        entry.usage_bad = usage.bad


def record_target(entry: RequestEntry, target: TargetSpec, outcome: Outcome) -> None:
    """A bare target's one attempt in the request log; its failure is the answer."""
    failed = outcome.failure
    local = failed is not None and failed.transport == "local"
    entry.attempts.append(
        {
            "target": target.key,
            "status": outcome.status if outcome.failure is None else outcome.failure.status,
            "outcome": bare_outcome(outcome, local),
            **({"reason": classify(failed).reason} if failed and local else {}),
            **({"malformedFrames": outcome.malformed} if outcome.malformed else {}),
        }
    )
    if outcome.committed:
        entry.target = target.key
        note_usage(entry, outcome.usage)
    if not outcome.committed and outcome.failure is not None:
        raise_upstream(outcome.failure, target.key)


def bare_outcome(outcome: Outcome, local: bool) -> str:
    if outcome.committed:
        # An upstream `response.failed` (or a break) after output is no success (issue #43).
        return "served" if outcome.failure is None else "failed_after_commit"
    return "local_overload" if local else "failed"


def record_route(
    entry: RequestEntry, result: RouteResult, roles: Mapping[int, Role] | None = None
) -> None:
    entry.attempts = [
        {
            "target": r.target,
            "status": r.status,
            "outcome": r.outcome,
            "reason": r.reason,
            "cooledUntil": r.cooled_until,
            "ms": r.ms,
            **({"malformedFrames": r.malformed} if r.malformed else {}),
            **({"waitMs": r.wait_ms} if r.wait_ms is not None else {}),
            **_role(r, i, roles),
        }
        for i, r in enumerate(result.attempts)
    ]
    entry.skipped = [[k, why] for k, why in result.skipped]
    if result.served is not None:
        entry.target = result.served.key
        note_usage(entry, result.usage)


_CONTINUATION_OUTCOMES = frozenset({"continuation", "continuation_refused", "continuation_failed"})


def _role(record: AttemptRecord, index: int, roles: Mapping[int, Role] | None) -> dict[str, str]:
    """The after-commit rescue's role of one attempt in the request log (`gateway.rescue`)."""
    if record.outcome in _CONTINUATION_OUTCOMES:
        return {"role": "continuation"}
    role = None if roles is None else roles.get(index + 1)
    if role is None:
        return {}
    return {"role": role.role, **({"roleDetail": role.detail} if role.detail else {})}


def _missing_for_client(target_key: str, why: str) -> str:
    """A missing credential as the client may read it: the provider, never the name of the
    server's environment variable (staff see that in `ocx doctor`, the admin and the log)."""
    if why == f"{SKIP_CREDENTIAL}: caller ChatGPT token":
        return why  # the caller's own token: the caller can act on it
    provider = target_key.split("/", 1)[0]
    return f"{SKIP_CREDENTIAL}: the credential of provider {provider} is not configured"


def finish_route(
    combo: ComboSpec, result: RouteResult, states: list[TargetState] | None = None
) -> None:
    if result.served is not None:
        return
    if result.unavailable:
        message = f"No available targets for combo: {combo.id}"
        if states:
            # Each target with its state and until when, in `ocx status`'s words; a missing
            # credential names its provider, never the server's variable.
            message += ": " + "; ".join(_unavailable_because(ts) for ts in states)
        now = _now_ms()
        until = refusals.earliest_return(states or ())
        if until is None and result.retry_after is not None:
            until = now + int(result.retry_after) * 1000
        raise HTTPFailure.shaped(
            refusals.unavailable(
                status=503,
                type_="server_error",
                code="combo_unavailable",
                message=message,
                until_ms=until,
                now_ms=now,
            )
        )
    assert result.failure is not None
    last = result.attempts[-1].target if result.attempts else None
    # Another target of the combo may be back before the one that failed last.
    cooled = [r.cooled_until for r in result.attempts if r.cooled_until is not None]
    raise_upstream(result.failure, last, min(cooled) if cooled else None)


def _unavailable_because(ts: TargetState) -> str:
    if ts.state == "no_credential" and ts.skip is not None:
        return f"{ts.target}: {_missing_for_client(ts.target, ts.skip)}"
    why = f" ({ts.reason})" if ts.reason else ""
    return f"{ts.target}: {status_label(ts)}{why}"


def raise_upstream(failure: Failure, target: str | None = None, sooner: int | None = None) -> None:
    """The last upstream failure, sanitized, with its own status (reference §3.7), naming the
    `provider/model` it came from (never a credential)."""
    if failure.transport == "local":
        # ocx's own limit: the client may retry soon, on this target or any other.
        cause = failure.error_code or "overloaded"
        raise HTTPFailure(
            503,
            "server_error",
            "ocx_overloaded",
            f"ocx is overloaded ({cause}); retry shortly",
            [(b"retry-after", str(OVERLOAD_RETRY_AFTER_S).encode())],
        )
    if failure.status is None:
        kind = failure.transport or "error"
        status = 504 if kind.startswith("timeout") else 502
        where = f" ({target})" if target else ""
        raise HTTPFailure(
            status,
            "upstream_error",
            f"upstream_{kind}",
            f"Provider {kind.replace('_', ' ')}{where}",
        )
    text = redact(failure.message) if failure.message else ""
    # "from p/m" sits before the colon: a chained ocx still peels the envelope (classify).
    source = f" from {target}" if target else ""
    message = f"Provider error {failure.status}{source}" + (f": {text}" if text else "")
    code = failure.error_code or classify(failure).code or None
    # Its wait as a capped Retry-After, or a usage limit when long (PRODUCT §9.10); `sooner`:
    # when another target of the combo is back.
    now = _now_ms()
    until = refusals.upstream_until(failure, now)
    if until is not None and sooner is not None and now < sooner < until:
        until = sooner
    raise HTTPFailure.shaped(
        refusals.upstream(
            status=failure.status,
            type_=failure.error_type or "upstream_error",
            code=code,
            message=message,
            until_ms=until,
            now_ms=now,
            headers=refusals.codex_rate_headers(failure.headers),
        )
    )
