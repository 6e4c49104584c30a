"""Usage rollups (PRODUCT §9.5) at unit level: in-memory aggregation of one batch, the
increment-only upsert (two batches and concurrent writers on the same bucket), minute → hour
downsampling, retention, and the selectors behind `GET /api/usage` and `ocx usage`."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import os
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from usage import selectors, services
from usage.models import HOUR, MINUTE, UsageRollup
from usage.requestlog import RequestEntry

T0 = dt.datetime(2026, 3, 2, 10, 15, 30, tzinfo=dt.UTC)


def entry(
    *,
    at: dt.datetime = T0,
    user: str = "ann",
    key_id: int = 1,
    target: str = "p/m",
    status: int = 200,
    outcome: str = "ok",
    tokens: tuple[int | None, int | None, int | None, int | None] = (100, 20, 10, 5),
    ms: int = 300,
    ttft: int | None = 120,
    attempts: list[dict[str, Any]] | None = None,
    cost: tuple[float | None, float | None, bool] = (None, None, False),
) -> RequestEntry:
    inp, out, cached, reasoning = tokens
    cost_usd, api_value_usd, unpriced = cost
    return RequestEntry(
        request_id="r",
        at=at.timestamp(),
        key_prefix=f"ocx_k{key_id}",
        user=user,
        requested_model="combo/c",
        combo="c",
        target=target,
        status=status,
        outcome=outcome,
        duration_ms=ms,
        input_tokens=inp,
        output_tokens=out,
        cached_tokens=cached,
        reasoning_tokens=reasoning,
        key_id=key_id,
        ttft_ms=ttft,
        attempts=attempts or [],
        cost_usd=cost_usd,
        api_value_usd=api_value_usd,
        unpriced=unpriced,
    )


def test_aggregate_one_batch() -> None:
    rows = services.aggregate(
        [
            entry(attempts=[{"outcome": "hop"}, {"outcome": "served"}]),
            entry(tokens=(50, 5, None, None), ms=4000, ttft=None),
            entry(tokens=(None, None, None, None)),  # served, usage not reported
            entry(target="", status=401, outcome="invalid_api_key", tokens=(None,) * 4),
            entry(at=T0 + dt.timedelta(minutes=1)),
        ]
    )
    minute = int(T0.timestamp()) // 60 * 60
    ok = rows[(minute, "ann", 1, "ocx_k1", "c", "p/m", "combo/c", "2xx")]
    c = dict(zip(services.COUNTERS, ok, strict=True))
    assert c["requests"] == 3 and c["errors"] == 0 and c["hops"] == 1
    assert (c["input_tokens"], c["output_tokens"]) == (150, 25)
    assert (c["cached_input_tokens"], c["reasoning_tokens"]) == (10, 5)
    assert c["unknown_usage_requests"] == 1
    assert c["latency_ms_sum"] == 4600
    # 300 ms twice in the (250, 500] bucket, 4000 ms in (2500, 5000].
    assert (c["latency_b2"], c["latency_b5"]) == (2, 1)
    assert (c["ttft_count"], c["ttft_ms_sum"], c["ttft_b2"]) == (2, 240, 2)
    refused = rows[(minute, "ann", 1, "ocx_k1", "c", "", "combo/c", "4xx")]
    r = dict(zip(services.COUNTERS, refused, strict=True))
    # Refused before any upstream: an error, and no tokens spent (not unknown).
    assert (r["requests"], r["errors"], r["unknown_usage_requests"]) == (1, 1, 0)
    assert len(rows) == 3


@pytest.mark.django_db
def test_two_batches_same_bucket_add_up() -> None:
    services.record_requests(records=[entry(), entry(user="bob")])
    services.record_requests(records=[entry(), entry(tokens=(None, None, None, None))])
    row = UsageRollup.objects.get(user="ann")
    assert row.resolution == MINUTE
    assert row.bucket == T0.replace(second=0)
    assert (row.requests, row.input_tokens, row.output_tokens) == (3, 200, 40)
    assert (row.cached_input_tokens, row.reasoning_tokens, row.unknown_usage_requests) == (
        20,
        10,
        1,
    )
    assert UsageRollup.objects.get(user="bob").requests == 1


@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="concurrent connections: PostgreSQL pass",
)
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_same_bucket_are_exact() -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            barrier.wait()
            for _ in range(25):
                services.record_requests(records=[entry(), entry(user="bob"), entry()])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ann = UsageRollup.objects.get(user="ann")
    assert (ann.requests, ann.input_tokens) == (200, 20000)
    assert UsageRollup.objects.get(user="bob").requests == 100


@pytest.mark.django_db
def test_compact_folds_old_minutes_into_hours_and_applies_retention() -> None:
    now = T0 + dt.timedelta(days=3)
    services.record_requests(
        records=[
            entry(at=T0),
            entry(at=T0 + dt.timedelta(minutes=20)),
            entry(at=T0 + dt.timedelta(minutes=50)),  # the next hour (11:05)
            entry(at=now - dt.timedelta(hours=2)),  # recent: stays per minute
            entry(at=now - dt.timedelta(days=40)),  # past a 30-day retention
        ]
    )
    folded, removed = services.compact(now=now, retention_days=30)
    assert folded == 4
    assert removed == 1
    hours = UsageRollup.objects.filter(resolution=HOUR).order_by("bucket")
    assert [(h.bucket, h.requests, h.input_tokens) for h in hours] == [
        (T0.replace(minute=0, second=0), 2, 200),
        (T0.replace(hour=11, minute=0, second=0), 1, 100),
    ]
    recent = UsageRollup.objects.get(resolution=MINUTE)
    assert recent.bucket == (now - dt.timedelta(hours=2)).replace(second=0)
    # Folding again finds nothing; a late minute row of an already folded hour adds to it.
    services.record_requests(records=[entry(at=T0 + dt.timedelta(minutes=1))])
    assert services.compact(now=now, retention_days=30) == (1, 0)
    assert (
        UsageRollup.objects.get(resolution=HOUR, bucket=T0.replace(minute=0, second=0)).requests
        == 3
    )
    # Totals over the whole range are unchanged by folding.
    report = selectors.usage_report(
        selectors.build_query(by="user", since="30d", until=None, now=now)
    )
    assert report["totals"]["requests"] == 5


def test_parse_time_and_query_errors() -> None:
    now = T0
    assert selectors.parse_time("1h", now=now, name="since") == now - dt.timedelta(hours=1)
    assert selectors.parse_time("30d", now=now, name="since") == now - dt.timedelta(days=30)
    assert selectors.parse_time("2026-03-01T00:00:00Z", now=now, name="since") == dt.datetime(
        2026, 3, 1, tzinfo=dt.UTC
    )
    # No offset means UTC.
    assert selectors.parse_time("2026-03-01T05:00", now=now, name="until") == dt.datetime(
        2026, 3, 1, 5, tzinfo=dt.UTC
    )
    q = selectors.build_query(by="user, model", since=None, until=None, now=now)
    assert (q.by, q.since, q.until) == (("user", "model"), now - dt.timedelta(days=1), now)
    for kwargs, message in (
        ({"by": "user,user"}, "by: one or two different dimensions"),
        ({"by": "teams"}, "by: unknown dimension 'teams'"),
        ({"since": "7x"}, "since: expected an ISO 8601 time"),
        ({"until": "2020-01-01"}, "since must be before until"),
        ({"bucket": "week"}, "bucket: use minute, hour or day"),
        ({"since": "999999w"}, "since: '999999w' is out of range"),
        ({"until": "9999-12-31T23:00:00-05:00"}, "until: '9999-12-31T23:00:00-05:00' is out of"),
    ):
        args: dict[str, Any] = {"by": None, "since": None, "until": None, **kwargs}
        with pytest.raises(selectors.UsageQueryError, match=message):
            selectors.build_query(now=now, **args)


@pytest.mark.django_db
def test_report_groups_csv_and_buckets() -> None:
    services.record_requests(
        records=[
            entry(cost=(0.25, 0.25, False)),
            # A subscription target: no cost, a value at API prices.
            entry(key_id=2, target="q/n", cost=(0.0, 0.5, False)),
            # No price for its target: no cost, counted as unpriced.
            entry(user="bob", tokens=(None, None, None, None), cost=(None, None, True)),
            entry(at=T0 + dt.timedelta(hours=1), cost=(0.125, 0.125, False)),
        ]
    )
    now = T0 + dt.timedelta(hours=2)
    report = selectors.usage_report(
        selectors.build_query(by="key,target", since="1d", until=None, now=now)
    )
    assert [(r["key"], r["keyId"], r["target"], r["requests"]) for r in report["rows"]] == [
        ("ocx_k1", 1, "p/m", 3),
        ("ocx_k2", 2, "q/n", 1),
    ]
    assert report["totals"] == {
        "requests": 4,
        "inputTokens": 300,
        "cachedInputTokens": 30,
        "outputTokens": 60,
        "reasoningTokens": 15,
        "unknownUsageRequests": 1,
        "costUsd": 0.375,
        "apiValueUsd": 0.875,
        "unpricedRequests": 1,
        "estimatedRequests": 0,
    }
    parsed = list(csv.DictReader(io.StringIO(selectors.report_csv(report))))
    assert parsed[0] == {
        "key": "ocx_k1",
        "keyId": "1",
        "keyName": "",  # no such key any more: its last prefix, no name or owner
        "owner": "",
        "target": "p/m",
        "requests": "3",
        "inputTokens": "200",
        "cachedInputTokens": "20",
        "outputTokens": "40",
        "reasoningTokens": "10",
        "unknownUsageRequests": "1",
        "costUsd": "0.375",
        "apiValueUsd": "0.375",
        "unpricedRequests": "1",
        "estimatedRequests": "0",
    }
    hourly = selectors.usage_report(
        selectors.build_query(by="user", since="1d", until=None, now=now, bucket="hour")
    )
    assert [(r["user"], r["at"], r["requests"]) for r in hourly["rows"]] == [
        ("ann", "2026-03-02T10:00:00Z", 2),
        ("ann", "2026-03-02T11:00:00Z", 1),
        ("bob", "2026-03-02T10:00:00Z", 1),
    ]


@pytest.mark.django_db
def test_csv_export_defuses_formula_cells() -> None:
    # The model column is whatever the client asked for: a key holder could plant a formula.
    planted = ['=HYPERLINK("http://evil","x")', "+1", "-2", "@SUM(A1)", "\tx", "ok=1"]
    services.record_requests(
        records=[dataclasses.replace(entry(), requested_model=m) for m in [*planted, "\rx"]]
    )
    report = selectors.usage_report(
        selectors.build_query(by="model", since="1d", until=None, now=T0 + dt.timedelta(hours=1))
    )
    text = selectors.report_csv(report)
    # A lone CR inside a cell is quoted (CRLF line ends), so a reader keeps the row whole.
    assert '\r\n"\'\rx",' in text
    parsed = list(csv.DictReader(io.StringIO(text, newline="")))
    assert sorted(r["model"] for r in parsed) == sorted(
        ["'" + m for m in planted[:-1]] + ["ok=1", "'\rx"]
    )
    # Numbers are not strings: unchanged.
    assert {r["requests"] for r in parsed} == {"1"} and {r["inputTokens"] for r in parsed} == {
        "100"
    }
    negative = {"by": ["model"], "rows": [{"model": "m", "requests": -3}]}
    assert selectors.report_csv(negative).splitlines()[1].startswith("m,-3,")


@pytest.mark.django_db
def test_ocx_usage_command_table_json_csv(capsys: pytest.CaptureFixture[str]) -> None:
    now = dt.datetime.now(dt.UTC)
    services.record_requests(
        records=[
            entry(at=now, tokens=(123456, 2000, 1000, 5), cost=(1.2345, 1.2345, False)),
            entry(at=now, user="bob-the-long-name", tokens=(7, 3, 0, 0), cost=(None, None, True)),
        ]
    )
    call_command("usage", "--by", "user", "--since", "1h")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("usage ")
    assert lines[1].split() == [
        "USER",
        "REQUESTS",
        "INPUT",
        "CACHED",
        "OUTPUT",
        "REASONING",
        "UNKNOWN",
        "COST",
        "API_VALUE",
        "UNPRICED",
        "ESTIMATED",
    ]
    # Tokens with thousands separators, dollars with cents.
    assert lines[2].split() == [
        *("ann", "1", "123,456", "1,000", "2,000", "5", "0", "$1.23", "$1.23", "0", "0")
    ]
    assert lines[3].split() == [
        *("bob-the-long-name", "1", "7", "0", "3", "0", "0", "$0.00", "$0.00", "1", "0")
    ]
    assert lines[4].split() == [
        *("TOTAL", "2", "123,463", "1,000", "2,003", "5", "0", "$1.23", "$1.23", "1", "0")
    ]
    # Columns line up: every line's numbers end at the same place.
    assert len({len(line) for line in lines[1:]}) == 1
    call_command("usage", "--by", "user", "--since", "1h", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["inputTokens"] == 123463 and len(data["rows"]) == 2
    assert (data["totals"]["costUsd"], data["totals"]["unpricedRequests"]) == (1.2345, 1)
    call_command("usage", "--by", "user", "--since", "1h", "--csv")
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["user"] for r in rows] == ["ann", "bob-the-long-name"]
    assert [(r["costUsd"], r["unpricedRequests"]) for r in rows] == [("1.2345", "0"), ("0.0", "1")]


@pytest.mark.django_db(transaction=True)
def test_a_batch_commits_log_and_usage_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch the writer keeps and retries (database unreachable) is counted exactly once: the
    log rows and the usage counts commit together. A model name longer than the columns is cut,
    never a reason to lose the batch."""
    from django.db import OperationalError

    from usage import requestlog
    from usage.models import RequestLog

    long_model = "m" * 300
    now = dt.datetime.now(dt.UTC)  # within both retentions
    batch = [entry(at=now), entry(at=now, user="bob")]
    batch[1].requested_model = long_model

    def unreachable(**_: Any) -> int:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services, "record_requests", unreachable)
    with pytest.raises(OperationalError):
        requestlog.write_entries(batch)
    assert RequestLog.objects.count() == 0 and UsageRollup.objects.count() == 0
    monkeypatch.undo()
    requestlog.write_entries(batch)  # the retry
    assert RequestLog.objects.count() == 2
    assert sorted((r.user, r.requests) for r in UsageRollup.objects.all()) == [
        ("ann", 1),
        ("bob", 1),
    ]
    assert RequestLog.objects.get(user="bob").requested_model == "m" * 256
    assert UsageRollup.objects.get(user="bob").model == "m" * 256


@pytest.mark.django_db
def test_by_key_groups_a_rotated_key_under_its_id_with_its_current_prefix() -> None:
    # Issue 42: a rotated key's secrets have their own prefixes; its usage is one row.
    from django.contrib.auth import get_user_model

    from accounts.models import ClientKey

    owner = get_user_model().objects.create_user("rota")
    key = ClientKey.objects.create(user=owner, name="laptop", prefix="ocx_New001", digest="e" * 64)
    before = entry(key_id=key.pk, user="rota")
    before.key_prefix = "ocx_Old001"
    after = entry(key_id=key.pk, user="rota")
    after.key_prefix = "ocx_New001"
    services.record_requests(records=[before, after])
    report = selectors.usage_report(
        selectors.build_query(by="key", since="1d", until=None, now=T0 + dt.timedelta(hours=1))
    )
    (row,) = report["rows"]
    assert (row["key"], row["keyId"], row["keyName"], row["owner"], row["requests"]) == (
        "ocx_New001",
        key.pk,
        "laptop",
        "rota",
        2,
    )
