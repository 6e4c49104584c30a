"""The request path's side of caller-scoped rate limits (issue #43, point 3; the store is
`state.caller_limits`).

Before a combo is routed, the caller's holds on its caller-forward targets are read (one
round trip, only for a combo that has such a target); a held target is skipped for this caller
alone. After an attempt, a caller-forward target's rate or usage limit becomes a hold for the
caller's credential on that target (its fingerprint, never the token), for the upstream's
`Retry-After` or the cooldown rule's length, and the shared target is not cooled.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from routing.attempts import Outcome
from routing.classify import classify
from routing.cooldown import cooldown_ms
from routing.eligibility import callers_rate_limit, forwards_caller_credential
from routing.types import ComboSpec, ProviderSpec, TargetSpec
from state.caller_limits import CallerLimits

# A limit without any length of its own (no Retry-After, reset header or combo cooldown).
DEFAULT_HOLD_MS = 60_000
SKIP_REASON = "caller rate-limited"


def _now_ms() -> int:
    return int(time.time() * 1000)


async def held_targets(
    store: CallerLimits,
    providers: Mapping[str, ProviderSpec],
    combo: ComboSpec,
    pairs: Mapping[str, tuple[str, str] | None],
) -> set[str]:
    """The keys of `combo`'s caller-forward targets this caller is held off (a set the
    request adds to as it goes)."""
    keys = []
    for target in combo.targets:
        provider = providers.get(target.provider)
        pair = pairs.get(target.key)
        if provider is not None and pair is not None and forwards_caller_credential(provider):
            keys.append((target.key, pair[1]))
    if not keys:
        return set()
    return {key for key, _ in await store.held(keys, now=_now_ms())}


async def note(
    store: CallerLimits,
    provider: ProviderSpec,
    target: TargetSpec,
    pair: tuple[str, str] | None,
    outcome: Outcome,
    combo: ComboSpec,
    held: set[str],
) -> Outcome:
    """`outcome` as the attempt loop should see it: a caller-forward target's rate limit holds
    this caller's credential off the target and cools nothing shared."""
    failure = outcome.failure
    if (
        failure is None
        or outcome.committed
        or pair is None
        or not forwards_caller_credential(provider)
    ):
        return outcome
    decision = classify(failure)
    if not callers_rate_limit(failure.status, decision.reason):
        return outcome
    now = _now_ms()
    ms = cooldown_ms(failure, decision, combo_cooldown_ms=combo.cooldown_ms, now=now)
    await store.hold((target.key, pair[1]), until=now + (ms or DEFAULT_HOLD_MS), now=now)
    held.add(target.key)
    return dataclasses.replace(outcome, cool=False)
