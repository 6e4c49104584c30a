"""Dollar budgets and durable counters on the gate (issue 27): validation and the CLI form,
the 429's message and headers in dollars, the 80 %/100 % events, the cost charged from the
served target's price (chatgpt costs nothing, unpriced nothing), and seeding the counters from
what was recorded (never lowering them; a flushed Redis noticed by its sentinel)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pytest

from routing.types import ConfigSnapshot, ModelPrice, ModelSpec, ProviderSpec
from state.budget_store import MemoryBudgetStore, RedisBudgetStore
from tests.usage.test_budgets import KEY_TOKENS, events, gate, ms  # noqa: F401 - fixtures
from usage.budget_gate import BudgetGate, SeedId
from usage.budgets import (
    BudgetError,
    ScopedBudget,
    TokenBudget,
    UsdBudget,
    budgets_json,
    parse_budgets,
    parse_cli_budget,
)

KEY_USD = ScopedBudget("key", "k1", "key ocx_abc… of dev", UsdBudget(50.0, "month"))
TEAM_USD = ScopedBudget("team", "t7", "team infra", UsdBudget(2.5, "day"))
# The dates lie in 2037, whose calendar is 2026's: in Redis a counter expires an hour after its
# period by the server's own clock, so a period already over in real time would be gone at once.
NOW = ms("2037-12-03T15:00:00+00:00")
MONTH_END = ms("2038-01-01T00:00:00+00:00")


def test_usd_budgets_parse_next_to_the_others() -> None:
    both = parse_budgets([{"tokens": 5, "period": "day"}, {"usd": 50, "period": "month"}])
    assert both == (TokenBudget(5, "day"), UsdBudget(50.0, "month"))
    assert budgets_json(both) == [{"tokens": 5, "period": "day"}, {"usd": 50, "period": "month"}]
    assert budgets_json(parse_budgets({"usd": 12.5, "period": "week"})) == [
        {"usd": 12.5, "period": "week"}
    ]
    assert UsdBudget(50.0, "month").micros == 50_000_000
    assert UsdBudget(50.0, "month").describe() == "$50.00 per month"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"usd": 0, "period": "day"}, "budget.usd must be more than 0 and at most 1000000000"),
        ({"usd": -1, "period": "day"}, "budget.usd must be more than 0"),
        ({"usd": 1e10, "period": "day"}, "budget.usd must be more than 0"),
        ({"usd": float("nan"), "period": "day"}, "budget.usd must be more than 0"),
        ({"usd": "5", "period": "day"}, "budget.usd must be a number"),
        ({"usd": True, "period": "day"}, "budget.usd must be a number"),
        ({"usd": 5, "period": "year"}, "budget.period must be one of day, week, month"),
        ({"usd": 5}, "budget.period must be one of day, week, month"),
        ({"usd": 5, "period": "day", "tokens": 3}, "unexpected field tokens in a dollar budget"),
        (
            [{"usd": 5, "period": "day"}, {"usd": 6, "period": "month"}],
            "at most one dollar budget",
        ),
    ],
)
def test_invalid_usd_budgets_are_refused_naming_the_part(value: Any, message: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_budgets(value)
    assert message in str(info.value)


def test_cli_usd_syntax() -> None:
    assert parse_cli_budget("usd=50/month") == {"usd": 50, "period": "month"}
    assert parse_cli_budget("usd=$12.50/day") == {"usd": 12.5, "period": "day"}
    for bad in ("usd=50/year", "usd=-5/day", "usd=/day", "usd=5"):
        with pytest.raises(BudgetError, match="usd=D/day"):
            parse_cli_budget(bad)
    with pytest.raises(BudgetError, match="budget.usd must be more than 0"):
        parse_budgets(parse_cli_budget("usd=0/week"))


async def test_usd_budget_refuses_in_dollars_with_events_at_80_and_100(
    gate: BudgetGate,  # noqa: F811 - the fixture
    events: list[dict[str, object]],  # noqa: F811
) -> None:
    budgets = (KEY_USD,)
    await gate.charge(budgets, tokens=10, usd_micros=39_990_000, served=None, now_ms=NOW)
    assert events == [] and await gate.admit(budgets, NOW) is None
    await gate.charge(budgets, tokens=10, usd_micros=20_000, served=None, now_ms=NOW)  # $40.01
    assert [e["percent"] for e in events] == [80]
    assert events[0]["message"] == (
        "key ocx_abc… of dev has used 80% of its budget of $50.00 per month ($40.01 of $50.00);"
        " it resets at 2038-01-01T00:00:00+00:00"
    )
    assert (events[0]["used"], events[0]["limit"]) == (40.01, 50.0)
    # Tokens alone (a free answer) add nothing to a dollar budget.
    await gate.charge(budgets, tokens=10**6, usd_micros=0, served=None, now_ms=NOW)
    assert await gate.admit(budgets, NOW) is None
    await gate.charge(budgets, tokens=10, usd_micros=10_110_000, served=None, now_ms=NOW)
    assert [e["percent"] for e in events] == [80, 100]
    refusal = await gate.admit(budgets, NOW)
    assert refusal is not None
    assert refusal.message() == (
        "Budget exceeded: key ocx_abc… of dev may use $50.00 per month and has used $50.12;"
        " it resets at 2038-01-01T00:00:00+00:00"
    )
    assert refusal.headers(NOW) == [
        (b"x-ocx-budget-limit", b"50.00"),
        (b"x-ocx-budget-remaining", b"0.00"),
        (b"x-ocx-budget-reset", str(MONTH_END // 1000).encode()),
        (b"retry-after", str((MONTH_END - NOW) // 1000).encode()),
    ]
    assert await gate.admit(budgets, MONTH_END) is None  # a new month


async def test_remaining_dollars_have_cents() -> None:
    bg = BudgetGate(MemoryBudgetStore(), prefix="t")
    both = (KEY_TOKENS, TEAM_USD)
    await bg.charge(both, tokens=1000, usd_micros=1_000_000, served=None, now_ms=NOW)
    refusal = await bg.admit(both, NOW)
    assert refusal is not None and refusal.budget == KEY_TOKENS  # $1 of $2.50 is not spent
    await bg.charge(both, tokens=1, usd_micros=1_500_000, served=None, now_ms=NOW)
    refused = await bg.admit((TEAM_USD,), NOW)
    assert refused is not None
    assert refused.headers(NOW)[:2] == [
        (b"x-ocx-budget-limit", b"2.50"),
        (b"x-ocx-budget-remaining", b"0.00"),
    ]
    assert "team infra may use $2.50 per day and has used $2.50" in refused.message()


def _snapshot(*providers: ProviderSpec) -> ConfigSnapshot:
    return ConfigSnapshot(
        version=1,
        providers=MappingProxyType({p.name: p for p in providers}),
        combos=MappingProxyType({}),
    )


def test_the_charge_is_the_served_targets_price() -> None:
    price = ModelPrice(input=1.25, cached_input=0.125, output=10)
    models = MappingProxyType({"m": ModelSpec(id="m", price=price)})
    snapshot = _snapshot(
        ProviderSpec(
            name="api", adapter="openai-responses", base_url="https://x.example/v1", models=models
        ),
        ProviderSpec(
            name="cg",
            adapter="chatgpt",
            base_url="https://chatgpt.com/backend-api/codex",
            models=models,
        ),
        ProviderSpec(name="local", adapter="openai-chat", base_url="http://127.0.0.1:1/v1"),
    )
    bg = BudgetGate(MemoryBudgetStore(), prefix="t")
    usage = {"input_tokens": 1_000_000, "cached_tokens": 200_000, "output_tokens": 100_000}
    at = NOW / 1000
    # 800k x 1.25 + 200k x 0.125 + 100k x 10 per million = 1.00 + 0.025 + 1.00 = $2.025.
    assert bg.cost_micros(snapshot, "api/m", at=at, **usage) == 2_025_000
    assert bg.cost_micros(snapshot, "cg/m", at=at, **usage) == 0  # a subscription
    assert bg.cost_micros(snapshot, "local/m", at=at, **usage) == 0  # unpriced
    assert bg.cost_micros(snapshot, "", at=at, **usage) == 0  # nothing served
    none = {"input_tokens": None, "cached_tokens": None, "output_tokens": None}
    assert bg.cost_micros(snapshot, "api/m", at=at, **none) == 0  # no usage reported
    assert bg.wants_cost((KEY_USD,)) and not bg.wants_cost((KEY_TOKENS,))


# --- seeding: counters from what was recorded ------------------------------------------------


class Recorded:
    def __init__(self, values: Mapping[SeedId, int]) -> None:
        self.values = dict(values)
        self.calls: list[list[SeedId]] = []

    def __call__(self, ids: Sequence[SeedId], now_ms: int) -> dict[SeedId, int]:
        self.calls.append(list(ids))
        return {i: self.values.get(i, 0) for i in ids}


async def test_seeding_raises_a_counter_to_what_was_recorded_and_never_lowers_it() -> None:
    recorded = Recorded({("k1", "tokens", "day"): 1200, ("k1", "usd", "month"): 60_000_000})
    bg = BudgetGate(MemoryBudgetStore(), prefix="t", recorded=recorded)
    now = int(time.time() * 1000)  # the seeding reads the clock: counters of today
    budgets = (KEY_TOKENS, KEY_USD)
    assert bg.unseeded(budgets)
    await bg.seed(budgets)
    assert not bg.unseeded(budgets) and recorded.calls == [
        [("k1", "tokens", "day"), ("k1", "usd", "month")]
    ]
    refusal = await bg.admit(budgets, now)
    assert refusal is not None and refusal.used in (1200, 60.0)
    # Seeded once: a second seed reads nothing.
    await bg.seed(budgets)
    assert len(recorded.calls) == 1
    # A counter ahead of the records (a batch not yet written) is never lowered.
    user = ScopedBudget("user", "u1", "user dev", TokenBudget(500, "day"))
    await bg.charge((user,), tokens=400, served=None, now_ms=now)
    recorded.values[("u1", "tokens", "day")] = 100
    await bg.seed((user,))
    assert await bg.admit((user,), now) is None
    await bg.charge((user,), tokens=100, served=None, now_ms=now)
    assert await bg.admit((user,), now) is not None  # 500: 400 + 100, not 100 + 100


async def test_a_budget_removed_and_set_again_is_seeded_again() -> None:
    recorded = Recorded({})
    bg = BudgetGate(MemoryBudgetStore(), prefix="t", recorded=recorded)

    class Info:
        def __init__(self, budgets: tuple[ScopedBudget, ...]) -> None:
            self.budgets = budgets

    await bg.seed((KEY_TOKENS,))
    bg.retain({"d": Info((KEY_TOKENS,))})
    assert not bg.unseeded((KEY_TOKENS,))
    bg.retain({"d": Info(())})
    assert bg.unseeded((KEY_TOKENS,))


async def test_a_failing_seed_admits_and_is_retried_later() -> None:
    def broken(ids: Sequence[SeedId], now_ms: int) -> dict[SeedId, int]:
        raise OSError("database unavailable")

    bg = BudgetGate(MemoryBudgetStore(), prefix="t", recorded=broken, seed_retry_s=3600)
    await bg.seed((KEY_TOKENS,))
    assert bg.unseeded((KEY_TOKENS,))
    assert await bg.admit((KEY_TOKENS,), NOW) is None
    bg.recorded = Recorded({})
    await bg.seed((KEY_TOKENS,))  # within the retry delay: not tried
    assert bg.unseeded((KEY_TOKENS,))


async def test_a_flushed_redis_is_noticed_and_the_counters_seeded_again() -> None:
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL not set")
    now = int(time.time() * 1000)
    recorded = Recorded({("k1", "tokens", "day"): 1500})
    store = RedisBudgetStore(url)
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    bg = BudgetGate(store, prefix=prefix, recorded=recorded)
    try:
        await bg.seed((KEY_TOKENS,))
        assert await store.redis.execute("GET", f"{prefix}:budget-seeded") == b"1"
        assert (await bg.admit((KEY_TOKENS,), now)) is not None
        # A flush (here: this bg's keys deleted) empties the counter and the sentinel.
        counter = bg._counter(KEY_TOKENS, KEY_TOKENS.budget, now)[0]  # type: ignore[arg-type]
        await store.redis.execute("DEL", counter, f"{prefix}:budget-seeded")
        refusal = await bg.admit((KEY_TOKENS,), now)
        assert refusal is not None and refusal.used == 1500
        assert len(recorded.calls) == 2
        # Read along the quota bg's MGET: the sentinel comes last.
        names = [counter, f"{prefix}:budget-seeded"]
        store.note_read = lambda names, values: None  # type: ignore[attr-defined]
        assert bg.along((KEY_TOKENS,), now) == names
        assert await bg.admit_along((KEY_TOKENS,), names, [b"10", b"1"], now) is None
        await store.redis.execute("DEL", counter, f"{prefix}:budget-seeded")
        refused = await bg.admit_along((KEY_TOKENS,), names, [None, None], now)
        assert refused is not None and refused.used == 1500 and len(recorded.calls) == 3
    finally:
        await store.redis.aclose()


class _Info:
    def __init__(self, *budgets: ScopedBudget) -> None:
        self.budgets = budgets


async def test_after_a_flush_one_worker_seeds_every_keys_series_for_all_workers() -> None:
    """Worker A notices the flush on key 1's request and sets the sentinel back; worker B
    still counts key 2's series as seeded and now sees the sentinel: key 2's spent counter
    must have been seeded again by A, or B admits it on an empty counter."""
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL not set")
    now = int(time.time() * 1000)
    k2 = ScopedBudget("key", "k2", "key ocx_two… of dev", UsdBudget(50.0, "month"))
    key_map = {"d1": _Info(KEY_TOKENS), "d2": _Info(k2)}
    recorded = Recorded({("k1", "tokens", "day"): 10, ("k2", "usd", "month"): 60_000_000})
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    store_a, store_b = RedisBudgetStore(url), RedisBudgetStore(url)
    a = BudgetGate(store_a, prefix=prefix, recorded=recorded)
    b = BudgetGate(store_b, prefix=prefix, recorded=recorded)
    try:
        for worker in (a, b):
            worker.retain(key_map)  # type: ignore[arg-type]
            await worker.seed(every=key_map)  # type: ignore[arg-type]
        assert (await b.admit((k2,), now)) is not None  # spent
        names = [n.decode() for n in await store_a.redis.execute("KEYS", f"{prefix}:*")]
        await store_a.redis.execute("DEL", *names)  # the flush
        assert (await a.admit((KEY_TOKENS,), now)) is None  # A notices, seeds, sets it back
        assert await store_a.redis.execute("GET", f"{prefix}:budget-seeded") == b"1"
        refusal = await b.admit((k2,), now)
        assert refusal is not None and refusal.used == 60_000_000 / 1_000_000
    finally:
        await store_a.redis.aclose()
        await store_b.redis.aclose()


async def test_a_degraded_store_is_not_taken_for_a_flushed_one() -> None:
    """While Redis is out the sentinel reads as missing: no reseeding storm, no warning per
    request."""

    class Breaker:
        open = True

    class Degraded(MemoryBudgetStore):
        shared_counters = True
        breaker = Breaker()

    recorded = Recorded({("k1", "tokens", "day"): 10})
    bg = BudgetGate(Degraded(), prefix="t", recorded=recorded)
    await bg.seed((KEY_TOKENS,))
    calls = len(recorded.calls)
    assert (await bg.admit((KEY_TOKENS,), int(time.time() * 1000))) is None
    assert len(recorded.calls) == calls  # no reseed: the sentinel's absence means nothing
    Degraded.breaker.open = False
    await bg.admit((KEY_TOKENS,), int(time.time() * 1000))
    assert len(recorded.calls) == calls + 1  # back: a missing sentinel is a flush again


def test_a_patch_forgets_only_the_series_its_old_entries_had() -> None:
    """A key write looks at the patched keys' budgets only: a removed budget's series is
    forgotten (set again later, it is seeded again); a new one is reported unseeded."""
    bg = BudgetGate(MemoryBudgetStore(), prefix="t", recorded=Recorded({}))
    bg.seeded |= {("k1", "tokens", "day"), ("k1", "usd", "month")}
    assert bg.replaced({}, old=(KEY_TOKENS, KEY_USD), new=(KEY_USD,)) is False
    assert bg.seeded == {("k1", "usd", "month")}
    assert bg.replaced({}, old=(KEY_USD,), new=(KEY_USD, KEY_TOKENS)) is True
    assert bg.seeded == {("k1", "usd", "month")}
