"""Keep routing when Redis is down or slow (PRODUCT §2.2, issue 16).

Every Redis-backed store of a worker (routing state, quota records, rpm limiter, compaction
recall) is wrapped so that:

* each Redis call on the request path is bounded by `OCX_REDIS_TIMEOUT_MS` (default 50 ms);
* a refused connection or any `RedisError` (a read-only replica, …), or three timeouts within
  2 s, open one per-worker circuit breaker: from then on every call goes to a per-worker
  in-memory copy, without touching Redis, so a dead Redis costs nothing per request;
* that copy is seeded by every shared value the worker read or wrote, so cooldowns and quota
  limits it knew keep holding, and its pure transitions still give at most one half-open probe
  per target (per worker) while it routes alone;
* a background task pings Redis with a growing pause (0.25 s doubling to 2 s); when it
  answers, the worker merges the states it changed meanwhile into the shared ones
  (`routing.state.merge`, `quota.tracker.merge_records`: the later cooldown end wins),
  then closes the breaker.

rpm limits fall back to `limit / workers` per worker (`OCX_WORKER_COUNT`, set by `ocx serve`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis

from quota.tracker import MemoryJsonStore, Update, merge_records
from routing.state import ComboState, MemoryStateStore, merge
from state.ratelimit import MemoryLimiter, RedisLimiter
from state.recall_store import MemoryRecall, RedisRecall
from state.redis_state import RedisStateStore
from state.redis_store import RedisJsonStore, unprime
from state.resp import RespClient

log = logging.getLogger("ocx.redis")

T = TypeVar("T")
R = TypeVar("R")

# What "Redis is unavailable" looks like: refused or reset connections, timeouts (ours and
# redis-py's), a read-only replica or any other server error.
REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError, TimeoutError)
BACKOFF_S = (0.25, 2.0)  # first and longest pause between probes of a degraded Redis
# A refused connection or a Redis error opens the breaker at once; timeouts only when several
# come close together (a frozen Redis times out every call; one slow call under a CPU spike
# is not an outage). The call that timed out falls back to the local copy either way.
TIMEOUTS_TO_TRIP = 3
TIMEOUT_WINDOW_S = 2.0
RESYNC_TIMEOUT_S = 10.0

Listener = Callable[[bool, dict[str, object]], None]


class _Bound:
    """One call in flight under the breaker's timeout."""

    __slots__ = ("task", "deadline", "cancelling", "expired")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        self.cancelling = task.cancelling()
        self.expired = False


