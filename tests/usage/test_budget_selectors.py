"""Budget use from what was recorded (usage.budget_selectors): per key, user and team (the
requests of the group's current members), in the current calendar period only, and the text
the admin shows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from usage.budget_selectors import budget_recorded, budget_use, scope_sums
from usage.budgets import ScopedBudget, TokenBudget, UsdBudget, WindowBudget
from usage.models import HOUR, MINUTE, UsageRollup

NOW = dt.datetime(2026, 12, 3, 15, 0, tzinfo=dt.UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def rollup(at: dt.datetime, user: str, key_id: int, tokens: int, cost: float, **extra: Any) -> None:
    UsageRollup.objects.create(
        resolution=extra.pop("resolution", MINUTE),
        bucket=at,
        user=user,
        key_id=key_id,
        target=extra.pop("target", "p/m"),
        input_tokens=tokens - 10,
        output_tokens=10,
        cost_usd=cost,
        **extra,
    )


@pytest.fixture
def recorded(db: Any) -> dict[str, int]:
    users = get_user_model().objects
    ann = users.create(username="ann")
    ben = users.create(username="ben")
    cat = users.create(username="cat")
    infra = Group.objects.create(name="infra")
    infra.user_set.add(ann, ben)
    today = NOW.replace(hour=1)
    rollup(today, "ann", 11, 100, 0.25)
    rollup(today.replace(minute=5), "ann", 12, 50, 0.5)
    rollup(today, "ben", 21, 1000, 1.0, target="q/m")
    rollup(today, "cat", 31, 7, 9.0)
    # Earlier this month (an hour row): counts for "month", not "day".
    rollup(dt.datetime(2026, 12, 1, 3, tzinfo=dt.UTC), "ann", 11, 300, 3.0, resolution=HOUR)
    # Last month: counts for nothing.
    rollup(dt.datetime(2026, 11, 30, 23, tzinfo=dt.UTC), "ann", 11, 9999, 99.0)
    return {"ann": ann.pk, "ben": ben.pk, "cat": cat.pk, "infra": infra.pk}


def test_scope_sums_per_key_user_and_team(recorded: dict[str, int]) -> None:
    ann, infra = recorded["ann"], recorded["infra"]
    since = NOW.replace(hour=0)
    sums = scope_sums({"k11", "k12", f"u{ann}", f"t{infra}", "k99"}, since)
    assert sums == {
        "k11": (100, 250_000),
        "k12": (50, 500_000),
        f"u{ann}": (150, 750_000),  # both of ann's keys
        f"t{infra}": (1150, 1_750_000),  # ann's and ben's requests, not cat's
    }


def test_team_use_follows_current_membership(recorded: dict[str, int]) -> None:
    infra = Group.objects.get(pk=recorded["infra"])
    cat = get_user_model().objects.get(username="cat")
    infra.user_set.add(cat)
    got = budget_recorded([(f"t{infra.pk}", "usd", "day")], NOW_MS, tz="UTC")
    assert got == {(f"t{infra.pk}", "usd", "day"): 10_750_000}


def test_budget_recorded_by_period(recorded: dict[str, int]) -> None:
    ann = recorded["ann"]
    ids = [
        ("k11", "tokens", "day"),
        ("k11", "tokens", "month"),
        ("k11", "usd", "month"),
        (f"u{ann}", "usd", "week"),  # the week from Monday 2026-11-30
    ]
    assert budget_recorded(ids, NOW_MS, tz="UTC") == {
        ("k11", "tokens", "day"): 100,
        ("k11", "tokens", "month"): 400,
        ("k11", "usd", "month"): 3_250_000,
        (f"u{ann}", "usd", "week"): 3_750_000 + 99_000_000,
    }


def test_budget_use_texts(recorded: dict[str, int]) -> None:
    ann = recorded["ann"]
    budgets = (
        ScopedBudget("key", "k11", "key ocx_a… of ann", TokenBudget(80, "day")),
        ScopedBudget("user", f"u{ann}", "user ann", UsdBudget(5.0, "month")),
        ScopedBudget("user", f"u{ann}", "user ann", WindowBudget(30.0, "cx")),
    )
    uses = budget_use(budgets, now_ms=NOW_MS, tz="UTC")
    assert [u.text for u in uses] == [
        "100 of 80 tokens today",
        "$3.75 of $5.00 this month",
        "30% of each cx quota window (use shown live in the 429 and events)",
    ]
    assert (uses[0].used, uses[0].limit, uses[0].period) == (100, 80, "day")
    assert uses[0].resets_at == dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    assert (uses[1].used, uses[1].limit) == (3.75, 5.0)
    assert uses[1].resets_at == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    assert uses[2].used is None
