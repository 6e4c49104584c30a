"""QuotaTracker on a shared store behaves the same whichever worker sees what."""

from __future__ import annotations

import asyncio

from quota import windows as qw
from quota.tracker import MemoryJsonStore, QuotaTracker

PAIR = ("primary", "fp1")


def _limit_window(now: int, reset_in: int) -> qw.Window:
    return qw.Window(
        name="five_hour",
        used_percent=100.0,
        window_minutes=300,
        resets_at_ms=now + reset_in,
        observed_at_ms=now,
        source=qw.SOURCE_CODEX_HEADERS,
    )


def test_probe_success_on_a_worker_that_never_saw_the_credential_restores_it() -> None:
    async def run() -> None:
        store = MemoryJsonStore()  # shared by both "workers"
        w1, w2 = QuotaTracker(store), QuotaTracker(store)
        t = 1_000_000
        await w1.ingest(PAIR, [_limit_window(t, 1000)], outcome="failure", now=t)
        gate = await w2.gate([PAIR], now=t + 500, shared=True)
        assert gate.reason(PAIR) == "quota_exhausted"
        # After the reset worker 2 takes the single probe lease ...
        gate = await w2.gate([PAIR], now=t + 1000, shared=True)
        assert gate.reason(PAIR) is None and PAIR in gate.probes
        # ... and its success without any quota header still completes the probe.
        transition = await w2.ingest(PAIR, [], outcome="success", now=t + 1100)
        assert transition is not None and transition.to_status == "available"
        gate = await w1.gate([PAIR], now=t + 1200, shared=True)
        assert gate.reason(PAIR) is None

    asyncio.run(run())


def test_unshared_tracker_skips_credentials_it_never_saw() -> None:
    async def run() -> None:
        tracker = QuotaTracker(MemoryJsonStore())
        assert await tracker.ingest(PAIR, [], outcome="success", now=1) is None
        assert await tracker.records() == {}

    asyncio.run(run())


class AlongStore(MemoryJsonStore):
    """A store that reads other names along (as `RedisJsonStore` does), in memory."""

    def __init__(self, raw: dict[str, bytes | None]) -> None:
        super().__init__()
        self.raw = raw
        self.reads: list[tuple[list[str], list[str]]] = []

    async def get_many_along(
        self, keys: list[str], along: list[str]
    ) -> tuple[list[dict[str, object] | None], list[bytes | None]]:
        self.reads.append((keys, list(along)))
        return await self.get_many(keys), [self.raw.get(name) for name in along]


def test_the_gate_reads_along_in_its_read_and_says_when_a_probe_lease_followed() -> None:
    async def run() -> None:
        store = AlongStore({"ocx:combo:main": b'{"v":1}'})
        tracker = QuotaTracker(store)
        t = 1_000_000
        gate = await tracker.gate([PAIR], now=t, shared=True, along=["ocx:combo:main"])
        assert gate.along == [b'{"v":1}']
        assert store.reads == [(["quota:primary:fp1"], ["ocx:combo:main"])]
        assert not gate.leased
        assert (await tracker.gate([PAIR], now=t, shared=True)).along is None  # nothing asked
        # With no credential to read, the names asked for are still read (one MGET of them).
        gate = await tracker.gate([], now=t, shared=True, along=["ocx:combo:main", "ocx:b"])
        assert gate.along == [b'{"v":1}', None]
        assert store.reads[-1] == ([], ["ocx:combo:main", "ocx:b"])
        reads = len(store.reads)
        assert (await tracker.gate([], now=t, shared=True)).along is None
        assert len(store.reads) == reads  # nothing to read: no round trip
        # A probe lease is a round trip after the read: the gate says so (`leased`).
        await tracker.ingest(PAIR, [_limit_window(t, 1000)], outcome="failure", now=t)
        gate = await tracker.gate([PAIR], now=t + 1000, shared=True, along=["ocx:combo:main"])
        assert PAIR in gate.probes and gate.leased and gate.along == [b'{"v":1}']

    asyncio.run(run())
