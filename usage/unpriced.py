"""No unpriced request under a dollar budget (issue 42, PRODUCT §9.5).

A target without a price costs $0, so a key, user or team with a `usd` budget could use it
without end. Before routing, a request under a dollar budget learns which of its route's
targets have no price (`unpriced_keys`): a combo skips them (reason `unpriced` in the route
trace) and serves from the priced ones; a route that can only reach unpriced targets is
refused with 400 `model_unpriced` (`refusal`), before any upstream is contacted. A `chatgpt`
(subscription) target is priced at $0 by design, never unpriced.

Rates are looked up once per snapshot, target and day (`PriceBook`, shared with the budget
charge): no I/O per request once a target's rate is known.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from routing.pricing import SUBSCRIPTION_ADAPTERS, PriceBook
from routing.types import ComboSpec, ConfigSnapshot
from usage.budgets import ScopedBudget, UsdBudget

CODE = "model_unpriced"
REASON = "unpriced"


def usd_budget(budgets: Sequence[ScopedBudget]) -> ScopedBudget | None:
    """The first dollar budget among a request's budgets (key, user, teams), else None."""
    for sb in budgets:
        if isinstance(sb.budget, UsdBudget):
            return sb
    return None


def is_priced(prices: PriceBook, snapshot: ConfigSnapshot, target: str, at: float) -> bool:
    provider, _, model = target.partition("/")
    spec = snapshot.providers.get(provider)
    if spec is None:
        return True  # an unknown provider fails on its own, not as unpriced
    if spec.adapter in SUBSCRIPTION_ADAPTERS:
        return True
    day = dt.datetime.fromtimestamp(at, tz=dt.UTC).date()
    return prices.rates(snapshot, provider, model, day) is not None


def unpriced_keys(
    prices: PriceBook, snapshot: ConfigSnapshot, combo: ComboSpec, at: float
) -> frozenset[str]:
    """The route's targets ("provider/model") that have no price."""
    return frozenset(t.key for t in combo.targets if not is_priced(prices, snapshot, t.key, at))


def refusal(model: str, unpriced: frozenset[str], budget: ScopedBudget) -> str:
    """The 400's message: the model, why, and how to price it."""
    target = sorted(unpriced)[0]
    provider, _, name = target.partition("/")
    where = model if model == target else f"{model} (only {', '.join(sorted(unpriced))})"
    return (
        f"Model {where} has no price, and {budget.owner} has a dollar budget "
        f"({budget.budget.describe()}): ocx refuses what it cannot charge. An administrator "
        f'can give it a price (models["{name}"].price on provider {provider}, USD per million '
        f"tokens) or a pricingProvider (ocx provider set {provider} --pricing-provider openai); "
        "see docs/usage.md#cost"
    )
