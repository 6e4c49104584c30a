"""`state.redis_guard` against a real `redis-server` the test starts and stops itself:
the circuit breaker, the per-worker fallbacks (rpm `limit / workers`, budget shares) and the
write-back when Redis returns."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from typing import Any

import pytest

from routing.state import ComboState, _frozen
from state.budget_store import MemoryBudgetStore, RedisBudgetStore
from state.ratelimit import RedisLimiter
from state.redis_guard import (
    GuardedBudgetStore,
    GuardedLimiter,
    GuardedStateStore,
    RedisBreaker,
    local_limit,
)
from state.redis_state import RedisStateStore
from tests.ocxsite.deps import RedisServer
from usage.budget_gate import BudgetGate
from usage.budgets import ScopedBudget, WindowBudget

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")


async def until(predicate: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


def test_local_limit_is_the_workers_share() -> None:
    assert local_limit(60, 3) == 20
    assert local_limit(10, 3) == 3
    assert local_limit(1, 4) == 1  # never zero: a worker can always serve one
    assert local_limit(5, 0) == 5


def test_the_breakers_bound_times_calls_out_in_order_with_one_timer() -> None:
    """Every call in flight shares one timer: each times out at its own deadline (its start
    plus the bound), falls back, leaves its task usable, and three timeouts close together
    open the breaker; a reply the loop read by the deadline counts as in time; a cancel from
    outside stays a cancel."""

    async def run() -> None:
        breaker = RedisBreaker("redis://127.0.0.1:1/0", timeout_s=0.2, backoff_s=(5.0, 5.0))
        loop = asyncio.get_running_loop()
        timers = 0
        real_call_at = loop.call_at

        def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal timers
            timers += 1
            return real_call_at(when, callback, *args, **kwargs)

        loop.call_at = counting  # type: ignore[method-assign]

        async def quick() -> int:
            await asyncio.sleep(0)
            return 7

        for _ in range(100):
            assert await breaker.call(quick) == (True, 7)
        assert timers == 1  # not one per call

        async def hang() -> None:
            await asyncio.Event().wait()

        async def timed(started: list[float]) -> tuple[bool, Any, float]:
            started.append(loop.time())
            ok, value = await breaker.call(hang)
            await asyncio.sleep(0)  # the task is not left cancelled
            return ok, value, loop.time()

        starts: list[float] = []
        first = loop.create_task(timed(starts))
        await asyncio.sleep(0.1)
        second = loop.create_task(timed(starts))
        ok, value, ended = await first
        assert (ok, value) == (False, None) and ended >= starts[0] + 0.2
        assert not second.done()  # its own deadline is 0.1 s later
        ok, value, ended = await second
        assert (ok, value) == (False, None) and ended >= starts[1] + 0.2
        assert not breaker.open  # two timeouts: not an outage yet

        # A busy loop is not a slow Redis: a reply read in the loop turn that reaches the
        # deadline (here the loop was blocked for 0.3 s) is still taken.
        reply: asyncio.Future[int] = loop.create_future()

        async def answered() -> int:
            return await reply

        loop.call_later(0.01, reply.set_result, 8)
        loop.call_soon(time.sleep, 0.3)
        assert await breaker.call(answered) == (True, 8)

        outside = loop.create_task(breaker.call(hang))
        await asyncio.sleep(0.01)
        outside.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outside
        assert not breaker.open  # a cancel is not a timeout

        assert await breaker.call(hang) == (False, None)  # the third: open
        assert breaker.open and breaker.reason == "TimeoutError"
        assert await breaker.call(quick) == (False, None)  # open: not even tried
        await breaker.aclose()

    asyncio.run(run())


def test_breaker_limiter_and_budget_fall_back_then_write_back(redis_server: RedisServer) -> None:
    changes: list[tuple[bool, dict[str, object]]] = []

    async def run() -> None:
        breaker = RedisBreaker(
            redis_server.url,
            timeout_s=0.2,
            on_change=lambda d, detail: changes.append((d, detail)),
            backoff_s=(0.05, 0.2),
        )
        limiter = GuardedLimiter(RedisLimiter(redis_server.url, "t"), breaker, workers=3)
        budget = GuardedBudgetStore(RedisBudgetStore(redis_server.url), breaker, workers=2)
        now = int(time.time() * 1000)
        expires = now + 3_600_000
        assert await limiter.hit(1, 9, now) is None
        assert await budget.add_many([("t:budget:k", 100, expires)], now) == [100]
        assert not breaker.open

        redis_server.stop()
        # rpm: 9 / 3 workers = 3 per worker while Redis is out.
        verdicts = [await limiter.hit(1, 9, now) for _ in range(4)]
        assert breaker.open and changes[0][0] is True
        assert verdicts[:3] == [None, None, None] and verdicts[3] is not None
        # Budget: the known 100 plus this worker's spending times 2 workers.
        assert await budget.add_many([("t:budget:k", 10, expires)], now) == [120]
        values, _ = await budget.read(["t:budget:k"], [], now)
        assert values == [120]

        redis_server.start()
        await until(lambda: not breaker.open)
        assert changes[-1][0] is False and changes[-1][1]["mergedStates"] == 1
        # The restarted Redis lost the counter; the outage's spending was written back.
        assert int(redis_server.client().get("t:budget:k")) == 10
        await breaker.aclose()

    asyncio.run(run())


def test_state_store_keeps_known_cooldowns_and_merges_back(redis_server: RedisServer) -> None:
    async def run() -> None:
        breaker = RedisBreaker(redis_server.url, timeout_s=0.2, backoff_s=(0.05, 0.2))
        store = GuardedStateStore(RedisStateStore(redis_server.url, "t"), breaker)
        known = ComboState(cooldowns=_frozen({"a/m": 10**13}))
        await store.update("c", lambda s: (known, None))
        assert (await store.get("c")) == known

        redis_server.stop()
        assert (await store.get("c")) == known  # seeded copy, no Redis
        assert breaker.open
        during = ComboState(cooldowns=_frozen({"a/m": 10**13, "b/m": 10**13 + 5}))
        await store.update("c", lambda s: (during, None))
        started = time.monotonic()
        for _ in range(200):  # an open breaker costs nothing per call
            await store.get("c")
        assert time.monotonic() - started < 1.0

        redis_server.start()
        await until(lambda: not breaker.open)
        shared = RedisStateStore(redis_server.url, "t")
        assert dict((await shared.get("c")).cooldowns) == {"a/m": 10**13, "b/m": 10**13 + 5}
        await shared.aclose()
        await breaker.aclose()

    asyncio.run(run())


def test_degraded_and_recovered_events_reach_ws_events_subscribers() -> None:
    """The runtime's breaker listener: gauge, and an event with a message for the admin's
    live events list (the channel layer here is the test run's own)."""
    from channels.layers import get_channel_layer

    from gateway.events import EVENTS_GROUP
    from gateway.runtime import Runtime
    from server import metrics

    async def run() -> list[dict[str, object]]:
        layer = get_channel_layer()
        assert layer is not None
        channel = await layer.new_channel()
        await layer.group_add(EVENTS_GROUP, channel)
        runtime = Runtime()
        runtime._on_redis(True, {"reason": "ConnectionError"})
        assert metrics.REDIS_DEGRADED._value.get() == 1  # type: ignore[attr-defined]
        runtime._on_redis(False, {"outageS": 3.5, "mergedStates": 2})
        assert metrics.REDIS_DEGRADED._value.get() == 0  # type: ignore[attr-defined]
        got: list[dict[str, object]] = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            message = await asyncio.wait_for(layer.receive(channel), 5)
            event = message["event"]
            if event.get("kind") == "dependency":
                got.append(event)
        await layer.group_discard(EVENTS_GROUP, channel)
        return got

    degraded, back = asyncio.run(run())
    assert degraded["status"] == "degraded" and degraded["dependency"] == "redis"
    assert "Redis unreachable (ConnectionError)" in str(degraded["message"])
    assert back["status"] == "ok" and back["mergedStates"] == 2
    assert str(back["message"]).startswith("Redis available again after 3.5 s: 2 state(s)")


def test_a_charge_that_timed_out_is_not_counted_again(redis_server: RedisServer) -> None:
    """One timeout leaves the breaker closed, but the INCRBY may have run on the server: the
    amount is not also kept for the write-back (at most once)."""

    class AnswerLost(MemoryBudgetStore):
        async def add_many(self, items: Any, now_ms: int) -> list[int]:
            value = await super().add_many(items, now_ms)
            await asyncio.Event().wait()  # written, but the answer never arrives
            return value

    async def run() -> None:
        breaker = RedisBreaker(redis_server.url, timeout_s=0.05, backoff_s=(0.05, 0.2))
        shared = AnswerLost()
        budget = GuardedBudgetStore(shared, breaker, workers=2)
        now = int(time.time() * 1000)
        expires = now + 3_600_000
        await budget.add_many([("t:budget:k", 100, expires)], now)
        assert not breaker.open
        assert await budget.resync() == 0
        assert (await shared.read(["t:budget:k"], [], now))[0] == [100]
        # Were Redis to go out now, the estimate starts from what it knew, not 100 twice over.
        breaker.trip(ConnectionError("test"))
        assert (await budget.read(["t:budget:k"], [], now))[0] == [0]
        await breaker.aclose()

    asyncio.run(run())


def codex(used: float, reset_ms: int) -> dict[str, str]:
    return {
        "x-codex-primary-used-percent": str(used),
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": str(reset_ms // 1000),
    }


def test_window_budgets_hold_through_an_outage_and_its_rise_is_not_charged_again(
    redis_server: RedisServer,
) -> None:
    async def run() -> None:
        breaker = RedisBreaker(redis_server.url, timeout_s=0.2, backoff_s=(0.05, 0.2))
        shared = RedisBudgetStore(redis_server.url)
        gate = BudgetGate(GuardedBudgetStore(shared, breaker, workers=2), prefix="t")
        now = int(time.time() * 1000)
        reset = now + 3_600_000
        pair = ("cx", "fp1")
        first, second, third = (
            ScopedBudget("key", f"k{i}", f"key {i}", WindowBudget(30.0, "cx")) for i in (1, 2, 3)
        )
        await gate.charge((first,), tokens=None, served=(pair, codex(10, reset)), now_ms=now)
        await gate.charge((first,), tokens=None, served=(pair, codex(45, reset)), now_ms=now)
        refused = await gate.admit((first,), now)
        assert refused is not None and refused.used == 35

        assert redis_server.proc is not None
        redis_server.proc.send_signal(signal.SIGSTOP)  # frozen: keys kept, every call times out
        try:
            breaker.trip(TimeoutError())
            # The used-up window budget keeps refusing while this worker routes alone ...
            refused = await gate.admit((first,), now)
            assert refused is not None and refused.used == 35
            # ... and a rise is measured from the last used-percent it knew: 45 -> 50.
            await gate.charge((second,), tokens=None, served=(pair, codex(50, reset)), now_ms=now)
            assert breaker.open
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        await until(lambda: not breaker.open)

        # The outage's last-seen 50 went up first: the next answer is charged 52 - 50, not 7.
        await gate.charge((third,), tokens=None, served=(pair, codex(52, reset)), now_ms=now)
        hashes = [f"t:budget:{sb.scope}:window:cx" for sb in (first, second, third)]
        _, maps = await shared.read([], hashes, now)
        points = [[float(v) for k, v in m.items() if not k.endswith("|r")] for m in maps]
        assert points == [[35.0], [5.0], [2.0]]  # the outage's points were written back too
        await shared.redis.aclose()
        await breaker.aclose()

    asyncio.run(run())


def test_recovery_resyncs_again_what_changed_while_it_ran(redis_server: RedisServer) -> None:
    async def run() -> None:
        breaker = RedisBreaker(redis_server.url, timeout_s=0.2, backoff_s=(0.05, 0.2))
        dirty = {"early"}
        calls: list[tuple[str, list[str]]] = []

        async def resync_a() -> int:
            calls.append(("a", sorted(dirty)))
            merged = len(dirty)
            dirty.clear()
            return merged

        async def resync_b() -> int:
            calls.append(("b", []))
            if len(calls) == 2:
                dirty.add("late")  # a request routed locally while this resync awaited
            await asyncio.sleep(0)
            return 0

        breaker.on_recover(resync_a, lambda: bool(dirty))
        breaker.on_recover(resync_b)
        breaker.trip(ConnectionError("test"))
        await until(lambda: not breaker.open)
        assert calls == [("a", ["early"]), ("b", []), ("a", ["late"]), ("b", [])]
        assert not dirty and breaker.last_resync["mergedStates"] == 2
        await breaker.aclose()

    asyncio.run(run())


def test_a_resync_bug_is_logged_and_retried_not_left_open(
    redis_server: RedisServer, caplog: Any
) -> None:
    async def run() -> None:
        breaker = RedisBreaker(redis_server.url, timeout_s=0.2, backoff_s=(0.05, 0.1))
        attempts: list[int] = []

        async def flaky() -> int:
            attempts.append(1)
            if len(attempts) == 1:
                raise ValueError("a bug in a resync")
            return 0

        breaker.on_recover(flaky)
        breaker.trip(ConnectionError("test"))
        await until(lambda: not breaker.open)
        assert len(attempts) == 2
        await breaker.aclose()

    asyncio.run(run())
    assert "resync after a redis outage failed" in caplog.text
