"""Compaction recall in Redis keeps the bounds of the in-process store (PRODUCT §5.7)."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from state.recall_store import RedisRecall

REDIS_URL = os.environ.get("REDIS_URL")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set: needs a real Redis")


def always(combo_id: str, target: str | None) -> bool:
    return True


def _store() -> RedisRecall:
    assert REDIS_URL is not None
    return RedisRecall(REDIS_URL, f"ocx-test-{uuid.uuid4().hex[:8]}")


def test_remember_and_recall_per_key_and_lane() -> None:
    async def run() -> None:
        store = _store()
        assert await store.remember("k1", "lane", "m-x", "main", now=1000, target="p/m-x")
        assert await store.recall("k1", "lane", "m-x", now=2000, live=always) == "main"
        assert await store.recall("k1", "other", "m-x", now=2000, live=always) is None
        assert await store.recall("k2", "lane", "m-x", now=2000, live=always) is None
        assert await store.recall("k1", "lane", "m-y", now=2000, live=always) is None
        assert await store.recall("k1", "lane", "m-x", now=2000, live=lambda c, t: False) is None

    asyncio.run(run())


def test_oversized_name_leaves_previous_entry() -> None:
    async def run() -> None:
        store = _store()
        assert await store.remember("k", "lane", "m-x", "main", now=1000, target="p/m-x")
        assert not await store.remember("k", "lane", "x" * 1025, "other", now=2000, target="p/m")
        assert await store.recall("k", "lane", "m-x", now=3000, live=always) == "main"

    asyncio.run(run())


def test_at_most_256_lanes_oldest_evicted_first() -> None:
    async def run() -> None:
        store = _store()
        for i in range(257):
            await store.remember("k", f"lane{i}", "m", "main", now=1000 + i, target="p/m")
        assert await store.recall("k", "lane0", "m", now=2000, live=always) is None
        assert await store.recall("k", "lane1", "m", now=2000, live=always) == "main"
        assert await store.recall("k", "lane256", "m", now=2000, live=always) == "main"

    asyncio.run(run())


def test_total_name_bytes_bounded_to_64_kib() -> None:
    async def run() -> None:
        store = _store()
        name = "n" * 1024
        for i in range(65):
            await store.remember("k", f"lane{i}", name, "main", now=1000 + i, target="p/m")
        # 65 KiB of names: the oldest lane goes so that at most 64 KiB remain.
        assert await store.recall("k", "lane0", name, now=2000, live=always) is None
        assert await store.recall("k", "lane1", name, now=2000, live=always) == "main"

    asyncio.run(run())
