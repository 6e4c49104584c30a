"""Reads for the admin's usage report (`/admin/usage/usagerollup/`): requests, tokens and spend
per user, team, key, model, combo or target over a period counted in the viewer's time zone,
the totals, and the spend per hour (today) or per day (longer periods) for the chart.

The rows come from `selectors.usage_report` (the `/api/usage` logic); only the chart's
series is queried here, because its days are the viewer's local days, not UTC ones."""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.apps import apps
from django.db.models import Sum
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from usage import selectors
from usage.models import UsageRollup

PERIODS: dict[str, str] = {
    "today": "Today",
    "7d": "7 days",
    "30d": "30 days",
    "month": "This month",
    "custom": "Custom",
}
# The groupings the picker offers, in order; one the selectors do not accept is left out.
GROUPINGS: dict[str, str] = {
    "user": "User",
    "team": "Team",
    "key": "Key",
    "model": "Model",
    "combo": "Combo",
    "target": "Target",
}
# What an empty grouping value means (refused before a key was recognised, no combo, …).
EMPTY_LABEL = {
    "user": "(no user)",
    "team": "(no team)",
    "key": "(no key)",
    "model": "(no model)",
    "combo": "(direct model, no combo)",
    "target": "(not served)",
}
# Grouping → the rollup column the drill-down filters on (team has none).
DRILL_COLUMN = {
    "user": "user",
    "key": "key_id",
    "model": "model",
    "combo": "combo",
    "target": "target",
}
MAX_CUSTOM_DAYS = 400
Step = Literal["hour", "day"]


class ReportError(ValueError):
    """A bad report parameter: the message names it and what is accepted."""


def groupings() -> dict[str, str]:
    """The picker's groupings that `/api/usage`'s `by` accepts (`team` once the selectors
    know it)."""
    out = {}
    for name, label in GROUPINGS.items():
        try:
            selectors.parse_by(name)
        except selectors.UsageQueryError:
            continue
        out[name] = label
    return out


@dataclass(frozen=True)
class Period:
    name: str
    zone: ZoneInfo
    since: dt.datetime  # UTC
    until: dt.datetime  # UTC, exclusive
    step: Step
    first: dt.date  # local calendar days covered (for the custom inputs)
    last: dt.date

    @property
    def zone_name(self) -> str:
        return self.zone.key

    @property
    def since_iso(self) -> str:
        return _iso(self.since)

    @property
    def until_iso(self) -> str:
        return _iso(self.until)

    @property
    def since_text(self) -> str:
        return self.since.astimezone(self.zone).strftime("%Y-%m-%d %H:%M")

    @property
    def until_text(self) -> str:
        return self.until.astimezone(self.zone).strftime("%Y-%m-%d %H:%M")


def parse_zone(value: str | None, *, default: str) -> ZoneInfo:
    name = (value or "").strip() or default
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ReportError(
            f"tz: {name!r} is not an IANA time zone (such as UTC or Europe/Berlin)"
        ) from None


def _midnight(day: dt.date, zone: ZoneInfo) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(0), tzinfo=zone).astimezone(dt.UTC)


def _date(value: str | None, name: str) -> dt.date:
    if not value or not value.strip():
        raise ReportError(f"{name}: a date (YYYY-MM-DD) is required for a custom period")
    try:
        return dt.date.fromisoformat(value.strip())
    except ValueError:
        raise ReportError(f"{name}: expected a date like 2026-03-01, got {value!r}") from None


def parse_period(
    *,
    period: str | None,
    start: str | None,
    end: str | None,
    zone: ZoneInfo,
    now: dt.datetime,
) -> Period:
    """today, 7d / 30d (today and the 6 / 29 days before), month (since the 1st), or custom
    (`from`..`to`, whole local days, both included); calendar days in `zone`."""
    name = (period or "").strip() or "7d"
    if name not in PERIODS:
        raise ReportError(f"period: use one of {', '.join(PERIODS)}; got {period!r}")
    today = now.astimezone(zone).date()
    until = now
    if name == "today":
        first = last = today
    elif name in ("7d", "30d"):
        first, last = today - dt.timedelta(days=int(name[:-1]) - 1), today
    elif name == "month":
        first, last = today.replace(day=1), today
    else:
        first, last = _date(start, "from"), _date(end, "to")
        if first > last:
            raise ReportError("from: must be on or before to")
        if (last - first).days + 1 > MAX_CUSTOM_DAYS:
            raise ReportError(f"to: a custom period spans at most {MAX_CUSTOM_DAYS} days")
        if first > today:
            raise ReportError("from: the period starts in the future")
        # A period reaching into the future ends now (the chart still shows its days).
        until = (
            min(now, _midnight(last + dt.timedelta(days=1), zone))
            if last >= today
            else (_midnight(last + dt.timedelta(days=1), zone))
        )
    since = _midnight(first, zone)
    return Period(
        name=name,
        zone=zone,
        since=since,
        until=until,
        step="hour" if first == last else "day",
        first=first,
        last=last,
    )


