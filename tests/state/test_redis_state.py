"""`RedisStateStore` against the real Redis of `REDIS_URL` (CI's second pass sets it)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from routing.state import ComboState, note_failure, note_success
from routing.types import ComboSpec, TargetSpec

REDIS_URL = os.environ.get("REDIS_URL")
pytestmark = pytest.mark.skipif(
    not REDIS_URL, reason="REDIS_URL is not set: the Redis state store needs a real Redis"
)

if REDIS_URL:  # redis is a runtime dependency, but keep collection cheap without a server
    from state.redis_state import DEFAULT_TTL_S, RedisStateStore

T = TypeVar("T")
A, B = "pa/ma", "pb/mb"
AB = ComboSpec(
    id="main",
    targets=(TargetSpec("pa", "ma"), TargetSpec("pb", "mb")),
    strategy="least-used",  # the one strategy whose successes change the state
)


def run(factory: Callable[[str], Awaitable[T]]) -> T:
    """Run `factory(prefix)` in a fresh loop with a unique key prefix, then delete its keys."""

    async def main() -> T:
        prefix = f"ocx-unit-{uuid.uuid4().hex[:10]}"
        try:
            return await factory(prefix)
        finally:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(REDIS_URL or "")
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()

    return asyncio.run(main())


def test_round_trip_get_update_clear() -> None:
    async def body(prefix: str) -> None:
        store = RedisStateStore(REDIS_URL or "", prefix)
        try:
            assert await store.get("main") == ComboState()
            result = await store.update(
                "main", lambda s: (note_failure(s, AB, A, 5_000, now=0), "done")
            )
            assert result == "done"
            assert (await store.get("main")).cooldowns == {A: 5_000}
            await store.update("main", lambda s: (note_success(s, AB, B), None))
            state = await store.get("main")
            assert state.cooldowns == {A: 5_000}
            assert state.success_counts == {B: 1}
            # A second client (another worker) reads the same state: no per-worker cache.
            other = RedisStateStore(REDIS_URL or "", prefix)
            assert await other.get("main") == state
            assert await other.get("other") == ComboState()
            await other.aclose()
            await store.clear("main")
            assert await store.get("main") == ComboState()
            assert await store.ttl_ms_left("main") == -2  # the key is gone
        finally:
            await store.aclose()

    run(body)


def test_key_layout_and_json_value() -> None:
    async def body(prefix: str) -> None:
        import redis.asyncio as aioredis

        store = RedisStateStore(REDIS_URL or "", prefix)
        client = aioredis.Redis.from_url(REDIS_URL or "")
        try:
            await store.update("main", lambda s: (note_success(s, AB, A), None))
            raw = await client.get(f"{prefix}:combo:main")
            assert isinstance(raw, bytes)
            assert ComboState.from_json(raw.decode()) == await store.get("main")
            assert raw.decode() == (await store.get("main")).to_json()
        finally:
            await client.aclose()
            await store.aclose()

    run(body)


def test_update_to_empty_state_deletes_the_key() -> None:
    async def body(prefix: str) -> None:
        store = RedisStateStore(REDIS_URL or "", prefix)
        try:
            await store.update("main", lambda s: (note_success(s, AB, A), None))
            assert await store.ttl_ms_left("main") > 0
            await store.update("main", lambda s: (ComboState(), None))
            assert await store.ttl_ms_left("main") == -2
        finally:
            await store.aclose()

    run(body)


def test_ttl_is_set_and_refreshed_on_write() -> None:
    async def body(prefix: str) -> None:
        import redis.asyncio as aioredis

        store = RedisStateStore(REDIS_URL or "", prefix)
        client = aioredis.Redis.from_url(REDIS_URL or "")
        try:
            await store.update("main", lambda s: (note_success(s, AB, A), None))
            ttl = await store.ttl_ms_left("main")
            assert DEFAULT_TTL_S * 1000 - 60_000 < ttl <= DEFAULT_TTL_S * 1000
            await client.pexpire(f"{prefix}:combo:main", 5_000)
            assert await store.ttl_ms_left("main") <= 5_000
            await store.update("main", lambda s: (note_success(s, AB, B), None))
            assert await store.ttl_ms_left("main") > DEFAULT_TTL_S * 1000 - 60_000
            short = RedisStateStore(REDIS_URL or "", prefix, ttl_s=7)
            await short.update("main", lambda s: (note_success(s, AB, A), None))
            assert 0 < await short.ttl_ms_left("main") <= 7_000
            await short.aclose()
        finally:
            await client.aclose()
            await store.aclose()

    run(body)


def test_concurrent_updates_from_two_clients_are_atomic() -> None:
    """200 concurrent increments, split over two clients (two workers), give exactly 200."""

    async def body(prefix: str) -> None:
        first = RedisStateStore(REDIS_URL or "", prefix)
        second = RedisStateStore(REDIS_URL or "", prefix)

        def bump(s: ComboState) -> tuple[ComboState, int]:
            new = note_success(s, AB, A)
            return new, new.success_counts[A]

        try:
            results = await asyncio.gather(
                *(
                    first.update("main", bump) if i % 2 else second.update("main", bump)
                    for i in range(200)
                )
            )
            assert (await first.get("main")).success_counts == {A: 200}
            # Every update saw a distinct predecessor: the results are exactly 1..200.
            assert sorted(results) == list(range(1, 201))
        finally:
            await first.aclose()
            await second.aclose()

    run(body)


def test_malformed_value_reads_as_empty_and_is_replaced() -> None:
    async def body(prefix: str) -> None:
        import redis.asyncio as aioredis

        store = RedisStateStore(REDIS_URL or "", prefix)
        client = aioredis.Redis.from_url(REDIS_URL or "")
        try:
            await client.set(f"{prefix}:combo:main", b"not json")
            assert await store.get("main") == ComboState()
            await store.update("main", lambda s: (note_success(s, AB, A), None))
            assert (await store.get("main")).success_counts == {A: 1}
        finally:
            await client.aclose()
            await store.aclose()

    run(body)


def test_combos_are_isolated_by_id_and_prefix() -> None:
    async def body(prefix: str) -> None:
        store = RedisStateStore(REDIS_URL or "", prefix)
        other_prefix = RedisStateStore(REDIS_URL or "", prefix + "-other")
        try:
            await store.update("main", lambda s: (note_success(s, AB, A), None))
            assert await store.get("second") == ComboState()
            assert await other_prefix.get("main") == ComboState()
        finally:
            await store.aclose()
            await other_prefix.aclose()

    run(body)


def test_combo_state_clear_deletes_only_the_named_combos(settings: object) -> None:
    """The write path's one-shot reset (`combos.state_reset`) uses the same key layout."""
    import redis

    from combos.state_reset import combo_state_clear

    prefix = f"ocx-unit-{uuid.uuid4().hex[:10]}"
    settings.OCX_REDIS_URL = REDIS_URL  # type: ignore[attr-defined]
    settings.OCX_STATE_KEY_PREFIX = prefix  # type: ignore[attr-defined]

    async def write(combo_id: str) -> None:
        store = RedisStateStore(REDIS_URL or "", prefix)
        await store.update(combo_id, lambda s: (note_success(s, AB, A), None))
        await store.aclose()

    for combo_id in ("a", "b"):
        asyncio.run(write(combo_id))
    client = redis.Redis.from_url(REDIS_URL or "")
    try:
        combo_state_clear(["a", "missing"])
        assert client.exists(f"{prefix}:combo:a") == 0
        assert client.exists(f"{prefix}:combo:b") == 1
        settings.OCX_REDIS_URL = None  # type: ignore[attr-defined]
        combo_state_clear(["b"])  # without Redis: a no-op
        assert client.exists(f"{prefix}:combo:b") == 1
    finally:
        client.delete(f"{prefix}:combo:b")
        client.close()


