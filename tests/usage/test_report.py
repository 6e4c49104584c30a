"""The admin's usage report (`/admin/usage/usagerollup/`) through Django's test client: exact
rows and totals per grouping over seeded rollups, local-day periods in the viewer's zone, the
spend chart's steps, bad parameters as a 400 naming them, and the per-minute drill-down."""

from __future__ import annotations

import datetime as dt
import re
from html import unescape
from typing import Any
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from usage import report
from usage.models import HOUR, UsageRollup

pytestmark = pytest.mark.django_db
UTC = dt.UTC
NY = ZoneInfo("America/New_York")
# A fixed week in March (the custom period reads it whatever the clock says).
WEEK = "period=custom&from=2026-03-02&to=2026-03-08&tz=UTC"


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "r@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def rollup(at: dt.datetime, **fields: Any) -> UsageRollup:
    return UsageRollup.objects.create(bucket=at, **fields)


def seed() -> None:
    """Ann: two priced requests on gpt (one on 2026-03-02, one on 03-04); Ben: 3 requests on
    a chatgpt subscription (cost 0, API value 1.50) and one unpriced request; one refused
    request without a user; one request outside the week."""
    rollup(
        dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC),
        user="ann",
        key_id=7,
        key_prefix="ocx_ann1",
        combo="main",
        target="openai/gpt-5",
        model="combo/main",
        status_class="2xx",
        requests=1,
        input_tokens=1_200_000,
        cached_input_tokens=200_000,
        output_tokens=30_000,
        cost_usd=1.25,
        api_value_usd=1.25,
    )
    rollup(
        dt.datetime(2026, 3, 4, 23, 30, tzinfo=UTC),
        user="ann",
        key_id=7,
        key_prefix="ocx_ann1",
        combo="main",
        target="openai/gpt-5",
        model="combo/main",
        status_class="2xx",
        requests=1,
        input_tokens=800_000,
        output_tokens=20_000,
        cost_usd=2.5,
        api_value_usd=2.5,
    )
    rollup(
        dt.datetime(2026, 3, 3, 9, 0, tzinfo=UTC),
        resolution=HOUR,
        user="ben",
        key_id=8,
        key_prefix="ocx_ben1",
        target="chatgpt/gpt-5-codex",
        model="gpt-5-codex",
        status_class="2xx",
        requests=3,
        input_tokens=9_000,
        output_tokens=900,
        cost_usd=0.0,
        api_value_usd=1.5,
    )
    rollup(
        dt.datetime(2026, 3, 3, 9, 0, tzinfo=UTC),
        user="ben",
        key_id=8,
        key_prefix="ocx_ben1",
        target="local/llama",
        model="local/llama",
        status_class="2xx",
        requests=1,
        input_tokens=500,
        output_tokens=50,
        unpriced_requests=1,
    )
    rollup(dt.datetime(2026, 3, 5, 12, 0, tzinfo=UTC), status_class="4xx", requests=1, errors=1)
    rollup(
        dt.datetime(2026, 3, 9, 0, 0, tzinfo=UTC),
        user="ann",
        target="openai/gpt-5",
        requests=1,
        cost_usd=100.0,
        api_value_usd=100.0,
    )


def table(html: str) -> list[list[str]]:
    """The report table's body rows and the totals row, cell texts."""
    body = html.split('id="ocx-report-table"', 1)[1].split("</table>", 1)[0]
    out = []
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)[1:]:
        cells = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, re.S)
        out.append([unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells])
    return out


def test_rows_and_totals_per_user_with_api_value_and_unpriced(staff: Client) -> None:
    seed()
    r = staff.get(f"/admin/usage/usagerollup/?{WEEK}&by=user")
    assert r.status_code == 200
    html = r.content.decode()
    # Columns: user, requests, input, cached, output, cost, API value, unpriced, drill-down.
    assert table(html) == [
        ["ann", "2", "2,000,000", "200,000", "50,000", "$3.75", "$3.75", "0", "per minute"],
        ["ben", "4", "9,500", "0", "950", "$0.00", "$1.50", "1", "per minute"],
        ["(no user)", "1", "0", "0", "0", "$0.00", "$0.00", "0", "per minute"],
        ["Total", "7", "2,009,500", "200,000", "50,950", "$3.75", "$5.25", "1", ""],
    ]
    assert 'id="ocx-total-cost">$3.75<' in html
    assert 'id="ocx-total-api-value">$5.25<' in html
    assert "$1.50 covered by subscriptions" in html
    assert 'id="ocx-total-unpriced">1<' in html
    assert 'id="ocx-zone">UTC<' in html
    # No raw rollup column of the old page.
    assert "Resolution" not in html and "resolution" not in table(html)[0]