# -- Formatting -------------------------------------------------------------------------------


def usd(value: float) -> str:
    """Dollars with cents and thousands separators; a cost under half a cent reads "< $0.01"."""
    if 0 < value < 0.005:
        return "< $0.01"
    return f"${value:,.2f}"


def count(value: int) -> str:
    return f"{value:,}"


# -- The report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    label: str
    empty: bool  # the group's value is empty ("(no user)", …)
    requests: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    cost_usd: float
    api_value_usd: float
    unpriced_requests: int
    drill_url: str | None = None
    estimated_requests: int = 0

    @property
    def cost(self) -> str:
        return usd(self.cost_usd)

    @property
    def api_value(self) -> str:
        return usd(self.api_value_usd)

    @property
    def tokens(self) -> dict[str, str]:
        return {
            "input": count(self.input_tokens),
            "cached": count(self.cached_input_tokens),
            "output": count(self.output_tokens),
            "requests": count(self.requests),
            "unpriced": count(self.unpriced_requests),
            "estimated": count(self.estimated_requests),
        }


@dataclass(frozen=True)
class Point:
    start: dt.datetime  # UTC
    label: str  # local hour or day
    cost_usd: float
    api_value_usd: float
    requests: int


@dataclass(frozen=True)
class Report:
    period: Period
    by: str
    rows: list[Row]
    totals: Row
    series: list[Point]
    rollups_url: str
    csv_url: str

    @property
    def by_label(self) -> str:
        return GROUPINGS.get(self.by, self.by)

    @property
    def shows_api_value(self) -> bool:
        """Some requests ran on a subscription (their API value differs from their cost)."""
        return abs(self.totals.api_value_usd - self.totals.cost_usd) >= 0.005

    @property
    def shows_unpriced(self) -> bool:
        return self.totals.unpriced_requests > 0

    @property
    def shows_estimated(self) -> bool:
        return self.totals.estimated_requests > 0

    @property
    def saved(self) -> str:
        return usd(max(0.0, self.totals.api_value_usd - self.totals.cost_usd))


def _row(label: str, empty: bool, data: Mapping[str, Any], drill: str | None = None) -> Row:
    return Row(
        label=label,
        empty=empty,
        requests=int(data["requests"]),
        input_tokens=int(data["inputTokens"]),
        cached_input_tokens=int(data["cachedInputTokens"]),
        output_tokens=int(data["outputTokens"]),
        cost_usd=float(data["costUsd"]),
        api_value_usd=float(data["apiValueUsd"]),
        unpriced_requests=int(data["unpricedRequests"]),
        drill_url=drill,
        estimated_requests=int(data.get("estimatedRequests", 0)),
    )


def _key_names(ids: list[int]) -> dict[int, str]:
    """Key id → "name (user)"; `accounts` sits above `usage`, so by app registry."""
    if not ids:
        return {}
    model = apps.get_model("accounts", "ClientKey")
    rows = model.objects.filter(pk__in=ids).values_list("pk", "name", "user__username")
    return {pk: f"{name or 'unnamed'} ({user})" for pk, name, user in rows}


def _label(by: str, row: Mapping[str, Any], names: Mapping[int, str]) -> tuple[str, bool]:
    if by == "key":
        prefix, key_id = row.get("key"), row.get("keyId")
        if not prefix:
            return EMPTY_LABEL["key"], True
        name = names.get(key_id or 0)
        return (f"{prefix}… {name}" if name else f"{prefix}… (deleted key)"), False
    value = row.get(by)
    if value in (None, ""):
        return EMPTY_LABEL.get(by, "(none)"), True
    return str(value), False


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def rollups_url(base: str, period: Period, **filters: Any) -> str:
    query = {"bucket__gte": _iso(period.since), "bucket__lt": _iso(period.until), **filters}
    return f"{base}?{urlencode(query)}"


