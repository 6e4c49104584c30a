"""The warning of a dollar budget next to unpriced targets (issue 42): said by `ocx serve` at
its start and by the admin's dashboard while both exist. Such a target is refused to every
request under a dollar budget (400 `model_unpriced`) or skipped in its combos."""

from __future__ import annotations

from collections.abc import Iterable

from django.apps import apps

from routing.types import ConfigSnapshot
from usage.budgets import UsdBudget, stored_budgets

SHOWN = 5


def _has_usd(rows: Iterable[object]) -> bool:
    return any(isinstance(b, UsdBudget) for raw in rows for b in stored_budgets(raw))


def usd_budget_exists() -> bool:
    """Whether any key, user or team has a dollar budget (one read per budget table; `accounts`
    sits above `usage`, so its models are looked up by name)."""
    for model_name in ("ClientKey", "UserBudget", "TeamProfile"):
        model = apps.get_model("accounts", model_name)
        rows = model.objects.exclude(budgets=[]).values_list("budgets", flat=True)
        if _has_usd(rows.iterator()):
            return True
    return False


def unpriced_warning(snapshot: ConfigSnapshot | None = None) -> str | None:
    """The warning while a dollar budget exists and an enabled target has no price, else None."""
    from combos import selectors as combo_selectors

    if not usd_budget_exists():
        return None
    missing = combo_selectors.unpriced_targets(snapshot or combo_selectors.config_snapshot())
    if not missing:
        return None
    listed = ", ".join(missing[:SHOWN]) + (
        f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    )
    return (
        f"A dollar budget is set, and {len(missing)} enabled target(s) have no price: {listed}. "
        "Requests under a dollar budget are refused them (400 model_unpriced) and combos skip "
        'them. Give each a price (its model\'s "price") or its provider a pricing provider '
        "(ocx provider set NAME --pricing-provider openai); docs/usage.md#cost"
    )
