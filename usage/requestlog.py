"""The request log (PRODUCT §9.3): one entry per proxy request with its route trace,
written in batches off the hot path, with a retention."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import Error as DbError
from django.db import connection, transaction
from django.db.models import CharField
from django.utils import timezone

from routing.pricing import PriceBook
from routing.types import ConfigSnapshot
from server import metrics
from server.background import BatchWriter

RETENTION_EVERY_S = 600.0
log = logging.getLogger("ocx.requestlog")


@dataclass
class RequestEntry:
    request_id: str
    at: float
    key_prefix: str = ""
    user: str = ""
    requested_model: str = ""
    combo: str = ""
    target: str = ""
    status: int = 0
    outcome: str = ""
    stream: bool = False
    duration_ms: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    # The request's token usage for accounting and budgets: input/output/cached/reasoning, all
    # None when the upstream reported none (unknown, never zero). Not in the RequestLog table.
    reasoning_tokens: int | None = None
    # Set by the writer (`price_entries`), never on the hot path: the cost in USD and the value
    # at API prices (None = unknown), and whether the target has no price at all.
    cost_usd: float | None = None
    api_value_usd: float | None = None
    unpriced: bool = False
    key_id: int | None = None
    # The tokens are ocx's estimate (`usage.estimate.settle`), and the budget that refused a
    # `budget_exceeded` request (its owner and limit).
    usage_estimated: bool = False
    budget: str = ""
    # The upstream sent a usage figure that was no integer (not stored: `usage_estimated` is).
    usage_bad: bool = False
    # Time from the request's arrival to the response start (commit), when it got that far.
    ttft_ms: int | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[list[str]] = field(default_factory=list)


def new_request_id(now_ns: int | None = None) -> str:
    """A request id: a UUIDv7 (RFC 9562) in hex, the milliseconds since the epoch first.

    Time-ordered, so the request log's `request_id` index grows at its end. A random UUID4
    put each row on a random page of that index: with the index larger than the database's
    page cache, a batch of 200 rows read and rewrote about 200 pages, and a worker spent 5 %
    more CPU per request at c=16-64 (bench/README.md, seventh run); more as the log grows."""
    ms = (time.time_ns() if now_ns is None else now_ns) // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 random bits, 74 of them used
    value = (
        (ms & 0xFFFF_FFFF_FFFF) << 80
        | 0x7 << 76  # version 7
        | (rand >> 68) << 64  # rand_a, 12 bits
        | 0b10 << 62  # the RFC 4122 variant
        | rand & ((1 << 62) - 1)  # rand_b, 62 bits
    )
    return f"{value:032x}"


_last_retention = 0.0
_last_usage_compact = 0.0


# What a database cannot store in text: NUL (PostgreSQL refuses it in text and jsonb) and lone
# surrogates (not encodable as UTF-8), which a client can send as `\u0000` / `\ud800` in JSON.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def clean_text(value: str) -> str:
    """`value` with every unstorable character replaced by U+FFFD (one test when clean)."""
    return _UNSTORABLE.sub("\ufffd", value)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): _clean(v) for k, v in value.items()}
    return value


_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
_TOKEN_MAX = 2**31 - 1  # the columns' range


def clean_entry(entry: RequestEntry) -> RequestEntry:
    """Clean every string of an entry (model, target and the route trace can come from the
    client) before it reaches a writer: one bad row must not fail a batch (issue #26), nor a
    token figure out of the columns' range (issue 42: the proxy already replaced it by its
    estimate; this is the last line, which keeps the row and drops the figures)."""
    for name, value in vars(entry).items():
        if isinstance(value, (str, list)):
            setattr(entry, name, _clean(value))
    for name in _TOKEN_FIELDS:
        value = getattr(entry, name)
        if value is not None and not (isinstance(value, int) and 0 <= value <= _TOKEN_MAX):
            for other in _TOKEN_FIELDS:
                setattr(entry, other, None)
            entry.usage_estimated = True
            break
    return entry


_prices = PriceBook()
_db_snapshot: tuple[int, ConfigSnapshot] | None = None


def _stored_snapshot() -> ConfigSnapshot:
    """The stored config, read again only when its version moved (a writer without a runtime)."""
    global _db_snapshot
    from combos import selectors

    version = selectors.config_version()
    if _db_snapshot is None or _db_snapshot[0] != version:
        _db_snapshot = (version, selectors.config_snapshot())
    return _db_snapshot[1]


def price_entries(entries: list[RequestEntry], snapshot: ConfigSnapshot | None) -> None:
    """Each served entry's cost from its usage and its target's price, per batch in the writer's
    thread; rates are looked up once per (provider, model) and day (`PriceBook`)."""
    if not any(e.target for e in entries):
        return
    config = snapshot if snapshot is not None else _stored_snapshot()
    failed = False
    for e in entries:
        if not e.target:
            continue
        try:
            priced = _prices.price(
                config,
                e.target,
                at=e.at,
                input_tokens=e.input_tokens,
                cached_tokens=e.cached_tokens,
                output_tokens=e.output_tokens,
            )
        except Exception:  # noqa: BLE001 - a pricing fault must not lose the batch's rows
            if not failed:  # once per batch
                failed = True
                log.exception("request log: pricing %s failed; written without a cost", e.target)
            continue
        e.cost_usd, e.api_value_usd, e.unpriced = (
            priced.cost_usd,
            priced.api_value_usd,
            priced.unpriced,
        )


def write_entries(
    entries: list[RequestEntry], snapshot: Callable[[], ConfigSnapshot | None] | None = None
) -> None:
    """Write one batch: price it (`snapshot` gives the serving process's config; without one
    the stored config is read), then the log rows and the usage counts."""
    for entry in entries:
        clean_entry(entry)
    if settings.OCX_REQUEST_LOG or settings.OCX_USAGE:
        price_entries(entries, None if snapshot is None else snapshot())
    # The log rows and the usage counts of a batch commit together: a batch kept and retried
    # while the database is unreachable is then neither half written nor counted twice.
    with transaction.atomic():
        if settings.OCX_REQUEST_LOG:
            _write_log(entries)
        if settings.OCX_USAGE:
            from usage import services as usage_services

            usage_services.record_requests(records=entries)
    _housekeeping()


def _housekeeping() -> None:
    """Retention and usage downsampling when due. Runs after the batch committed, so a failure
    here is logged and tried again later, never a reason to write the batch again."""
    global _last_retention, _last_usage_compact
    now = time.monotonic()
    try:
        if settings.OCX_REQUEST_LOG and now - _last_retention > RETENTION_EVERY_S:
            _last_retention = now
            from usage.models import RequestLog

            cutoff = timezone.now() - dt.timedelta(days=settings.OCX_REQUEST_LOG_RETENTION_DAYS)
            RequestLog.objects.filter(at__lt=cutoff).delete()
        if settings.OCX_USAGE and now - _last_usage_compact > RETENTION_EVERY_S:
            _last_usage_compact = now
            from usage import services as usage_services

            usage_services.compact(
                now=timezone.now(), retention_days=settings.OCX_USAGE_RETENTION_DAYS
            )
    except DbError:
        log.exception("request log: retention or usage downsampling failed; tried again later")
        with contextlib.suppress(DbError):
            connection.close()


class _Insert:
    """The log rows of a batch in one statement: `COPY … FROM STDIN` on PostgreSQL, a prepared
    `INSERT` with `executemany` on SQLite. The ORM's `bulk_create` builds a model instance and
    compiles every field of every row (measured: 50 µs CPU per row against 16 µs with COPY and
    20 µs with SQLite's executemany); here a row is a tuple and only the columns that need it
    (the timestamp, the JSON route trace) go through the field's own conversion."""

    def __init__(self) -> None:
        from usage.models import RequestLog

        fields = [f for f in RequestLog._meta.concrete_fields if not f.primary_key]
        quote = connection.ops.quote_name
        self.names = [f.attname for f in fields]
        table = quote(RequestLog._meta.db_table)
        columns = ", ".join(quote(str(f.column)) for f in fields)
        self.sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})"
        self.copy_sql = f"COPY {table} ({columns}) FROM STDIN"
        # A client-chosen model name longer than its column must not fail the batch.
        self.limits = [
            f.max_length if isinstance(f, CharField) and f.max_length else None for f in fields
        ]
        self.convert = [
            f if f.get_internal_type() in ("DateTimeField", "JSONField") else None for f in fields
        ]

    def rows(self, entries: list[RequestEntry]) -> list[tuple[Any, ...]]:
        rows = []
        for e in entries:
            data = vars(e)
            row = []
            for name, limit, model_field in zip(self.names, self.limits, self.convert, strict=True):
                value = data[name]
                if limit is not None and len(value) > limit:
                    value = value[:limit]
                elif model_field is not None:
                    if name == "at":
                        value = dt.datetime.fromtimestamp(value, tz=dt.UTC)
                    value = model_field.get_db_prep_save(value, connection)
                row.append(value)
            rows.append(tuple(row))
        return rows


@functools.cache
def _insert() -> _Insert:
    return _Insert()  # one database per process: built on the first batch


def _write_log(entries: list[RequestEntry]) -> None:
    if not entries:
        return
    insert = _insert()
    rows = insert.rows(entries)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # COPY: one statement for the batch (executemany still runs one INSERT per row).
            # On the driver's own cursor, so its errors are turned into Django's here: an
            # unreachable database must stay an OperationalError (the batch is kept and
            # retried), not a psycopg one (the batch would be dropped).
            with connection.wrap_database_errors, cursor.cursor.copy(insert.copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            cursor.executemany(insert.sql, rows)


def new_writer(
    snapshot: Callable[[], ConfigSnapshot | None] | None = None,
) -> BatchWriter[RequestEntry]:
    return BatchWriter(
        "request log",
        functools.partial(write_entries, snapshot=snapshot),
        maxsize=settings.OCX_REQUEST_LOG_QUEUE,
        on_drop=metrics.REQUEST_LOG_DROPPED.inc,
        ident=lambda entry: entry.request_id,
    )