def build(
    *,
    params: Mapping[str, str],
    now: dt.datetime,
    default_zone: str,
    rollups_base: str,
) -> Report:
    """The report for the page's query parameters (`period`, `from`, `to`, `by`, `tz`);
    ReportError for a bad one."""
    zone = parse_zone(params.get("tz"), default=default_zone)
    period = parse_period(
        period=params.get("period"),
        start=params.get("from"),
        end=params.get("to"),
        zone=zone,
        now=now,
    )
    by = (params.get("by") or "").strip() or "user"
    offered = groupings()
    if by not in offered:
        raise ReportError(f"by: use one of {', '.join(offered)}; got {params.get('by')!r}")
    data = selectors.usage_report(
        selectors.UsageQuery(since=period.since, until=period.until, by=(by,))
    )
    names = _key_names([r["keyId"] for r in data["rows"] if r.get("keyId")]) if by == "key" else {}
    rows = []
    for r in data["rows"]:
        label, empty = _label(by, r, names)
        column = DRILL_COLUMN.get(by)
        drill = None
        if column is not None:
            value = r.get("keyId") if by == "key" else r.get(by)
            drill = rollups_url(
                rollups_base, period, **{column: value or ("0" if by == "key" else "")}
            )
        rows.append(_row(label, empty, r, drill))
    rows.sort(key=lambda r: (-r.cost_usd, -r.api_value_usd, -r.requests, r.empty, r.label))
    csv = urlencode(
        {"format": "csv", "by": by, "since": _iso(period.since), "until": _iso(period.until)}
    )
    return Report(
        period=period,
        by=by,
        rows=rows,
        totals=_row("Total", False, data["totals"]),
        series=spend_series(period),
        rollups_url=rollups_url(rollups_base, period),
        csv_url=f"/api/usage?{csv}",
    )


def _starts(period: Period) -> list[dt.datetime]:
    """The chart's steps: every local hour of the day, or every local day of the period."""
    if period.step == "hour":
        end = _midnight(period.last + dt.timedelta(days=1), period.zone)
        out, at = [], period.since
        while at < end:
            out.append(at)
            at += dt.timedelta(hours=1)  # UTC hours: a DST day has 23 or 25
        return out
    days = (period.last - period.first).days + 1
    return [_midnight(period.first + dt.timedelta(days=i), period.zone) for i in range(days)]


def spend_series(period: Period) -> list[Point]:
    """Cost, API value and requests per local hour (one day) or local day, zero-filled."""
    # Grouped by the stored bucket (an index range, no per-row time zone function: SQLite's
    # is Python code); at most a day of minutes plus the hours before, binned below.
    rows = (
        UsageRollup.objects.filter(bucket__gte=period.since, bucket__lt=period.until)
        .values("bucket")
        .annotate(cost=Sum("cost_usd"), api=Sum("api_value_usd"), n=Sum("requests"))
        .order_by()
    )
    starts = _starts(period)
    stamps = [s.timestamp() for s in starts]
    cost = [0.0] * len(starts)
    api = [0.0] * len(starts)
    requests = [0] * len(starts)
    for row in rows:
        at = row["bucket"]
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.UTC)
        i = bisect.bisect_right(stamps, at.timestamp()) - 1
        if 0 <= i < len(starts):
            cost[i] += row["cost"] or 0.0
            api[i] += row["api"] or 0.0
            requests[i] += row["n"] or 0
    if period.step == "hour":
        fmt = "%H:%M"
    else:
        fmt = "%a %m-%d" if len(starts) <= 12 else "%m-%d"
    return [
        Point(
            start=s,
            label=s.astimezone(period.zone).strftime(fmt),
            cost_usd=cost[i],
            api_value_usd=api[i],
            requests=requests[i],
        )
        for i, s in enumerate(starts)
    ]


# -- The chart (inline SVG, no script, no external asset) ---------------------------------------

CHART_W, CHART_H = 1000, 230
_LEFT, _BOTTOM, _TOP = 64, 26, 10


def _ticks(peak: float) -> tuple[float, int]:
    """(step, count): a round dollar step (1, 2 or 5 × 10^n, at least a cent) and at most 5
    steps that reach `peak`."""
    if peak <= 0:
        return 1.0, 1
    step = 0.01
    while True:
        for mult in (1, 2, 5):
            if step * mult * 5 >= peak:
                size = round(step * mult, 2)
                return size, max(1, math.ceil(peak / size - 1e-9))
        step *= 10


