"""Shared state on Redis: the compare-and-set primitive (`RedisCas`) behind both the routing
state store (`ocxsite.redis_state`) and the quota `JsonStore` (`RedisJsonStore`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis

from quota.tracker import Update

T = TypeVar("T")
TTL_MS = 8 * 24 * 3600 * 1000  # longer than a weekly window
MAX_ATTEMPTS = 100
MAX_LOCKS = 10_000

_CAS = """
local current = redis.call('GET', KEYS[1])
if current == false then current = '' end
if current ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
"""


class RedisCas:
    """Optimistic read-modify-write of string values: GET, apply a pure function, then a Lua
    compare-and-set writes only if the key still holds what was read; retry otherwise.
    Within one process, updates of the same key wait for each other, so retries only
    happen between workers."""

    def __init__(self, url: str, *, socket_timeout: float = 5.0) -> None:
        self.redis = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            health_check_interval=30,
        )
        self._cas = self.redis.register_script(_CAS)
        self._locks: dict[str, asyncio.Lock] = {}

    async def update(
        self, key: str, fn: Callable[[bytes | None], tuple[str | None, T]], *, ttl_ms: int
    ) -> T:
        """`fn(current raw value or None) -> (new value, None to delete, result)`; returning
        the unchanged value (or None for an absent key) writes nothing."""
        if len(self._locks) > MAX_LOCKS:
            # One lock per key ever seen would grow with every ChatGPT account: keep busy ones.
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            for _ in range(MAX_ATTEMPTS):
                value = await self.redis.get(key)
                raw = value.encode() if isinstance(value, str) else value
                new, result = fn(raw)
                current = None if raw is None else raw.decode()
                if new == current:
                    return result
                if await self._cas(keys=[key], args=[raw or b"", new or "", ttl_ms]):
                    return result
        raise ConflictError(f"{key} is too contended")


class ConflictError(RuntimeError):
    """The compare-and-set kept losing to other writers (should never happen in practice)."""


class RedisJsonStore:
    def __init__(self, url: str, prefix: str = "ocx") -> None:
        self.prefix = prefix
        self._cas = RedisCas(url)
        self._redis = self._cas.redis

    def _k(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    @staticmethod
    def _decode(raw: bytes | str | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        if not keys:
            return []
        raws = await self._redis.mget([self._k(k) for k in keys])
        return [self._decode(r) for r in raws]

    async def update(self, key: str, fn: Update[T]) -> T:
        def step(raw: bytes | None) -> tuple[str | None, T]:
            current = self._decode(raw)
            new, result = fn(current)
            if new == current:
                return (None if raw is None else raw.decode()), result
            return (None if new is None else json.dumps(new, separators=(",", ":"))), result

        return await self._cas.update(self._k(key), step, ttl_ms=TTL_MS)

    async def keys(self) -> list[str]:
        prefix = self._k("quota:")
        out = []
        async for raw in self._redis.scan_iter(match=prefix + "*", count=500):
            name = raw.decode() if isinstance(raw, bytes) else raw
            out.append(name[len(self.prefix) + 1 :])
        return out
