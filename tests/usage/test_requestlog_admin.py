"""The request log admin: columns, filters (status class, combo, user, time range) and the
route tables of the detail page."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from usage.models import RequestLog

pytestmark = pytest.mark.django_db
AT = dt.datetime(2026, 12, 1, 5, 10, 3, 250000, tzinfo=dt.UTC)


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    get_user_model().objects.create_user("alice", password="pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def _row(request_id: str, **fields: Any) -> RequestLog:
    data: dict[str, Any] = {
        "request_id": request_id,
        "at": timezone.now(),
        "user": "alice",
        "requested_model": "combo/main",
        "combo": "main",
        "target": "p1/m1",
        "status": 200,
        "outcome": "served",
        "duration_ms": 1234,
    }
    data.update(fields)
    return RequestLog.objects.create(**data)


def _ids(html: str) -> set[str]:
    return set(re.findall(r"/admin/usage/requestlog/(\d+)/change/", html))


def test_list_columns_local_time_to_the_second_and_hops(staff: Client) -> None:
    attempts = [
        {
            "target": "p0/m0",
            "status": 503,
            "outcome": "hop",
            "reason": "server_error",
            "cooledUntil": int(AT.timestamp() * 1000) + 60_000,
            "ms": 12,
        },
        {
            "target": "p1/m1",
            "status": 200,
            "outcome": "served",
            "reason": "",
            "cooledUntil": None,
            "ms": 1200,
        },
    ]
    _row("req-a", at=AT, attempts=attempts)
    html = staff.get("/admin/usage/requestlog/").content.decode()
    head = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert head == [
        "when",
        "status_badge",
        "duration",
        "user",
        "combo_name",
        "served",
        "hop_count",
    ]
    # The browser formats the ISO time in its own zone; the fallback has the seconds too.
    assert (
        '<time class="ocx-time" datetime="2026-12-01T05:10:03.250Z">2026-12-01 05:10:03 UTC</time>'
        in html
    )
    assert '<span class="ocx-status ocx-status-2xx">200</span>' in html
    assert '<td class="field-hop_count">1</td>' in html
    assert '<td class="field-duration">1234 ms</td>' in html
    assert "ocx/localtime.js" in html


def test_filters_by_status_class_combo_user_and_time_range(staff: Client) -> None:
    now = timezone.now()
    ok = _row("ok", status=200)
    refused = _row("refused", status=429, user="bob", combo="other")
    gone = _row("gone", status=499)
    failed = _row("failed", status=503, combo="")
    old = _row("old", status=200, at=now - dt.timedelta(hours=3))
    older = _row("older", status=200, at=now - dt.timedelta(days=3))

    def ids(query: str) -> set[str]:
        response = staff.get("/admin/usage/requestlog/?" + query)
        assert response.status_code == 200
        return _ids(response.content.decode())

    def pks(*rows: RequestLog) -> set[str]:
        return {str(r.pk) for r in rows}

    assert ids("status_class=2xx") == pks(ok, old, older)
    assert ids("status_class=4xx") == pks(refused)
    assert ids("status_class=499") == pks(gone)
    assert ids("status_class=5xx") == pks(failed)
    assert ids("combo=other") == pks(refused)
    assert ids("combo=-") == pks(failed)
    assert ids("user=bob") == pks(refused)
    assert ids("since=1h") == pks(ok, refused, gone, failed)
    assert ids("since=24h") == pks(ok, refused, gone, failed, old)
    assert ids("since=7d&status_class=2xx") == pks(ok, old, older)
    # The user filter offers the users (alice, root), the combo filter the configured combos.
    html = staff.get("/admin/usage/requestlog/").content.decode()
    assert "?user=alice" in html and "?status_class=499" in html and "?since=1h" in html


def test_detail_shows_the_route_as_tables(staff: Client) -> None:
    until = int(AT.timestamp() * 1000) + 60_000
    row = _row(
        "req-b",
        at=AT,
        attempts=[
            {
                "target": "p0/m0",
                "status": 503,
                "outcome": "hop",
                "reason": "server_error",
                "cooledUntil": until,
                "ms": 12,
            },
            {
                "target": "p1/m1",
                "status": 200,
                "outcome": "served",
                "reason": "",
                "cooledUntil": None,
                "ms": 1200,
            },
        ],
        skipped=[["p2/m2", "cooling"], ["p3/m3", "credential: OCX_TEST_KEY is not set"]],
    )
    html = staff.get(f"/admin/usage/requestlog/{row.pk}/change/").content.decode()
    attempts = html[
        html.index('id="ocx-attempts"') : html.index("</table>", html.index('id="ocx-attempts"'))
    ]
    cells = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", attempts, re.S)
    ]
    assert cells == [
        "1",
        "p0/m0",
        "503",
        "hop",
        "server_error",
        "2026-12-01 05:11:03 UTC (+1 min)",
        "12 ms",
        "2",
        "p1/m1",
        "200",
        "served",
        "—",
        "—",
        "1200 ms",
    ]
    assert 'datetime="2026-12-01T05:11:03.250Z"' in attempts
    skipped = html[html.index('id="ocx-skipped"') :]
    assert "<td>p2/m2</td><td>cooling</td>" in skipped
    assert "<td>p3/m3</td><td>credential: OCX_TEST_KEY is not set</td>" in skipped
    assert "cooledUntil" not in html  # no raw JSON


def test_detail_without_attempts_says_so(staff: Client) -> None:
    row = _row("req-c", status=401, target="", attempts=[], skipped=[])
    html = staff.get(f"/admin/usage/requestlog/{row.pk}/change/").content.decode()
    assert "No upstream attempt." in html
    assert "No target was skipped." in html


def test_bookmarks_of_the_pages_before_the_move_still_lead_there(staff: Client) -> None:
    """The request log and the keys moved out of the `ocxsite` app (docs/architecture.md): the
    old admin addresses answer with a permanent redirect to the new ones, query kept."""
    old = staff.get("/admin/ocxsite/requestlog/?status_class=5xx&since=1h&combo=main")
    assert old.status_code == 301
    assert old["Location"] == "/admin/usage/requestlog/?status_class=5xx&since=1h&combo=main"
    assert staff.get(old["Location"]).status_code == 200
    key = staff.get("/admin/ocxsite/clientkey/7/change/")
    assert (key.status_code, key["Location"]) == (301, "/admin/accounts/clientkey/7/change/")
    assert staff.get("/admin/ocxsite/somethingelse/").status_code == 404


def test_a_same_target_retry_shows_its_wait(staff: Client) -> None:
    row = _row(
        "req-retry",
        at=AT,
        attempts=[
            {
                "target": "p1/m1",
                "status": 429,
                "outcome": "retry",
                "reason": "rate_limited",
                "cooledUntil": None,
                "ms": 9,
                "waitMs": 2000,
            },
            {"target": "p1/m1", "status": 200, "outcome": "served", "reason": "", "ms": 30},
        ],
    )
    html = staff.get(f"/admin/usage/requestlog/{row.pk}/change/").content.decode()
    attempts = html[
        html.index('id="ocx-attempts"') : html.index("</table>", html.index('id="ocx-attempts"'))
    ]
    cells = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", attempts, re.S)
    ]
    assert cells[:7] == [
        "1",
        "p1/m1",
        "429",
        "retry, again after 2000 ms",
        "rate_limited",
        "—",
        "9 ms",
    ]
    assert cells[7:11] == ["2", "p1/m1", "200", "served"]


def test_the_route_table_names_the_rescue_roles() -> None:
    from usage.requestlog_admin import attempts_table

    row = RequestLog(
        request_id="r",
        attempts=[
            {"target": "a/m", "status": 502, "outcome": "hop", "role": "restart"},
            {"target": "b/m", "status": 200, "outcome": "continued"},
            {"target": "c/m", "status": 200, "outcome": "continuation", "role": "continuation"},
            {
                "target": "d/m",
                "status": 200,
                "outcome": "failed_after_commit",
                "role": "not_continued",
                "roleDetail": "tool call started",
            },
        ],
    )
    html = str(attempts_table(row))
    assert "<td>hop (restart)</td>" in html
    assert "<td>continued</td>" in html
    assert "<td>continuation</td>" in html
    assert "<td>failed_after_commit (not_continued: tool call started)</td>" in html


def test_a_budget_refusal_names_its_budget_and_an_estimate_says_so(staff: Client) -> None:
    # Issue 42: the lead sees which budget refused, and which tokens are ocx's estimate.
    refused = _row(
        "req-budget",
        status=429,
        target="",
        outcome="budget_exceeded",
        budget="team infra: $5.00 per day",
    )
    estimated = _row("req-est", input_tokens=105, output_tokens=12, usage_estimated=True)
    html = staff.get("/admin/usage/requestlog/").content.decode()
    assert "budget: team infra: $5.00 per day" in html
    detail = staff.get(f"/admin/usage/requestlog/{refused.pk}/change/").content.decode()
    assert "team infra: $5.00 per day" in detail
    detail = staff.get(f"/admin/usage/requestlog/{estimated.pk}/change/").content.decode()
    assert "105 / 12 (estimated)" in detail
