"""The dashboard (`/admin/`) and the routing events page in a real browser (Debian's Chromium via
Playwright) against a real `ocx serve` and the mock upstream, at 1280 and 1920 px, with every
request to a host other than the server refused (an air-gapped network):

- while traffic runs, a scripted 429 cools the first target: its badge turns to "Cooling until"
  with a countdown that ticks, the event list gains the cooldown and the hop, the quota window
  the upstream reported shows as a bar, and the requests chart gains the new requests;
- the events page shows the history from the database, live events, and a connection
  indicator that reports a dropped socket and reconnects;
- `/api/docs` renders Swagger UI from ocx's own static files.

Screenshots go to test-artifacts/browser/ (dashboard-*.png, events-*.png).
"""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import pytest

from tests.browser.test_admin_browser import (  # noqa: F401 - fixtures used by name
    ARTIFACTS,
    WIDTHS,
    admin_server,
    browser,
    login,
    new_page,
    pytestmark,
    shot,
)
from tests.conftest import Mock, Server
from tests.gateway.test_quota_failover import provider, sync

# The browser's zone is not UTC: every time shown must be this zone's, none the server's UTC.
ZONE = "America/New_York"


@pytest.fixture
def page(admin_server: Server, browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:  # noqa: F811
    """A browser page in ZONE; its width is the test's `page` parameter."""
    with new_page(browser, admin_server.url, request.param, 2400, timezone_id=ZONE) as page:
        yield page


def local_clock(epoch_s: float) -> str:
    return dt.datetime.fromtimestamp(epoch_s, tz=ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M")


CODEX_LIMITS = {
    "x-codex-primary-used-percent": "42",
    "x-codex-primary-window-minutes": "300",
    "x-codex-primary-reset-after-seconds": "5400",
    "x-codex-secondary-used-percent": "17",
    "x-codex-secondary-window-minutes": "10080",
    "x-codex-secondary-reset-after-seconds": "300000",
}
# The requests the charts show for one combo, summed over the range.
TOTAL_JS = """(combo) => {
  const d = window.ocxDashboard && window.ocxDashboard.data();
  const c = d && d.perCombo[combo];
  return c ? c.requests.reduce((a, b) => a + b, 0) : 0;
}"""
CHART_TOTAL_JS = """(combo) => {
  const chart = window.ocxDashboard.charts.requests;
  const set = chart.data.datasets.find((s) => s.label === combo);
  return set ? set.data.reduce((a, b) => a + b, 0) : 0;
}"""


def airgap(page: Any, server: Server) -> list[str]:  # noqa: F811
    """Refuse every request that leaves the server; returns the refused URLs."""
    local = urlsplit(server.url).netloc
    refused: list[str] = []

    def route(r: Any) -> None:
        url = r.request.url
        if urlsplit(url).netloc == local or url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            refused.append(url)
            r.abort()

    page.route("**/*", route)
    return refused


def ask(server: Server, key: str, combo_id: str) -> Any:
    r = server.http.post(
        "/v1/responses",
        json={"model": f"combo/{combo_id}", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    return r


def poll(fn: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def countdown_seconds(text: str) -> int:
    m = re.search(r"\(in (?:(\d+) min )?(\d+) s\)", text)
    assert m, text
    return int(m.group(1) or 0) * 60 + int(m.group(2))


@pytest.mark.parametrize("page", WIDTHS, indirect=True)
def test_dashboard_follows_live_traffic_and_events_page(
    page: Any,  # noqa: F811
    admin_server: Server,  # noqa: F811
    mock: Mock,
) -> None:
    server = admin_server
    width = page.viewport_size["width"]
    refused = airgap(page, server)
    tag = uuid.uuid4().hex[:6]
    pm, fm = f"da-{tag}", f"db-{tag}"
    url = mock.url + "/v1"
    server.put_provider(f"primary-{tag}", provider(url, pm, apiKey="sk-dash-primary"))
    server.put_provider(f"fallback-{tag}", provider(url, fm, apiKey="sk-dash-fallback"))
    combo_id = f"dash{tag}"
    primary, fallback = f"primary-{tag}/{pm}", f"fallback-{tag}/{fm}"
    server.put_combo(
        combo_id,
        {
            "targets": [
                {"provider": f"primary-{tag}", "model": pm},
                {"provider": f"fallback-{tag}", "model": fm},
            ],
            "cooldownMs": 45_000,
        },
    )
    sync(server)
    key = server.create_key(user=f"dash-user-{tag}")
    mock.script(fm, [], then={"headers": CODEX_LIMITS})
    ask(server, key, combo_id)  # traffic before the page opens: the chart starts above zero

    login(page)
    page.wait_for_selector("#ocx-dashboard")
    page.wait_for_selector("#ocx-conn.ocx-conn-on")
    assert page.inner_text("#ocx-conn") == "\u25cf live"
    box = page.locator(f'#ocx-dash-live tr[data-combo="{combo_id}"]')
    badges = box.locator(".ocx-badge")
    assert badges.all_inner_texts() == [f"{primary}: Available", f"{fallback}: Available"]
    before = page.evaluate(CHART_TOTAL_JS, combo_id)
    shot(page, f"dashboard-01-before-{width}")

    # Traffic: the primary answers 429, the router cools it and hops to the fallback.
    mock.script(pm, [{"status": 429}])
    r = ask(server, key, combo_id)
    assert r.headers["x-ocx-target"] == fallback
    ask(server, key, combo_id)  # served by the fallback while the primary cools
    first = box.locator(f'[data-target="{primary}"]')
    first.locator("time.ocx-until").wait_for()
    assert first.inner_text().startswith(f"{primary}: Cooling until ")
    assert "ocx-cooling" in (first.get_attribute("class") or "")
    left = countdown_seconds(first.inner_text())
    assert 30 <= left <= 45, first.inner_text()
    # The countdown ticks in the page (no reload).
    # Looked up on each check: a live redraw (an event) replaces the element.
    page.wait_for_function(
        "([sel, left]) => { const el = document.querySelector(sel);"
        " const m = el && el.textContent.match(/\\(in (\\d+) s\\)/);"
        " return m && Number(m[1]) < left; }",
        arg=[f'#ocx-dash-live tr[data-combo="{combo_id}"] [data-target="{primary}"]', left],
    )
    # No raw UTC ISO time anywhere on the page.
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", page.inner_text("#ocx-dashboard"))

    # The event list: the hop and the cooldown, newest first, each with a local time.
    events = page.locator("#ocx-event-list li")
    page.wait_for_function(
        "() => document.querySelectorAll('#ocx-event-list li.ocx-ev-hop').length >= 1"
    )
    texts = events.all_inner_texts()
    # In the browser's zone (New York), not UTC: the hop happened within the last minute.
    now = time.time()
    assert texts[0][:16] in (local_clock(now), local_clock(now - 60)), (texts[0], now)
    assert any(f"combo/{combo_id}: hopped off {primary} (429" in t for t in texts), texts
    assert any(f"combo/{combo_id}: {primary} cooling until " in t for t in texts), texts
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", t) for t in texts), texts

    # The quota windows the fallback reported, as bars.
    quota = page.locator(f'#ocx-dash-live .ocx-quota[data-provider="fallback-{tag}"]')
    quota.wait_for()
    rows = quota.locator(".ocx-window").all_inner_texts()
    assert re.match(
        r"5 h\s+42 %\s+resets (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d \(in 1 h (29|30) min\)", rows[0]
    ), rows
    # 300 000 s: days and hours, not "83 h 19 min".
    assert re.match(
        r"7 d\s+17 %\s+resets (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d \(in 3 d 11 h\)", rows[1]
    ), rows

    # The requests chart gains the new traffic (rollups are written off the hot path).
    page.wait_for_function(
        f"() => ({CHART_TOTAL_JS})('{combo_id}') >= {before} + 2", timeout=25_000
    )
    hops = page.evaluate(
        "(c) => window.ocxDashboard.data().perCombo[c].hops.reduce((a, b) => a + b, 0)", combo_id
    )
    assert hops == 1
    page.wait_for_timeout(300)  # let Chart.js finish painting for the screenshot
    shot(page, f"dashboard-02-cooling-{width}")
    # The dashboard alone (docs/img/dashboard.png is made from the 1280 px one).
    page.locator("#ocx-dashboard").screenshot(path=str(ARTIFACTS / f"dashboard-only-{width}.png"))
    page.click('#ocx-range button[data-range="24h"]')
    page.wait_for_function("() => window.ocxDashboard.data().range === '24h'")
    assert page.evaluate(TOTAL_JS, combo_id) >= 3
    page.click('#ocx-dim button[data-dim="perTarget"]')
    labels = page.evaluate(
        "() => window.ocxDashboard.charts.requests.data.datasets.map(s => s.label)"
    )
    assert primary in labels and fallback in labels
    shot(page, f"dashboard-03-24h-per-target-{width}")
    # Issue 28 items 9 and 4: every target is labelled on the latency chart, and "Clear" beside
    # the cooling target frees it from the dashboard.
    latency = page.evaluate("() => window.ocxDashboard.charts.latency.data.labels")
    assert primary in latency and fallback in latency, latency
    with page.expect_navigation():
        page.click(f'#ocx-dash-live button.ocx-reset[value="{primary}"]')
    message = page.locator(".messagelist").inner_text()
    assert f"Cleared the routing state of {primary} in combo {combo_id}." in message, message
    badge = page.locator(f'#ocx-dash-live .ocx-badge[data-target="{primary}"]').first
    assert "Available" in badge.inner_text()
    assert page.locator(f'#ocx-dash-live button.ocx-reset[value="{primary}"]').count() == 0
    events = page.locator(".ocx-ev-reset").all_inner_texts()
    assert any(
        f"combo/{combo_id}: routing state cleared for {primary} (operator)" in t for t in events
    ), events
    shot(page, f"dashboard-04-cleared-{width}")

    # The events page: history from the database (the writer is off the hot path) ...
    page.goto("/admin/combos/combo/events/")
    page.wait_for_selector("#ocx-conn.ocx-conn-on")
    history = page.locator("#ocx-event-list li").all_inner_texts()
    assert any(f"hopped off {primary}" in t for t in history), history
    assert any(f"{primary} cooling until " in t for t in history), history
    # ... then live: another combo's first target answers 429 and is cooled.
    xm = f"dx-{tag}"
    server.put_provider(f"extra-{tag}", provider(url, xm, apiKey="sk-dash-extra"))
    other = f"other{tag}"
    server.put_combo(
        other,
        {
            "targets": [
                {"provider": f"extra-{tag}", "model": xm},
                {"provider": f"fallback-{tag}", "model": fm},
            ],
            "cooldownMs": 45_000,
        },
    )
    sync(server)
    mock.script(xm, [{"status": 429}])
    ask(server, key, other)
    page.wait_for_function(
        "(t) => Array.from(document.querySelectorAll('#ocx-event-list li'))"
        ".slice(0, 2).some((li) => li.textContent.includes(t))",
        arg=f"combo/{other}: extra-{tag}/{xm} cooling until",
    )
    top = page.locator("#ocx-event-list li").first
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (cooldown|hop) combo/", top.inner_text())
    shot(page, f"events-01-history-and-live-{width}")
    # The indicator reports a dropped connection and comes back by itself.
    page.evaluate("() => window.ocxEvents.socket.close()")
    page.wait_for_selector("#ocx-conn.ocx-conn-off")
    assert "disconnected" in page.inner_text("#ocx-conn")
    shot(page, f"events-02-disconnected-{width}")
    page.wait_for_selector("#ocx-conn.ocx-conn-on", timeout=10_000)

    # Swagger UI from ocx's own static files, with no internet.
    page.goto("/api/docs")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "ocx management API" in page.inner_text(".swagger-ui .info .title")
    assert refused == []
