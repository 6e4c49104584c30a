"""Budget reads from what was recorded (issue 27): the use of each budget's current period, per
key, user or team, from the usage rollups (or the request log when rollups are off).

`budget_recorded` seeds the proxy's counters (`BudgetGate.seed`: after a restart, a Redis
flush, a budget set mid-period); `budget_use` is what the admin shows ("$1.20 of $5.00 this
month"). Both run in a thread, never on the request path.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import F, QuerySet, Sum
from django.db.models.functions import Coalesce

from usage.budget_gate import SeedId, limit_units, unit
from usage.budgets import (
    MICROS,
    Period,
    ScopedBudget,
    TokenBudget,
    UsdBudget,
    WindowBudget,
    period_bounds,
    usd_text,
)
from usage.models import RequestLog, UsageRollup

Sums = dict[str, tuple[int, int]]  # scope → (tokens, micro-dollars)
_WHEN: Mapping[Period, str] = {"day": "today", "week": "this week", "month": "this month"}


def _tz(tz: str | None) -> ZoneInfo:
    return ZoneInfo(tz or settings.OCX_TIME_ZONE)


def _add(out: Sums, scope: str, tokens: int | None, cost: float | None) -> None:
    t, c = out.get(scope, (0, 0))
    out[scope] = (t + int(tokens or 0), c + round(float(cost or 0) * MICROS))


def _by(
    column: str, values: Iterable[Any], since: dt.datetime
) -> dict[Any, tuple[int | None, float | None]]:
    """Tokens (input + output) and cost per value of `column` since `since`: the rollups (minute
    and hour rows never overlap) or, with rollups off, the request log."""
    values = list(values)
    if not values:
        return {}
    rows: QuerySet[Any]
    if settings.OCX_USAGE:
        rows = UsageRollup.objects.filter(bucket__gte=since, **{f"{column}__in": values})
    else:
        rows = RequestLog.objects.filter(at__gte=since, **{f"{column}__in": values})
    grouped = rows.values(column).annotate(
        t=Sum(Coalesce(F("input_tokens"), 0) + Coalesce(F("output_tokens"), 0)),
        c=Sum("cost_usd"),
    )
    return {row[column]: (row["t"], row["c"]) for row in grouped}


def scope_sums(scopes: Iterable[str], since: dt.datetime) -> Sums:
    """(tokens, micro-dollars) used since `since` by each scope: `k<key id>`, `u<user id>` (all
    their keys) and `t<group id>` (the requests of the group's current members)."""
    keys: set[int] = set()
    users: set[int] = set()
    teams: set[int] = set()
    for scope in scopes:
        kind, number = scope[0], int(scope[1:])
        {"k": keys, "u": users, "t": teams}[kind].add(number)
    out: Sums = {}
    if keys:
        if settings.OCX_USAGE:
            for key_id, (t, c) in _by("key_id", keys, since).items():
                _add(out, f"k{key_id}", t, c)
        else:  # the request log knows a key by its prefix
            client_key = apps.get_model("accounts", "ClientKey")
            prefixes = dict(client_key.objects.filter(pk__in=keys).values_list("prefix", "pk"))
            for prefix, (t, c) in _by("key_prefix", prefixes, since).items():
                _add(out, f"k{prefixes[prefix]}", t, c)
    user_model = get_user_model()
    if users:
        names = dict(user_model.objects.filter(pk__in=users).values_list("username", "pk"))
        for name, (t, c) in _by("user", names, since).items():
            _add(out, f"u{names[name]}", t, c)
    if teams:
        members: dict[str, list[int]] = {}
        for gid, name in user_model.objects.filter(groups__in=teams).values_list(
            "groups", "username"
        ):
            members.setdefault(name, []).append(gid)
        for name, (t, c) in _by("user", members, since).items():
            for gid in members[name]:
                _add(out, f"t{gid}", t, c)
    return out


def budget_recorded(
    ids: Sequence[SeedId], now_ms: int, *, tz: str | None = None
) -> dict[SeedId, int]:
    """What each counter series (scope, "tokens" | "usd", period) has used in its current
    period, in counter units (tokens, micro-dollars). One query per period and scope kind."""
    zone = _tz(tz)
    out: dict[SeedId, int] = {}
    for period in sorted({p for _, _, p in ids}):
        _, start_ms, _ = period_bounds(period, now_ms, zone)
        since = dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC)
        sums = scope_sums({s for s, _, p in ids if p == period}, since)
        for scope, kind, p in ids:
            if p == period:
                tokens, micros = sums.get(scope, (0, 0))
                out[(scope, kind, p)] = tokens if kind == "tokens" else micros
    return out


@dataclass(frozen=True)
class BudgetUse:
    """One budget and what its current period has used, as recorded."""

    scope: str  # "key", "user" or "team"
    owner: str
    budget: dict[str, object]
    used: float | None  # tokens or dollars; None for a window budget (live only)
    limit: float
    period: str  # day / week / month, or the provider of a window budget
    resets_at: dt.datetime | None
    text: str


def budget_use(
    budgets: Sequence[ScopedBudget], *, now_ms: int | None = None, tz: str | None = None
) -> list[BudgetUse]:
    """For each budget: used, limit, period and reset (token and dollar budgets, from the
    recorded usage; up to a batch of the request log behind the proxy's live counters)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    zone = _tz(tz)
    ids: list[SeedId] = [
        (sb.scope, unit(sb.budget), sb.budget.period)
        for sb in budgets
        if isinstance(sb.budget, TokenBudget | UsdBudget)
    ]
    recorded = budget_recorded(ids, now_ms, tz=tz) if ids else {}
    out = []
    for sb in budgets:
        b = sb.budget
        if isinstance(b, WindowBudget):
            out.append(
                BudgetUse(
                    sb.kind,
                    sb.owner,
                    b.to_json(),
                    None,
                    b.percent,
                    b.provider,
                    None,
                    f"{b.describe()} (use shown live in the 429 and events)",
                )
            )
            continue
        used_units = recorded.get((sb.scope, unit(b), b.period), 0)
        _, _, end_ms = period_bounds(b.period, now_ms, zone)
        reset = dt.datetime.fromtimestamp(end_ms / 1000, zone)
        if isinstance(b, UsdBudget):
            used: float = used_units / MICROS
            text = f"{usd_text(used)} of {usd_text(b.usd)} {_WHEN[b.period]}"
        else:
            used = used_units
            text = f"{used_units:,} of {limit_units(b):,} tokens {_WHEN[b.period]}"
        out.append(
            BudgetUse(
                sb.kind,
                sb.owner,
                b.to_json(),
                used,
                float(limit_units(b)) / (MICROS if isinstance(b, UsdBudget) else 1),
                b.period,
                reset,
                text,
            )
        )
    return out
