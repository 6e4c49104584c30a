"""The one sender: delivers the outbox, retries with backoff for 24 h, runs the periodic checks.

Every worker runs a `Sender`, but only the holder of the lease row (`SenderLease`, renewed every
pass, taken over once it lapses) sends: one sender across workers and servers on one database.
Each destination is delivered by a task of its own, so a destination that is down or slow
delays only its own messages; a failure puts that destination's pending messages back behind the
retry time (attempts 1, 2, 3 … wait `OCX_ALERT_RETRY_MS` × 1, 2, 4 … up to an hour); a message
not delivered 24 h after it was written is marked failed. Failures show in the admin (the
message's status and last error) and in `/metrics` (`ocx_alert_deliveries_total`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence

import httpx
from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone
from prometheus_client import Counter

from alerts import delivery
from alerts.models import FAILED, PENDING, SENT, AlertDestination, AlertMessage, SenderLease
from server.background import in_thread

log = logging.getLogger("ocx.alerts")

DELIVERIES = Counter(
    "ocx_alert_deliveries_total",
    "Alert deliveries by destination and result (sent, retry: failed and kept, failed: given up)",
    ["destination", "result"],
)
RETRY_FOR = dt.timedelta(hours=24)
RETRY_MAX = dt.timedelta(hours=1)
LEASE = dt.timedelta(seconds=30)
KEEP = dt.timedelta(days=30)  # delivered and failed messages are kept this long, then deleted
BATCH = 50

Periodic = Callable[[dt.datetime], object]


def backoff(attempts: int, base_ms: int) -> dt.timedelta:
    """The wait after the `attempts`-th failed attempt: base × 2^(attempts-1), at most 1 h."""
    return min(dt.timedelta(milliseconds=base_ms * 2 ** min(attempts - 1, 20)), RETRY_MAX)


def take_lease(holder: str, now: dt.datetime, *, name: str = "sender") -> bool:
    """Take or renew the sender lease; True when `holder` has it until now + LEASE."""
    until = now + LEASE
    taken = SenderLease.objects.filter(Q(holder=holder) | Q(until__lt=now), name=name).update(
        holder=holder, until=until
    )
    if taken:
        return True
    if SenderLease.objects.filter(name=name).exists():
        return False  # another process holds it (no failing insert every pass)
    try:
        with transaction.atomic():
            SenderLease.objects.create(name=name, holder=holder, until=until)
    except IntegrityError:
        return False  # another process holds it
    return True


def release_lease(holder: str, *, name: str = "sender") -> None:
    SenderLease.objects.filter(name=name, holder=holder).delete()


def due(now: dt.datetime, busy: Sequence[int]) -> dict[int, list[AlertMessage]]:
    """Pending messages whose time has come, per destination (not those being delivered)."""
    rows = (
        AlertMessage.objects.select_related("destination")
        .filter(status=PENDING, next_at__lte=now)
        .exclude(destination_id__in=list(busy))
        .order_by("next_at", "id")[: BATCH * 4]
    )
    out: dict[int, list[AlertMessage]] = {}
    for row in rows:
        group = out.setdefault(row.destination_id, [])
        if len(group) < BATCH:
            group.append(row)
    return out


def mark_sent(message_id: int, now: dt.datetime) -> None:
    AlertMessage.objects.filter(pk=message_id).update(
        status=SENT, sent_at=now, last_error="", attempts=F("attempts") + 1
    )


def mark_failed(message: AlertMessage, error: str, now: dt.datetime, base_ms: int) -> str:
    """Record a failed attempt: retried later (and the destination's other pending messages
    wait as long), or given up 24 h after the message was written. Returns the result."""
    attempts = message.attempts + 1
    if now - message.created >= RETRY_FOR:
        AlertMessage.objects.filter(pk=message.pk).update(
            status=FAILED, attempts=attempts, last_error=error[:500]
        )
        return "failed"
    later = now + backoff(attempts, base_ms)
    with transaction.atomic():
        AlertMessage.objects.filter(pk=message.pk).update(
            attempts=attempts, last_error=error[:500], next_at=later
        )
        AlertMessage.objects.filter(
            destination_id=message.destination_id, status=PENDING, next_at__lt=later
        ).update(next_at=later)
    return "retry"


def prune(now: dt.datetime) -> int:
    deleted, _ = AlertMessage.objects.filter(
        status__in=(SENT, FAILED), created__lt=now - KEEP
    ).delete()
    return deleted


class Sender:
    def __init__(
        self,
        *,
        periodic: Sequence[Periodic] = (),
        periodic_every: dt.timedelta = dt.timedelta(minutes=10),
        clock: Callable[[], dt.datetime] = timezone.now,
        holder: str | None = None,
    ) -> None:
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.periodic = (*periodic, prune)
        self.periodic_every = periodic_every
        self.clock = clock
        self.busy: dict[int, asyncio.Task[None]] = {}
        self._periodic_at: dt.datetime | None = None
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run on `loop` (it may not be running yet: a worker starting)."""
        if self._task is None or self._task.done():
            self._task = loop.create_task(self.run())

    async def run(self) -> None:
        failing = False
        while True:
            try:
                await self.tick()
                if failing:
                    log.warning("alert sender: database reachable again")
                failing = False
            except DatabaseError as exc:
                if not failing:  # said once per outage: the outbox waits in the database
                    log.warning("alert sender: database unreachable (%s)", type(exc).__name__)
                failing = True
            except Exception:  # noqa: BLE001 - the sender must outlive a bad pass
                log.exception("alert sender pass failed")
            await asyncio.sleep(settings.OCX_ALERT_POLL_MS / 1000)

    async def tick(self, *, wait: bool = False) -> bool:
        """One pass: take the lease, run the periodic checks when due, start a delivery task
        per destination with due messages (`wait`: and wait for them). False: not the sender."""
        now = self.clock()
        if not await in_thread(take_lease, self.holder, now):
            return False
        if self._periodic_at is None or now >= self._periodic_at:
            self._periodic_at = now + self.periodic_every
            for check in self.periodic:
                try:
                    await in_thread(check, now)
                except DatabaseError:
                    raise
                except Exception:  # noqa: BLE001 - one check's bug must not stop delivery
                    log.exception("alert check %s failed", getattr(check, "__name__", check))
        self.busy = {d: t for d, t in self.busy.items() if not t.done()}
        jobs = await in_thread(due, now, list(self.busy))
        loop = asyncio.get_running_loop()
        for destination_id, messages in jobs.items():
            self.busy[destination_id] = loop.create_task(self._deliver_all(messages))
        if wait and self.busy:
            await asyncio.gather(*self.busy.values())
        return True

    async def _deliver_all(self, messages: list[AlertMessage]) -> None:
        for message in messages:
            if not await self._deliver(message):
                return  # the destination failed: the rest waits behind the retry time

    async def _deliver(self, message: AlertMessage) -> bool:
        destination: AlertDestination = message.destination
        try:
            if destination.kind == "email":
                await in_thread(
                    lambda: delivery.send_email(
                        to=list(destination.to), payload=message.payload, folded=message.folded
                    )
                )
            else:
                if self._client is None:
                    self._client = httpx.AsyncClient()
                await delivery.post(
                    self._client,
                    kind=destination.kind,
                    url=destination.url,
                    sealed=destination.secret,
                    payload=message.payload,
                    folded=message.folded,
                )
        except delivery.DeliveryError as exc:
            result = await in_thread(
                mark_failed, message, str(exc), self.clock(), settings.OCX_ALERT_RETRY_MS
            )
            DELIVERIES.labels(destination.name, result).inc()
            log.warning(
                "alert %s to %s: attempt %d failed (%s)%s",
                message.event,
                destination.name,
                message.attempts + 1,
                exc,
                "; given up after 24 h" if result == "failed" else "",
            )
            return False
        await in_thread(mark_sent, message.pk, self.clock())
        DELIVERIES.labels(destination.name, "sent").inc()
        return True

    async def stop(self) -> None:
        """A graceful stop: deliveries in flight end (they are marked either way), the lease
        is given back so that another process takes over at once."""
        if self._task is not None:
            self._task.cancel()
        if self.busy:
            await asyncio.wait(list(self.busy.values()), timeout=2)
        try:
            await in_thread(release_lease, self.holder)
        except DatabaseError as exc:  # the lease lapses by itself (30 s)
            log.warning("alert sender: could not give the lease back (%s)", type(exc).__name__)
        await self.aclose()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for task in self.busy.values():
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
