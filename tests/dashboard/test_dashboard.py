"""The admin dashboard (`/admin/`) and the routing events page, rendered by Django's test client:
combos with each target's state in order, quota windows as bars, charts from the usage
rollups only, routing events history (stored off the hot path), the percentile math, and that
no admin page nor `/api/docs` references an external host."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos import live
from combos.services import combo_set
from dashboard import selectors, services
from dashboard.models import KEEP, RoutingEvent
from providers.services import provider_set
from quota import windows as qw
from quota.models import QuotaTransition
from quota.tracker import Record
from routing.state import ComboState
from usage import services as usage_services
from usage.models import RequestLog, UsageRollup
from usage.requestlog import RequestEntry, write_entries

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "r@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def _setup_combo() -> None:
    for name in ("p1", "p2"):
        provider_set(
            name=name,
            raw={"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1", "apiKey": "k"},
        )
    combo_set(
        combo_id="main",
        raw={"targets": [{"provider": "p1", "model": "m1"}, {"provider": "p2", "model": "m2"}]},
    )


def _entry(
    at: float,
    *,
    user: str,
    target: str,
    status: int = 200,
    ms: int = 300,
    stream: bool = False,
    ttft: int = 80,
) -> RequestEntry:
    return RequestEntry(
        request_id="r",
        at=at,
        user=user,
        requested_model="combo/main",
        combo="main",
        target=target,
        status=status,
        outcome="ok" if status < 400 else "error",
        duration_ms=ms,
        stream=stream,
        input_tokens=100,
        output_tokens=20,
        ttft_ms=ttft,
        attempts=[{"target": "p1/m1", "outcome": "hop"}] if target == "p2/m2" else [],
    )


def test_nearest_rank_percentile() -> None:
    assert selectors.nearest_rank([], 0.5) is None
    assert selectors.nearest_rank([7], 0.95) == 7
    values = list(range(1, 101))  # 1..100
    assert selectors.nearest_rank(values, 0.5) == 50
    assert selectors.nearest_rank(values, 0.95) == 95
    assert selectors.nearest_rank([3, 1, 2], 0.5) == 2  # unsorted input


def test_charts_read_the_rollups_per_combo_target_user_and_model() -> None:
    now = time.time()
    minute = int(now) // 60 * 60
    usage_services.record_requests(
        records=[
            _entry(minute + 1, user="ann", target="p1/m1"),
            _entry(minute + 2, user="ann", target="p1/m1", ms=2000),
            _entry(minute - 120, user="bob", target="p2/m2", status=502),
            # Two hours ago: outside the last hour, inside 24 h.
            _entry(now - 7200, user="cid", target="p1/m1"),
        ]
    )
    hour = selectors.charts("1h", now=now)
    assert hour["points"] == 60 and hour["step"] == 60_000
    assert hour["start"] == (minute - 59 * 60) * 1000
    main = hour["perCombo"]["main"]
    assert main["requests"][-1] == 2 and main["requests"][-3] == 1
    assert sum(main["requests"]) == 3
    assert main["errors"][-3] == 1 and sum(main["errors"]) == 1
    assert main["hops"][-3] == 1 and sum(main["hops"]) == 1
    assert sum(hour["perTarget"]["p1/m1"]["requests"]) == 2
    assert hour["tokensByUser"] == [
        {"name": "ann", "input": 200, "output": 40},
        {"name": "bob", "input": 100, "output": 20},
    ]
    assert hour["tokensByModel"] == [{"name": "combo/main", "input": 300, "output": 60}]
    day = selectors.charts("24h", now=now)
    assert day["points"] == 24 and sum(day["perCombo"]["main"]["requests"]) == 4
    assert {r["name"] for r in day["tokensByUser"]} == {"ann", "bob", "cid"}
    # Latency from the request log's real durations (issue 28 item 9): the rollups' buckets
    # made every fast target read 50/95 ms.
    RequestLog.objects.all().delete()
    write_entries(
        [
            _entry(minute + 1, user="ann", target="p1/m1", ms=3, stream=True, ttft=2),
            _entry(minute + 2, user="ann", target="p1/m1", ms=8, stream=True, ttft=5),
            _entry(minute + 3, user="ann", target="p1/m1", ms=5),
            _entry(minute - 120, user="bob", target="p2/m2", ms=40),
            _entry(now - 7200, user="cid", target="p1/m1", ms=900),  # outside the hour
        ]
    )
    assert selectors.charts("1h", now=now)["latency"] == [
        {"target": "p1/m1", "requests": 3, "p50": 5, "p95": 8, "ttftP50": 2, "ttftP95": 5},
        {"target": "p2/m2", "requests": 1, "p50": 40, "p95": 40, "ttftP50": None, "ttftP95": None},
    ]


def test_routing_events_are_stored_bounded_and_listed_with_quota_transitions() -> None:
    at = int(time.time() * 1000)
    stored = services.routing_events_write(
        events=[
            {
                "kind": "cooldown",
                "combo": "main",
                "target": "p1/m1",
                "until": at + 60_000,
                "reason": "rate_limited",
                "at": at,
            },
            {
                "kind": "hop",
                "combo": "main",
                "target": "p1/m1",
                "status": 429,
                "reason": "rate_limited",
                "at": at + 1,
            },
            {"kind": "dependency", "at": at},  # not a routing event: not stored
            {"kind": "hop", "combo": "main"},  # no time: not stored
        ]
    )
    assert stored == 2
    QuotaTransition.objects.create(
        provider="p1",
        credential="fp",
        from_state="available",
        to_state="limited",
        reason="window exhausted",
        message="p1 is out of quota",
        at=dt.datetime.fromtimestamp((at + 2) / 1000, tz=dt.UTC),
    )
    rows = selectors.recent_events(10)
    assert [r.kind for r in rows] == ["quota", "hop", "cooldown"]
    cooldown = rows[2]
    assert cooldown.at == dt.datetime.fromtimestamp(at / 1000, tz=dt.UTC)
    assert cooldown.until_ms == at + 60_000
    # Bounded: only the newest KEEP rows stay.
    services.routing_events_write(
        events=[{"kind": "hop", "combo": "c", "target": "t", "at": at + i} for i in range(KEEP)]
    )
    assert RoutingEvent.objects.count() == KEEP
    assert not RoutingEvent.objects.filter(kind="cooldown").exists()


def test_dashboard_is_the_admin_index_with_states_quota_charts_and_events(
    staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    _setup_combo()
    now = int(time.time() * 1000)
    window = qw.Window(
        name="five_hour",
        used_percent=100.0,
        window_minutes=300,
        resets_at_ms=now + 3_600_000,
        observed_at_ms=now,
        source=qw.SOURCE_CODEX_HEADERS,
    )
    state, _ = qw.observe(qw.CredentialQuota("p2", "fp9"), [window], now=now)
    # The live routing state as the server holds it (in memory or in Redis).
    snapshot = live.LiveSnapshot(
        "this process",
        states={"main": ComboState(cooldowns={"p1/m1": now + 90_000})},
        records={("p2", "fp9"): Record(state, (window,))},
    )
    monkeypatch.setattr(live, "load", lambda *a, **k: snapshot)
    services.routing_events_write(
        events=[
            {
                "kind": "cooldown",
                "combo": "main",
                "target": "p1/m1",
                "until": now + 90_000,
                "reason": "rate_limited",
                "at": now,
            }
        ]
    )
    page = staff.get("/admin/")
    # No "View site" link: ocx has no site at `/` (issue 28 item 10).
    assert "View site" not in page.content.decode()
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="ocx-dashboard"' in html
    # Targets in order, each with its state; the cooldown's end is a <time> counting down.
    first = html.index('data-target="p1/m1"')
    assert first < html.index('data-target="p2/m2"')
    assert re.search(
        r'class="ocx-badge ocx-cooling" data-target="p1/m1"[^>]*>p1/m1: Cooling until '
        r'<time class="ocx-until" datetime="[-\dT:.]+Z">',
        html,
    )
    # The quota window as a bar: length, used %, reset countdown, recovery state.
    assert 'data-provider="p2" data-credential="fp9"' in html
    assert '<span class="ocx-window-name">5 h</span>' in html
    assert 'style="width: 100%"' in html
    assert "all windows recover at <time" in html
    # The event with the time it happened (not the cooldown's end).
    assert re.search(r'<li class="ocx-ev ocx-ev-cooldown"><time class="ocx-time" datetime=', html)
    charts = json.loads(
        re.search(
            r'<script id="ocx-charts-data" type="application/json">(.*?)</script>', html, re.S
        ).group(1)  # type: ignore[union-attr]
    )
    assert charts["range"] == "1h" and charts["points"] == 60
    # Django's app list stays reachable below the dashboard.
    assert "Site administration" in html and 'id="ocx-apps"' in html
    assert "/admin/combos/combo/" in html
    # No raw UTC ISO time in the visible text (only in datetime attributes and the JSON).
    visible = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", visible), visible


def test_dashboard_live_fragment_and_chart_data_are_staff_only(staff: Client) -> None:
    _setup_combo()
    live = staff.get("/admin/dashboard/live/")
    assert live.status_code == 200
    assert 'data-target="p1/m1"' in live.content.decode()
    data = staff.get("/admin/dashboard/charts/?range=7d")
    assert data.status_code == 200 and data.json()["points"] == 168
    bad = staff.get("/admin/dashboard/charts/?range=5y")
    assert bad.status_code == 400
    assert bad.json() == {"error": "range: use one of 1h, 24h, 7d; got '5y'"}
    anonymous = Client()
    for url in ("/admin/", "/admin/dashboard/live/", "/admin/dashboard/charts/"):
        r = anonymous.get(url)
        assert r.status_code == 302 and "/admin/login/" in r["Location"], url
    user = get_user_model().objects.create_user("plain", "p@example.com", "pw-123456789")
    plain = Client()
    plain.force_login(user)
    assert plain.get("/admin/dashboard/charts/").status_code == 302


def test_dashboard_empty_states(staff: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing routed yet (a shared Redis may hold other tests' quota records).
    monkeypatch.setattr(live, "load", lambda *a, **k: live.LiveSnapshot("this process"))
    html = staff.get("/admin/").content.decode()
    assert "No combos yet." in html
    assert "No quota data yet" in html
    assert "No cooldowns, hops or quota transitions recorded yet." in html


def test_events_page_shows_history_with_the_time_it_happened(staff: Client) -> None:
    at = int(time.time() * 1000) - 5000
    services.routing_events_write(
        events=[
            {
                "kind": "cooldown",
                "combo": "main",
                "target": "p1/m1",
                "until": at + 600_000,
                "reason": "rate_limited",
                "at": at,
            },
            {
                "kind": "hop",
                "combo": "main",
                "target": "p1/m1",
                "status": 429,
                "reason": "rate_limited",
                "at": at,
            },
        ]
    )
    html = staff.get("/admin/combos/combo/events/").content.decode()
    assert 'id="ocx-conn"' in html and 'id="ocx-event-list"' in html
    iso = dt.datetime.fromtimestamp(at / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
    iso = iso.replace("+00:00", "Z")
    assert html.count(f'<time class="ocx-time" datetime="{iso}">') == 2
    assert "combo/main: hopped off p1/m1 (429, rate_limited)" in html
    assert 'combo/main: p1/m1 cooling until <time class="ocx-until"' in html


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "action") and value:
                self.urls.append(value)


def external_urls(html: str) -> list[str]:
    """src/href/action URLs that leave this server (http(s)://host or //host)."""
    parser = _Links()
    parser.feed(html)
    out = []
    for url in parser.urls:
        parts = urlsplit(url)
        if parts.netloc and parts.hostname not in ("testserver", "127.0.0.1", "localhost"):
            out.append(url)
    # Scripts that load by URL in code (Swagger's init): any absolute URL in an inline script.
    for script in re.findall(r"<script[^>]*>(.*?)</script>", html, re.S):
        out += [u for u in re.findall(r"https?://[^\s\"')]+", script) if "://testserver" not in u]
    return out


def test_no_page_references_an_external_host(staff: Client) -> None:
    _setup_combo()
    pages = [
        "/admin/",
        "/admin/combos/combo/",
        "/admin/combos/combo/add/",
        "/admin/combos/combo/events/",
        "/admin/providers/provider/",
        "/admin/usage/requestlog/",
        "/admin/usage/usagerollup/",
        "/admin/usage/usagerollup/rollups/",
        "/api/docs",
    ]
    for url in pages:
        r = staff.get(url)
        assert r.status_code == 200, url
        html = r.content.decode()
        assert external_urls(html) == [], url
    docs = staff.get("/api/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in docs
    assert staff.get("/static/ninja/swagger-ui-bundle.js").status_code == 200
    assert staff.get("/static/ocx/vendor/chart-4.5.1.umd.min.js").status_code == 200


def _spent(at: dt.datetime, user: str, cost: float, api: float, n: int = 1, **kw: int) -> None:
    UsageRollup.objects.create(
        bucket=at, user=user, requests=n, cost_usd=cost, api_value_usd=api, **kw
    )


def test_spend_today_this_month_and_top_spenders_in_the_configured_zone() -> None:
    utc = dt.UTC
    now = dt.datetime(2026, 3, 4, 3, 0, tzinfo=utc)  # 2026-03-03 22:00 in New York
    _spent(dt.datetime(2026, 3, 4, 2, 0, tzinfo=utc), "ann", 1.25, 1.25)  # NY today
    _spent(dt.datetime(2026, 3, 3, 6, 0, tzinfo=utc), "ben", 0.0, 4.0, n=3)  # NY today (01:00)
    _spent(dt.datetime(2026, 3, 3, 4, 0, tzinfo=utc), "cat", 2.0, 2.0)  # NY yesterday
    _spent(dt.datetime(2026, 3, 1, 5, 0, tzinfo=utc), "dan", 0.5, 0.5)  # NY 03-01 00:00
    _spent(dt.datetime(2026, 3, 1, 4, 59, tzinfo=utc), "eve", 50.0, 50.0)  # NY February
    _spent(dt.datetime(2026, 3, 2, 0, 0, tzinfo=utc), "", 0.0, 0.0, unpriced_requests=1)
    for i, name in enumerate(("fay", "gus", "hal")):
        _spent(dt.datetime(2026, 3, 2, 12, i, tzinfo=utc), name, 0.01 * (i + 1), 0.01 * (i + 1))
    s = selectors.spend(now=now, zone="America/New_York")
    assert (s.today_usd, s.today_api_value_usd, s.today_requests) == (1.25, 5.25, 4)
    assert (round(s.month_usd, 6), round(s.month_api_value_usd, 6)) == (3.81, 7.81)
    assert (s.month_requests, s.month_unpriced) == (10, 1)
    assert [(t.user, t.cost_usd, t.api_value_usd) for t in s.top] == [
        ("cat", 2.0, 2.0),
        ("ann", 1.25, 1.25),
        ("dan", 0.5, 0.5),
        ("hal", 0.03, 0.03),
        ("gus", 0.02, 0.02),
    ]
    # In UTC, eve's request is in March and ben's on 03-03 is yesterday.
    s = selectors.spend(now=now, zone="UTC")
    assert (s.today_usd, s.today_requests) == (1.25, 1)
    assert s.top[0].user == "eve"


def test_the_dashboard_shows_the_spend(staff: Client, settings: Any) -> None:
    settings.OCX_TIME_ZONE = "UTC"
    now = dt.datetime.now(dt.UTC)
    _spent(now - dt.timedelta(seconds=5), "ann", 1234.5, 1234.5, n=2)
    _spent(now - dt.timedelta(seconds=5), "ben", 0.0, 3.0)
    html = staff.get("/admin/").content.decode()
    spend = html.split('id="ocx-spend"', 1)[1].split("</section>", 1)[0]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", spend))
    assert "Today $1,234.50 3 requests · $1,237.50 at API prices" in text
    assert "Days and months in UTC" in text
    assert "User Cost API value Requests ann $1,234.50 $1,234.50 2 ben $0.00 $3.00 1" in text
    assert "/admin/usage/usagerollup/?period=month&amp;by=user" in spend


def test_the_dashboard_spend_without_any(staff: Client) -> None:
    html = staff.get("/admin/").content.decode()
    spend = html.split('id="ocx-spend"', 1)[1].split("</section>", 1)[0]
    assert "No spend yet this month." in spend
    assert "$0.00" in spend and "API value" not in spend


def test_dashboard_warns_while_a_dollar_budget_meets_an_unpriced_target(
    staff: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accounts.models import ClientKey

    monkeypatch.setattr(live, "load", lambda *a, **k: live.LiveSnapshot("this process"))
    _setup_combo()  # p1/m1 and p2/m2 at 127.0.0.1: no price list
    html = staff.get("/admin/").content.decode()
    assert 'id="ocx-unpriced-warning"' not in html  # no dollar budget: nothing to warn about
    user = get_user_model().objects.create_user("spender")
    key = ClientKey.objects.create(user=user, prefix="ocx_Warn01", digest="d" * 64, budgets=[])
    key.budgets = [{"tokens": 100, "period": "day"}]
    key.save()
    assert 'id="ocx-unpriced-warning"' not in staff.get("/admin/").content.decode()
    key.budgets = [{"usd": 5, "period": "day"}]
    key.save()
    html = staff.get("/admin/").content.decode()
    assert 'id="ocx-unpriced-warning"' in html
    assert "2 enabled target(s) have no price: p1/m1, p2/m2" in html
    assert "400 model_unpriced" in html
