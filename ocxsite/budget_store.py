"""Budget counters (PRODUCT §9.5): per process in memory, or shared by every worker in Redis.

Two shapes, the same in both stores:

* token counters: one integer per (scope, period), `INCRBY` at request end, expiring after
  its period (`{prefix}:budget:{scope}:tokens:{period}:{start}`);
* window points: one hash per (scope, provider) with a field per credential window,
  `{credential}|{window}` → percentage points used and `{credential}|{window}|r` → the
  window's reset (ms); a later window of the same credential starts again from zero.

`attribute` also keeps the last used-percent seen per (provider, credential, window), shared by
all keys, so a rise is counted once, against the request whose answer reported it. Admission
reads all of one request's counters in one round trip (`read`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Two resets closer than this are the same window (a reset given as "seconds from now"
# jitters); a window lasts at least an hour, so the next one is always further away.
SAME_WINDOW_MS = 10 * 60 * 1000
HASH_TTL_MS = 8 * 24 * 3600 * 1000  # longer than a weekly window
COUNTER_GRACE_MS = 3600 * 1000

# KEYS[1] = last-seen hash of (provider, credential, window); KEYS[2..] = scope hashes.
# ARGV = field, used, reset ms, now ms, same-window ms, hash ttl ms.
# Returns {rise, points of each scope hash after the charge} as strings.
_ATTRIBUTE = """
local used = tonumber(ARGV[2])
local reset = tonumber(ARGV[3])
local tol = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local su = redis.call('HGET', KEYS[1], 'u')
local sr = redis.call('HGET', KEYS[1], 'r')
local rise = 0
local fresh = false
if su == false or sr == false then
  redis.call('HSET', KEYS[1], 'u', ARGV[2], 'r', ARGV[3])
elseif reset > tonumber(sr) + tol then
  rise = used
  fresh = true
  redis.call('HSET', KEYS[1], 'u', ARGV[2], 'r', ARGV[3])
elseif reset < tonumber(sr) - tol then
  return {'0'}
else
  local last = tonumber(su)
  if used > last then rise = used - last end
  redis.call('HSET', KEYS[1], 'u', ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ttl)
local out = {tostring(rise)}
for i = 2, #KEYS do
  local value = 0
  if rise > 0 then
    local r = redis.call('HGET', KEYS[i], ARGV[1] .. '|r')
    if r == false or reset > tonumber(r) + tol then
      redis.call('HSET', KEYS[i], ARGV[1], tostring(rise), ARGV[1] .. '|r', ARGV[3])
      value = rise
    else
      value = tonumber(redis.call('HINCRBYFLOAT', KEYS[i], ARGV[1], tostring(rise)))
    end
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
  out[#out + 1] = tostring(value)
end
return out
"""


class MemoryBudgetStore:
    """Per-process counters (no Redis): exact within one worker."""

    def __init__(self) -> None:
        self._counters: dict[str, tuple[int, int]] = {}  # name → (value, expires at ms)
        self._hashes: dict[str, dict[str, str]] = {}

    async def read(
        self, counters: Sequence[str], hashes: Sequence[str], now_ms: int
    ) -> tuple[list[int], list[dict[str, str]]]:
        values = []
        for name in counters:
            value, expires = self._counters.get(name, (0, 0))
            values.append(value if expires > now_ms else 0)
        return values, [dict(self._hashes.get(h, {})) for h in hashes]

    async def add(self, name: str, amount: int, expire_at_ms: int, now_ms: int) -> int:
        if len(self._counters) > 10_000:
            self._counters = {k: v for k, v in self._counters.items() if v[1] > now_ms}
        value, expires = self._counters.get(name, (0, 0))
        if expires <= now_ms:
            value = 0
        value += amount
        self._counters[name] = (value, expire_at_ms)
        return value

    async def attribute(
        self,
        seen: str,
        hashes: Sequence[str],
        field: str,
        used: float,
        reset_ms: int,
        now_ms: int,
    ) -> tuple[float, list[float]]:
        # The same steps as the Lua script, with no await inside: atomic on one event loop.
        last = self._hashes.get(seen)
        rise = 0.0
        if last is None:
            self._hashes[seen] = {"u": repr(used), "r": str(reset_ms)}
        elif reset_ms > int(last["r"]) + SAME_WINDOW_MS:
            rise = used
            self._hashes[seen] = {"u": repr(used), "r": str(reset_ms)}
        elif reset_ms < int(last["r"]) - SAME_WINDOW_MS:
            return 0.0, []
        else:
            rise = max(0.0, used - float(last["u"]))
            last["u"] = repr(used)
        points: list[float] = []
        for name in hashes:
            value = 0.0
            if rise > 0:
                data = self._hashes.setdefault(name, {})
                r = data.get(field + "|r")
                if r is None or reset_ms > int(r) + SAME_WINDOW_MS:
                    value = rise
                    data[field + "|r"] = str(reset_ms)
                else:
                    value = float(data.get(field, "0")) + rise
                data[field] = repr(value)
            points.append(value)
        return rise, points


class RedisBudgetStore:
    """Counters shared by every worker through Redis: exact across workers."""

    def __init__(self, url: str, *, socket_timeout: float = 2.0) -> None:
        import redis.asyncio as aioredis

        self.redis: Any = aioredis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._attribute = self.redis.register_script(_ATTRIBUTE)

    async def read(
        self, counters: Sequence[str], hashes: Sequence[str], now_ms: int
    ) -> tuple[list[int], list[dict[str, str]]]:
        pipe = self.redis.pipeline(transaction=False)
        if counters:
            pipe.mget(list(counters))
        for name in hashes:
            pipe.hgetall(name)
        results = await pipe.execute()
        values = [int(v) if v is not None else 0 for v in results[0]] if counters else []
        maps = [
            {k.decode(): v.decode() for k, v in raw.items()}
            for raw in results[1 if counters else 0 :]
        ]
        return values, maps

    async def add(self, name: str, amount: int, expire_at_ms: int, now_ms: int) -> int:
        pipe = self.redis.pipeline(transaction=True)
        pipe.incrby(name, amount)
        pipe.pexpireat(name, expire_at_ms)
        value, _ = await pipe.execute()
        return int(value)

    async def attribute(
        self,
        seen: str,
        hashes: Sequence[str],
        field: str,
        used: float,
        reset_ms: int,
        now_ms: int,
    ) -> tuple[float, list[float]]:
        out = await self._attribute(
            keys=[seen, *hashes],
            args=[field, repr(used), reset_ms, now_ms, SAME_WINDOW_MS, HASH_TTL_MS],
        )
        values = [float(v) for v in out]
        return values[0], values[1:]
