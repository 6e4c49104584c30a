"""Reads for the admin dashboard and the routing events page. Charts read only the usage
rollups (`usage.UsageRollup`, a few hundred rows per range), never the request log."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from combos import live
from combos.status import status_report
from dashboard.models import RoutingEvent
from quota import windows as qw
from quota.models import QuotaTransition
from usage.models import LATENCY_BOUNDS_MS, TTFT_BOUNDS_MS
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
LATENCY = tuple(f"latency_b{i}" for i in range(len(LATENCY_BOUNDS_MS) + 1))
TTFT = tuple(f"ttft_b{i}" for i in range(len(TTFT_BOUNDS_MS) + 1))
TOP = 12  # users / models / targets shown in a bar chart, the busiest first


def percentile(counts: Sequence[int], bounds: Sequence[int], q: float) -> int | None:
    """The q-quantile (0..1) of a histogram with upper `bounds` (the last bucket is open),
    interpolated linearly inside its bucket; None without data. A quantile in the open bucket
    is reported as its lower bound (at least that)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            lower = bounds[i - 1] if i > 0 else 0
            if i >= len(bounds):
                return lower
            return round(lower + (bounds[i] - lower) * (rank - seen) / count)
        seen += count
    return bounds[-1]


def _series(
    rows: list[dict[str, Any]], column: str, *, start: int, step: int, points: int
) -> dict[str, dict[str, list[int]]]:
    out: dict[str, dict[str, list[int]]] = {}
    for row in rows:
        index = (int(row["bucket"].timestamp()) - start) // step
        if not 0 <= index < points:
            continue  # an hour row that began before the range (counted whole elsewhere)
        name = row[column] or "(none)"
        lines = out.get(name)
        if lines is None:
            lines = out[name] = {s: [0] * points for s in SERIES}
        for s in SERIES:
            lines[s][index] += row[s]
    return dict(sorted(out.items()))


def _top(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    ranked = sorted(rows, key=lambda r: -(r["input_tokens"] + r["output_tokens"]))[:TOP]
    return [
        {
            "name": r[column] or "(none)",
            "input": r["input_tokens"],
            "output": r["output_tokens"],
        }
        for r in ranked
        if r["input_tokens"] or r["output_tokens"]
    ]


def charts(range_name: str, *, now: float | None = None) -> dict[str, Any]:
    """Everything the dashboard's charts show for one range: requests/errors/hops per combo and
    per target per step (zero-filled), p50/p95 latency and TTFT per target, tokens per user
    and per model. `start` is the first step's start in epoch ms."""
    length, step = RANGES[range_name]
    now_s = int(time.time() if now is None else now)
    points = length // step
    start = now_s // step * step - (points - 1) * step
    since = dt.datetime.fromtimestamp(start, tz=dt.UTC)
    until = dt.datetime.fromtimestamp(now_s + step, tz=dt.UTC)
    by_combo = usage_rows(since=since, until=until, group=("combo", "bucket"), counters=SERIES)
    by_target = usage_rows(since=since, until=until, group=("target", "bucket"), counters=SERIES)
    timing = usage_rows(since=since, until=until, group=("target",), counters=LATENCY + TTFT)
    users = usage_rows(since=since, until=until, group=("user",), counters=TOKENS)
    models = usage_rows(since=since, until=until, group=("model",), counters=TOKENS)
    latency = []
    for row in timing:
        lat = [row[c] for c in LATENCY]
        ttft = [row[c] for c in TTFT]
        if not row["target"] or not sum(lat):
            continue
        latency.append(
            {
                "target": row["target"],
                "requests": sum(lat),
                "p50": percentile(lat, LATENCY_BOUNDS_MS, 0.5),
                "p95": percentile(lat, LATENCY_BOUNDS_MS, 0.95),
                "ttftP50": percentile(ttft, TTFT_BOUNDS_MS, 0.5),
                "ttftP95": percentile(ttft, TTFT_BOUNDS_MS, 0.95),
            }
        )
    latency.sort(key=lambda r: -r["requests"])
    return {
        "range": range_name,
        "start": start * 1000,
        "step": step * 1000,
        "points": points,
        "perCombo": _series(by_combo, "combo", start=start, step=step, points=points),
        "perTarget": _series(by_target, "target", start=start, step=step, points=points),
        "latency": latency[:TOP],
        "tokensByUser": _top(users, "user"),
        "tokensByModel": _top(models, "model"),
    }


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


def combos_report() -> dict[str, Any]:
    """Every combo with its targets in order and each target's state (`/api/status`)."""
    return status_report()
