"""The request log (PRODUCT §9.3): one entry per proxy request with its route trace,
written in batches off the hot path, with a retention."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from ocxsite import metrics
from ocxsite.background import BatchWriter

RETENTION_EVERY_S = 600.0


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
    attempts: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[list[str]] = field(default_factory=list)


_last_retention = 0.0


def write_entries(entries: list[RequestEntry]) -> None:
    from ocxsite.models import RequestLog

    global _last_retention
    rows = []
    for e in entries:
        # A shallow copy: entries are never touched once queued (`asdict` deep-copies, a third
        # of this function's time).
        data = dict(vars(e))
        data["at"] = dt.datetime.fromtimestamp(e.at, tz=dt.UTC)
        rows.append(RequestLog(**data))
    RequestLog.objects.bulk_create(rows)
    now = time.monotonic()
    if now - _last_retention > RETENTION_EVERY_S:
        _last_retention = now
        cutoff = timezone.now() - dt.timedelta(days=settings.OCX_REQUEST_LOG_RETENTION_DAYS)
        RequestLog.objects.filter(at__lt=cutoff).delete()


def new_writer() -> BatchWriter[RequestEntry]:
    return BatchWriter(
        "request log",
        write_entries,
        maxsize=settings.OCX_REQUEST_LOG_QUEUE,
        on_drop=metrics.REQUEST_LOG_DROPPED.inc,
    )