class RedisBreaker:
    """One worker's view of Redis: `open` while it is considered unavailable.

    `call(op)` runs `op()` under the hot-path timeout and returns `(True, result)`, or
    `(False, None)` when the breaker is open or the call failed (which opens it)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        on_change: Listener | None = None,
        backoff_s: tuple[float, float] = BACKOFF_S,
    ) -> None:
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.on_change = on_change
        self.degraded_since: float | None = None
        self.reason = ""
        self.failures = 0  # times the breaker opened
        self.last_resync: dict[str, object] = {}
        self._resyncs: list[Callable[[], Awaitable[int]]] = []
        self._pending: list[Callable[[], bool]] = []
        self._client = RespClient(url, timeout_s=max(timeout_s, 1.0))
        self._probe: asyncio.Task[None] | None = None
        self._timeouts: list[float] = []
        self._calls: dict[_Bound, None] = {}  # in flight, oldest first
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    @property
    def open(self) -> bool:
        return self.degraded_since is not None

    def on_recover(
        self, resync: Callable[[], Awaitable[int]], pending: Callable[[], bool] | None = None
    ) -> None:
        """`resync()` writes this worker's local changes back; returns how many it merged.
        `pending()`: whether local changes are still waiting (made while another resync ran)."""
        self._resyncs.append(resync)
        if pending is not None:
            self._pending.append(pending)

    async def call(self, op: Callable[[], Awaitable[R]]) -> tuple[bool, R | None]:
        if self.degraded_since is not None:
            return False, None
        # The hot-path bound, as `asyncio.timeout` would keep it but with one timer for all
        # the calls in flight (they share one timeout, so they expire in the order they
        # started): a timer per call was a heap push and a cancelled handle per round trip.
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        bound = _Bound(task, loop.time() + self.timeout_s)
        calls = self._calls
        calls[bound] = None
        if self._timer is None or self._timer_loop is not loop:
            self._timer, self._timer_loop = loop.call_at(bound.deadline, self._expire), loop
        try:
            return True, await op()
        except asyncio.CancelledError:
            if not bound.expired or task.uncancel() > bound.cancelling:
                raise  # cancelled from outside (the client went away, a shutdown)
            self._timed_out(TimeoutError())
            return False, None
        except TimeoutError as exc:
            self._timed_out(exc)
            return False, None
        except REDIS_ERRORS as exc:
            self.trip(exc)
            return False, None
        finally:
            del calls[bound]

    def _expire(self) -> None:
        self._timer = None
        loop = self._timer_loop
        assert loop is not None
        now = loop.time()
        due = []
        for bound in self._calls:  # oldest first
            if bound.task.get_loop() is not loop:
                continue  # left by another event loop (tests, commands)
            if bound.deadline > now:
                self._timer = loop.call_at(bound.deadline, self._expire)
                break
            if not bound.expired:
                due.append(bound)
        if due:
            # One loop turn of grace: a call whose reply the loop has already read is queued
            # to resume ahead of this and finishes; only the calls still waiting on Redis time
            # out. A busy loop (64 requests in flight) is not a slow Redis.
            loop.call_soon(self._cancel, due)

    def _cancel(self, due: list[_Bound]) -> None:
        for bound in due:
            if bound in self._calls and not bound.expired:
                bound.expired = True
                bound.task.cancel()

    def _timed_out(self, exc: BaseException) -> None:
        now = time.monotonic()
        self._timeouts = [t for t in self._timeouts if now - t < TIMEOUT_WINDOW_S] + [now]
        if len(self._timeouts) >= TIMEOUTS_TO_TRIP:
            self._timeouts.clear()
            self.trip(exc)

    def trip(self, exc: BaseException) -> None:
        if self.degraded_since is not None:
            return
        self.degraded_since = time.monotonic()
        self.failures += 1
        self.reason = type(exc).__name__ if isinstance(exc, TimeoutError) else _describe(exc)
        log.warning(
            "redis unavailable (%s): this worker routes on its own copy of the routing state "
            "until it answers again",
            self.reason,
        )
        self._notify(True, {"reason": self.reason})
        self._probe = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        pause = self.backoff_s[0]
        while True:
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.backoff_s[1])
            try:
                async with asyncio.timeout(max(self.timeout_s, 0.2)):
                    await self._client.ping()
            except REDIS_ERRORS:
                continue
            try:
                merged = await self._resync_all()
            except REDIS_ERRORS as exc:
                log.warning("redis answered but the resync failed (%s); retrying", _describe(exc))
                continue
            except Exception:  # noqa: BLE001 - a bug must not keep the breaker open for good
                log.exception("resync after a redis outage failed; retrying")
                continue
            # No await between the last resync and closing: no local write can slip in between.
            assert self.degraded_since is not None
            outage_s = time.monotonic() - self.degraded_since
            self.degraded_since = None
            self.last_resync = {"mergedStates": merged, "outageS": round(outage_s, 3)}
            log.warning(
                "redis available again after %.1f s: %d local state(s) merged into the shared "
                "state; shared routing resumed",
                outage_s,
                merged,
            )
            self._notify(False, dict(self.last_resync))
            return

    async def _resync_all(self) -> int:
        merged = 0
        async with asyncio.timeout(RESYNC_TIMEOUT_S):
            while True:
                for resync in self._resyncs:
                    merged += await resync()
                # A request routing locally may have changed a store whose resync already ran
                # (while a later one awaited): go round again until nothing waits.
                if not any(pending() for pending in self._pending):
                    return merged

    def _notify(self, degraded: bool, detail: dict[str, object]) -> None:
        if self.on_change is not None:
            self.on_change(degraded, detail)

    def status(self) -> dict[str, object]:
        """For /readyz: this worker's breaker."""
        if self.degraded_since is None:
            return {"mode": "shared"}
        return {
            "mode": "local",
            "reason": self.reason,
            "degradedForS": round(time.monotonic() - self.degraded_since, 3),
        }

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        await self._client.aclose()


def _describe(exc: BaseException) -> str:
    # The class name and message, never the URL (it may hold a password).
    text = str(exc).split(" to ", 1)[0].strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _merging(local: ComboState) -> Callable[[ComboState], tuple[ComboState, None]]:
    return lambda shared: (merge(shared, local), None)


def _restoring(local: ComboState) -> Callable[[ComboState], tuple[ComboState, None]]:
    # Only where Redis lost the key (restarted without persistence, evicted).
    return lambda shared: (merge(shared, local) if shared == ComboState() else shared, None)


def _merging_record(local: dict[str, Any] | None) -> Update[None]:
    return lambda shared: (merge_records(shared, local), None)


