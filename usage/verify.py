"""The ledger adds up (issue 42, PRODUCT §9.7): `ocx usage verify [--since]`, and `ocx doctor`
for today.

Three records of the same requests are compared:

1. the **request log** and the **usage rollups** since `since` (both on): per user and key,
   the requests, input and output tokens, estimated requests and cost (to a micro-dollar per
   request: costs are floats);
2. the rollups and the **budget counters** of the current periods: every token and dollar
   budget of every key, user and team, its counter (Redis, or the serving process's memory)
   against what was recorded in its period (`budget_selectors.budget_recorded`, the sums the
   counters are seeded from). Dollar counters add each request's cost rounded to a micro-dollar,
   so they may differ from the recorded sum by up to one micro-dollar per request.

Counters run up to a request-log batch (at most 0.5 s) ahead of the records: run it once the
traffic of the last second is written. After a Redis flush the counters are seeded again by
the next budgeted request; until then there is nothing to compare (a note, not a difference).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django.apps import apps
from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce

from usage.budget_gate import SeedId, unit
from usage.budget_selectors import budget_recorded
from usage.budgets import (
    MICROS,
    ScopedBudget,
    TokenBudget,
    UsdBudget,
    period_bounds,
    stored_budgets,
)
from usage.models import RequestLog, UsageRollup

if TYPE_CHECKING:
    from server import doctor

# Counter values by name, and whether the store still holds its seeding sentinel (False: a
# shared store that was emptied and not seeded again yet).
CounterReader = Callable[[Sequence[str], str], tuple[list[int], bool]]


@dataclass
class Verification:
    since: dt.datetime
    checked: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return not self.differences

    def text(self) -> str:
        lines = [f"usage verify since {self.since.isoformat().replace('+00:00', 'Z')}"]
        lines += [f"  checked: {c}" for c in self.checked]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  DIFFERENCE: {d}" for d in self.differences]
        lines.append(
            "the ledger agrees" if self.agrees else f"{len(self.differences)} difference(s)"
        )
        return "\n".join(lines)


def start_of_today(now: dt.datetime, tz: str | None = None) -> dt.datetime:
    zone = ZoneInfo(tz or settings.OCX_TIME_ZONE)
    _, start_ms, _ = period_bounds("day", int(now.timestamp() * 1000), zone)
    return dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC)


# --- 1. request log against rollups -----------------------------------------------------------


def _log_sums(since: dt.datetime) -> dict[tuple[str, str], tuple[int, int, int, int, float]]:
    rows = (
        RequestLog.objects.filter(at__gte=since)
        .values("user", "key_prefix")
        .annotate(
            n=Count("id"),
            i=Sum(Coalesce(F("input_tokens"), 0)),
            o=Sum(Coalesce(F("output_tokens"), 0)),
            e=Count("id", filter=Q(usage_estimated=True)),
            c=Sum(Coalesce(F("cost_usd"), 0.0)),
        )
    )
    return {(r["user"], r["key_prefix"]): (r["n"], r["i"], r["o"], r["e"], r["c"]) for r in rows}


def _rollup_sums(since: dt.datetime) -> dict[tuple[str, str], tuple[int, int, int, int, float]]:
    rows = (
        UsageRollup.objects.filter(bucket__gte=since)
        .values("user", "key_prefix")
        .annotate(
            n=Sum("requests"),
            i=Sum("input_tokens"),
            o=Sum("output_tokens"),
            e=Sum("estimated_requests"),
            c=Sum("cost_usd"),
        )
    )
    return {(r["user"], r["key_prefix"]): (r["n"], r["i"], r["o"], r["e"], r["c"]) for r in rows}


_FIELDS = ("requests", "input tokens", "output tokens", "estimated requests")


def log_against_rollups(since: dt.datetime, out: Verification) -> None:
    if not (settings.OCX_REQUEST_LOG and settings.OCX_USAGE):
        out.notes.append("request log or rollups off: the two are not compared")
        return
    logged, rolled = _log_sums(since), _rollup_sums(since)
    for group in sorted(set(logged) | set(rolled)):
        a = logged.get(group, (0, 0, 0, 0, 0.0))
        b = rolled.get(group, (0, 0, 0, 0, 0.0))
        who = f"user {group[0] or '(none)'} key {group[1] + '…' if group[1] else '(none)'}"
        for name, x, y in zip(_FIELDS, a[:4], b[:4], strict=True):
            if int(x or 0) != int(y or 0):
                out.differences.append(f"{who}: {name}: request log {x}, rollups {y}")
        if abs(float(a[4] or 0) - float(b[4] or 0)) > 1e-6 * max(1, int(a[0] or 0)):
            out.differences.append(
                f"{who}: cost: request log ${float(a[4] or 0):.6f}, rollups ${float(b[4] or 0):.6f}"
            )
    total = sum(int(v[0] or 0) for v in logged.values())
    out.checked.append(f"request log against rollups: {len(logged)} key(s), {total} request(s)")


# --- 2. rollups against the budget counters ---------------------------------------------------


def all_budgets() -> list[ScopedBudget]:
    """Every budget of every key, user and team (`accounts` sits above `usage`: by name)."""
    out: list[ScopedBudget] = []
    client_key = apps.get_model("accounts", "ClientKey")
    for pk, prefix, raw in client_key.objects.exclude(budgets=[]).values_list(
        "pk", "prefix", "budgets"
    ):
        out += [ScopedBudget("key", f"k{pk}", f"key {prefix}…", b) for b in stored_budgets(raw)]
    user_budget = apps.get_model("accounts", "UserBudget")
    for user_id, name, raw in user_budget.objects.exclude(budgets=[]).values_list(
        "user_id", "user__username", "budgets"
    ):
        out += [ScopedBudget("user", f"u{user_id}", f"user {name}", b) for b in stored_budgets(raw)]
    team = apps.get_model("accounts", "TeamProfile")
    for group_id, name, raw in team.objects.exclude(budgets=[]).values_list(
        "group_id", "group__name", "budgets"
    ):
        out += [
            ScopedBudget("team", f"t{group_id}", f"team {name}", b) for b in stored_budgets(raw)
        ]
    return out


def counter_name(prefix: str, seed: SeedId, now_ms: int, zone: ZoneInfo) -> str:
    scope, kind, period = seed
    label, _, _ = period_bounds(period, now_ms, zone)
    return f"{prefix}:budget:{scope}:{kind}:{period}:{label}"


def counters_against_records(
    now: dt.datetime, read: CounterReader, out: Verification, budgets: Iterable[ScopedBudget]
) -> None:
    owners: dict[SeedId, str] = {}
    for sb in budgets:
        if isinstance(sb.budget, TokenBudget | UsdBudget):
            owners.setdefault((sb.scope, unit(sb.budget), sb.budget.period), sb.owner)
    if not owners:
        out.checked.append("budget counters: no token or dollar budget is set")
        return
    now_ms = int(now.timestamp() * 1000)
    zone = ZoneInfo(settings.OCX_TIME_ZONE)
    ids = sorted(owners)
    prefix = settings.OCX_STATE_KEY_PREFIX
    values, seeded = read([counter_name(prefix, s, now_ms, zone) for s in ids], prefix)
    if not seeded:
        out.notes.append(
            "the shared budget counters were emptied (a Redis restart or FLUSHALL) and are not "
            "seeded again yet: the next budgeted request seeds them from the records"
        )
        return
    recorded = budget_recorded(ids, now_ms)
    for seed, value in zip(ids, values, strict=True):
        want = recorded.get(seed, 0)
        scope, kind, period = seed
        if kind == "tokens":
            if value != want:
                out.differences.append(
                    f"{owners[seed]}: tokens this {period}: counter {value}, records {want}"
                )
        elif abs(value - want) > _usd_slack(scope, period, now_ms, zone):
            out.differences.append(
                f"{owners[seed]}: dollars this {period}: counter ${value / MICROS:.6f}, "
                f"records ${want / MICROS:.6f}"
            )
    out.checked.append(f"budget counters against records: {len(ids)} counter(s)")


def _usd_slack(scope: str, period: Any, now_ms: int, zone: ZoneInfo) -> int:
    """Micro-dollars a dollar counter may differ by: one per request of its period (rounding)."""
    _, start_ms, _ = period_bounds(period, now_ms, zone)
    since = dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC)
    rows = UsageRollup.objects.filter(bucket__gte=since)
    kind, number = scope[0], int(scope[1:])
    if kind == "k":
        rows = rows.filter(key_id=number)
    elif kind == "u":
        name = (
            apps.get_model("auth", "User")
            .objects.filter(pk=number)
            .values_list("username", flat=True)
        )
        rows = rows.filter(user__in=list(name))
    else:
        members = apps.get_model("auth", "User").objects.filter(groups=number)
        rows = rows.filter(user__in=list(members.values_list("username", flat=True)))
    return max(1, int(rows.aggregate(n=Sum("requests"))["n"] or 0))


# --- the counters' stores -----------------------------------------------------------------------


def redis_counters(url: str) -> CounterReader:
    """Read counters (and the seeding sentinel) from Redis, on a connection of its own."""

    def read(names: Sequence[str], prefix: str) -> tuple[list[int], bool]:
        import asyncio

        from state.resp import RespClient

        async def go() -> tuple[list[int], bool]:
            client = RespClient(url, timeout_s=5.0)
            try:
                raw = await client.execute("MGET", *names, f"{prefix}:budget-seeded")
            finally:
                await client.aclose()
            values = [int(v) if v is not None else 0 for v in raw[:-1]]
            return values, raw[-1] is not None

        return asyncio.run(go())

    return read


# Set by the serving process (`gateway.runtime`): its own counters, when they live in its memory.
_live: Callable[[], CounterReader | None] | None = None


def serve_counters(reader: Callable[[], CounterReader | None]) -> None:
    global _live
    _live = reader


def memory_counters(store: Any) -> CounterReader:
    """A reader of this process's in-memory counters (`MemoryBudgetStore.values`)."""

    def read(names: Sequence[str], prefix: str) -> tuple[list[int], bool]:
        import time

        return store.values(names, int(time.time() * 1000)), True

    return read