def test_grouping_by_target_key_model_and_combo(staff: Client) -> None:
    seed()
    rows = table(staff.get(f"/admin/usage/usagerollup/?{WEEK}&by=target").content.decode())
    assert [(r[0], r[1], r[5]) for r in rows] == [
        ("openai/gpt-5", "2", "$3.75"),
        ("chatgpt/gpt-5-codex", "3", "$0.00"),
        ("local/llama", "1", "$0.00"),
        ("(not served)", "1", "$0.00"),
        ("Total", "7", "$3.75"),
    ]
    get_user_model().objects.create_user("ann")
    key_model: Any = __import__("accounts.models", fromlist=["ClientKey"]).ClientKey
    key_model.objects.create(
        pk=7, user=get_user_model().objects.get(username="ann"), name="laptop", prefix="ocx_ann1"
    )
    rows = table(staff.get(f"/admin/usage/usagerollup/?{WEEK}&by=key").content.decode())
    assert [r[0] for r in rows] == [
        "ocx_ann1… laptop (ann)",
        "ocx_ben1… (deleted key)",
        "(no key)",
        "Total",
    ]
    rows = table(staff.get(f"/admin/usage/usagerollup/?{WEEK}&by=combo").content.decode())
    assert [(r[0], r[1]) for r in rows] == [
        ("main", "2"),
        ("(direct model, no combo)", "5"),
        ("Total", "7"),
    ]
    rows = table(staff.get(f"/admin/usage/usagerollup/?{WEEK}&by=model").content.decode())
    assert [r[0] for r in rows][0] == "combo/main"


def test_without_subscriptions_or_unpriced_the_extra_columns_stay_away(staff: Client) -> None:
    rollup(
        dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC),
        user="ann",
        target="openai/gpt-5",
        requests=3,
        input_tokens=1000,
        cost_usd=0.004,
        api_value_usd=0.004,
    )
    html = staff.get(f"/admin/usage/usagerollup/?{WEEK}").content.decode()
    assert table(html) == [
        ["ann", "3", "1,000", "0", "0", "< $0.01", "per minute"],
        ["Total", "3", "1,000", "0", "0", "< $0.01", ""],
    ]
    assert "API value" not in html and "Unpriced" not in html


def test_the_chart_has_one_bar_per_local_day_with_that_days_spend(staff: Client) -> None:
    seed()
    html = staff.get(f"/admin/usage/usagerollup/?{WEEK}").content.decode()
    steps = re.findall(r'<g class="ocx-step" data-at="([^"]+)" data-cost="([^"]+)">', html)
    assert steps == [
        ("2026-03-02T00:00:00Z", "1.250000"),
        ("2026-03-03T00:00:00Z", "0.000000"),
        ("2026-03-04T00:00:00Z", "2.500000"),
        ("2026-03-05T00:00:00Z", "0.000000"),
        ("2026-03-06T00:00:00Z", "0.000000"),
        ("2026-03-07T00:00:00Z", "0.000000"),
        ("2026-03-08T00:00:00Z", "0.000000"),
    ]
    assert "<svg" in html and "Spend per day" in html
    # In New York the 23:30 UTC request of 03-04 is on 03-04 still, and the days start at 05:00Z.
    ny = staff.get(
        "/admin/usage/usagerollup/?period=custom&from=2026-03-02&to=2026-03-08&tz=America/New_York"
    ).content.decode()
    steps = re.findall(r'<g class="ocx-step" data-at="([^"]+)" data-cost="([^"]+)">', ny)
    assert steps[0] == ("2026-03-02T05:00:00Z", "1.250000")
    assert steps[2] == ("2026-03-04T05:00:00Z", "2.500000")
    assert 'id="ocx-zone">America/New_York<' in ny
    # Sunday 03-08 in New York ends at 04:00Z on 03-09 (DST starts): the 00:00Z request counts.
    assert re.search(r'id="ocx-total-cost">\$103.75<', ny)


def test_today_is_counted_per_local_hour() -> None:
    now = dt.datetime(2026, 3, 4, 15, 20, tzinfo=UTC)
    period = report.parse_period(period="today", start=None, end=None, zone=NY, now=now)
    assert (period.since, period.until, period.step) == (
        dt.datetime(2026, 3, 4, 5, 0, tzinfo=UTC),
        now,
        "hour",
    )
    rollup(dt.datetime(2026, 3, 4, 14, 59, tzinfo=UTC), user="ann", requests=2, cost_usd=0.5)
    series = report.spend_series(period)
    assert len(series) == 24
    assert series[0].label == "00:00"
    assert [(p.label, p.cost_usd, p.requests) for p in series if p.requests] == [("09:00", 0.5, 2)]


