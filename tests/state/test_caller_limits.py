"""`state.caller_limits`: holds per (target, credential fingerprint), bounded, shared through
Redis (issue #43, point 3)."""

from __future__ import annotations

import asyncio
import time

from state.caller_limits import MemoryCallerLimits, RedisCallerLimits

A, B = ("p/m", "fp-a"), ("p/m", "fp-b")


def test_a_hold_is_that_credentials_on_that_target_until_it_ends() -> None:
    async def run() -> None:
        store = MemoryCallerLimits()
        await store.hold(A, until=2_000, now=1_000)
        assert await store.held([A, B, ("p/other", "fp-a")], now=1_500) == {A}
        assert await store.held([A], now=2_000) == frozenset()

    asyncio.run(run())


def test_the_memory_store_is_bounded() -> None:
    async def run() -> None:
        store = MemoryCallerLimits(max_holds=3)
        for i in range(10):
            await store.hold(("t", f"fp{i}"), until=5_000, now=1_000)
        keys = [("t", f"fp{i}") for i in range(10)]
        assert await store.held(keys, now=1_000) == {("t", "fp7"), ("t", "fp8"), ("t", "fp9")}

    asyncio.run(run())


def test_redis_holds_are_shared_and_expire(redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]

    async def run() -> None:
        one, other = RedisCallerLimits(url, "ocx-t"), RedisCallerLimits(url, "ocx-t")
        now = int(time.time() * 1000)
        await one.hold(A, until=now + 60_000, now=now)
        assert await other.held([A, B], now=now) == {A}
        assert await other.held([A], now=now + 60_000) == frozenset()
        await one.hold(B, until=now + 50, now=now)
        await asyncio.sleep(0.2)  # Redis expired it (PX): nothing left behind
        assert await other.held([B], now=now) == frozenset()

    asyncio.run(run())