def test_an_uncontended_update_is_one_round_trip_and_a_stale_guess_is_corrected() -> None:
    """The compare-and-set starts from the value this worker last saw; another worker's write
    in between costs one retry, never a lost update."""

    async def body(prefix: str) -> None:
        mine = RedisStateStore(REDIS_URL or "", prefix)
        other = RedisStateStore(REDIS_URL or "", prefix)
        sent: list[str] = []
        real = mine._redis.execute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            sent.append(str(args[0]))
            return await real(*args, **kwargs)

        mine._redis.execute = counted  # type: ignore[method-assign]

        def bump(s: ComboState) -> tuple[ComboState, int]:
            new = note_success(s, AB, A)
            return new, new.success_counts[A]

        try:
            await mine.get("main")
            assert await mine.update("main", bump) == 1
            assert await mine.update("main", bump) == 2
            assert sent == ["GET", "EVALSHA", "EVALSHA"]
            sent.clear()
            assert await other.update("main", bump) == 3
            assert await mine.update("main", bump) == 4  # its guess said 2: retried on 3
            assert sent == ["EVALSHA", "EVALSHA"]
        finally:
            await mine.aclose()
            await other.aclose()

    run(body)


def test_checks_that_write_nothing_do_not_queue_behind_each_other() -> None:
    """A healthy pick writes nothing: concurrent ones are in flight together, not one round
    trip after another; a pick that writes still waits for the worker's other writes."""

    async def body(prefix: str) -> None:
        store = RedisStateStore(REDIS_URL or "", prefix)
        real = store._redis.execute
        in_flight = 0
        most = 0

        async def counted(*args: Any) -> Any:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                return await real(*args)
            finally:
                in_flight -= 1

        store._redis.execute = counted  # type: ignore[method-assign]

        def keep(s: ComboState) -> tuple[ComboState, str]:
            return s, "kept"

        def bump(s: ComboState) -> tuple[ComboState, int]:
            new = note_success(s, AB, A)
            return new, new.success_counts[A]

        try:
            assert await store.update("main", bump) == 1  # the guess is known from here on
            most = 0
            assert (
                await asyncio.gather(*(store.update("main", keep) for _ in range(8)))
                == ["kept"] * 8
            )
            assert most == 8
            most = 0
            assert sorted(
                await asyncio.gather(*(store.update("main", bump) for _ in range(4)))
            ) == [
                2,
                3,
                4,
                5,
            ]
            assert most == 1  # writes of one worker still take turns (no retries among them)
            calls = 0

            def counted_bump(s: ComboState) -> tuple[ComboState, int]:
                nonlocal calls
                calls += 1
                return bump(s)

            assert await store.update("main", counted_bump) == 6
            assert calls == 1  # the step decided before the lock is reused, not run again
        finally:
            await store.aclose()

    run(body)


