"""The usage report (`/admin/usage/usagerollup/`) and the dashboard's spend in a real browser
(Debian's Chromium via Playwright) against a real `ocx serve`, at 1280 and 1920 px, in a
browser zone that is not the server's (America/New_York), with every request to another host
refused (air-gapped):

- the page takes the browser's zone (shown), lists one row per user with requests, tokens and
  dollars, a totals row and a spend chart of one bar per local day, without sideways scrolling;
- the grouping and period pickers change the rows (target grouping; 30 days reaches a request
  from 20 days ago; today has 24 hourly bars; a custom range);
- a row's drill-down opens its per-minute rollups;
- a request served through the proxy with a priced model shows up with its cost;
- the dashboard shows today's and this month's spend and the top spenders.

Screenshots go to test-artifacts/browser/ (usage-report-*.png, dashboard-spend-*.png).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any
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
from tests.browser.test_dashboard_browser import airgap
from tests.conftest import ROOT, Mock, Server
from tests.gateway.test_quota_failover import provider, sync

ZONE = "America/New_York"
REPORT = "/admin/usage/usagerollup/"
NO_SIDEWAYS_SCROLL = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"

SEED = """
import datetime as dt, json, sys
from usage.models import UsageRollup
for row in json.loads(sys.stdin.read()):
    row["bucket"] = dt.datetime.fromisoformat(row["bucket"])
    UsageRollup.objects.create(**row)
"""


def seed(server: Server, rows: list[dict[str, Any]]) -> None:
    """Rollup rows written into the server's own database (`manage.py shell`)."""
    r = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", SEED],
        cwd=ROOT,
        env=server.env,
        input=json.dumps(rows),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


@pytest.fixture
def page(admin_server: Server, browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:  # noqa: F811
    with new_page(browser, admin_server.url, request.param, 1400, timezone_id=ZONE) as page:
        yield page


def rows(page: Any) -> list[list[str]]:
    out: list[list[str]] = page.eval_on_selector_all(
        "#ocx-report-table tbody tr.ocx-row",
        "trs => trs.map(tr => Array.from(tr.cells).map(td => td.innerText.trim()))",
    )
    return out


def fits(page: Any) -> None:
    assert page.evaluate(NO_SIDEWAYS_SCROLL), page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )


@pytest.mark.parametrize("page", WIDTHS, indirect=True)
def test_usage_report_and_dashboard_spend(
    page: Any,
    admin_server: Server,  # noqa: F811
    mock: Mock,
) -> None:
    server = admin_server
    width = page.viewport_size["width"]
    refused = airgap(page, server)
    tag = uuid.uuid4().hex[:5]
    ann, ben, cat = f"ann-{tag}", f"ben-{tag}", f"cat-{tag}"
    now = dt.datetime.now(dt.UTC)
    today_ny = now.astimezone(ZoneInfo(ZONE)).date()
    seed(
        server,
        [
            # Today: ann on an API target, ben on a chatgpt subscription (cost 0).
            {
                "bucket": (now - dt.timedelta(minutes=3)).isoformat(),
                "user": ann,
                "target": "openai/gpt-5",
                "model": "combo/main",
                "status_class": "2xx",
                "requests": 12,
                "input_tokens": 1_234_567,
                "output_tokens": 45_678,
                "cost_usd": 1234.5,
                "api_value_usd": 1234.5,
            },
            {
                "bucket": (now - dt.timedelta(minutes=2)).isoformat(),
                "user": ben,
                "target": "chatgpt/gpt-5-codex",
                "model": "gpt-5-codex",
                "status_class": "2xx",
                "requests": 5,
                "input_tokens": 50_000,
                "output_tokens": 4_000,
                "cost_usd": 0.0,
                "api_value_usd": 7.25,
            },
            # Three days ago (in the 7 days): ann again.
            {
                "bucket": (now - dt.timedelta(days=3)).isoformat(),
                "resolution": 3600,
                "user": ann,
                "target": "openai/gpt-5",
                "model": "combo/main",
                "status_class": "2xx",
                "requests": 3,
                "input_tokens": 1000,
                "output_tokens": 100,
                "cost_usd": 10.0,
                "api_value_usd": 10.0,
            },
            # Twenty days ago: only in the 30 days.
            {
                "bucket": (now - dt.timedelta(days=20)).isoformat(),
                "resolution": 3600,
                "user": cat,
                "target": "anthropic/claude",
                "model": "claude",
                "status_class": "2xx",
                "requests": 2,
                "input_tokens": 500,
                "output_tokens": 50,
                "cost_usd": 0.75,
                "api_value_usd": 0.75,
            },
        ],
    )
    # One request served through the proxy by a model with its own price.
    model = f"pr-{tag}"
    price = {"inputPerMTok": 1000, "outputPerMTok": 1000}
    spec = provider(mock.url + "/v1", model, apiKey="sk-report")
    spec["models"][model]["price"] = price
    server.put_provider(f"priced-{tag}", spec)
    sync(server)
    live = f"live-{tag}"
    key = server.create_key(user=live)
    r = server.http.post(
        "/v1/responses",
        json={"model": f"priced-{tag}/{model}", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text

    login(page)
    page.goto(REPORT)
    # The script reloads the page once with the browser's zone.
    page.wait_for_url(f"**tz={ZONE.replace('/', '%2F')}*")
    assert page.inner_text("#ocx-zone") == ZONE
    assert page.get_attribute('#ocx-period a[data-period="7d"]', "aria-current") == "true"
    # The range reads in local time (localtime.js), never as a raw ISO time.
    range_text = page.inner_text("#ocx-range")
    assert range_text.startswith(f"{today_ny - dt.timedelta(days=6):%Y-%m-%d} 00:00:00 to ")
    assert "T" not in range_text.split(" · ")[0]

    # The served request reaches the rollups within the writer's batch time.
    deadline = time.monotonic() + 10
    while live not in [r[0] for r in rows(page)] and time.monotonic() < deadline:
        time.sleep(0.3)
        page.reload()
    by_user = {r[0]: r for r in rows(page)}
    assert by_user[ann][:6] == [ann, "15", "1,235,567", "0", "45,778", "$1,244.50"]
    assert by_user[ben][5:7] == ["$0.00", "$7.25"]
    assert by_user[live][1] == "1" and by_user[live][5].startswith("$")
    assert by_user[live][5] not in ("$0.00",)
    assert cat not in by_user
    total = page.locator("#ocx-report-total td").all_inner_texts()
    assert total[0] == f"{sum(int(r[1].replace(',', '')) for r in by_user.values()):,}"
    assert int(total[0]) >= 21  # 12 + 5 + 3 + the live one
    # The chart: one bar group per local day of the 7, drawn at a readable size.
    assert page.locator("#ocx-spend-chart .ocx-step").count() == 7
    box = page.locator("#ocx-spend-chart").bounding_box()
    assert box["height"] > 150 and box["width"] > 800
    fits(page)
    shot(page, f"usage-report-01-users-7d-{width}")

    # Group by target: the rows are targets now.
    page.click('#ocx-group a[data-by="target"]')
    page.wait_for_selector('#ocx-group a[data-by="target"].ocx-on')
    targets = [r[0] for r in rows(page)]
    assert targets[0] == "openai/gpt-5"
    assert {"chatgpt/gpt-5-codex", f"priced-{tag}/{model}"} <= set(targets)
    assert ann not in targets
    assert "tz=America%2FNew_York" in page.url
    fits(page)
    shot(page, f"usage-report-02-targets-7d-{width}")

    # 30 days: cat's request from 20 days ago appears (grouping kept).
    page.click('#ocx-period a[data-period="30d"]')
    page.wait_for_selector('#ocx-period a[data-period="30d"].ocx-on')
    assert "anthropic/claude" in [r[0] for r in rows(page)]
    assert page.locator("#ocx-spend-chart .ocx-step").count() == 30
    fits(page)
    shot(page, f"usage-report-03-targets-30d-{width}")

    # Today per user: 24 hourly bars, ann's older request is not counted.
    page.click('#ocx-group a[data-by="user"]')
    page.click('#ocx-period a[data-period="today"]')
    page.wait_for_selector('#ocx-period a[data-period="today"].ocx-on')
    assert page.locator("#ocx-spend-chart .ocx-step").count() in (23, 24, 25)  # DST days
    today = {r[0]: r for r in rows(page)}
    assert today[ann][1] == "12" and today[ann][5] == "$1,234.50"
    fits(page)
    shot(page, f"usage-report-04-users-today-{width}")

    # A custom range: the day of cat's request only.
    day = (now - dt.timedelta(days=20)).astimezone(ZoneInfo(ZONE)).date()
    page.fill("#ocx-from", day.isoformat())
    page.fill("#ocx-to", day.isoformat())
    page.click("#ocx-custom button[type=submit]")
    page.wait_for_selector("#ocx-custom.ocx-on")
    # (The server and its database serve both widths: the other run's rows are there too.)
    assert [r[0] for r in rows(page) if r[0].endswith(tag)] == [cat]
    assert page.inner_text("#ocx-zone") == ZONE

    # The drill-down: cat's per-minute (here hourly) rollup rows.
    page.locator("#ocx-report-table tbody tr.ocx-row", has_text=cat).locator(".ocx-drill a").click()
    page.wait_for_url("**/usagerollup/rollups/**")
    assert page.locator("#result_list tbody tr").count() == 1
    assert cat in page.inner_text("#result_list")
    fits(page)
    # Every column shows (the old list was 1563 px wide at 1440 px and scrolled).
    shot(page, f"usage-report-05-drill-down-{width}")
    assert page.evaluate(
        "(() => { const r = document.querySelector('#changelist .results');"
        " return r.scrollWidth <= r.clientWidth; })()"
    ), page.evaluate(
        "(() => { const r = document.querySelector('#changelist .results');"
        " return [r.scrollWidth, r.clientWidth]; })()"
    )
    assert "T" not in page.inner_text("#result_list .field-when")  # local, not ISO
    shot(page, f"usage-report-05-drill-down-{width}")

    # The dashboard's spend.
    page.goto("/admin/")
    page.wait_for_selector("#ocx-spend")
    today_box = page.inner_text("#ocx-spend-today")
    cost = float(today_box.split("$", 1)[1].split()[0].replace(",", ""))
    assert cost >= 1234.51  # ann's and the live request's (and the other width's run)
    assert "at API prices" in today_box
    spenders = page.locator("#ocx-top-spenders tbody tr td:first-child").all_inner_texts()
    assert ann in spenders[:2] and len(spenders) <= 5
    assert live in spenders
    fits(page)
    page.locator("#ocx-spend").screenshot(path=str(ARTIFACTS / f"dashboard-spend-{width}.png"))
    assert refused == []
