"""Usage rollup writes: one batch of finished requests → per-minute counter increments, and the
periodic downsampling (minutes → hours after a day) and retention.

Called from the request-log writer's thread with a whole batch, never per request. Counters are
only ever incremented with `INSERT … ON CONFLICT DO UPDATE SET c = c + EXCLUDED.c` (SQLite and
PostgreSQL), so several workers writing the same bucket at once add up exactly."""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from django.db import connection, transaction

from usage.models import (
    COUNTERS,
    DIMENSIONS,
    HOUR,
    LATENCY_BOUNDS_MS,
    MINUTE,
    TTFT_BOUNDS_MS,
    UsageRollup,
)

# Bucket start (epoch seconds) + the DIMENSIONS values.
RowKey = tuple[Any, ...]
_COUNTER_INDEX = {name: i for i, name in enumerate(COUNTERS)}
_LAT0 = _COUNTER_INDEX["latency_b0"]
_TTFT0 = _COUNTER_INDEX["ttft_b0"]
_UNPRICED = _COUNTER_INDEX["unpriced_requests"]
_COST = _COUNTER_INDEX["cost_usd"]
_API_VALUE = _COUNTER_INDEX["api_value_usd"]
_ESTIMATED = _COUNTER_INDEX["estimated_requests"]
_UNIQUE = ("resolution", "bucket", "user", "key_id", "combo", "target", "model", "status_class")
_CHUNK = 100
COMPACT_AFTER = dt.timedelta(days=1)
COMPACT_ROWS = 5000


class UsageRecord(Protocol):
    """What one finished proxy request tells the rollups (`usage.requestlog.RequestEntry`)."""

    at: float
    user: str
    key_id: int | None
    key_prefix: str
    combo: str
    target: str
    requested_model: str
    status: int
    outcome: str
    duration_ms: int
    ttft_ms: int | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    # Priced by the request-log writer before the batch is counted (routing.pricing).
    cost_usd: float | None
    api_value_usd: float | None
    unpriced: bool
    attempts: list[dict[str, Any]]
    usage_estimated: bool


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status <= 599 else "err"


def aggregate(records: Iterable[UsageRecord]) -> dict[RowKey, list[float]]:
    """Sum a batch in memory: one counter vector per (minute, dimensions)."""
    rows: dict[RowKey, list[float]] = {}
    # One row per unique (minute, user, key id, …): a rotated key's secrets (other prefixes)
    # share it, as the table's unique constraint has it (PostgreSQL refuses an upsert that
    # touches a row twice). The prefix kept is the first seen in the batch.
    keys: dict[RowKey, RowKey] = {}
    for r in records:
        minute, user, key_id = int(r.at) // MINUTE * MINUTE, r.user[:150], r.key_id or 0
        # Cut to the columns (a client-chosen model name can be longer).
        combo, target, model = r.combo[:64], r.target[:512], r.requested_model[:256]
        ident = (minute, user, key_id, combo, target, model, status_class(r.status))
        key = keys.get(ident)
        if key is None:
            key = keys[ident] = (*ident[:3], r.key_prefix[:16], *ident[3:])
        c = rows.get(key)
        if c is None:
            c = rows[key] = [0] * len(COUNTERS)
        c[0] += 1
        if r.status >= 400 or r.status == 0 or r.outcome != "ok":
            c[1] += 1
        c[2] += sum(1 for a in r.attempts if a.get("outcome") == "hop")
        if r.input_tokens is None and r.output_tokens is None:
            # Served without a usage report: unknown, never counted as zero tokens. A request
            # that no upstream answered (refused, failed before output) spent nothing.
            if r.target:
                c[7] += 1
        else:
            c[3] += r.input_tokens or 0
            c[4] += r.cached_tokens or 0
            c[5] += r.output_tokens or 0
            c[6] += r.reasoning_tokens or 0
        c[8] += r.duration_ms
        c[_LAT0 + bisect.bisect_left(LATENCY_BOUNDS_MS, r.duration_ms)] += 1
        if r.ttft_ms is not None:
            c[9] += r.ttft_ms
            c[10] += 1
            c[_TTFT0 + bisect.bisect_left(TTFT_BOUNDS_MS, r.ttft_ms)] += 1
        if r.unpriced:
            c[_UNPRICED] += 1
        if r.cost_usd is not None:
            c[_COST] += r.cost_usd
        if r.api_value_usd is not None:
            c[_API_VALUE] += r.api_value_usd
        if r.usage_estimated:
            c[_ESTIMATED] += 1
    return rows


