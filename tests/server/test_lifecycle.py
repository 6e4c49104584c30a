"""`server.lifecycle.freeze_heap` (the drain itself is tested on real workers in
test_worker_lifecycle.py)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from django.test import override_settings

from server import lifecycle, metrics


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@override_settings(OCX_GC_FREEZE=True)
def test_freeze_moves_the_heap_out_of_the_collector(unfrozen: None, thresholds: None) -> None:
    assert lifecycle.freeze_heap() is True
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # the test process has Django and the apps loaded
    assert metrics.FROZEN_OBJECTS._value.get() == frozen  # type: ignore[attr-defined]


@override_settings(OCX_GC_FREEZE=False)
def test_freeze_can_be_turned_off(unfrozen: None, thresholds: None) -> None:
    metrics.FROZEN_OBJECTS.set(12345)  # a stale count must not survive
    assert lifecycle.freeze_heap() is False
    assert gc.get_freeze_count() == 0
    assert metrics.FROZEN_OBJECTS._value.get() == 0  # type: ignore[attr-defined]


@pytest.fixture
def thresholds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    saved = gc.get_threshold()
    # `tune_collector` records the worker's young threshold: the requests of later tests must
    # not move this process's.
    monkeypatch.setattr(lifecycle, "_young", lifecycle._young)
    yield
    gc.set_threshold(*saved)


@override_settings(OCX_GC_FREEZE=False, OCX_GC_YOUNG=20_000)
def test_a_serving_worker_collects_its_young_objects_less_often(thresholds: None) -> None:
    lifecycle.freeze_heap()
    assert gc.get_threshold() == (20_000, 20, 10)


@override_settings(OCX_GC_FREEZE=False, OCX_GC_YOUNG=0)
def test_gc_young_0_keeps_pythons_thresholds(thresholds: None) -> None:
    gc.set_threshold(1, 1, 1)
    lifecycle.freeze_heap()
    assert gc.get_threshold() == (700, 10, 10)


def _thresholds_with_requests(n: int) -> list[tuple[int, int, int]]:
    """The collector's thresholds before, while `n` requests are in flight (tracked), after."""
    seen = [gc.get_threshold()]

    async def go() -> None:
        release = asyncio.Event()

        async def request() -> None:
            with lifecycle.track():
                await release.wait()

        tasks = [asyncio.create_task(request()) for _ in range(n)]
        await asyncio.sleep(0)
        seen.append(gc.get_threshold())
        release.set()
        await asyncio.gather(*tasks)
        seen.append(gc.get_threshold())

    asyncio.run(go())
    return seen


@override_settings(OCX_GC_FREEZE=False, OCX_GC_YOUNG=20_000)
def test_the_young_threshold_grows_with_the_requests_in_flight(thresholds: None) -> None:
    # What open streams hold is alive: collecting it while they open finds nothing.
    lifecycle.tune_collector()
    per = lifecycle.GC_PER_REQUEST
    assert _thresholds_with_requests(3) == [
        (20_000, 20, 10),
        (20_000 + 3 * per, 20, 10),
        (20_000, 20, 10),  # back once they ended: the cycles they left are collected
    ]


@override_settings(OCX_GC_FREEZE=False, OCX_GC_YOUNG=20_000)
def test_the_young_threshold_stops_growing_past_the_requests_a_worker_is_sized_for(
    thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "GC_MAX_REQUESTS", 2)
    lifecycle.tune_collector()
    per = lifecycle.GC_PER_REQUEST
    assert _thresholds_with_requests(3)[1] == (20_000 + 2 * per, 20, 10)


@override_settings(OCX_GC_FREEZE=False, OCX_GC_YOUNG=0)
def test_with_pythons_thresholds_requests_do_not_move_them(thresholds: None) -> None:
    lifecycle.tune_collector()
    assert _thresholds_with_requests(3) == [(700, 10, 10)] * 3