def live_counters() -> CounterReader | None:
    """The counters this process serves with: Redis when set, else its own memory (when it is
    an `ocx serve` worker that has started its proxy)."""
    if settings.OCX_REDIS_URL:
        return redis_counters(settings.OCX_REDIS_URL)
    return None if _live is None else _live()


NO_COUNTERS = (
    "budget counters not compared: they live in the memory of the `ocx serve` process (no "
    "REDIS_URL), which did not answer (GET /api/usage/verify there compares them)"
)


def parse_since(value: str | None, *, now: dt.datetime) -> dt.datetime:
    """`--since`: ISO 8601 or a duration back (`selectors.parse_time`); default today's start.
    A start older than a day is taken from its hour (rollups older than a day are hourly)."""
    from usage import selectors

    if not value:
        return start_of_today(now)
    since = selectors.parse_time(value, now=now, name="since")
    if since >= now:
        raise selectors.UsageQueryError("since must be before now")
    if now - since > dt.timedelta(days=1):
        return since.replace(minute=0, second=0, microsecond=0)
    return since.replace(second=0, microsecond=0)


def verify(
    *,
    since: dt.datetime,
    now: dt.datetime,
    counters: CounterReader | None,
    counters_note: str | None = None,
) -> Verification:
    out = Verification(since=since)
    log_against_rollups(since, out)
    if counters is None:
        if counters_note:
            out.notes.append(counters_note)
    else:
        counters_against_records(now, counters, out, all_budgets())
    return out


