"""`usage.verify` on its own (issue 42): the request log against the rollups, and the budget
counters against the records, with counters read through an injected reader."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import ClientKey
from usage import verify
from usage.requestlog import RequestEntry, write_entries

pytestmark = pytest.mark.django_db


def _entry(key: ClientKey, now: dt.datetime, n: int) -> RequestEntry:
    return RequestEntry(
        request_id=f"r{n}",
        at=now.timestamp(),
        key_prefix=key.prefix,
        key_id=key.pk,
        user="vera",
        target="",
        status=200,
        outcome="ok",
        input_tokens=60,
        output_tokens=40,
    )


def _reader(values: dict[str, int], seeded: bool = True) -> verify.CounterReader:
    def read(names: Sequence[str], prefix: str) -> tuple[list[int], bool]:
        return [values.get(name.rsplit(":", 4)[1], 0) for name in names], seeded

    return read


def test_counters_are_compared_with_the_records_and_differences_named() -> None:
    now = timezone.now().replace(second=0, microsecond=0) - dt.timedelta(minutes=1)
    user = get_user_model().objects.create_user("vera")
    key = ClientKey.objects.create(
        user=user,
        prefix="ocx_Vera01",
        digest="v" * 64,
        budgets=[{"tokens": 10**6, "period": "day"}],
    )
    write_entries([_entry(key, now, 1), _entry(key, now, 2)])  # 200 tokens recorded
    since = verify.start_of_today(timezone.now())
    scope = f"k{key.pk}"

    agreed = verify.verify(since=since, now=timezone.now(), counters=_reader({scope: 200}))
    assert agreed.agrees, agreed.text()
    assert agreed.checked == [
        "request log against rollups: 1 key(s), 2 request(s)",
        "budget counters against records: 1 counter(s)",
    ]
    assert agreed.text().endswith("the ledger agrees")

    ahead = verify.verify(since=since, now=timezone.now(), counters=_reader({scope: 300}))
    assert ahead.differences == ["key ocx_Vera01…: tokens this day: counter 300, records 200"]
    assert ahead.text().endswith("1 difference(s)")

    flushed = verify.verify(since=since, now=timezone.now(), counters=_reader({}, seeded=False))
    assert flushed.agrees and "emptied" in flushed.notes[0]

    without = verify.verify(
        since=since, now=timezone.now(), counters=None, counters_note=verify.NO_COUNTERS
    )
    assert without.agrees and without.notes == [verify.NO_COUNTERS]


def test_since_defaults_to_today_and_is_checked() -> None:
    now = dt.datetime(2026, 12, 5, 9, 30, 15, tzinfo=dt.UTC)
    assert verify.parse_since(None, now=now) == dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    assert verify.parse_since("2h", now=now) == dt.datetime(2026, 12, 5, 7, 30, tzinfo=dt.UTC)
    assert verify.parse_since("3d", now=now) == dt.datetime(2026, 12, 2, 9, tzinfo=dt.UTC)
    from usage.selectors import UsageQueryError

    with pytest.raises(UsageQueryError, match="since"):
        verify.parse_since("yesterday", now=now)
