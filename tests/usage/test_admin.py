"""The usage rollups in the admin (the usage report's per-minute drill-down): rollup rows and
CSV export links that the staff session can follow to `/api/usage?format=csv`. The report
itself: tests/usage/test_report.py."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from usage import services
from usage.requestlog import RequestEntry

pytestmark = pytest.mark.django_db


def test_admin_usage_page_links_csv_for_the_session() -> None:
    now = dt.datetime.now(dt.UTC)
    services.record_requests(
        records=[
            RequestEntry(
                request_id="r1",
                at=now.timestamp(),
                user="ann",
                target="p/m",
                requested_model="p/m",
                status=200,
                outcome="ok",
                input_tokens=12,
                output_tokens=3,
            )
        ]
    )
    staff = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(staff)
    page = client.get("/admin/usage/usagerollup/rollups/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'href="/api/usage?format=csv&amp;by=user&amp;since=7d"' in html
    assert "ann" in html
    # Read-only: no delete action (only the retention removes counts).
    assert "delete_selected" not in html
    export = client.get("/api/usage?format=csv&by=user&since=7d")
    assert export.status_code == 200
    assert export["content-disposition"] == 'attachment; filename="ocx-usage.csv"'
    rows = list(csv.DictReader(io.StringIO(export.content.decode())))
    assert [(r["user"], r["requests"], r["inputTokens"]) for r in rows] == [("ann", "1", "12")]
    # A non-staff session gets no usage data.
    plain = get_user_model().objects.create_user("bob", "bob@example.com", "pw-123456789")
    other = Client()
    other.force_login(plain)
    assert other.get("/api/usage?format=csv").status_code == 403
    assert other.get("/admin/usage/usagerollup/").status_code == 302
    assert other.get("/admin/usage/usagerollup/rollups/").status_code == 302
