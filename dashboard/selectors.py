"""Reads for the admin dashboard and the routing events page. The series and token charts read
the usage rollups (`usage.UsageRollup`, a few hundred rows per range); the latency chart reads
the request log's real durations (the newest `LATENCY_SAMPLE` served requests of the range):
the rollups' histogram buckets start at 100 ms, so every fast target showed 50/95 ms."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import CharField, F, Sum
from django.db.models.functions import Substr, TruncHour

from combos import live
from dashboard.models import RoutingEvent
from quota import windows as qw
from quota.models import QuotaTransition
from usage.models import MINUTE, RequestLog, UsageRollup
from usage.selectors import usage_rows

RangeName = Literal["1h", "24h", "7d"]
# Range → (length in seconds, chart step in seconds).
RANGES: dict[str, tuple[int, int]] = {
    "1h": (3600, 60),
    "24h": (86400, 3600),
    "7d": (7 * 86400, 3600),
}
DEFAULT_RANGE: RangeName = "1h"
SERIES = ("requests", "errors", "hops")
TOKENS = ("input_tokens", "output_tokens")
TOP = 12  # users / models / targets shown in a bar chart, the busiest first
LATENCY_SAMPLE = 20_000  # request-log rows read for the latency chart, newest first


def nearest_rank(values: Sequence[int], q: float) -> int | None:
    """The q-quantile (0..1) of `values` by nearest rank; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def _latency(start_s: int, end_s: int) -> list[dict[str, Any]]:
    """p50/p95 of the duration, and of the time to first token of streams, per served target
    over the range, from the request log (an index scan of `at`, bounded by LATENCY_SAMPLE)."""
    rows = (
        RequestLog.objects.filter(
            at__gte=dt.datetime.fromtimestamp(start_s, tz=dt.UTC),
            at__lt=dt.datetime.fromtimestamp(end_s, tz=dt.UTC),
        )
        .exclude(target="")
        .order_by("-at")
        .values_list("target", "duration_ms", "ttft_ms", "stream")[:LATENCY_SAMPLE]
    )
    durations: dict[str, list[int]] = {}
    ttfts: dict[str, list[int]] = {}
    for target, duration, ttft, stream in rows:
        durations.setdefault(target, []).append(duration)
        if stream and ttft is not None:
            ttfts.setdefault(target, []).append(ttft)
    out: list[dict[str, Any]] = [
        {
            "target": target,
            "requests": len(values),
            "p50": nearest_rank(values, 0.5),
            "p95": nearest_rank(values, 0.95),
            "ttftP50": nearest_rank(ttfts.get(target, []), 0.5),
            "ttftP95": nearest_rank(ttfts.get(target, []), 0.95),
        }
        for target, values in durations.items()
    ]
    out.sort(key=lambda r: (-r["requests"], r["target"]))
    return out[:TOP]


def _hour(value: Any) -> int:
    """A row's time step start in epoch seconds (a datetime, or SQLite's "YYYY-MM-DD HH")."""
    if isinstance(value, str):
        return int(
            dt.datetime.strptime(value[:13], "%Y-%m-%d %H").replace(tzinfo=dt.UTC).timestamp()
        )
    return int(value.timestamp())


def _step_expr(step: int) -> Any:
    """The rollup bucket truncated to the chart's step, computed by the database."""
    if step == MINUTE:
        return F("bucket")
    if connection.vendor == "sqlite":
        # Stored as "YYYY-MM-DD HH:MM:SS" (UTC): a substring, no per-row Python function.
        return Substr("bucket", 1, 13, output_field=CharField())
    return TruncHour("bucket", tzinfo=dt.UTC)


def _sums(names: Sequence[str]) -> dict[str, Sum]:
    return {name: Sum(name) for name in names}


def _add(
    into: dict[str, dict[str, list[int]]], name: str, row: dict[str, Any], i: int, n: int
) -> None:
    lines = into.get(name)
    if lines is None:
        lines = into[name] = {s: [0] * n for s in SERIES}
    for s in SERIES:
        lines[s][i] += row[s] or 0


def _top(totals: dict[str, list[int]]) -> list[dict[str, Any]]:
    ranked = sorted(totals.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:TOP]
    return [{"name": k, "input": v[0], "output": v[1]} for k, v in ranked if v[0] or v[1]]


