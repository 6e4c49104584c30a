"""The outbox: an event becomes one `AlertMessage` per destination that wants it.

`write()` is called in the transaction of the event where there is one (a budget event's row,
`usage.budget_events`), else as soon as the event is known: producers on the `/v1` path hand
alerts to an `AlertQueue` (in memory, bounded, never waits), whose background writer calls
`write()` in a thread, as the request log's writer does. Storms fold here: an event whose key
already has a message for that destination within `OCX_ALERT_MIN_INTERVAL` adds to that
message's `folded` count instead of a message of its own; a `once` key gets one message ever.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from prometheus_client import Counter

from alerts.events import Alert
from alerts.models import PENDING, AlertDestination, AlertMessage
from server.background import BatchWriter

ALERTS_DROPPED = Counter(
    "ocx_alerts_dropped_total", "Alert events dropped: the in-memory alert queue was full"
)
LOCAL_FOLD_S = 1.0  # a worker queues one event per key per second; the database folds the rest


def wants(destination: AlertDestination, alert: Alert) -> bool:
    """The destination's events and filters: a filter applies to events that have its dimension
    (a team filter to budgets and key expiry, a combo filter to routing events)."""
    if alert["event"] not in destination.events:
        return False
    if destination.teams and "teams" in alert:
        if not set(destination.teams) & set(alert["teams"]):
            return False
    if destination.combos and "combos" in alert:
        if not set(destination.combos) & set(alert["combos"]):
            return False
    return True


def _teams_of(scope: str) -> list[str]:
    """The teams a budget's counter belongs to: a team's own, or its user's teams."""
    kind, number = scope[:1], scope[1:]
    if not number.isdigit():
        return []
    if kind == "t":
        return list(Group.objects.filter(pk=int(number)).values_list("name", flat=True))
    user_id: int | None = int(number)
    if kind == "k":
        # The accounts app sits above this one: its model by name, as usage's selectors do.
        client_key = apps.get_model("accounts", "ClientKey")
        user_id = (
            client_key.objects.filter(pk=int(number)).values_list("user_id", flat=True).first()
        )
    elif kind != "u":
        return []
    if user_id is None:
        return []
    return sorted(
        get_user_model()
        .objects.filter(pk=user_id)
        .values_list("groups__name", flat=True)
        .exclude(groups__name=None)
    )


def write(alerts: Iterable[Alert], *, now: dt.datetime | None = None) -> int:
    """Outbox rows for `alerts` (ORM; call in the event's transaction when it has one).
    Returns the messages created."""
    destinations = list(AlertDestination.objects.all())
    if not destinations:
        return 0
    now = now or timezone.now()
    since = now - dt.timedelta(seconds=settings.OCX_ALERT_MIN_INTERVAL)
    created = 0
    with transaction.atomic():
        for alert in alerts:
            if "scope" in alert and "teams" not in alert:
                alert = {**alert, "teams": _teams_of(alert["scope"])}
            for destination in destinations:
                if not wants(destination, alert):
                    continue
                prior = AlertMessage.objects.filter(destination=destination, key=alert["key"])
                if alert.get("once"):
                    if prior.exists():
                        continue
                else:
                    recent = prior.filter(created__gte=since).order_by("-created").first()
                    if recent is not None:
                        AlertMessage.objects.filter(pk=recent.pk).update(
                            folded=F("folded") + 1 + alert.get("folded", 0)
                        )
                        continue
                AlertMessage.objects.create(
                    destination=destination,
                    event=alert["event"],
                    key=alert["key"][:300],
                    payload=dict(alert),
                    created=now,
                    folded=alert.get("folded", 0),
                    status=PENDING,
                    next_at=now,
                )
                created += 1
    return created


class AlertQueue:
    """What the `/v1` path hands alerts to: `offer()` never waits and does no I/O. One event per
    key per second goes to the bounded queue (the rest are counted into the next one); a full
    queue drops and counts (`ocx_alerts_dropped_total`)."""

    def __init__(self, *, maxsize: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self.writer: BatchWriter[Alert] = BatchWriter(
            "alerts", _write_batch, maxsize=maxsize, flush_s=0.5, on_drop=ALERTS_DROPPED.inc
        )
        self._clock = clock
        self._recent: dict[str, tuple[float, int]] = {}  # key -> (last queued, folded since)

    def offer(self, alert: Alert) -> bool:
        now = self._clock()
        key = alert["key"]
        seen = self._recent.get(key)
        if seen is not None and now - seen[0] < LOCAL_FOLD_S:
            self._recent[key] = (seen[0], seen[1] + 1)
            return False
        if len(self._recent) > 10_000:  # old keys are only a fold count: forget them
            self._recent = {k: v for k, v in self._recent.items() if now - v[0] < LOCAL_FOLD_S}
        if seen is not None and seen[1]:
            alert = {**alert, "folded": alert.get("folded", 0) + seen[1]}
        self._recent[key] = (now, 0)
        return self.writer.submit(alert)

    async def drain(self) -> None:
        await self.writer.drain()


def _write_batch(alerts: list[Alert]) -> None:
    write(alerts)
