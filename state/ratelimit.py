"""Per-client-key requests-per-minute budgets (PRODUCT §9.1), shared through Redis when set.

A fixed one-minute window per key: cheap, and exact across workers with Redis (INCR on a key
that expires with its minute).
"""

from __future__ import annotations


class MemoryLimiter:
    def __init__(self) -> None:
        self._counts: dict[tuple[int, int], int] = {}

    async def hit(self, key_id: int, limit: int, now_ms: int) -> int | None:
        """Count one request; None when allowed, else the seconds until the window resets."""
        minute = now_ms // 60_000
        count = self._counts.get((key_id, minute), 0) + 1
        if len(self._counts) > 10_000:
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= minute}
        self._counts[(key_id, minute)] = count
        return None if count <= limit else _left(now_ms)


class RedisLimiter:
    def __init__(self, url: str, prefix: str) -> None:
        from state.resp import RespClient

        self._redis = RespClient(url, timeout_s=2.0)
        self.prefix = prefix

    async def hit(self, key_id: int, limit: int, now_ms: int) -> int | None:
        name = f"{self.prefix}:rpm:{key_id}:{now_ms // 60_000}"
        count, _ = await self._redis.transaction([("INCR", name), ("PEXPIRE", name, 61_000)])
        return None if int(count) <= limit else _left(now_ms)


def _left(now_ms: int) -> int:
    return max(1, -(-(60_000 - now_ms % 60_000) // 1000))