def spend_chart(series: list[Point], *, with_api_value: bool) -> SafeString:
    """Bars of the cost per step (and, behind them, the value at API prices when some
    requests ran on a subscription), a dollar axis and local step labels."""
    n = max(1, len(series))
    peak = max([p.api_value_usd if with_api_value else p.cost_usd for p in series] or [0.0])
    size, ticks = _ticks(peak)
    top = size * ticks
    plot_w, plot_h = CHART_W - _LEFT - 8, CHART_H - _BOTTOM - _TOP
    slot = plot_w / n
    bar = max(1.0, slot * 0.7)
    grid = []
    for i in range(ticks + 1):
        value = size * i
        y = _TOP + plot_h - plot_h * i / ticks
        grid.append(
            (f"{y:.1f}", f"{y + 4:.1f}", f"${value:,.2f}" if size < 1 else f"${value:,.0f}")
        )
    gridlines = format_html_join(
        "",
        '<line class="ocx-grid" x1="{}" x2="{}" y1="{}" y2="{}"></line>'
        '<text class="ocx-axis" x="{}" y="{}" text-anchor="end">{}</text>',
        ((_LEFT, CHART_W - 8, y, y, _LEFT - 6, ty, label) for y, ty, label in grid),
    )
    every = max(1, -(-n // 12))  # at most 12 step labels (readable at 1280 px)
    bars = []
    for i, p in enumerate(series):
        x = _LEFT + slot * i + (slot - bar) / 2
        parts = []
        title = f"{p.label}: {usd(p.cost_usd)}"
        if with_api_value:
            title += f" (at API prices {usd(p.api_value_usd)})"
            h = plot_h * p.api_value_usd / top
            parts.append(
                format_html(
                    '<rect class="ocx-bar-api" x="{}" y="{}" width="{}" height="{}"></rect>',
                    f"{x:.1f}",
                    f"{_TOP + plot_h - h:.1f}",
                    f"{bar:.1f}",
                    f"{h:.1f}",
                )
            )
        title += f", {count(p.requests)} requests"
        h = plot_h * p.cost_usd / top
        parts.append(
            format_html(
                '<rect class="ocx-bar-cost" x="{}" y="{}" width="{}" height="{}"></rect>',
                f"{x:.1f}",
                f"{_TOP + plot_h - h:.1f}",
                f"{bar:.1f}",
                f"{h:.1f}",
            )
        )
        label = ""
        if i % every == 0:
            label = format_html(
                '<text class="ocx-axis" x="{}" y="{}" text-anchor="middle">{}</text>',
                f"{_LEFT + slot * i + slot / 2:.1f}",
                CHART_H - 8,
                p.label,
            )
        bars.append(
            format_html(
                '<g class="ocx-step" data-at="{}" data-cost="{}"><title>{}</title>'
                '<rect class="ocx-hit" x="{}" y="{}" width="{}" height="{}"></rect>{}</g>{}',
                _iso(p.start),
                f"{p.cost_usd:.6f}",
                title,
                f"{_LEFT + slot * i:.1f}",
                _TOP,
                f"{slot:.1f}",
                plot_h,
                SafeString("".join(parts)),
                label,
            )
        )
    empty = ""
    if not any(p.requests for p in series):
        empty = format_html(
            '<text class="ocx-chart-none" x="{}" y="{}" text-anchor="middle">{}</text>',
            _LEFT + plot_w / 2,
            _TOP + plot_h / 2,
            "No requests in this period.",
        )
    return format_html(
        '<svg id="ocx-spend-chart" class="ocx-spend-chart" viewBox="0 0 {} {}" role="img" '
        'aria-label="Spend over time">{}<line class="ocx-axis-line" x1="{}" x2="{}" y1="{}" '
        'y2="{}"></line>{}{}</svg>',
        CHART_W,
        CHART_H,
        gridlines,
        _LEFT,
        CHART_W - 8,
        _TOP + plot_h,
        _TOP + plot_h,
        SafeString("".join(bars)),
        empty,
    )


__all__ = [
    "GROUPINGS",
    "PERIODS",
    "Period",
    "Report",
    "ReportError",
    "Row",
    "build",
    "count",
    "groupings",
    "parse_period",
    "parse_zone",
    "spend_chart",
    "spend_series",
    "usd",
]
