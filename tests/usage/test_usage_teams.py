"""Usage `by=team` (issue 27): a request counts for each team its user is in now; requests of
users in no team (or of no user) under `(no team)`; the totals count each request once. Through
the selectors, `GET /api/usage` (JSON and CSV) and `ocx usage --by team`."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from accounts import team_services
from tests.usage.test_rollups import entry
from usage import selectors, services

pytestmark = pytest.mark.django_db
TOKEN = "test-admin-token-for-usage-teams-1"


@pytest.fixture
def recorded() -> dt.datetime:
    for name in ("ann", "ben", "cy"):
        get_user_model().objects.create_user(name)
    team_services.team_set(name="infra", members=["ann", "ben"])
    team_services.team_set(name="apps", members=["ann"])
    now = timezone.now().replace(microsecond=0)
    at = now - dt.timedelta(minutes=5)
    services.record_requests(
        records=[
            entry(at=at, user="ann", cost=(0.5, 0.5, False)),  # infra and apps
            entry(at=at, user="ben", cost=(0.25, 0.25, False)),  # infra
            entry(at=at, user="ben", target="q/n", cost=(0.25, 0.25, False)),  # infra
            entry(at=at, user="cy", cost=(1.0, 1.0, False)),  # no team
            entry(at=at, user="", tokens=(None, None, None, None)),  # refused before a key
        ]
    )
    return now


def test_by_team_counts_each_team_of_the_user(recorded: dt.datetime) -> None:
    report = selectors.usage_report(
        selectors.build_query(by="team", since="1h", until=None, now=recorded)
    )
    assert [(r["team"], r["requests"], r["costUsd"], r["inputTokens"]) for r in report["rows"]] == [
        ("(no team)", 2, 1.0, 100),
        ("apps", 1, 0.5, 100),
        ("infra", 3, 1.0, 300),
    ]
    # Each request once in the totals, though ann's counts for two teams.
    assert report["totals"]["requests"] == 5
    assert report["totals"]["costUsd"] == 2.0
    assert report["by"] == ["team"]

    by_two = selectors.usage_report(
        selectors.build_query(by="team,target", since="1h", until=None, now=recorded)
    )
    assert [(r["team"], r["target"], r["requests"]) for r in by_two["rows"]] == [
        ("(no team)", "p/m", 2),
        ("apps", "p/m", 1),
        ("infra", "p/m", 2),
        ("infra", "q/n", 1),
    ]
    with_user = selectors.usage_report(
        selectors.build_query(by="team,user", since="1h", until=None, now=recorded)
    )
    assert [(r["team"], r["user"], r["requests"]) for r in with_user["rows"]] == [
        ("(no team)", "cy", 1),
        ("(no team)", None, 1),
        ("apps", "ann", 1),
        ("infra", "ann", 1),
        ("infra", "ben", 2),
    ]


def test_membership_is_read_at_report_time(recorded: dt.datetime) -> None:
    team_services.team_set(name="infra", members=["cy"])
    report = selectors.usage_report(
        selectors.build_query(by="team", since="1h", until=None, now=recorded)
    )
    assert [(r["team"], r["requests"]) for r in report["rows"]] == [
        ("(no team)", 3),  # ben and the key-less request
        ("apps", 1),
        ("infra", 1),  # cy's request now
    ]


def test_api_json_csv_and_cli(recorded: dt.datetime, settings: Any, client: Client) -> None:
    settings.OCX_ADMIN_TOKEN = TOKEN
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    r = client.get("/api/usage", {"by": "team", "since": "1h"}, **auth)
    assert r.status_code == 200, r.content
    assert [(row["team"], row["requests"]) for row in r.json()["rows"]] == [
        ("(no team)", 2),
        ("apps", 1),
        ("infra", 3),
    ]
    r = client.get("/api/usage", {"by": "team", "since": "1h", "format": "csv"}, **auth)
    rows = list(csv.DictReader(io.StringIO(r.content.decode())))
    assert [(row["team"], row["requests"], row["costUsd"]) for row in rows] == [
        ("(no team)", "2", "1.0"),
        ("apps", "1", "0.5"),
        ("infra", "3", "1.0"),
    ]
    r = client.get("/api/usage", {"by": "teams"}, **auth)
    assert r.status_code == 400
    assert r.json()["error"] == (
        "by: unknown dimension 'teams'; use one or two of user, team, key, combo, target, "
        "model, status"
    )

    out = io.StringIO()
    call_command("usage", "--by", "team", "--since", "1h", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[1].split() == [
        "TEAM",
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
    assert lines[2].split()[:3] == ["(no", "team)", "2"]
    assert lines[3].split()[:2] == ["apps", "1"]
    assert lines[4].split()[:3] == ["infra", "3", "300"]
    assert lines[5].split()[:2] == ["TOTAL", "5"]