def _ask_server(since: dt.datetime) -> Verification | None:
    """Without Redis the counters are in the `ocx serve` process: ask it (its server file and
    `OCX_ADMIN_TOKEN`), or None when it cannot be asked."""
    import httpx

    from server.paths import server_file_read

    found = server_file_read(settings.OCX_DATA_DIR) or {}
    url, token = found.get("url"), settings.OCX_ADMIN_TOKEN
    if not isinstance(url, str) or not token:
        return None
    try:
        r = httpx.get(
            url.rstrip("/") + "/api/usage/verify",
            params={"since": since.isoformat()},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    data = r.json()
    return Verification(
        since=since,
        checked=list(data["checked"]),
        differences=list(data["differences"]),
        notes=list(data["notes"]),
    )


def verify_here(*, since: dt.datetime, now: dt.datetime) -> Verification:
    """`ocx usage verify` and `ocx doctor`: with Redis the counters are read there; without it
    the serving process is asked, else only the request log and rollups are compared."""
    if not settings.OCX_REDIS_URL:
        asked = _ask_server(since)
        if asked is not None:
            return asked
    return verify(since=since, now=now, counters=live_counters(), counters_note=NO_COUNTERS)


def doctor_check() -> doctor.Check:
    """`ocx usage verify` for today: the request log, rollups and budget counters agree."""
    from django.utils import timezone

    from server import doctor

    now = timezone.now()
    result = verify_here(since=start_of_today(now), now=now)
    if not result.agrees:
        shown = "; ".join(result.differences[:3])
        return doctor.Check(
            "ledger", doctor.FAIL, f"{len(result.differences)} difference(s) today: {shown}"
        )
    detail = "; ".join(result.checked) or "nothing to compare"
    if result.notes:
        detail += " (" + "; ".join(result.notes) + ")"
    return doctor.Check("ledger", doctor.OK, f"today agrees: {detail}")
