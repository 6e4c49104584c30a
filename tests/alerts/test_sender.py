"""The outbox and its sender against real receivers: Slack and webhook bodies over real
sockets (tests/alerts/receiver.py), the HMAC signature, e-mail through Django's locmem backend,
retries with backoff (a receiver failing three times still gets the alert), a down destination
delaying only itself, giving up after 24 h, storm folding, `once` keys, team filters and the
one-sender lease. The clock is injected; nothing sleeps."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.contrib.auth.models import Group, User
from django.core import mail
from django.db import connection
from django.utils import timezone
from prometheus_client import REGISTRY

from accounts.models import ClientKey
from alerts import events, outbox, services
from alerts.models import FAILED, PENDING, SENT, AlertMessage
from alerts.sender import Sender, backoff
from tests.alerts.receiver import Receiver, serve

pytestmark = pytest.mark.django_db(transaction=True)
T = TypeVar("T")
SECRET = "whsec-test-0123456789"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec, stop = serve()
    try:
        yield rec
    finally:
        stop()


@pytest.fixture(autouse=True)
def _public_url(settings: Any) -> None:
    settings.OCX_PUBLIC_URL = "https://ocx.example"
    settings.OCX_ALERT_MIN_INTERVAL = 300
    settings.OCX_ALERT_RETRY_MS = 30_000


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        try:
            return await scenario()
        finally:
            await asyncio.get_running_loop().run_in_executor(None, lambda: connection.close())

    return asyncio.run(main())


class Clock:
    def __init__(self) -> None:
        self.now = timezone.now() + dt.timedelta(seconds=1)

    def __call__(self) -> dt.datetime:
        return self.now


def cooled(combo: str = "c1", target: str = "p/m") -> events.Alert:
    now = int(timezone.now().timestamp() * 1000)
    return events.target_cooled(combo, target, now + 60_000, "rate_limited", now)


def deliveries(destination: str, result: str) -> float:
    value = REGISTRY.get_sample_value(
        "ocx_alert_deliveries_total", {"destination": destination, "result": result}
    )
    return value or 0.0


def test_slack_and_signed_webhook_bodies_reach_real_receivers(receiver: Receiver) -> None:
    services.destination_set(
        name="chat", kind="slack", url=receiver.url + "/slack", events_wanted=["target_cooled"]
    )
    services.destination_set(
        name="hook",
        kind="webhook",
        url=receiver.url + "/hook",
        events_wanted=["target_cooled"],
        secret=SECRET,
    )
    services.destination_set(
        name="plain", kind="webhook", url=receiver.url + "/plain", events_wanted=["target_cooled"]
    )
    alert = cooled()
    assert outbox.write([alert]) == 3
    clock = Clock()
    before = deliveries("chat", "sent")

    assert run(lambda: Sender(clock=clock).tick(wait=True)) is True

    got = {r.path: r for r in receiver.wait_for(3)}
    assert json.loads(got["/slack"].body) == {
        "text": f"[ocx] {alert['text']}\nhttps://ocx.example/admin/combos/combo/?q=c1"
    }
    hook = got["/hook"]
    body = json.loads(hook.body)
    assert body["event"] == "target_cooled"
    assert body["text"] == alert["text"]
    assert body["link"] == "https://ocx.example/admin/combos/combo/?q=c1"
    assert body["folded"] == 0
    assert body["details"] == {
        "combo": "c1",
        "target": "p/m",
        "reason": "rate_limited",
        "until": body["details"]["until"],
        "seconds": 60,
    }
    expected = hmac.new(SECRET.encode(), hook.body, hashlib.sha256).hexdigest()
    assert hook.headers["x-ocx-signature"] == expected
    assert hook.headers["content-type"] == "application/json"
    assert "x-ocx-signature" not in got["/plain"].headers
    assert SECRET.encode() not in hook.body
    assert set(AlertMessage.objects.values_list("status", flat=True)) == {SENT}
    assert deliveries("chat", "sent") == before + 1


def test_a_receiver_that_fails_three_times_still_gets_the_alert(receiver: Receiver) -> None:
    services.destination_set(
        name="flaky", kind="slack", url=receiver.url, events_wanted=["target_cooled"]
    )
    outbox.write([cooled()])
    receiver.statuses = [500, 503, 502]
    clock = Clock()
    retries = deliveries("flaky", "retry")

    async def scenario() -> list[tuple[str, int, str]]:
        sender = Sender(clock=clock)
        seen = []
        for attempt in range(1, 5):
            await sender.tick(wait=True)
            row = await asyncio.to_thread(lambda: AlertMessage.objects.get())
            seen.append((row.status, row.attempts, row.last_error))
            if row.status == PENDING:
                # Not due before its backoff: a pass in between sends nothing.
                await sender.tick(wait=True)
                assert receiver.attempts == attempt
                assert row.next_at == clock.now + backoff(attempt, 30_000)
                clock.now = row.next_at
        await sender.aclose()
        return seen

    seen = run(scenario)
    assert seen == [
        (PENDING, 1, "HTTP 500"),
        (PENDING, 2, "HTTP 503"),
        (PENDING, 3, "HTTP 502"),
        (SENT, 4, ""),
    ]
    assert receiver.attempts == 4
    assert len(receiver.received) == 1
    assert deliveries("flaky", "retry") == retries + 3
    assert [backoff(n, 30_000).total_seconds() for n in (1, 2, 3, 9)] == [30, 60, 120, 3600]


def test_a_down_destination_delays_only_itself(receiver: Receiver) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/services/T0/B0/SECRETPATH"
    services.destination_set(name="down", kind="slack", url=dead, events_wanted=["target_cooled"])
    services.destination_set(
        name="up", kind="slack", url=receiver.url, events_wanted=["target_cooled"]
    )
    outbox.write([cooled("c1"), cooled("c2")])  # two messages for each destination
    clock = Clock()

    run(lambda: Sender(clock=clock).tick(wait=True))

    assert len(receiver.wait_for(2)) == 2
    down = list(AlertMessage.objects.filter(destination__name="down").order_by("id"))
    assert [m.status for m in down] == [PENDING, PENDING]
    # The first failed; the second waits behind its retry time without an attempt of its own.
    assert [m.attempts for m in down] == [1, 0]
    assert {m.next_at for m in down} == {clock.now + dt.timedelta(seconds=30)}
    assert down[0].last_error.startswith("ConnectError")
    assert "SECRETPATH" not in down[0].last_error and "127.0.0.1" not in down[0].last_error
    assert set(
        AlertMessage.objects.filter(destination__name="up").values_list("status", flat=True)
    ) == {SENT}


def test_a_message_is_given_up_after_24_hours(receiver: Receiver) -> None:
    services.destination_set(
        name="gone", kind="webhook", url=receiver.url, events_wanted=["target_cooled"]
    )
    outbox.write([cooled()])
    receiver.statuses = [500]
    clock = Clock()
    clock.now += dt.timedelta(hours=24)
    failed = deliveries("gone", "failed")

    run(lambda: Sender(clock=clock).tick(wait=True))

    row = AlertMessage.objects.get()
    assert (row.status, row.attempts, row.last_error) == (FAILED, 1, "HTTP 500")
    assert deliveries("gone", "failed") == failed + 1
    run(lambda: Sender(clock=clock).tick(wait=True))
    assert receiver.attempts == 1  # a failed message is not sent again


def test_email_goes_through_djangos_backend(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "ocx@example.com"
    services.destination_set(
        name="mail",
        kind="email",
        to=["lead@example.com", "ops@example.com"],
        events_wanted=["target_cooled"],
    )
    alert = cooled()
    outbox.write([alert])

    run(lambda: Sender(clock=Clock()).tick(wait=True))

    assert len(mail.outbox) == 1
    sent = mail.outbox[0]
    assert sent.to == ["lead@example.com", "ops@example.com"]
    assert sent.from_email == "ocx@example.com"
    assert sent.subject == f"[ocx] {alert['text']}"
    assert "https://ocx.example/admin/combos/combo/?q=c1" in sent.body
    assert '"target": "p/m"' in sent.body
    assert AlertMessage.objects.get().status == SENT


def test_a_storm_folds_into_one_message_per_key_and_interval(receiver: Receiver) -> None:
    services.destination_set(
        name="chat", kind="slack", url=receiver.url, events_wanted=["target_cooled"]
    )
    start = timezone.now()
    for _ in range(3):
        outbox.write([cooled()], now=start)
    outbox.write([cooled("c2")], now=start)
    assert sorted(AlertMessage.objects.values_list("key", "folded")) == [
        ("target_cooled:c1:p/m", 2),
        ("target_cooled:c2:p/m", 0),
    ]
    run(lambda: Sender(clock=Clock()).tick(wait=True))
    texts = sorted(json.loads(r.body)["text"] for r in receiver.wait_for(2))
    assert texts[0].startswith("[ocx] Target p/m of combo c1 is cooling down")
    assert "(and 2 more like it)" in texts[0]
    assert "more like it" not in texts[1]
    # After the interval the same key is a new message.
    outbox.write([cooled()], now=start + dt.timedelta(seconds=301))
    assert AlertMessage.objects.filter(key="target_cooled:c1:p/m").count() == 2


def test_once_keys_and_filters_by_event_and_team() -> None:
    infra = Group.objects.create(name="infra")
    ann = User.objects.create_user("ann")
    ann.groups.add(infra)
    bob = User.objects.create_user("bob")
    key = ClientKey.objects.create(user=ann, prefix="ocx_ann", digest="d" * 64)
    services.destination_set(
        name="infra-budgets",
        kind="webhook",
        url="http://127.0.0.1:9/x",
        events_wanted=["budget", "target_cooled"],
        teams=["infra"],
    )
    services.destination_set(
        name="quota-only", kind="webhook", url="http://127.0.0.1:9/y", events_wanted=["quota_low"]
    )

    def budget(scope: str, owner: str) -> events.Alert:
        return events.budget(
            {
                "percent": 80,
                "owner": owner,
                "scope": {"k": "key", "u": "user"}[scope[0]],
                "label": scope,
                "budget": {"kind": "tokens", "limit": 1000, "period": "day"},
                "window": None,
                "used": 800,
                "limit": 1000,
                "resetsAt": 2_000_000_000_000,
                "message": f"{owner} has used 80% of its budget",
                "at": 1_999_000_000_000,
            }
        )

    ann_key = budget(f"k{key.pk}", "key ocx_ann… of ann")
    assert outbox.write([ann_key, ann_key]) == 1  # once per budget, threshold and period
    assert outbox.write([ann_key]) == 0
    assert outbox.write([budget(f"u{bob.pk}", "user bob")]) == 0  # bob is in no team
    assert outbox.write([cooled()]) == 1  # no team dimension: the team filter does not apply
    row = AlertMessage.objects.get(event="budget")
    assert row.destination.name == "infra-budgets"
    assert row.payload["link"] == f"/admin/accounts/clientkey/{key.pk}/change/"
    assert row.payload["teams"] == ["infra"]
    assert row.payload["data"]["owner"] == "key ocx_ann… of ann"
    assert (row.payload["data"]["used"], row.payload["data"]["limit"]) == (800, 1000)


def test_one_sender_across_processes_holds_the_lease() -> None:
    clock = Clock()
    first, second = Sender(clock=clock, holder="a"), Sender(clock=clock, holder="b")
    assert run(lambda: first.tick()) is True
    assert run(lambda: second.tick()) is False
    assert run(lambda: first.tick()) is True  # renewed
    clock.now += dt.timedelta(seconds=31)  # `a` stopped renewing: the lease lapses
    assert run(lambda: second.tick()) is True
    assert run(lambda: first.tick()) is False


def test_the_in_memory_queue_folds_a_storm_per_key_per_second() -> None:
    now = [100.0]
    queue = outbox.AlertQueue(clock=lambda: now[0])
    taken: list[events.Alert] = []

    async def scenario() -> None:
        queue.writer.submit = taken.append  # type: ignore[method-assign,assignment]
        for _ in range(5):
            queue.offer(cooled())
        queue.offer(cooled("c2"))
        now[0] += 1.0
        queue.offer(cooled())

    asyncio.run(scenario())
    assert [(a["key"], a.get("folded", 0)) for a in taken] == [
        ("target_cooled:c1:p/m", 0),
        ("target_cooled:c2:p/m", 0),
        ("target_cooled:c1:p/m", 4),
    ]
