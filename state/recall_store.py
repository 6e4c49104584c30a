"""Compaction recall shared by every worker (PRODUCT §5.7, reference §7).

`MemoryRecall` wraps the pure `RecallStore` (one worker). `RedisRecall` keeps the same
bounds in Redis: one entry per (client key, lane) expiring after 30 minutes, at most 256
lanes and 64 KiB of names in all (oldest evicted first), names over 1 KiB never stored.
"""

from __future__ import annotations

import json

from routing.recall import (
    MAX_LANES,
    MAX_NAME_BYTES,
    MAX_TOTAL_BYTES,
    TTL_MS,
    Liveness,
    RecallStore,
    name_size,
)


class MemoryRecall:
    def __init__(self) -> None:
        self.store = RecallStore()

    async def remember(
        self, key_id: str, lane: str | None, name: str, combo_id: str, *, now: int, target: str
    ) -> bool:
        return self.store.remember(key_id, lane, name, combo_id, now=now, target=target)

    async def recall(
        self, key_id: str, lane: str | None, name: str, *, now: int, live: Liveness
    ) -> str | None:
        return self.store.recall(key_id, lane, name, now=now, live=live)


# KEYS: lanes zset, sizes hash. ARGV: now, member, value, size, ttl, max lanes, max bytes, prefix.
_REMEMBER = """
redis.call('SET', ARGV[8] .. ARGV[2], ARGV[3], 'PX', ARGV[5])
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
local function drop(member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('HDEL', KEYS[2], member)
  redis.call('DEL', ARGV[8] .. member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - ARGV[5])) do
  drop(member)
end
local total = 0
for _, size in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(size) end
while redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[6]) or total > tonumber(ARGV[7]) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not oldest then break end
  total = total - tonumber(redis.call('HGET', KEYS[2], oldest) or '0')
  drop(oldest)
end
return 1
"""


class RedisRecall:
    def __init__(self, url: str, prefix: str) -> None:
        from state.resp import RespClient

        self._redis = RespClient(url, timeout_s=2.0)
        self._script = self._redis.script(_REMEMBER)
        self.prefix = f"{prefix}:recall:"

    async def remember(
        self, key_id: str, lane: str | None, name: str, combo_id: str, *, now: int, target: str
    ) -> bool:
        if not lane or not combo_id or not name.strip():
            return False
        size = name_size(name, MAX_NAME_BYTES)
        if size is None:
            return False  # an oversized name leaves the previous selection untouched
        member = f"{key_id}:{lane}"
        value = json.dumps({"name": name, "combo": combo_id, "target": target})
        await self._script(
            keys=[self.prefix + "lanes", self.prefix + "sizes"],
            args=[now, member, value, size, TTL_MS, MAX_LANES, MAX_TOTAL_BYTES, self.prefix],
        )
        return True

    async def recall(
        self, key_id: str, lane: str | None, name: str, *, now: int, live: Liveness
    ) -> str | None:
        if not lane or not name or "/" in name:
            return None
        raw = await self._redis.get(f"{self.prefix}{key_id}:{lane}")
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
        except ValueError:
            return None
        if not live(entry["combo"], entry.get("target")):
            return None
        return entry["combo"] if entry.get("name") == name else None