def _compute(range_name: str, now_s: int) -> dict[str, Any]:
    length, step = RANGES[range_name]
    points = length // step
    start = now_s // step * step - (points - 1) * step
    rows = UsageRollup.objects.filter(
        bucket__gte=dt.datetime.fromtimestamp(start, tz=dt.UTC),
        bucket__lt=dt.datetime.fromtimestamp(now_s + step, tz=dt.UTC),
    )
    # Two scans of the range: per (combo, target, step) and per (target, user, model).
    series: Any = rows.values("combo", "target", at=_step_expr(step)).annotate(**_sums(SERIES))
    per_combo: dict[str, dict[str, list[int]]] = {}
    per_target: dict[str, dict[str, list[int]]] = {}
    for row in series.order_by():
        i = (_hour(row["at"]) - start) // step
        if 0 <= i < points:
            _add(per_combo, row["combo"] or "(no combo)", row, i, points)
            _add(per_target, row["target"] or "(none served)", row, i, points)
    totals: Any = rows.values("user", "model").annotate(**_sums(TOKENS))
    users: dict[str, list[int]] = {}
    models: dict[str, list[int]] = {}
    for total in totals.order_by():
        tokens = [total[c] or 0 for c in TOKENS]
        for bucket, name in (
            (users, total["user"] or "(none)"),
            (models, total["model"] or "(none)"),
        ):
            have = bucket.setdefault(name, [0, 0])
            have[0] += tokens[0]
            have[1] += tokens[1]
    return {
        "range": range_name,
        "start": start * 1000,
        "step": step * 1000,
        "points": points,
        "perCombo": dict(sorted(per_combo.items())),
        "perTarget": dict(sorted(per_target.items())),
        "latency": _latency(start, now_s + step),
        "tokensByUser": _top(users),
        "tokensByModel": _top(models),
    }


# Hour-step ranges change slowly: computed at most once a minute per worker, and again as
# soon as a new rollup row exists (a new user, target or minute).
_CACHE_S = 60.0
_cache: dict[str, tuple[float, int, dict[str, Any]]] = {}


def clear_cache() -> None:
    _cache.clear()


def charts(range_name: str, *, now: float | None = None) -> dict[str, Any]:
    """Everything the dashboard's charts show for one range: requests/errors/hops per combo and
    per target per step (zero-filled), p50/p95 latency and TTFT per target, tokens per user
    and per model. `start` is the first step's start in epoch ms."""
    now_s = int(time.time() if now is None else now)
    if RANGES[range_name][1] == MINUTE or now is not None:
        return _compute(range_name, now_s)
    newest = UsageRollup.objects.order_by("-id").values_list("id", flat=True).first() or 0
    hit = _cache.get(range_name)
    if hit is not None and hit[1] == newest and time.monotonic() - hit[0] < _CACHE_S:
        return hit[2]
    data = _compute(range_name, now_s)
    _cache[range_name] = (time.monotonic(), newest, data)
    return data


# -- Quota windows --------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowBar:
    name: str
    scope: str
    used_percent: float | None
    window_minutes: int | None
    resets_at_ms: int | None
    exhausted: bool

    @property
    def width(self) -> float:
        return max(0.0, min(100.0, self.used_percent or 0.0))

    @property
    def length(self) -> str:
        m = self.window_minutes
        if not m:
            return self.name
        if m % 1440 == 0:
            return f"{m // 1440} d"
        if m % 60 == 0:
            return f"{m // 60} h"
        return f"{m} min"


@dataclass(frozen=True)
class CredentialQuota:
    provider: str
    credential: str
    status: str  # available, limited, probing
    eligibility: str  # eligible, probe, wait
    recovers_at_ms: int | None
    windows: tuple[WindowBar, ...]