def test_a_check_on_a_stale_guess_is_decided_again_on_the_value_redis_holds() -> None:
    async def body(prefix: str) -> None:
        mine = RedisStateStore(REDIS_URL or "", prefix)
        other = RedisStateStore(REDIS_URL or "", prefix)
        seen: list[int] = []

        def look(s: ComboState) -> tuple[ComboState, int]:
            seen.append(s.success_counts.get(A, 0))
            return s, s.success_counts.get(A, 0)

        def bump(s: ComboState) -> tuple[ComboState, int]:
            new = note_success(s, AB, A)
            return new, new.success_counts[A]

        try:
            await mine.update("main", bump)
            await other.get("main")
            await other.update("main", bump)  # mine's guess (1) is now stale
            assert await mine.update("main", look) == 2
            assert seen == [1, 2]  # decided on the guess, refused, decided on Redis's value
        finally:
            await mine.aclose()
            await other.aclose()

    run(body)


def test_a_pick_on_the_state_read_along_with_the_quota_gate_needs_no_check() -> None:
    """The quota gate's `MGET` carries the combo's routing state: a pick decided on it that
    writes nothing sends nothing more; one that writes is checked as ever; a value this
    worker wrote over since, or one read by another request, is not decided on."""
    from quota.tracker import QuotaTracker
    from state.redis_guard import GuardedJsonStore, GuardedStateStore, RedisBreaker
    from state.redis_store import RedisJsonStore

    async def body(prefix: str) -> None:
        breaker = RedisBreaker(REDIS_URL or "", timeout_s=1.0)
        state = GuardedStateStore(RedisStateStore(REDIS_URL or "", prefix), breaker)
        other = RedisStateStore(REDIS_URL or "", prefix)  # another worker
        quota = RedisJsonStore(REDIS_URL or "", prefix)
        tracker = QuotaTracker(GuardedJsonStore(quota, breaker))
        sent: list[str] = []
        for client in (state.shared._redis, quota._redis):
            real = client.execute

            async def counted(*args: Any, real: Any = real) -> Any:
                sent.append(" ".join(str(a) for a in args[:1]))
                return await real(*args)

            client.execute = counted  # type: ignore[method-assign]

        def keep(s: ComboState) -> tuple[ComboState, str]:
            return s, "kept"

        def bump(s: ComboState) -> tuple[ComboState, int]:
            new = note_success(s, AB, A)
            return new, new.success_counts[A]

        async def gate_and(step: Callable[[ComboState], tuple[ComboState, Any]]) -> Any:
            gate = await tracker.gate(
                [("pa", "k")], now=0, shared=True, along=(state.shared_key("main"),)
            )
            assert gate.along is not None
            state.prime("main", gate.along[0])
            return await state.update("main", step)

        try:
            await state.update("main", bump)  # a value to read
            sent.clear()
            assert await gate_and(keep) == "kept"
            assert sent == ["MGET"]  # one round trip: the quota gate's, with the state in it
            sent.clear()
            assert await gate_and(bump) == 2
            assert sent == ["MGET", "EVALSHA"]  # a write is compare-and-set as ever
            sent.clear()
            assert await state.update("main", keep) == "kept"
            assert sent == ["EVALSHA"]  # nothing read along: the guess is checked

            # Read along, then another request of this worker writes the key before the pick:
            # the pick is checked, not decided on the older value.
            state.prime("main", (await quota._redis.mget([state.shared_key("main")]))[0])
            await asyncio.get_running_loop().create_task(state.update("main", bump))
            sent.clear()
            assert await state.update("main", keep) == "kept"
            assert sent == ["EVALSHA"]

            # This worker's write lands between Redis running the read and the prime (another
            # connection's reply came first): the value read differs from the one held, so
            # nothing is primed and the pick is checked (on the value read, as the likelier
            # newer one: here it is the older, so the check corrects it once).
            older = (await quota._redis.mget([state.shared_key("main")]))[0]
            await state.update("main", bump)
            state.prime("main", older)
            sent.clear()
            assert await state.update("main", keep) == "kept"
            assert sent == ["EVALSHA", "EVALSHA"]
            # Another worker wrote since this one looked: the value read is the next guess,
            # and one check confirms it.
            await other.update("main", bump)
            state.prime("main", (await quota._redis.mget([state.shared_key("main")]))[0])
            sent.clear()
            assert await state.update("main", keep) == "kept"
            assert sent == ["EVALSHA"]

            # Primed in one request (task) only: another request, a task the primed one
            # started included, checks its own guess; the primed request still decides alone.
            async def prime_only() -> None:
                state.prime("main", (await quota._redis.mget([state.shared_key("main")]))[0])

            await asyncio.get_running_loop().create_task(prime_only())
            sent.clear()
            assert await state.update("main", keep) == "kept"
            assert sent == ["EVALSHA"]
            state.prime("main", (await quota._redis.mget([state.shared_key("main")]))[0])
            sent.clear()
            child = asyncio.get_running_loop().create_task(state.update("main", keep))
            assert await child == "kept"
            assert sent == ["EVALSHA"]
            sent.clear()
            assert await state.update("main", keep) == "kept"
            assert sent == []

            # Redis out at the pick: the prime is dropped, a later step of the request checks.
            state.prime("main", (await quota._redis.mget([state.shared_key("main")]))[0])
            breaker.trip(ConnectionError("test"))
            assert await state.update("main", keep) == "kept"  # on the worker's own copy
            breaker.degraded_since = None
            sent.clear()
            assert await state.update("main", keep) == "kept"
            assert sent == ["EVALSHA"]
        finally:
            await state.shared.aclose()
            await other.aclose()
            await quota._redis.aclose()

    run(body)
