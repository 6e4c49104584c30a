"""Budgets (PRODUCT §9.5): validation, calendar periods, the CLI syntax, and the gate's
admission/charging logic on the in-memory counter store (time injected)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from state.budget_store import MemoryBudgetStore, RedisBudgetStore
from tests.conftest import ROOT
from usage.budget_gate import BudgetGate
from usage.budgets import (
    BudgetError,
    ScopedBudget,
    TokenBudget,
    WindowBudget,
    budgets_json,
    parse_budgets,
    parse_cli_budget,
    period_bounds,
)

UTC = ZoneInfo("UTC")


# The dates lie in 2037, whose calendar is 2026's: in Redis a counter expires an hour after its
# period by the server's own clock, so a period already over in real time would be gone at once.
def ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).timestamp() * 1000)


# --- validation -------------------------------------------------------------------------------


def test_one_object_or_a_list_in_canonical_form() -> None:
    assert parse_budgets({"tokens": 1000, "period": "day"}) == (TokenBudget(1000, "day"),)
    both = parse_budgets(
        [{"tokens": 5, "period": "month"}, {"windowPercent": 30, "provider": "cx"}],
        providers={"cx"},
    )
    assert both == (TokenBudget(5, "month"), WindowBudget(30.0, "cx"))
    assert budgets_json(both) == [
        {"tokens": 5, "period": "month"},
        {"windowPercent": 30, "provider": "cx"},
    ]
    assert budgets_json(parse_budgets({"windowPercent": 12.5, "provider": "cx"})) == [
        {"windowPercent": 12.5, "provider": "cx"}
    ]
    assert parse_budgets(None) == () and parse_budgets([]) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"tokens": 0, "period": "day"}, "budget.tokens must be from 1 to"),
        ({"tokens": 10**16, "period": "day"}, "budget.tokens must be from 1 to"),
        ({"tokens": "5", "period": "day"}, "budget.tokens must be an integer"),
        ({"tokens": True, "period": "day"}, "budget.tokens must be an integer"),
        ({"tokens": 1.5, "period": "day"}, "budget.tokens must be an integer"),
        ({"tokens": 5, "period": "year"}, "budget.period must be one of day, week, month"),
        ({"tokens": 5}, "budget.period must be one of day, week, month"),
        ({"tokens": 5, "period": "day", "x": 1}, "unexpected field x in a token budget"),
        ({"windowPercent": 0, "provider": "cx"}, "windowPercent must be more than 0"),
        ({"windowPercent": 101, "provider": "cx"}, "windowPercent must be more than 0"),
        ({"windowPercent": "30", "provider": "cx"}, "windowPercent must be a number"),
        ({"windowPercent": 30, "provider": ""}, "budget.provider must be a provider name"),
        ({"windowPercent": 30}, "budget.provider must be a provider name"),
        ({"windowPercent": 30, "provider": "nope"}, "budget.provider: unknown provider nope"),
        ({"windowPercent": 30, "provider": "cx", "tokens": 1}, "field provider in a token budget"),
        ({}, "budget must be"),
        ("5/day", "budget must be an object"),
        (
            [{"tokens": 5, "period": "day"}, {"tokens": 6, "period": "week"}],
            "at most one token budget",
        ),
        (
            [{"windowPercent": 5, "provider": "cx"}, {"windowPercent": 6, "provider": "cx"}],
            "at most one window budget for provider cx",
        ),
        ([{"tokens": 5, "period": "day"}, 7], "budgets[1] must be an object"),
    ],
)
def test_invalid_budgets_are_refused_naming_the_part(value: Any, message: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_budgets(value, providers={"cx"})
    assert message in str(info.value)


def test_cli_syntax() -> None:
    assert parse_cli_budget("tokens=100000/day") == {"tokens": 100000, "period": "day"}
    assert parse_cli_budget("tokens=100k/week") == {"tokens": 100_000, "period": "week"}
    assert parse_cli_budget("tokens=2M/month") == {"tokens": 2_000_000, "period": "month"}
    assert parse_cli_budget("window=30%/chatgpt") == {"windowPercent": 30, "provider": "chatgpt"}
    assert parse_cli_budget("window=12.5/cx") == {"windowPercent": 12.5, "provider": "cx"}
    for bad in ("tokens=5/year", "tokens=-5/day", "100k/day", "window=30%", "tokens=5"):
        with pytest.raises(BudgetError, match="use tokens=N/day"):
            parse_cli_budget(bad)


# --- calendar periods ---------------------------------------------------------------------------


def test_periods_in_utc() -> None:
    now = ms("2037-12-03T15:04:05+00:00")  # a Thursday
    assert period_bounds("day", now, UTC) == (
        "2037-12-03",
        ms("2037-12-03T00:00:00+00:00"),
        ms("2037-12-04T00:00:00+00:00"),
    )
    assert period_bounds("week", now, UTC) == (
        "2037-11-30",
        ms("2037-11-30T00:00:00+00:00"),
        ms("2037-12-07T00:00:00+00:00"),
    )
    assert period_bounds("month", now, UTC) == (
        "2037-12-01",
        ms("2037-12-01T00:00:00+00:00"),
        ms("2038-01-01T00:00:00+00:00"),
    )


def test_periods_follow_the_configured_zone_and_dst() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # 23:30 UTC on 3 Dec is already 4 Dec in Berlin.
    label, start, end = period_bounds("day", ms("2037-12-03T23:30:00+00:00"), berlin)
    assert label == "2037-12-04"
    assert start == ms("2037-12-04T00:00:00+01:00") and end == ms("2037-12-05T00:00:00+01:00")
    # The day summer time ends is 25 hours long.
    _, start, end = period_bounds("day", ms("2037-10-25T12:00:00+01:00"), berlin)
    assert end - start == 25 * 3600 * 1000


# --- the gate -----------------------------------------------------------------------------------


KEY_TOKENS = ScopedBudget("key", "k1", "key ocx_abc… of dev", TokenBudget(1000, "day"))
USER_WINDOW = ScopedBudget("user", "u1", "user dev", WindowBudget(30.0, "cx"))
PAIR = ("cx", "fp1")
RESET = ms("2037-12-03T18:00:00+00:00")


def codex(used: float, reset_ms: int = RESET) -> dict[str, str]:
    return {
        "x-codex-primary-used-percent": str(used),
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": str(reset_ms // 1000),
    }


@pytest.fixture
def events() -> list[dict[str, object]]:
    return []


@pytest.fixture(params=["memory", "redis"])
async def gate(
    request: pytest.FixtureRequest, events: list[dict[str, object]]
) -> AsyncIterator[BudgetGate]:
    # The same behaviour from both stores: the Redis one runs the Lua script (CI's second pass).
    if request.param == "memory":
        yield BudgetGate(MemoryBudgetStore(), prefix="t", on_event=events.append)
        return
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL not set")
    store = RedisBudgetStore(url)
    yield BudgetGate(store, prefix=f"t-{uuid.uuid4().hex[:8]}", on_event=events.append)
    await store.redis.aclose()


async def test_token_budget_admits_until_used_up_then_refuses_until_the_period_ends(
    gate: BudgetGate, events: list[dict[str, object]]
) -> None:
    now = ms("2037-12-03T15:00:00+00:00")
    budgets = (KEY_TOKENS,)
    assert await gate.admit(budgets, now) is None
    await gate.charge(budgets, tokens=700, served=None, now_ms=now)
    assert await gate.admit(budgets, now) is None
    assert events == []
    await gate.charge(budgets, tokens=200, served=None, now_ms=now)  # 900: past 80 %
    assert [e["percent"] for e in events] == [80]
    assert await gate.admit(budgets, now) is None  # 900 < 1000: still admitted
    await gate.charge(budgets, tokens=150, served=None, now_ms=now)  # 1050: past 100 %
    assert [e["percent"] for e in events] == [80, 100]
    assert events[1]["message"] == (
        "key ocx_abc… of dev has used 100% of its budget of 1000 tokens per day (1050 of 1000);"
        " it resets at 2037-12-04T00:00:00+00:00"
    )
    refusal = await gate.admit(budgets, now)
    assert refusal is not None
    assert refusal.message() == (
        "Budget exceeded: key ocx_abc… of dev may use 1000 tokens per day and has used"
        " 1050 tokens; it resets at 2037-12-04T00:00:00+00:00"
    )
    midnight = ms("2037-12-04T00:00:00+00:00")
    assert refusal.headers(now) == [
        (b"x-ocx-budget-limit", b"1000"),
        (b"x-ocx-budget-remaining", b"0"),
        (b"x-ocx-budget-reset", str(midnight // 1000).encode()),
        (b"retry-after", str((midnight - now) // 1000).encode()),
    ]
    # More usage in the same period crosses nothing again; the next day starts from zero.
    await gate.charge(budgets, tokens=500, served=None, now_ms=now)
    assert len(events) == 2
    assert await gate.admit(budgets, midnight) is None
    # Unknown usage (no tokens reported) counts nothing.
    await gate.charge(budgets, tokens=None, served=None, now_ms=midnight)
    assert await gate.admit(budgets, midnight) is None


async def test_window_budget_counts_each_rise_against_the_request_that_reported_it(
    gate: BudgetGate, events: list[dict[str, object]]
) -> None:
    now = ms("2037-12-03T15:00:00+00:00")
    mine = (USER_WINDOW,)
    providers = frozenset({"cx"})
    # The first answer seen only sets the baseline (10 %): nothing is attributed.
    await gate.charge(mine, tokens=None, served=(PAIR, codex(10)), now_ms=now)
    assert await gate.admit(mine, now) is None
    # Someone without a budget raises it to 25: not this user's points.
    await gate.charge((), tokens=None, served=(PAIR, codex(25)), now_ms=now, providers=providers)
    # This user's answers: 25 → 45 (20 points), 45 → 52 (7 points, 27 in all: past 80 %).
    await gate.charge(mine, tokens=None, served=(PAIR, codex(45)), now_ms=now)
    await gate.charge(mine, tokens=None, served=(PAIR, codex(52)), now_ms=now)
    assert [e["percent"] for e in events] == [80]
    assert events[0]["window"] == "five_hour"
    assert await gate.admit(mine, now) is None
    # 52 → 55: 30 points, used up.
    await gate.charge(mine, tokens=None, served=(PAIR, codex(55)), now_ms=now)
    assert [e["percent"] for e in events] == [80, 100]
    refusal = await gate.admit(mine, now)
    assert refusal is not None
    assert refusal.message() == (
        "Budget exceeded: user dev may use 30% of each cx quota window and has used 30 points"
        " of the five_hour window; it resets at 2037-12-03T18:00:00+00:00"
    )
    assert refusal.headers(now)[:3] == [
        (b"x-ocx-budget-limit", b"30"),
        (b"x-ocx-budget-remaining", b"0"),
        (b"x-ocx-budget-reset", str(RESET // 1000).encode()),
    ]
    # Once the window has reset the budget admits again; the next window starts from zero and
    # its first answer's whole used-percent is the rise since the reset.
    later = RESET + 1000
    assert await gate.admit(mine, later) is None
    next_reset = RESET + 5 * 3600 * 1000
    await gate.charge(mine, tokens=None, served=(PAIR, codex(4, next_reset)), now_ms=later)
    assert await gate.admit(mine, later) is None
    # A late answer from the old window changes nothing.
    await gate.charge(mine, tokens=None, served=(PAIR, codex(99)), now_ms=later)
    assert await gate.admit(mine, later) is None


async def test_window_rises_of_other_providers_or_unbudgeted_requests_are_skipped(
    gate: BudgetGate,
) -> None:
    now = ms("2037-12-03T15:00:00+00:00")
    mine = (USER_WINDOW,)
    await gate.charge(mine, tokens=None, served=(PAIR, codex(10)), now_ms=now)
    # Another provider's windows never count against a cx budget.
    await gate.charge(mine, tokens=None, served=(("other", "fp2"), codex(90)), now_ms=now)
    assert await gate.admit(mine, now) is None
    # An unbudgeted request to a provider no budget names is not even looked at.
    await gate.charge((), tokens=None, served=(PAIR, codex(80)), now_ms=now)
    await gate.charge(mine, tokens=None, served=(PAIR, codex(20)), now_ms=now)
    assert await gate.admit(mine, now) is None  # 10 points


async def test_refusal_names_the_budget_that_resets_last(gate: BudgetGate) -> None:
    now = ms("2037-12-03T15:00:00+00:00")
    week = ScopedBudget("user", "u1", "user dev", TokenBudget(10, "week"))
    day = ScopedBudget("key", "k1", "key ocx_abc… of dev", TokenBudget(10, "day"))
    await gate.charge((day, week), tokens=10, served=None, now_ms=now)
    refusal = await gate.admit((day, week), now)
    assert refusal is not None and refusal.budget == week
    assert refusal.reset_ms == ms("2037-12-07T00:00:00+00:00")


async def test_one_charge_counts_every_token_budget_of_the_request(gate: BudgetGate) -> None:
    """The key's and the user's token budgets are charged together (one round trip in Redis),
    each counter on its own and expiring an hour after its own period."""
    now = ms("2037-12-03T15:00:00+00:00")
    user = ScopedBudget("user", "u1", "user dev", TokenBudget(100, "week"))
    key = ScopedBudget("key", "k1", "key ocx_abc… of dev", TokenBudget(50, "day"))
    await gate.charge((key, user), tokens=30, served=None, now_ms=now)
    await gate.charge((user,), tokens=30, served=None, now_ms=now)
    assert await gate.admit((key,), now) is None  # 30 of 50
    refusal = await gate.admit((user,), now)
    assert refusal is None  # 60 of 100
    await gate.charge((key, user), tokens=40, served=None, now_ms=now)
    refused = await gate.admit((key, user), now)
    assert refused is not None and (refused.budget, refused.used) == (user, 100)
    assert (await gate.admit((key,), now)) is not None  # 70 of 50
    store = gate.store
    if isinstance(store, RedisBudgetStore):
        day = gate._counter(key, key.budget, now)[0]  # type: ignore[arg-type]
        expires = await store.redis.execute("PEXPIRETIME", day)
        assert expires == ms("2037-12-04T01:00:00+00:00")


# --- OCX_TIME_ZONE --------------------------------------------------------------------------------


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../etc/passwd", "UTC+2"])
def test_a_bad_time_zone_stops_the_start(zone: str, tmp_path: Any) -> None:
    env = {**os.environ, "OCX_TIME_ZONE": zone, "OCX_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    r = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode != 0
    assert (
        f"OCX_TIME_ZONE must be an IANA time zone such as UTC or Europe/Berlin, got {zone!r}"
        in r.stderr
    )


def test_a_good_time_zone_is_used_by_the_gate(tmp_path: Any) -> None:
    env = {**os.environ, "OCX_TIME_ZONE": "Europe/Berlin", "OCX_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    code = (
        "import django; django.setup(); from usage.budget_events import new_gate; "
        "print(new_gate(lambda e: None, lambda: 0).tz_name)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "ocxsite.settings"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Europe/Berlin"


@pytest.mark.django_db(transaction=True)
def test_a_budget_event_queued_at_shutdown_is_written_by_the_runtime_flush(settings: Any) -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from gateway.runtime import Runtime
    from usage.models import BudgetEvent

    # With REDIS_URL the counter is shared: a prefix of its own, or an earlier run's 1050
    # tokens (the fixed day below) would leave no threshold to cross.
    settings.OCX_STATE_KEY_PREFIX = f"t-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        rt = Runtime()
        now = ms("2037-12-03T15:00:00+00:00")
        # 1050 of 1000 tokens: the 80 % and 100 % events, queued for the background writer.
        await rt.budgets.charge((KEY_TOKENS,), tokens=1050, served=None, now_ms=now)
        await rt.flush()  # what a graceful shutdown runs before the worker stops
        await loop.run_in_executor(None, lambda: connection.close())

    asyncio.run(scenario())
    assert sorted(BudgetEvent.objects.values_list("percent", flat=True)) == [80, 100]


async def test_counters_read_along_with_the_quota_gate_decide_as_the_gates_own_read() -> None:
    """`along` names the token counters for the quota gate's `MGET` (only for a store that
    keeps them in Redis, and only when no window budget needs a hash read); `admit_read`
    decides on the raw values read there and hands them to the store (its outage copy)."""
    noted: list[tuple[list[str], list[int]]] = []

    class Noting(MemoryBudgetStore):
        def note_read(self, counters: list[str], values: list[int]) -> None:
            noted.append((list(counters), list(values)))

    gate = BudgetGate(Noting(), prefix="t")
    now = ms("2037-12-03T15:00:00+00:00")
    key = ScopedBudget("key", "k1", "key ocx_abc… of dev", TokenBudget(50, "day"))
    user = ScopedBudget("user", "u1", "user dev", TokenBudget(100, "week"))
    day, week = period_bounds("day", now, UTC)[0], period_bounds("week", now, UTC)[0]
    names = gate.along((key, user), now)
    assert names is not None
    assert names == [f"t:budget:k1:tokens:day:{day}", f"t:budget:u1:tokens:week:{week}"]
    assert gate.along((key, USER_WINDOW), now) is None  # a hash: read by `admit`
    assert gate.along((), now) is None
    assert BudgetGate(MemoryBudgetStore(), prefix="t").along((key,), now) is None
    assert gate.admit_read((key, user), names, [b"49", None], now) is None
    refused = gate.admit_read((key, user), names, [b"50", b"100"], now)
    assert refused is not None and (refused.budget, refused.used) == (user, 100)
    assert refused.reset_ms == ms("2037-12-07T00:00:00+00:00")
    assert noted == [(names, [49, 0]), (names, [50, 100])]
