"""`RedisStateStore`: the routing state shared by every worker and host (PRODUCT §2.2, §2.3).

One Redis string per combo, `{prefix}:combo:{id}`, holds `ComboState.to_json()`. Every read goes
to Redis (no per-worker cache), so a cooldown, a half-open probe lease or a round-robin step
written by one worker is seen by the next pick of any worker.

`update` is an optimistic read-modify-write: GET the current value, apply the pure transition
in Python, then a Lua compare-and-set writes the new value only if the key still holds exactly
the value that was read (absent counts as a value); otherwise it re-reads and retries. Because the
whole state is the value, comparing values is enough (an A→B→A change in between is harmless:
the transition is applied to an identical state). Within one worker, updates of the same combo
are serialised by an `asyncio.Lock`, so retries only happen between workers. Writes set a TTL
(refreshed by every write): idle combos' state eventually disappears, like a restart would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

import redis.asyncio as aioredis

from combos.engine.state import ComboState

log = logging.getLogger("ocx.state")

T = TypeVar("T")

DEFAULT_TTL_S = 24 * 3600
MAX_ATTEMPTS = 100

# KEYS[1]: the combo key. ARGV[1]: the value read ("" = absent), ARGV[2]: the new value
# ("" = delete), ARGV[3]: TTL in milliseconds. Returns 1 when written, 0 on a conflict.
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


class StateConflictError(RuntimeError):
    """The compare-and-set kept losing to other writers (should never happen in practice)."""


def _decode(combo_id: str, raw: bytes | str | None) -> ComboState:
    if raw is None:
        return ComboState()
    try:
        return ComboState.from_json(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError):
        log.warning("discarding malformed routing state of combo %s", combo_id)
        return ComboState()


class RedisStateStore:
    """`StateStore` on Redis (`redis.asyncio`), shared by all workers using the same prefix."""

    def __init__(
        self,
        url: str,
        prefix: str = "ocx",
        *,
        ttl_s: int = DEFAULT_TTL_S,
        socket_timeout: float = 5.0,
    ) -> None:
        self.prefix = prefix
        self.ttl_ms = ttl_s * 1000
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            health_check_interval=30,
        )
        self._cas = self._redis.register_script(_CAS)
        self._locks: dict[str, asyncio.Lock] = {}

    def key(self, combo_id: str) -> str:
        return f"{self.prefix}:combo:{combo_id}"

    async def get(self, combo_id: str) -> ComboState:
        return _decode(combo_id, await self._redis.get(self.key(combo_id)))

    async def update(self, combo_id: str, fn: Callable[[ComboState], tuple[ComboState, T]]) -> T:
        key = self.key(combo_id)
        lock = self._locks.get(combo_id)
        if lock is None:
            lock = self._locks[combo_id] = asyncio.Lock()
        async with lock:
            for _ in range(MAX_ATTEMPTS):
                raw: bytes | str | None = await self._redis.get(key)
                state = _decode(combo_id, raw)
                new, result = fn(state)
                if new == state and raw is not None:
                    return result  # nothing to write; the read was a consistent snapshot
                value = "" if new == ComboState() else new.to_json()
                if value == "" and raw is None:
                    return result
                written = await self._cas(keys=[key], args=[raw or b"", value, self.ttl_ms])
                if written:
                    return result
        raise StateConflictError(f"routing state of combo {combo_id} is too contended")

    async def clear(self, combo_id: str) -> None:
        await self._redis.delete(self.key(combo_id))

    async def ttl_ms_left(self, combo_id: str) -> int:
        """Remaining TTL of the combo's key in ms (-2 absent, -1 no TTL); for tests and ops."""
        return int(await self._redis.pttl(self.key(combo_id)))

    async def aclose(self) -> None:
        await self._redis.aclose()
