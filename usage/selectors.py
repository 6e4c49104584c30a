"""Usage reads: totals over a time range grouped by any dimensions, optionally per time bucket
(`GET /api/usage`, `ocx usage`, and later the dashboard)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db.models import Max, Sum
from django.db.models.functions import TruncDay, TruncHour, TruncMinute

from usage.models import COUNTERS, UsageRollup

# Public grouping name → rollup columns.
GROUPS: dict[str, tuple[str, ...]] = {
    "user": ("user",),
    # Read per user, then counted for each team the user is in now (`_teams_of_users`).
    "team": ("user",),
    # Per key id, across rotations (each secret has its own prefix): `_keys` names it.
    "key": ("key_id",),
    "combo": ("combo",),
    "target": ("target",),
    "model": ("model",),
    "status": ("status_class",),
}
# The counters every report shows, in camelCase.
REPORTED = {
    "requests": "requests",
    "inputTokens": "input_tokens",
    "cachedInputTokens": "cached_input_tokens",
    "outputTokens": "output_tokens",
    "reasoningTokens": "reasoning_tokens",
    "unknownUsageRequests": "unknown_usage_requests",
    "costUsd": "cost_usd",
    "apiValueUsd": "api_value_usd",
    "unpricedRequests": "unpriced_requests",
    "estimatedRequests": "estimated_requests",
}
# USD sums: floats, reported to the micro-dollar (a sum of float costs carries noise below it).
MONEY = frozenset({"costUsd", "apiValueUsd"})
USD_DIGITS = 6
MAX_GROUPS = 2
# The `team` of requests whose user is in no team (a team name never has a parenthesis).
NO_TEAM = "(no team)"
Bucket = Literal["minute", "hour", "day"]
_TRUNC = {"minute": TruncMinute, "hour": TruncHour, "day": TruncDay}
_RELATIVE = re.compile(r"^(\d{1,6})([mhdw])$")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class UsageQueryError(ValueError):
    """A bad parameter: the message names it and what is accepted."""


@dataclass(frozen=True)
class UsageQuery:
    since: dt.datetime
    until: dt.datetime
    by: tuple[str, ...] = ()
    bucket: Bucket | None = None


def parse_time(value: str, *, now: dt.datetime, name: str) -> dt.datetime:
    """ISO 8601 (no offset = UTC) or a duration back from now: `30m`, `1h`, `24h`, `7d`, `2w`."""
    text = value.strip()
    m = _RELATIVE.match(text)
    try:
        if m:
            return now - dt.timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        # In UTC from here on (an offset at the calendar's edge cannot be converted).
        return parsed.replace(tzinfo=parsed.tzinfo or dt.UTC).astimezone(dt.UTC)
    except OverflowError:
        raise UsageQueryError(f"{name}: {value!r} is out of range") from None
    except ValueError:
        raise UsageQueryError(
            f"{name}: expected an ISO 8601 time (2026-01-31T12:00:00Z) or a duration "
            f"like 1h, 24h, 7d, 30d; got {value!r}"
        ) from None


def parse_by(value: str | None) -> tuple[str, ...]:
    if value is None or not value.strip():
        return ()
    names = tuple(part.strip() for part in value.split(","))
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        raise UsageQueryError(
            f"by: unknown dimension {unknown[0]!r}; use one or two of {', '.join(GROUPS)}"
        )
    if len(names) > MAX_GROUPS or len(set(names)) != len(names):
        raise UsageQueryError("by: one or two different dimensions, comma-separated")
    return names


def build_query(
    *,
    by: str | None,
    since: str | None,
    until: str | None,
    now: dt.datetime,
    bucket: str | None = None,
) -> UsageQuery:
    """Validate the public parameters; the default range is the last 24 hours."""
    start = parse_time(since, now=now, name="since") if since else now - dt.timedelta(days=1)
    end = parse_time(until, now=now, name="until") if until else now
    if start >= end:
        raise UsageQueryError("since must be before until")
    if bucket is not None and bucket not in _TRUNC:
        raise UsageQueryError("bucket: use minute, hour or day")
    return UsageQuery(since=start, until=end, by=parse_by(by), bucket=bucket)  # type: ignore[arg-type]


def usage_rows(
    *,
    since: dt.datetime,
    until: dt.datetime,
    group: Sequence[str] = (),
    bucket: Bucket | None = None,
    counters: Sequence[str] = COUNTERS,
    filters: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Summed rollup counters for buckets starting in [since, until), grouped by rollup
    columns `group` (and by time when `bucket` is set, as `at`). Hour rows (data older than a
    day) count whole: a range boundary inside such an hour is rounded to its start."""
    qs = UsageRollup.objects.filter(bucket__gte=since, bucket__lt=until, **(filters or {}))
    keys = list(group)
    if bucket is not None:
        qs = qs.annotate(at=_TRUNC[bucket]("bucket", tzinfo=dt.UTC))
        keys.append("at")
    sums = {name: Sum(name) for name in counters}
    if not keys:
        total = qs.aggregate(**sums)
        return [{k: v or 0 for k, v in total.items()}]
    rows = qs.values(*keys).annotate(**sums).order_by(*keys)
    return [{**row, **{name: row[name] or 0 for name in counters}} for row in rows]


