"""Retrying the same target (a combo's `retrySameTarget`, issue #29), decided without I/O.

Before the attempt loop hops on a failure before commit, `retry_wait` says whether the same
target is worth another try and how long to wait first. Only transient failures qualify: a 429
whose `Retry-After` fits in `maxWaitMs`, a 500/502/503/504 that is not quota, billing or a
credential problem, a connection refused or reset before any output. Never quota exhaustion,
auth, other 4xx, context overflow, refusals, ocx's own overload or a failure after commit, and
never a timeout (no first byte, a stall, issue #43): a silent target retried multiplies the wait,
so the combo moves on at once.
The clock, the random source and the deadline are passed in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from routing.classify import Decision, Failure
from routing.cooldown import parse_retry_after
from routing.types import RetryPolicy

RETRY_STATUSES: frozenset[int] = frozenset({500, 502, 503, 504})
# "connect": refused or failed to connect; "reset": the socket closed before any output.
RETRY_TRANSPORTS: frozenset[str] = frozenset({"connect", "reset"})
# Classifications of a 5xx that say "try again", not "this account or request is wrong".
RETRY_REASONS: frozenset[str] = frozenset({"server_error", "overloaded", "connection"})
TIMEOUT_TRANSPORTS: frozenset[str] = frozenset(
    {"timeout_connect", "timeout_first_byte", "timeout_idle", "timeout_total"}
)
# The jittered wait when the upstream gave no Retry-After (capped by maxWaitMs).
BACKOFF_MIN_MS = 100
BACKOFF_MAX_MS = 500
ATTEMPTS_RANGE = (1, 3)
MAX_WAIT_RANGE = (0, 10_000)


@dataclass(frozen=True)
class Verdict:
    """`wait_ms` before the retry, or None to hop now; `why` names the rule (tests, docs)."""

    wait_ms: int | None
    why: str

    @property
    def retry(self) -> bool:
        return self.wait_ms is not None


def transient(failure: Failure, decision: Decision) -> bool:
    """Whether the classified pre-commit failure is one a same-target retry may cure."""
    if decision.local_overload or not decision.hop or decision.scope != "target":
        return False
    if failure.timed_out or failure.transport in TIMEOUT_TRANSPORTS:
        return False  # a silent target: waiting on it again doubles the wait
    if decision.reason not in RETRY_REASONS and decision.reason != "rate_limited":
        return False
    if failure.stream_event is not None:
        return False
    if failure.status is None:
        return failure.transport in RETRY_TRANSPORTS
    if failure.transport is not None:
        return False  # a malformed body is not transient
    if failure.status == 429:
        return decision.reason == "rate_limited"
    return failure.status in RETRY_STATUSES and decision.reason in RETRY_REASONS


def retry_wait(
    failure: Failure,
    decision: Decision,
    policy: RetryPolicy | None,
    *,
    retries_done: int,
    now: int,
    deadline: int | None,
    rng: random.Random,
) -> Verdict:
    """The wait before retrying the same target, or a verdict to hop.

    A 429 is retried only with a `Retry-After` of at most `maxWaitMs` (waited exactly); a 5xx
    with a `Retry-After` waits it under the same bound; otherwise the wait is a jittered
    100–500 ms, capped by `maxWaitMs`. At most `policy.attempts` retries per target, and a
    wait that would end after `deadline` (epoch ms) hops instead.
    """
    if policy is None:
        return Verdict(None, "off")
    if retries_done >= policy.attempts:
        return Verdict(None, "retries_spent")
    if not transient(failure, decision):
        return Verdict(None, "not_transient")
    hint = _retry_after_ms(failure, now)
    if hint is not None and hint > policy.max_wait_ms:
        return Verdict(None, "retry_after_too_long")
    if hint is None and failure.status == 429:
        return Verdict(None, "no_retry_after")
    if hint is None:
        wait = min(policy.max_wait_ms, rng.randint(BACKOFF_MIN_MS, BACKOFF_MAX_MS))
        why = "backoff"
    else:
        wait = hint
        why = "retry_after"
    if deadline is not None and now + wait > deadline:
        return Verdict(None, "deadline")
    return Verdict(wait, why)


def _retry_after_ms(failure: Failure, now: int) -> int | None:
    value = failure.headers.get("retry-after")
    return None if value is None else parse_retry_after(value, now)
