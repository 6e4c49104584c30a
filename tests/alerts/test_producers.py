"""The producers' side of alerts: the key-expiry check (7 days and 1 day before, once each),
the quota watch (a window past the threshold, once per reset), and what a finished route tells
(a refused stored key, a combo with no target left)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from accounts.expiry_alerts import check_expiring, warning_due
from accounts.models import ClientKey
from alerts import events, services
from alerts.models import AlertMessage
from alerts.outbox import AlertQueue
from gateway import alerting
from quota.windows import Window
from routing.attempts import AttemptRecord
from routing.eligibility import TargetState

NOW = dt.datetime(2037, 3, 1, 12, 0, tzinfo=dt.UTC)
NOW_MS = int(NOW.timestamp() * 1000)


@pytest.mark.parametrize(
    ("left", "due"),
    [
        (dt.timedelta(days=8), None),
        (dt.timedelta(days=7), 7),
        (dt.timedelta(days=2), 7),
        (dt.timedelta(hours=24), 1),
        (dt.timedelta(minutes=5), 1),
        (dt.timedelta(0), None),
        (-dt.timedelta(hours=1), None),
    ],
)
def test_the_warning_due(left: dt.timedelta, due: int | None) -> None:
    assert warning_due(NOW + left, NOW) == due


@pytest.mark.django_db
def test_key_expiry_warnings_once_each_for_active_keys(settings: Any) -> None:
    settings.OCX_PUBLIC_URL = ""
    infra = Group.objects.create(name="infra")
    ann = User.objects.create_user("ann")
    ann.groups.add(infra)
    gone = User.objects.create_user("gone", is_active=False)
    soon = ClientKey.objects.create(
        user=ann, name="ci", prefix="ocx_soon", digest="a" * 64, expires=NOW + dt.timedelta(days=3)
    )
    ClientKey.objects.create(  # far away, revoked, inactive user, already expired: nothing
        user=ann, prefix="ocx_far", digest="b" * 64, expires=NOW + dt.timedelta(days=30)
    )
    ClientKey.objects.create(
        user=ann,
        prefix="ocx_rev",
        digest="c" * 64,
        expires=NOW + dt.timedelta(days=1),
        revoked=NOW,
    )
    ClientKey.objects.create(
        user=gone, prefix="ocx_gone", digest="d" * 64, expires=NOW + dt.timedelta(days=1)
    )
    ClientKey.objects.create(
        user=ann, prefix="ocx_old", digest="e" * 64, expires=NOW - dt.timedelta(days=1)
    )
    services.destination_set(
        name="leads",
        kind="slack",
        url="https://hooks.example/x",
        events_wanted=["key_expiring"],
        teams=["infra"],
    )

    assert check_expiring(NOW) == 1
    assert check_expiring(NOW + dt.timedelta(hours=1)) == 1  # checked again: still one message
    assert AlertMessage.objects.count() == 1
    check_expiring(NOW + dt.timedelta(days=2, hours=1))  # under a day left: the 1-day warning
    rows = list(AlertMessage.objects.order_by("id"))
    assert [r.payload["data"]["warning"] for r in rows] == ["7d", "1d"]
    assert rows[0].payload["text"] == (
        "Client key ocx_soon… (ci) of ann expires in 3 day(s) 0 hour(s), at 2037-03-04T12:00:00Z"
    )
    assert (
        rows[1]
        .payload["text"]
        .startswith(
            "Client key ocx_soon… (ci) of ann expires in 23 hour(s), at 2037-03-04T12:00:00Z"
        )
    )
    assert rows[0].payload["link"] == f"/admin/accounts/clientkey/{soon.pk}/change/"
    assert rows[0].payload["teams"] == ["infra"]


def test_the_quota_watch_tells_once_per_window_reset() -> None:
    taken: list[events.Alert] = []
    queue = AlertQueue()
    queue.offer = taken.append  # type: ignore[method-assign,assignment]
    watch = alerting.QuotaWatch(90)

    def window(percent: float, reset: int) -> Window:
        return Window("five_hour", percent, 300, reset, NOW_MS)

    watch.check(queue, ("codex", "fp1"), [window(89.9, 1)], NOW_MS)
    watch.check(queue, ("codex", "fp1"), [window(92.04, 1)], NOW_MS)
    watch.check(queue, ("codex", "fp1"), [window(97, 1)], NOW_MS)  # same reset: told already
    watch.check(queue, ("codex", "fp1"), [window(95, 2_000_000_000_000)], NOW_MS)  # next window
    assert [a["key"] for a in taken] == [
        "quota_low:codex:fp1:five_hour:1",
        "quota_low:codex:fp1:five_hour:2000000000000",
    ]
    assert taken[1]["text"] == (
        "Quota of provider codex (credential fp1): the five_hour window is 95% used "
        "(threshold 90%); it resets at 2033-05-18T03:33:20Z"
    )
    assert taken[0]["data"]["usedPercent"] == 92
    assert taken[0]["once"] is True


def test_a_finished_route_tells_refused_keys_and_an_empty_combo() -> None:
    taken: list[events.Alert] = []
    queue = AlertQueue()
    queue.offer = taken.append  # type: ignore[method-assign,assignment]
    attempts = [
        AttemptRecord("p/a", 401, "hop", "auth"),
        AttemptRecord("q/b", 429, "hop", "rate_limited"),
        AttemptRecord("r/c", 403, "stop", "forbidden"),
        AttemptRecord("s/d", 401, "hop", "caller_credential"),  # the caller's own token
    ]
    alerting.after_route(queue, "main", attempts, None, None, NOW_MS)
    assert [(a["event"], a["key"]) for a in taken] == [
        ("provider_auth_failed", "provider_auth_failed:p"),
        ("provider_auth_failed", "provider_auth_failed:r"),
    ]
    assert taken[1]["data"] == {"provider": "r", "target": "r/c", "combo": "main", "status": 403}
    taken.clear()
    states = [TargetState("p/a", "cooling", reason="auth"), TargetState("q/b", "out_of_quota")]
    alerting.after_route(queue, "main", [], states, "30", NOW_MS)
    (alert,) = taken
    assert alert["text"] == (
        "Combo main has no target left (p/a: cooling (auth); q/b: out_of_quota); "
        "earliest retry in 30 s"
    )
    assert alert["combos"] == ["main"] and alert["data"]["retryAfterSeconds"] == 30


def test_the_attempt_loop_says_when_a_cooled_target_serves_again() -> None:
    from routing.attempts import Outcome, route
    from routing.state import MemoryStateStore
    from routing.types import ComboSpec, ProviderSpec, TargetSpec

    combo = ComboSpec(id="c", targets=(TargetSpec("p", "a"),))
    providers = {"p": ProviderSpec(name="p", adapter="openai-responses", base_url="http://x")}
    store = MemoryStateStore()
    recovered: list[str] = []
    now = [1_000]

    async def dispatch(target: TargetSpec, last: bool, **_: object) -> Outcome:
        return Outcome(committed=True)

    async def sleep(ms: int) -> None:
        now[0] += ms

    async def scenario() -> None:
        import random

        from routing import state as st

        kwargs: dict[str, Any] = dict(
            dispatch=dispatch,
            now=lambda: now[0],
            sleep=sleep,
            rng=random.Random(1),
            on_recovered=recovered.append,
        )
        await route(combo, providers, store, **kwargs)
        assert recovered == []  # healthy all along
        await store.update("c", lambda s: (st.note_failure(s, combo, "p/a", 500, 0), None))
        await route(combo, providers, store, **kwargs)
        assert recovered == ["p/a"]
        await route(combo, providers, store, **kwargs)
        assert recovered == ["p/a"]

    asyncio.run(scenario())


def test_builders_name_the_thing_and_link_to_it() -> None:
    alert = events.target_cooled("main", "p/a", NOW_MS + 90_000, "server_error", NOW_MS)
    assert alert["text"] == (
        "Target p/a of combo main is cooling down for 90 s (until 2037-03-01T12:01:30Z): "
        "server_error"
    )
    assert alert["link"] == "/admin/combos/combo/?q=main"
    assert timezone.is_aware(NOW)