@pytest.mark.parametrize(
    ("name", "since", "first"),
    [
        ("7d", dt.datetime(2026, 2, 26, 5, 0, tzinfo=UTC), dt.date(2026, 2, 26)),
        ("30d", dt.datetime(2026, 2, 3, 5, 0, tzinfo=UTC), dt.date(2026, 2, 3)),
        ("month", dt.datetime(2026, 3, 1, 5, 0, tzinfo=UTC), dt.date(2026, 3, 1)),
    ],
)
def test_periods_start_at_local_midnight(name: str, since: dt.datetime, first: dt.date) -> None:
    now = dt.datetime(2026, 3, 4, 15, 20, tzinfo=UTC)
    period = report.parse_period(period=name, start=None, end=None, zone=NY, now=now)
    assert (period.since, period.until, period.first, period.step) == (since, now, first, "day")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("period=year", "period: use one of today, 7d, 30d, month, custom; got &#x27;year&#x27;"),
        ("period=custom&to=2026-03-01", "from: a date (YYYY-MM-DD) is required"),
        ("period=custom&from=2026-13-01&to=2026-03-01", "from: expected a date like 2026-03-01"),
        ("period=custom&from=2026-03-05&to=2026-03-01", "from: must be on or before to"),
        ("period=custom&from=2020-01-01&to=2026-03-01", "to: a custom period spans at most 400"),
        ("period=custom&from=2999-01-01&to=2999-01-02", "from: the period starts in the future"),
        ("by=status", "by: use one of user"),
        ("tz=Mars/Olympus", "tz: &#x27;Mars/Olympus&#x27; is not an IANA time zone"),
    ],
)
def test_a_bad_parameter_is_a_400_that_names_it(staff: Client, query: str, message: str) -> None:
    r = staff.get(f"/admin/usage/usagerollup/?{query}")
    assert r.status_code == 400
    html = r.content.decode()
    assert 'id="ocx-report-error"' in html and message in html
    # The pickers stay usable to pick a good period.
    assert 'data-period="today"' in html


def test_drill_down_lists_the_rollups_of_the_row_and_period(staff: Client) -> None:
    seed()
    html = staff.get(f"/admin/usage/usagerollup/?{WEEK}&by=user").content.decode()
    links = [unescape(u) for u in re.findall(r'<td class="ocx-drill"><a href="([^"]+)"', html)]
    ann = urlsplit(links[0])
    assert ann.path == "/admin/usage/usagerollup/rollups/"
    assert parse_qs(ann.query) == {
        "bucket__gte": ["2026-03-02T00:00:00Z"],
        "bucket__lt": ["2026-03-09T00:00:00Z"],
        "user": ["ann"],
    }
    page = staff.get(links[0])
    assert page.status_code == 200
    listing = page.content.decode()
    assert "2 usage rollups" in listing  # ann's two rows of the week, not the one after it
    assert "column-cost" in listing and "Usage report" in listing
    drill = re.search(r'href="([^"]+)" id="ocx-drill"', html)
    assert drill is not None
    assert "5 usage rollups" in staff.get(unescape(drill.group(1))).content.decode()
    csv = re.search(r'href="([^"]+)" id="ocx-csv"', html)
    assert csv is not None
    export = staff.get(unescape(csv.group(1)))
    assert export.status_code == 200
    lines = export.content.decode().splitlines()
    assert [line.split(",")[:2] for line in lines[1:]] == [["", "1"], ["ann", "2"], ["ben", "4"]]


def test_staff_only() -> None:
    plain = get_user_model().objects.create_user("bob", "bob@example.com", "pw-123456789")
    client = Client()
    client.force_login(plain)
    assert client.get("/admin/usage/usagerollup/").status_code == 302
    assert client.get("/admin/usage/usagerollup/rollups/").status_code == 302


def test_team_is_offered_exactly_when_the_selectors_accept_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from usage import selectors

    def accepts(names: set[str]) -> None:
        def parse_by(value: str | None) -> tuple[str, ...]:
            if value not in names:
                raise selectors.UsageQueryError(f"by: unknown dimension {value!r}")
            return (value,)

        monkeypatch.setattr(selectors, "parse_by", parse_by)

    accepts({"user", "key", "model", "combo", "target"})
    assert list(report.groupings()) == ["user", "key", "model", "combo", "target"]
    accepts({"user", "team", "key", "model", "combo", "target"})
    assert list(report.groupings()) == ["user", "team", "key", "model", "combo", "target"]
