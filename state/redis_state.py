"""`RedisStateStore`: the routing state shared by every worker and host (PRODUCT §2.2, §2.3).

One Redis string per combo, `{prefix}:combo:{id}`, holds `ComboState.to_json()`. Every read goes
to Redis (no per-worker cache), so a cooldown, a half-open probe lease or a round-robin step
written by one worker is seen by the next pick of any worker.

`update` is an optimistic read-modify-write (`state.redis_store.RedisCas`): apply the pure
transition in Python to the value last seen, then a Lua compare-and-set writes the new value
only if the key still holds exactly that value (absent counts as a value); otherwise it retries
with the value the script returned. Because the
whole state is the value, comparing values is enough (an A→B→A change in between is harmless:
the transition is applied to an identical state). Within one worker, updates of the same combo
are serialised by an `asyncio.Lock`, so retries only happen between workers. Writes set a TTL
(refreshed by every write): idle combos' state eventually disappears, like a restart would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from routing.state import ComboState
from state.redis_store import ConflictError, RedisCas

log = logging.getLogger("ocx.state")

T = TypeVar("T")

DEFAULT_TTL_S = 24 * 3600
StateConflictError = ConflictError


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
        self._cas = RedisCas(url, socket_timeout=socket_timeout)
        self._redis = self._cas.redis

    def key(self, combo_id: str) -> str:
        return f"{self.prefix}:combo:{combo_id}"

    async def get(self, combo_id: str) -> ComboState:
        raw = await self._redis.get(self.key(combo_id))
        self._cas.note(self.key(combo_id), raw)
        return _decode(combo_id, raw)

    def prime(self, combo_id: str, raw: bytes | None) -> None:
        """The combo's value as this request just read it (`RedisCas.prime`)."""
        self._cas.prime(self.key(combo_id), raw)

    async def update(self, combo_id: str, fn: Callable[[ComboState], tuple[ComboState, T]]) -> T:
        def step(raw: bytes | None) -> tuple[str | None, T]:
            state = _decode(combo_id, raw)
            new, result = fn(state)
            if new == state and raw is not None:
                return raw.decode(), result  # nothing to write
            return (None if new == ComboState() else new.to_json()), result

        return await self._cas.update(self.key(combo_id), step, ttl_ms=self.ttl_ms)

    async def clear(self, combo_id: str) -> None:
        await self._redis.delete(self.key(combo_id))

    async def ttl_ms_left(self, combo_id: str) -> int:
        """Remaining TTL of the combo's key in ms (-2 absent, -1 no TTL); for tests and ops."""
        return int(await self._redis.pttl(self.key(combo_id)))

    async def aclose(self) -> None:
        await self._redis.aclose()
