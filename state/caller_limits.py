"""Caller-scoped rate limits on caller-forward (`chatgpt`) targets (issue #43, point 3).

A `chatgpt` target answers each caller with that caller's own account: one caller's 429 (a
rate or usage limit) says nothing about the next caller's. So the hold is kept per (target,
credential fingerprint) — the credential's hash, never the token — until the upstream's
`Retry-After` (or the cooldown rule's length) has passed, and the shared target is not cooled.
With Redis the holds are shared by every worker (`SET … PX`, read with one `MGET`), mirrored in
the worker's memory for when Redis is out; without it they live in the worker. Bounded: at most
`MAX_HOLDS` entries per worker (expired ones dropped first, then the oldest).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

Hold = tuple[str, str]  # (target key, credential fingerprint)
MAX_HOLDS = 10_000


class CallerLimits(Protocol):
    async def hold(self, key: Hold, *, until: int, now: int) -> None: ...

    async def held(self, keys: Sequence[Hold], *, now: int) -> frozenset[Hold]: ...


class MemoryCallerLimits:
    def __init__(self, max_holds: int = MAX_HOLDS) -> None:
        self._until: dict[Hold, int] = {}
        self.max_holds = max_holds

    async def hold(self, key: Hold, *, until: int, now: int) -> None:
        self.put(key, until=until, now=now)

    def put(self, key: Hold, *, until: int, now: int) -> None:
        self._until.pop(key, None)  # re-inserted last: the dict's order is the age
        self._until[key] = until
        if len(self._until) > self.max_holds:
            self._until = {k: u for k, u in self._until.items() if u > now}
            while len(self._until) > self.max_holds:
                del self._until[next(iter(self._until))]

    async def held(self, keys: Sequence[Hold], *, now: int) -> frozenset[Hold]:
        return frozenset(k for k in keys if self._until.get(k, 0) > now)


class RedisCallerLimits:
    def __init__(self, url: str, prefix: str) -> None:
        from state.resp import RespClient

        self._redis = RespClient(url, timeout_s=2.0)
        self.prefix = f"{prefix}:callerlimit:"

    def _name(self, key: Hold) -> str:
        return f"{self.prefix}{key[1]}:{key[0]}"

    async def hold(self, key: Hold, *, until: int, now: int) -> None:
        if until > now:
            await self._redis.execute("SET", self._name(key), str(until), "PX", until - now)

    async def held(self, keys: Sequence[Hold], *, now: int) -> frozenset[Hold]:
        if not keys:
            return frozenset()
        values = await self._redis.mget([self._name(k) for k in keys])
        return frozenset(k for k, v in zip(keys, values, strict=True) if v and int(v) > now)


Breaker = Callable[[Callable[[], Awaitable[Any]]], Awaitable[tuple[bool, Any]]]


class GuardedCallerLimits:
    """Redis behind the worker's circuit breaker, mirrored in memory for when it is out."""

    def __init__(self, shared: RedisCallerLimits, call: Breaker) -> None:
        self.shared = shared
        self.local = MemoryCallerLimits()
        self._call = call

    async def hold(self, key: Hold, *, until: int, now: int) -> None:
        self.local.put(key, until=until, now=now)
        await self._call(lambda: self.shared.hold(key, until=until, now=now))

    async def held(self, keys: Sequence[Hold], *, now: int) -> frozenset[Hold]:
        ok, found = await self._call(lambda: self.shared.held(keys, now=now))
        if ok and found is not None:
            return found  # type: ignore[no-any-return]
        return await self.local.held(keys, now=now)


def new(redis_url: str | None, prefix: str, breaker: Any | None) -> CallerLimits:
    """The worker's store: shared through Redis when it is set, else this worker's memory."""
    if redis_url and breaker is not None:
        return GuardedCallerLimits(RedisCallerLimits(redis_url, prefix), breaker.call)
    return MemoryCallerLimits()