def _upsert(rows: Mapping[RowKey, Sequence[float]], resolution: int) -> None:
    if not rows:
        return
    q = connection.ops.quote_name
    table = q(UsageRollup._meta.db_table)
    columns = ("resolution", "bucket", *DIMENSIONS, *COUNTERS)
    placeholders = "(" + ", ".join(["%s"] * len(columns)) + ")"
    updates = ", ".join(f"{q(c)} = {table}.{q(c)} + EXCLUDED.{q(c)}" for c in COUNTERS)
    # A fixed order: concurrent writers lock conflicting rows in the same order (no deadlock).
    items = sorted(rows.items(), key=lambda kv: tuple(map(str, kv[0])))
    with connection.cursor() as cursor:
        for start in range(0, len(items), _CHUNK):
            chunk = items[start : start + _CHUNK]
            params: list[Any] = []
            for key, counters in chunk:
                bucket = dt.datetime.fromtimestamp(key[0], tz=dt.UTC)
                params += [resolution, connection.ops.adapt_datetimefield_value(bucket)]
                params += [*key[1:], *counters]
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(q(c) for c in columns)}) "
                f"VALUES {', '.join([placeholders] * len(chunk))} "
                f"ON CONFLICT ({', '.join(q(c) for c in _UNIQUE)}) DO UPDATE SET {updates}",
                params,
            )


def record_requests(*, records: Sequence[UsageRecord]) -> int:
    """Add one batch of finished requests to the per-minute rollups; the rows touched."""
    rows = aggregate(records)
    with transaction.atomic():
        _upsert(rows, MINUTE)
    return len(rows)


def compact(*, now: dt.datetime, retention_days: int) -> tuple[int, int]:
    """Fold minute rows older than a day into hour rows, then drop rows past the retention.
    Returns (minute rows folded, rows deleted by retention). Safe with several workers: the
    rows folded are the rows this transaction deleted, so none is added twice."""
    cutoff = (now - COMPACT_AFTER).replace(minute=0, second=0, microsecond=0)
    folded = 0
    while True:
        with transaction.atomic():
            found = list(
                UsageRollup.objects.select_for_update()
                .filter(resolution=MINUTE, bucket__lt=cutoff)
                .order_by("id")
                .values("id", "bucket", *DIMENSIONS, *COUNTERS)[:COMPACT_ROWS]
            )
            if not found:
                break
            ids = [row["id"] for row in found]
            deleted = 0
            for start in range(0, len(ids), 500):
                deleted += UsageRollup.objects.filter(id__in=ids[start : start + 500]).delete()[0]
            if deleted != len(found):
                # Another worker folded some of them first: roll back, let it finish.
                raise transaction.TransactionManagementError("usage rows folded concurrently")
            hours: dict[RowKey, list[float]] = {}
            for row in found:
                start_s = int(row["bucket"].timestamp()) // HOUR * HOUR
                key = (start_s, *(row[d] for d in DIMENSIONS))
                c = hours.get(key)
                if c is None:
                    c = hours[key] = [0] * len(COUNTERS)
                for i, name in enumerate(COUNTERS):
                    c[i] += row[name]
            _upsert(hours, HOUR)
            folded += len(found)
        if len(found) < COMPACT_ROWS:
            break
    expired = now - dt.timedelta(days=retention_days)
    removed = UsageRollup.objects.filter(bucket__lt=expired).delete()[0]
    return folded, removed
