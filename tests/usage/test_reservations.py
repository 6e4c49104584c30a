"""Bounded overshoot (issue 42, `usage.reservations`): admission reserves each request's
expected cost; a burst worth N requests' budget is admitted N times; the end lets the
reservation go. Both stores: this worker's memory and Redis (CI's second pass)."""

from __future__ import annotations

import asyncio

from tests.usage.test_budgets import KEY_TOKENS, events, gate, ms  # noqa: F401 - fixtures
from usage.budget_gate import BudgetGate, Refusal
from usage.budgets import ScopedBudget, UsdBudget
from usage.reservations import Hold, Recent, Reservations

NOW = ms("2037-12-03T15:00:00+00:00")  # KEY_TOKENS: 1000 tokens per day
USER_USD = ScopedBudget("user", "u9", "user dev", UsdBudget(1.0, "day"))


async def test_a_burst_is_admitted_as_often_as_the_budget_holds(
    gate: BudgetGate,  # noqa: F811 - the fixture
) -> None:
    reservations = Reservations(gate)
    budgets = (KEY_TOKENS,)
    await gate.charge(budgets, tokens=100, served=None, now_ms=NOW)  # 900 left: 3 of 300
    results = await asyncio.gather(
        *(reservations.reserve(budgets, tokens=300, micros=0, now_ms=NOW) for _ in range(16))
    )
    holds = [r for r in results if isinstance(r, Hold)]
    refusals = [r for r in results if isinstance(r, Refusal)]
    assert len(holds) == 3 and len(refusals) == 13
    # The refusal counts what is charged and what the requests in flight reserved.
    assert refusals[0].used == 100 + 3 * 300 and refusals[0].limit == 1000
    # One ends having used 250: charged, its reservation let go; one more fits (1000 - 250 -
    # 2 x 300 - 100 = 50 left, and a budget admits while under its limit).
    await gate.charge(budgets, tokens=250, served=None, now_ms=NOW)
    await reservations.release(holds[0])
    again = await reservations.reserve(budgets, tokens=300, micros=0, now_ms=NOW)
    assert isinstance(again, Hold)
    assert isinstance(
        await reservations.reserve(budgets, tokens=300, micros=0, now_ms=NOW), Refusal
    )
    for hold in (*holds[1:], again):
        await reservations.release(hold)
    # All let go: only the charged 350 counts, so the next request is admitted again.
    assert isinstance(await reservations.reserve(budgets, tokens=300, micros=0, now_ms=NOW), Hold)


async def test_dollar_budgets_reserve_micro_dollars_and_windows_nothing(
    gate: BudgetGate,  # noqa: F811 - the fixture
) -> None:
    reservations = Reservations(gate)
    budgets = (KEY_TOKENS, USER_USD)
    hold = await reservations.reserve(budgets, tokens=10, micros=600_000, now_ms=NOW)
    assert isinstance(hold, Hold) and [a for _, a in hold.items] == [10, 600_000]
    # $0.60 in flight of $1.00: the next is admitted (under the limit), the one after not.
    assert isinstance(
        await reservations.reserve(budgets, tokens=10, micros=600_000, now_ms=NOW), Hold
    )
    refused = await reservations.reserve(budgets, tokens=10, micros=600_000, now_ms=NOW)
    assert isinstance(refused, Refusal) and refused.budget is USER_USD
    assert refused.used == 1.2 and refused.limit == 1.0


def test_recent_cost_is_a_moving_average_per_key_and_model() -> None:
    recent = Recent()
    assert recent.get(1, "m") is None
    recent.learn(1, "m", 100, 2000)
    assert recent.get(1, "m") == (100, 2000)
    recent.learn(1, "m", 300, 0)
    assert recent.get(1, "m") == (200, 1000)
    assert recent.get(2, "m") is None and recent.get(1, "other") is None
