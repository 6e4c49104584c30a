"""The ledger where the lead looks (issue 42): each budget's use with a bar, and the budget that
binds a key (its own, its user's or a team's), for the admin's key and team pages."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from usage.budget_selectors import BudgetUse


def binding(uses: Sequence[BudgetUse]) -> BudgetUse | None:
    """The token or dollar budget closest to its limit (or furthest past it): the one that
    refuses first. Window budgets are live only (their use is not in the records)."""
    counted = [u for u in uses if u.used is not None and u.limit > 0]
    return max(counted, key=lambda u: (u.used or 0) / u.limit, default=None)


def _line(use: BudgetUse, owner: bool) -> SafeString:
    who = use.owner if owner else use.scope
    if use.used is None:
        return format_html("{}: {}", who, use.text)
    spent = " (used up)" if use.used >= use.limit else ""
    return format_html(
        '{}: {}{} <meter class="ocx-budget-bar" min="0" max="{}" value="{}" low="{}" '
        'high="{}" title="{}"></meter>',
        who,
        use.text,
        spent,
        use.limit,
        min(use.used, use.limit),
        use.limit * 0.8,
        use.limit * 0.99,
        f"{use.used / use.limit:.0%} of {use.budget}",
    )


def uses_html(uses: Sequence[BudgetUse], *, owner: bool = False) -> SafeString:
    """One line per budget: `team: $3.10 of $5.00 today` and a bar."""
    return format_html_join(mark_safe("<br>"), "{}", ((_line(u, owner),) for u in uses))


def binding_html(uses: Sequence[BudgetUse]) -> SafeString:
    """`binds: team infra: $5.10 of $5.00 today (used up)` and a bar, then every budget."""
    top = binding(uses)
    if top is None:
        return uses_html(uses)
    return format_html("<strong>binds: {}</strong><br>{}", _line(top, True), uses_html(uses))
