"""Budget counters (PRODUCT §9.5): per process in memory, or shared by every worker in Redis.

Two shapes, the same in both stores:

* token counters: one integer per (scope, period), `INCRBY` at request end (all of a
  request's counters in one script call), expiring after its period
  (`{prefix}:budget:{scope}:tokens:{period}:{start}`);
* window points: one hash per (scope, provider) with a field per credential window,
  `{credential}|{window}` → percentage points used and `{credential}|{window}|r` → the
  window's reset (ms); a later window of the same credential starts again from zero.

`attribute` also keeps the last used-percent seen per (provider, credential, window), shared by
all keys, so a rise is counted once, against the request whose answer reported it. Admission
reads all of one request's counters in one round trip (`read`); with token budgets only, the
quota gate's `MGET` reads them instead (`BudgetGate.along`).
"""

from __future__ import annotations

from collections.abc import Sequence

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

# KEYS = token counters; ARGV = each one's amount and expiry (ms), in turn. Returns the new
# totals. One command (one reply to read) where a MULTI of INCRBY and PEXPIREAT pairs was
# 2 + 2n; as with the MULTI, no other client's command runs between its steps.
_ADD = """
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('INCRBY', KEYS[i], ARGV[2 * i - 1])
  redis.call('PEXPIREAT', KEYS[i], ARGV[2 * i])
end
return out
"""

# Seeding (durable budgets): raise each counter to at least the recorded value, never lower it
# (SET then PEXPIREAT: `SET … PXAT` needs Redis 6.2).
# KEYS = counters; ARGV = each one's value and expiry (ms), in turn.
_RAISE_COUNTERS = """
for i = 1, #KEYS do
  local v = tonumber(ARGV[2 * i - 1])
  local cur = tonumber(redis.call('GET', KEYS[i]) or '0')
  if v > cur then
    redis.call('SET', KEYS[i], ARGV[2 * i - 1])
    redis.call('PEXPIREAT', KEYS[i], ARGV[2 * i])
  end
end
return 1
"""

# Write back one field a worker kept while Redis was out: KEYS[1] = a hash; ARGV = value
# field, reset field, value, reset ms, same-window ms, hash ttl ms. A later window replaces
# the field; in the same window the higher value wins (never lowered); an older one is dropped.
_RAISE = """
local v = tonumber(ARGV[3])
local reset = tonumber(ARGV[4])
local tol = tonumber(ARGV[5])
local cr = redis.call('HGET', KEYS[1], ARGV[2])
if cr == false or reset > tonumber(cr) + tol then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3], ARGV[2], ARGV[4])
elseif reset >= tonumber(cr) - tol then
  local cv = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
  if v > cv then redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
else
  return 0
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[6]))
return 1
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

    def values(self, counters: Sequence[str], now_ms: int) -> list[int]:
        """The counters' values, read synchronously (`ocx usage verify` from another thread)."""
        out = []
        for name in counters:
            value, expires = self._counters.get(name, (0, 0))
            out.append(value if expires > now_ms else 0)
        return out

    def seed(self, name: str, data: dict[str, str]) -> None:
        """Take a hash as read from the shared store (`redis_guard`: the copy for an outage)."""
        self._hashes[name] = dict(data)

    def peek(self, name: str) -> dict[str, str]:
        return self._hashes.get(name, {})

    async def raise_counters(
        self, items: Sequence[tuple[str, int, int]], now_ms: int, *, sentinel: str | None = None
    ) -> None:
        """Each counter `(name, value, expire_at_ms)` becomes at least `value` (seeding)."""
        for name, value, expire_at_ms in items:
            current, expires = self._counters.get(name, (0, 0))
            if expires <= now_ms:
                current = 0
            if value > current:
                self._counters[name] = (value, expire_at_ms)

    async def add_many(self, items: Sequence[tuple[str, int, int]], now_ms: int) -> list[int]:
        if len(self._counters) > 10_000:
            self._counters = {k: v for k, v in self._counters.items() if v[1] > now_ms}
        totals = []
        for name, amount, expire_at_ms in items:
            value, expires = self._counters.get(name, (0, 0))
            if expires <= now_ms:
                value = 0
            value += amount
            self._counters[name] = (value, expire_at_ms)
            totals.append(value)
        return totals

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

    shared_counters = True

    def __init__(self, url: str, *, socket_timeout: float = 2.0) -> None:
        from state.resp import RespClient

        self.redis = RespClient(url, timeout_s=socket_timeout)
        self._add = self.redis.script(_ADD)
        self._attribute = self.redis.script(_ATTRIBUTE)
        self._raise = self.redis.script(_RAISE)
        self._raise_counters = self.redis.script(_RAISE_COUNTERS)

    async def raise_counters(
        self, items: Sequence[tuple[str, int, int]], now_ms: int, *, sentinel: str | None = None
    ) -> None:
        """Each counter becomes at least its recorded value, in one script call; then the
        `sentinel` (no expiry) says the counters are seeded: gone, Redis lost them."""
        if items:
            args: list[int] = []
            for _, value, expire_at_ms in items:
                args += (value, expire_at_ms)
            await self._raise_counters(keys=[name for name, _, _ in items], args=args)
        if sentinel is not None:
            await self.redis.execute("SET", sentinel, "1")

    async def read(
        self, counters: Sequence[str], hashes: Sequence[str], now_ms: int
    ) -> tuple[list[int], list[dict[str, str]]]:
        commands: list[list[str]] = [["MGET", *counters]] if counters else []
        commands += [["HGETALL", name] for name in hashes]
        if not commands:
            return [], []
        results = await self.redis.pipeline(commands)
        values = [int(v) if v is not None else 0 for v in results[0]] if counters else []
        maps = [
            {k.decode(): v.decode() for k, v in zip(raw[0::2], raw[1::2], strict=True)}
            for raw in results[1 if counters else 0 :]
        ]
        return values, maps

    async def add_many(self, items: Sequence[tuple[str, int, int]], now_ms: int) -> list[int]:
        # One script call for all of a request's token budgets (the key's and its user's).
        if not items:
            return []
        args: list[int] = []
        for _, amount, expire_at_ms in items:
            args += (amount, expire_at_ms)
        totals = await self._add(keys=[name for name, _, _ in items], args=args)
        return [int(v) for v in totals]

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

    async def raise_field(
        self, name: str, value_field: str, reset_field: str, value: float, reset_ms: int
    ) -> None:
        """Merge a value kept while Redis was out: the higher one wins within a window."""
        await self._raise(
            keys=[name],
            args=[value_field, reset_field, repr(value), reset_ms, SAME_WINDOW_MS, HASH_TTL_MS],
        )