class GuardedStateStore:
    """`StateStore`: the shared `RedisStateStore`, or this worker's copy while Redis is out."""

    def __init__(self, shared: RedisStateStore, breaker: RedisBreaker) -> None:
        self.shared = shared
        self.local = MemoryStateStore()
        self.breaker = breaker
        self._dirty: set[str] = set()
        breaker.on_recover(self.resync, lambda: bool(self._dirty))

    async def get(self, combo_id: str) -> ComboState:
        ok, state = await self.breaker.call(lambda: self.shared.get(combo_id))
        if ok:
            assert state is not None
            self.local.seed(combo_id, state)
            return state
        return await self.local.get(combo_id)

    async def update(self, combo_id: str, fn: Callable[[ComboState], tuple[ComboState, T]]) -> T:
        written: list[ComboState] = []

        def tap(state: ComboState) -> tuple[ComboState, T]:
            new, result = fn(state)
            written.append(new)  # the last call is the one the compare-and-set accepted
            return new, result

        ok, result = await self.breaker.call(lambda: self.shared.update(combo_id, tap))
        if ok:
            self.local.seed(combo_id, written[-1])
            return result  # type: ignore[return-value]
        unprime()  # a later update of this request must not decide on it unchecked
        self._dirty.add(combo_id)
        return await self.local.update(combo_id, fn)

    async def clear(self, combo_id: str) -> None:
        self.local.forget(combo_id)
        self._dirty.discard(combo_id)
        await self.breaker.call(lambda: self.shared.clear(combo_id))

    def shared_key(self, combo_id: str) -> str:
        """The combo's Redis name, for a read made along with the quota gate's."""
        return self.shared.key(combo_id)

    def prime(self, combo_id: str, raw: bytes | None) -> None:
        """The combo's value read along with the quota gate's (`RedisCas.prime`)."""
        self.shared.prime(combo_id, raw)

    def forget(self, combo_id: str) -> None:
        """The combo's definition changed: the write path resets the shared key."""
        self.local.forget(combo_id)
        self._dirty.discard(combo_id)

    def forget_target(self, combo_id: str, key: str) -> None:
        """An operator reset one target: the write path resets it in the shared key."""
        self.local.forget_target(combo_id, key)

    def peek(self, combo_id: str) -> ComboState:
        return self.local.peek(combo_id)

    async def resync(self) -> int:
        """Merge the combos changed while degraded into Redis; restore the other known ones
        if Redis lost them (a restart without persistence)."""
        merged = 0
        while self._dirty:
            combo_id = self._dirty.pop()
            local = self.local.peek(combo_id)
            try:
                await self.shared.update(combo_id, _merging(local))
            except BaseException:
                self._dirty.add(combo_id)
                raise
            merged += 1
        for combo_id in self.local.combo_ids():
            local = self.local.peek(combo_id)
            await self.shared.update(
                combo_id,
                _restoring(local),
            )
        return merged


class GuardedJsonStore:
    """Quota `JsonStore`: `RedisJsonStore`, or this worker's copy while Redis is out."""

    def __init__(self, shared: RedisJsonStore, breaker: RedisBreaker) -> None:
        self.shared = shared
        self.local = MemoryJsonStore()
        self.breaker = breaker
        self._dirty: set[str] = set()
        breaker.on_recover(self.resync, lambda: bool(self._dirty))

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        return (await self.get_many_along(keys, ()))[0]

    async def get_many_along(
        self, keys: list[str], along: Sequence[str]
    ) -> tuple[list[dict[str, Any] | None], list[bytes | None] | None]:
        """`get_many`, and the raw values of the Redis names `along` in the same round trip
        (None while Redis is out: this worker's copies are read instead)."""
        ok, got = await self.breaker.call(lambda: self.shared.get_many_along(keys, along))
        if ok:
            assert got is not None
            values, raws = got
            for key, value in zip(keys, values, strict=True):
                self._seed(key, value)
            return values, raws
        return await self.local.get_many(keys), None

    async def update(self, key: str, fn: Update[T]) -> T:
        written: list[dict[str, Any] | None] = []

        def tap(current: dict[str, Any] | None) -> tuple[dict[str, Any] | None, T]:
            new, result = fn(current)
            written.append(new)
            return new, result

        ok, result = await self.breaker.call(lambda: self.shared.update(key, tap))
        if ok:
            self._seed(key, written[-1])
            return result  # type: ignore[return-value]
        self._dirty.add(key)
        return await self.local.update(key, fn)

    async def keys(self) -> list[str]:
        ok, keys = await self.breaker.call(self.shared.keys)
        return keys if ok and keys is not None else await self.local.keys()

    def _seed(self, key: str, value: dict[str, Any] | None) -> None:
        if value is None:
            self.local.data.pop(key, None)
        else:
            self.local.data[key] = value

    async def resync(self) -> int:
        merged = 0
        while self._dirty:
            key = self._dirty.pop()
            local = self.local.data.get(key)
            try:
                await self.shared.update(key, _merging_record(local))
            except BaseException:
                self._dirty.add(key)
                raise
            merged += 1
        return merged


