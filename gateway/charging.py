"""What a request costs: its budgets' reservation at admission and their refusal, the usage
settled at its end (the upstream's figures, checked, or the estimate), and the charge."""

from __future__ import annotations

import logging
import time

from accounts.access import KeyInfo
from gateway import refusals
from gateway.exchange import (
    Exchange,
    HTTPFailure,
)
from gateway.outcomes import (
    note_usage,
)
from gateway.runtime import Runtime
from routing.types import ComboSpec, ConfigSnapshot
from usage import estimate
from usage import unpriced as pricing_gate
from usage.budget_gate import Refusal
from usage.requestlog import RequestEntry

log = logging.getLogger("ocx.proxy")


def _now_ms() -> int:
    return int(time.time() * 1000)


def refuse(refusal: Refusal | None, now: int, entry: RequestEntry | None = None) -> None:
    """A used-up budget (PRODUCT §9.5) refuses the request, as a usage limit (§9.10); its
    request-log row names it."""
    if refusal is not None:
        if entry is not None:
            entry.budget = f"{refusal.budget.owner}: {refusal.budget.budget.describe()}"
        raise HTTPFailure.shaped(
            refusals.budget_exceeded(
                message=refusal.message(),
                reset_ms=refusal.reset_ms,
                headers=refusal.headers(now),
                now_ms=now,
            )
        )


def unpriced(
    runtime: Runtime, snapshot: ConfigSnapshot, combo: ComboSpec, model: str, key: KeyInfo
) -> frozenset[str]:
    """Under a dollar budget, the route's targets without a price (`usage.unpriced`): a
    combo skips them; a route with only such targets is refused before any upstream."""
    budget = pricing_gate.usd_budget(key.budgets)
    if budget is None:
        return frozenset()
    prices = runtime.budgets.prices
    found = pricing_gate.unpriced_keys(prices, snapshot, combo, time.time())
    if found and all(t.key in found for t in combo.targets):
        raise HTTPFailure(
            400,
            "invalid_request_error",
            pricing_gate.CODE,
            pricing_gate.refusal(model, found, budget),
        )
    return found


async def reserve(
    runtime: Runtime, combo: ComboSpec, key: KeyInfo, exchange: Exchange, now: int
) -> None:
    """Reserve the request's expected cost against its budgets (`usage.reservations`): the
    key's recent cost on this model, else the estimate of its input at the first target's
    price. Refused when the requests in flight already take the rest of a budget."""
    model = exchange.entry.requested_model
    expected = runtime.reservations.recent.get(key.id, model)
    if expected is None:
        tokens, micros = estimate.input_estimate(exchange.request), 0
        if runtime.budgets.wants_cost(key.budgets):
            micros = runtime.budgets.cost_micros(
                runtime.snapshot,
                combo.targets[0].key,
                at=time.time(),
                input_tokens=tokens,
                cached_tokens=0,
                output_tokens=0,
            )
        expected = (tokens, micros)
    hold = await runtime.reservations.reserve(
        key.budgets, tokens=expected[0], micros=expected[1], now_ms=now
    )
    if isinstance(hold, Refusal):
        refuse(hold, now, exchange.entry)
    else:
        exchange.hold = hold


def settle(runtime: Runtime, exchange: Exchange, outcome: str) -> None:
    """The usage of a request that reached a client: the upstream's figures, checked, or
    the estimate (`usage.estimate`) when they are bad or the answer was cut short."""
    entry = exchange.entry
    if not entry.target:
        entry.target = exchange.committed_target  # the client left mid-answer
        if entry.input_tokens is None and entry.output_tokens is None:
            note_usage(entry, exchange.noted)
    # Cut short: the client left, or the upstream broke after output (a combo's attempt
    # `failed_after_commit`; a bare target's `served` with the failure's status).
    cut_short = outcome == "client_cancelled" or any(
        a.get("outcome") == "failed_after_commit"
        or (a.get("outcome") == "served" and (a.get("status") or 0) >= 300)
        for a in entry.attempts
    )
    estimate.settle(
        entry,
        request=exchange.request,
        relayed=exchange.relayed,
        cut_short=cut_short,
        cap=estimate.context_window(runtime.snapshot, entry.target),
        bad=entry.usage_bad,
    )


async def charge(runtime: Runtime, exchange: Exchange) -> None:
    """Count a finished request against the budgets (before its last byte is sent, so the
    client's next request already sees it). Never fails the request."""
    key = exchange.key
    if key is None:
        return
    served = exchange.served_quota
    providers = runtime.budgets.window_providers(runtime.keys) if served else frozenset()
    if not key.budgets and (served is None or served[0][0] not in providers):
        return
    entry = exchange.entry
    known = entry.input_tokens is not None or entry.output_tokens is not None
    tokens = (entry.input_tokens or 0) + (entry.output_tokens or 0) if known else None
    try:
        usd = 0
        if known and runtime.budgets.wants_cost(key.budgets):
            usd = runtime.budgets.cost_micros(
                runtime.snapshot,
                entry.target,
                at=entry.at,
                input_tokens=entry.input_tokens,
                cached_tokens=entry.cached_tokens,
                output_tokens=entry.output_tokens,
            )
        if tokens is not None and key.budgets:
            # The next reservation of this key on this model expects about as much.
            runtime.reservations.recent.learn(key.id, entry.requested_model, tokens, usd)
        hold = exchange.hold
        shared = hold is not None and hold.shared
        if await runtime.budgets.charge(
            key.budgets,
            tokens=tokens,
            served=served,
            now_ms=_now_ms(),
            providers=providers,
            usd_micros=usd,
            release=hold.items if hold is not None and shared else (),
        ):
            exchange.hold = None  # let go in the charge's own call
    except Exception:  # noqa: BLE001 - the answer is complete; only the count is lost
        log.exception("could not count request %s against its budgets", exchange.request_id)