def quota_bars(*, now_ms: int | None = None) -> tuple[str, list[CredentialQuota]]:
    """(live state source, every (provider, credential) with its windows)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    snapshot = live.load((), reasons=False)
    out = []
    for (provider, credential), record in sorted(snapshot.records.items()):
        state = record.state
        exhausted = {(w.name, w.scope) for w in state.exhausted}
        bars = tuple(
            WindowBar(
                name=w.name,
                scope=w.scope,
                used_percent=w.used_percent,
                window_minutes=w.window_minutes,
                resets_at_ms=w.resets_at_ms
                if w.resets_at_ms is None or w.resets_at_ms > now
                else None,
                exhausted=(w.name, w.scope) in exhausted,
            )
            for w in sorted(record.windows, key=lambda w: (w.window_minutes or 0, w.name))
            if not w.informational
        )
        out.append(
            CredentialQuota(
                provider=provider,
                credential=credential,
                status=state.status,
                eligibility=qw.eligibility(state, now=now),
                recovers_at_ms=qw.next_change_at(state),
                windows=bars,
            )
        )
    return snapshot.source, out


# -- Routing events -------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    at: dt.datetime
    kind: str  # cooldown, hop, quota
    combo: str = ""
    target: str = ""
    status: int | None = None
    reason: str = ""
    until: dt.datetime | None = None
    provider: str = ""
    credential: str = ""
    from_state: str = ""
    to_state: str = ""
    message: str = ""

    @property
    def until_ms(self) -> int | None:
        return None if self.until is None else int(self.until.timestamp() * 1000)


def recent_events(limit: int = 50) -> list[EventRow]:
    """The newest cooldowns, hops and quota transitions, newest first (two indexed reads)."""
    rows = [
        EventRow(
            at=e.at,
            kind=e.kind,
            combo=e.combo,
            target=e.target,
            status=e.status,
            reason=e.reason,
            until=e.until,
        )
        for e in RoutingEvent.objects.order_by("-at", "-id")[:limit]
    ]
    rows += [
        EventRow(
            at=t.at,
            kind="quota",
            provider=t.provider,
            credential=t.credential,
            from_state=t.from_state,
            to_state=t.to_state,
            reason=t.reason,
            message=t.message,
        )
        for t in QuotaTransition.objects.order_by("-at")[:limit]
    ]
    rows.sort(key=lambda r: r.at, reverse=True)
    return rows[:limit]


# -- Spend ----------------------------------------------------------------------------------

TOP_SPENDERS = 5


@dataclass(frozen=True)
class Spender:
    user: str
    cost_usd: float
    api_value_usd: float
    requests: int


@dataclass(frozen=True)
class Spend:
    zone: str
    today_usd: float
    today_api_value_usd: float
    today_requests: int
    month_usd: float
    month_api_value_usd: float
    month_requests: int
    month_unpriced: int
    top: tuple[Spender, ...]  # this month, by cost (then API value), at most TOP_SPENDERS

    @property
    def shows_api_value(self) -> bool:
        """Some of this month's requests ran on a subscription (API value ≠ cost)."""
        return abs(self.month_api_value_usd - self.month_usd) >= 0.005


_SPEND = ("requests", "cost_usd", "api_value_usd", "unpriced_requests")


def spend(*, now: dt.datetime, zone: str) -> Spend:
    """Cost today and this month (calendar days in `zone`) and the users who spent the most
    this month, from the rollups (one grouped scan of the month)."""
    tz = ZoneInfo(zone)
    local = now.astimezone(tz)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0).astimezone(dt.UTC)
    first = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).astimezone(dt.UTC)
    month = usage_rows(since=first, until=now, group=("user",), counters=_SPEND)
    today = usage_rows(since=midnight, until=now, counters=_SPEND)[0]
    ranked = sorted(
        (r for r in month if r["cost_usd"] or r["api_value_usd"]),
        key=lambda r: (-r["cost_usd"], -r["api_value_usd"], -r["requests"], r["user"]),
    )
    return Spend(
        zone=zone,
        today_usd=float(today["cost_usd"]),
        today_api_value_usd=float(today["api_value_usd"]),
        today_requests=int(today["requests"]),
        month_usd=float(sum(r["cost_usd"] for r in month)),
        month_api_value_usd=float(sum(r["api_value_usd"] for r in month)),
        month_requests=int(sum(r["requests"] for r in month)),
        month_unpriced=int(sum(r["unpriced_requests"] for r in month)),
        top=tuple(
            Spender(
                user=r["user"] or "(no user)",
                cost_usd=float(r["cost_usd"]),
                api_value_usd=float(r["api_value_usd"]),
                requests=int(r["requests"]),
            )
            for r in ranked[:TOP_SPENDERS]
        ),
    )