class GuardedLimiter:
    """rpm limiter: shared counts in Redis, or `limit / workers` per worker while it is out."""

    def __init__(self, shared: RedisLimiter, breaker: RedisBreaker, workers: int) -> None:
        self.shared = shared
        self.local = MemoryLimiter()
        self.breaker = breaker
        self.workers = max(1, workers)

    async def hit(self, key_id: int, limit: int, now_ms: int) -> int | None:
        ok, wait = await self.breaker.call(lambda: self.shared.hit(key_id, limit, now_ms))
        if ok:
            return wait
        return await self.local.hit(key_id, local_limit(limit, self.workers), now_ms)


def local_limit(limit: int, workers: int) -> int:
    """A worker's share of a shared limit while it cannot count with the others."""
    return max(1, limit // max(1, workers))


class GuardedRecall:
    """Compaction recall: Redis, mirrored in this worker's memory for when Redis is out."""

    def __init__(self, shared: RedisRecall, breaker: RedisBreaker) -> None:
        self.shared = shared
        self.local = MemoryRecall()
        self.breaker = breaker

    async def remember(
        self, key_id: str, lane: str | None, name: str, combo_id: str, *, now: int, target: str
    ) -> bool:
        kept = await self.local.remember(key_id, lane, name, combo_id, now=now, target=target)
        ok, stored = await self.breaker.call(
            lambda: self.shared.remember(key_id, lane, name, combo_id, now=now, target=target)
        )
        return bool(stored) if ok else kept

    async def recall(
        self, key_id: str, lane: str | None, name: str, *, now: int, live: Any
    ) -> str | None:
        ok, combo = await self.breaker.call(
            lambda: self.shared.recall(key_id, lane, name, now=now, live=live)
        )
        if ok:
            return combo
        return await self.local.recall(key_id, lane, name, now=now, live=live)


class GuardedBudgetStore:
    """Budget counters (`state.budget_store`): Redis, or this worker's share while it is out.

    While degraded a counter reads as the last shared value this worker saw plus its own
    spending since, times the number of workers: each worker may spend its `1 / workers`
    share of what was left (the `limit / workers` rule, started from the known total). When
    Redis returns, the spending of the outage is added to the shared counters.

    Window budgets while degraded run on a local copy of the window hashes and of the
    last-seen used-percents, seeded by every shared read and charge of this worker, so a
    used-up window budget keeps refusing and a rise is measured from the last value known.
    When Redis returns, the local last-seen values and window points are written back (the
    higher value wins within a window) before the shared store charges again, so the first
    answer after the outage is not charged the whole outage's rise."""

    shared_counters = True

    def __init__(self, shared: Any, breaker: RedisBreaker, workers: int) -> None:
        from state.budget_store import MemoryBudgetStore

        self.shared = shared
        self.local = MemoryBudgetStore()  # window-budget attribution while degraded
        self.breaker = breaker
        self.workers = max(1, workers)
        self._seen: dict[str, int] = {}  # counter -> last shared value
        self._spent: dict[str, tuple[int, int]] = {}  # counter -> (outage spending, expiry)
        # (hash, value field, reset field) changed locally while degraded
        self._dirty: set[tuple[str, str, str]] = set()
        breaker.on_recover(self.resync, lambda: bool(self._spent or self._dirty))

    def _estimate(self, name: str, now_ms: int) -> int:
        spent, expires = self._spent.get(name, (0, 0))
        return self._seen.get(name, 0) + (spent * self.workers if expires > now_ms else 0)

    async def read(
        self, counters: Any, hashes: Any, now_ms: int
    ) -> tuple[list[int], list[dict[str, str]]]:
        ok, got = await self.breaker.call(lambda: self.shared.read(counters, hashes, now_ms))
        if ok:
            assert got is not None
            self.note_read(counters, got[0])
            for name, data in zip(hashes, got[1], strict=True):
                self.local.seed(name, data)
            return got  # type: ignore[no-any-return]
        _, maps = await self.local.read([], hashes, now_ms)
        return [self._estimate(name, now_ms) for name in counters], maps

    def note_read(self, counters: Sequence[str], values: Sequence[int]) -> None:
        """Counters read from Redis by another store's round trip (the quota gate's, for the
        admission): the starting point of an outage."""
        if len(self._seen) > 10_000:
            self._seen.clear()  # only a starting point for an outage
        self._seen.update(zip(counters, values, strict=True))

    async def add_many(self, items: Sequence[tuple[str, int, int]], now_ms: int) -> list[int]:
        sent = not self.breaker.open
        ok, values = await self.breaker.call(lambda: self.shared.add_many(items, now_ms))
        if ok:
            assert values is not None
            totals = [int(v) for v in values]
            self._seen.update((name, v) for (name, _, _), v in zip(items, totals, strict=True))
            return totals
        if not sent:
            # Never sent to Redis (the breaker was open): this worker's spending of the outage,
            # added to the shared counters when Redis returns.
            for name, amount, expire_at_ms in items:
                spent, expires = self._spent.get(name, (0, 0))
                self._spent[name] = ((spent if expires > now_ms else 0) + amount, expire_at_ms)
        # Else the call failed or timed out with the breaker closed: the INCRBYs may have run
        # on the server, so they are not counted again (at most once: a charge may be lost,
        # never counted twice).
        return [self._estimate(name, now_ms) for name, _, _ in items]

    async def raise_counters(
        self, items: Sequence[tuple[str, int, int]], now_ms: int, *, sentinel: str | None = None
    ) -> None:
        """Seeding: only on Redis (while it is out the seed fails and is tried again later)."""
        ok, _ = await self.breaker.call(
            lambda: self.shared.raise_counters(items, now_ms, sentinel=sentinel)
        )
        if not ok:
            raise ConnectionError("Redis is unavailable: budget counters not seeded")
        for name, value, _ in items:
            self._seen[name] = max(self._seen.get(name, 0), value)

    async def attribute(
        self, seen: str, hashes: Any, field: str, used: float, reset_ms: int, now_ms: int
    ) -> tuple[float, list[float]]:
        ok, got = await self.breaker.call(
            lambda: self.shared.attribute(seen, hashes, field, used, reset_ms, now_ms)
        )
        if ok:
            assert got is not None
            self._mirror(seen, hashes, field, used, reset_ms, got)
            return got  # type: ignore[no-any-return]
        rise, points = await self.local.attribute(seen, hashes, field, used, reset_ms, now_ms)
        self._dirty.add((seen, "u", "r"))
        if rise > 0:
            self._dirty.update((name, field, field + "|r") for name in hashes)
        return rise, points

    def _mirror(
        self,
        seen: str,
        hashes: Any,
        field: str,
        used: float,
        reset_ms: int,
        got: tuple[float, list[float]],
    ) -> None:
        """Keep the local copy what the shared script just made of the last-seen value and of
        the scope hashes (the starting point if Redis goes out)."""
        from state.budget_store import SAME_WINDOW_MS

        last = self.local.peek(seen)
        if not last or reset_ms > int(last["r"]) + SAME_WINDOW_MS:
            self.local.seed(seen, {"u": repr(used), "r": str(reset_ms)})
        elif reset_ms >= int(last["r"]) - SAME_WINDOW_MS:
            self.local.seed(seen, {**last, "u": repr(used)})
        rise, points = got
        if rise <= 0:
            return
        for name, value in zip(hashes, points, strict=True):
            data = dict(self.local.peek(name))
            data[field] = repr(value)
            reset = data.get(field + "|r")
            if reset is None or reset_ms > int(reset) + SAME_WINDOW_MS:
                data[field + "|r"] = str(reset_ms)
            self.local.seed(name, data)

    async def resync(self) -> int:
        merged = 0
        # Window values first: the last-seen used-percents and window points of the outage go
        # up (the higher wins) before any shared charge runs again.
        while self._dirty:
            item = self._dirty.pop()
            name, value_field, reset_field = item
            data = self.local.peek(name)
            if value_field not in data or reset_field not in data:
                continue
            try:
                await self.shared.raise_field(
                    name, value_field, reset_field, float(data[value_field]), int(data[reset_field])
                )
            except BaseException:
                self._dirty.add(item)
                raise
            merged += 1
        now_ms = int(time.time() * 1000)
        while self._spent:
            counter, (amount, expires) = self._spent.popitem()
            if expires > now_ms and amount:
                try:
                    (self._seen[counter],) = await self.shared.add_many(
                        [(counter, amount, expires)], now_ms
                    )
                except BaseException:
                    self._spent[counter] = (amount, expires)
                    raise
                merged += 1
        return merged