def usage_report(query: UsageQuery, users: Collection[str] | None = None) -> dict[str, Any]:
    """The `/api/usage` body: rows per group (camelCase counters) and the totals.

    `by=team` counts a request for each team its user is in at the time of the report (so the
    rows of a user in two teams add up to more than the totals), and requests of users in no
    team (and of no user) under `(no team)`. The totals count every request once."""
    columns = list(dict.fromkeys(c for name in query.by for c in GROUPS[name]))
    counters = list(REPORTED.values())
    raw = usage_rows(
        since=query.since,
        until=query.until,
        group=columns,
        bucket=query.bucket,
        counters=counters,
        # `users`: only these users' requests (a team manager's teams).
        filters=None if users is None else {"user__in": sorted(users)},
    )
    teams = _teams_of_users() if "team" in query.by else None
    keys = _keys({r["key_id"] for r in raw if r.get("key_id")}, query) if "key" in query.by else {}
    rows: list[dict[str, Any]] = []
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    totals = dict.fromkeys(REPORTED, 0)
    for r in raw if columns or query.bucket else []:
        for out, column in REPORTED.items():
            totals[out] += r[column]
        user_teams = (teams.get(r["user"]) or [NO_TEAM]) if teams is not None else [None]
        for team in user_teams:
            row: dict[str, Any] = {}
            for name in query.by:
                if name == "key":
                    prefix, key_name, owner = keys.get(r["key_id"], (None, None, None))
                    row["key"] = prefix
                    row["keyId"] = r["key_id"] or None
                    row["keyName"] = key_name
                    row["owner"] = owner
                elif name == "team":
                    row["team"] = team
                else:
                    row[name] = r[GROUPS[name][0]] or None
            if query.bucket is not None:
                row["at"] = _iso(r["at"])
            if teams is None:
                rows.append({**row, **{out: r[c] for out, c in REPORTED.items()}})
                continue
            same = merged.setdefault(tuple(row.values()), {**row, **dict.fromkeys(REPORTED, 0)})
            for out, column in REPORTED.items():
                same[out] += r[column]
    if teams is not None:
        rows = sorted(merged.values(), key=lambda row: _order(row, query))
    rows = [{k: _value(k, v) if k in REPORTED else v for k, v in row.items()} for row in rows]
    if not rows and not columns and not query.bucket:
        totals = {out: raw[0][column] for out, column in REPORTED.items()}
    totals = {out: _value(out, value) for out, value in totals.items()}
    return {
        "since": _iso(query.since),
        "until": _iso(query.until),
        "by": list(query.by),
        "rows": rows,
        "totals": totals,
    }


def _keys(ids: set[int], query: UsageQuery) -> dict[int, tuple[str, str | None, str | None]]:
    """key id → (prefix of its current secret, name, owner); a deleted key keeps the last
    prefix it was counted under (`accounts` sits above `usage`: its model by name)."""
    if not ids:
        return {}
    model = apps.get_model("accounts", "ClientKey")
    out: dict[int, tuple[str, str | None, str | None]] = {
        pk: (prefix, name or None, owner)
        for pk, prefix, name, owner in model.objects.filter(pk__in=ids).values_list(
            "pk", "prefix", "name", "user__username"
        )
    }
    gone = ids - set(out)
    if gone:
        rows = (
            UsageRollup.objects.filter(
                key_id__in=gone, bucket__gte=query.since, bucket__lt=query.until
            )
            .values("key_id")
            .annotate(prefix=Max("key_prefix"))
        )
        out.update({r["key_id"]: (r["prefix"], None, None) for r in rows})
    return out


def _teams_of_users() -> dict[str, list[str]]:
    """username → the names of the teams (Django groups) the user is in now, sorted."""
    out: dict[str, list[str]] = {}
    pairs = (
        get_user_model()
        .objects.filter(groups__isnull=False)
        .values_list("username", "groups__name")
        .order_by("groups__name")
    )
    for username, team in pairs:
        out.setdefault(username, []).append(team)
    return out


def _order(row: dict[str, Any], query: UsageQuery) -> tuple[Any, ...]:
    keys = [k for name in query.by for k in (("keyId",) if name == "key" else (name,))]
    if query.bucket is not None:
        keys.append("at")
    # Within one column the values share a type (None sorts last).
    return tuple((row[k] is None, row[k] if row[k] is not None else 0) for k in keys)


def _value(name: str, value: Any) -> Any:
    return round(float(value), USD_DIGITS) if name in MONEY else int(value)


# A spreadsheet runs a cell starting with one of these as a formula (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A CSV cell: "" for None; a string a spreadsheet would run as a formula (the `model`
    column is the client's requested model) gets a leading `'`; numbers as they are."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def report_csv(report: dict[str, Any]) -> str:
    """The rows of a report as CSV with a header line (no totals line)."""
    out = io.StringIO()
    fields = [*(k for k in _dims(report)), *REPORTED]
    # RFC 4180's CRLF: the writer then also quotes a cell holding a lone CR (with "\n" alone it
    # would not, and a spreadsheet would split the row there).
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\r\n")
    writer.writeheader()
    for row in report["rows"]:
        writer.writerow({k: _cell(row.get(k)) for k in fields})
    return out.getvalue()


def _dims(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name in report["by"]:
        out += ["key", "keyId", "keyName", "owner"] if name == "key" else [name]
    if report["rows"] and "at" in report["rows"][0]:
        out.append("at")
    return out


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


__all__ = [
    "GROUPS",
    "MONEY",
    "UsageQuery",
    "UsageQueryError",
    "build_query",
    "parse_time",
    "report_csv",
    "usage_report",
    "usage_rows",
]
