"""The runtime's budget gate and what happens to its 80 % / 100 % events: a log line, a push
to `/ws/events`, and a `BudgetEvent` row (written in batches off the hot path, shown in the
admin) with, in the same transaction, the alert messages it makes (`alerts.outbox`)."""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction

from alerts import events as alert_events
from alerts import outbox
from server.background import BatchWriter
from state.budget_store import MemoryBudgetStore, RedisBudgetStore
from usage.budget_gate import BudgetGate

log = logging.getLogger("ocx.budget")


def write_events(events: list[dict[str, Any]]) -> None:
    from usage.models import BudgetEvent

    rows = [
        BudgetEvent(
            at=dt.datetime.fromtimestamp(e["at"] / 1000, tz=dt.UTC),
            owner=e["owner"][:200],
            scope=e["scope"],
            percent=e["percent"],
            budget=e["budget"],
            window=e["window"] or "",
            used=e["used"],
            limit=e["limit"],
            resets_at=dt.datetime.fromtimestamp(e["resetsAt"] / 1000, tz=dt.UTC),
            message=e["message"],
        )
        for e in events
    ]
    with transaction.atomic():  # the events and their alerts' outbox rows, together
        BudgetEvent.objects.bulk_create(rows)
        try:
            with transaction.atomic():
                outbox.write([alert_events.budget(e) for e in events])
        except (OperationalError, InterfaceError):
            raise  # the database is unreachable: the batch is kept and retried whole
        except Exception:  # noqa: BLE001 - an alert's failure must not lose the budget events
            log.exception("could not write the alerts of %d budget event(s)", len(events))


def new_writer() -> BatchWriter[dict[str, Any]]:
    """The `BudgetEvent` writer (the runtime keeps it, to drain it at shutdown)."""
    return BatchWriter("budget events", write_events, maxsize=1000)


def new_gate(
    emit: Callable[[dict[str, object]], None],
    now_ms: Callable[[], int],
    writer: BatchWriter[dict[str, Any]] | None = None,
) -> BudgetGate:
    """A gate on Redis when `REDIS_URL` is set (exact across workers), else per process."""
    if writer is None:
        writer = new_writer()

    def on_event(event: dict[str, object]) -> None:
        event["at"] = now_ms()
        log.warning("budget %s%%: %s", event["percent"], event["message"])
        emit(event)
        writer.submit(event)

    store = (
        RedisBudgetStore(settings.OCX_REDIS_URL) if settings.OCX_REDIS_URL else MemoryBudgetStore()
    )
    recorded = None
    if settings.OCX_USAGE or settings.OCX_REQUEST_LOG:
        from usage.budget_selectors import budget_recorded

        # Durable budgets: counters start from what was recorded this period (issue 27).
        recorded = functools.partial(budget_recorded, tz=settings.OCX_TIME_ZONE)
    return BudgetGate(
        store,
        prefix=settings.OCX_STATE_KEY_PREFIX,
        tz=settings.OCX_TIME_ZONE,
        on_event=on_event,
        recorded=recorded,
    )
