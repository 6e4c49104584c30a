"""`RedisJsonStore`: the quota `JsonStore` on Redis, shared by every worker and host.

Same optimistic compare-and-set as the routing state store (`ocxsite.redis_state`): read the
value, apply the pure transition, write only if the key still holds what was read.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import redis.asyncio as aioredis

from quota.tracker import Update

T = TypeVar("T")
TTL_MS = 8 * 24 * 3600 * 1000  # longer than a weekly window
MAX_ATTEMPTS = 100

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


class RedisJsonStore:
    def __init__(self, url: str, prefix: str = "ocx") -> None:
        self.prefix = prefix
        self._redis = aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._cas = self._redis.register_script(_CAS)
        self._locks: dict[str, asyncio.Lock] = {}

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
        full = self._k(key)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            for _ in range(MAX_ATTEMPTS):
                raw = await self._redis.get(full)
                current = self._decode(raw)
                new, result = fn(current)
                if new == current:
                    return result
                value = "" if new is None else json.dumps(new, separators=(",", ":"))
                if await self._cas(keys=[full], args=[raw or b"", value, TTL_MS]):
                    return result
        raise RuntimeError(f"quota state {key} is too contended")

    async def keys(self) -> list[str]:
        prefix = self._k("quota:")
        out = []
        async for raw in self._redis.scan_iter(match=prefix + "*", count=500):
            name = raw.decode() if isinstance(raw, bytes) else raw
            out.append(name[len(self.prefix) + 1 :])
        return out
