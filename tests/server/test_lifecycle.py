"""`server.lifecycle.freeze_heap` (the drain itself is tested on real workers in
test_worker_lifecycle.py)."""

from __future__ import annotations

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
def test_freeze_moves_the_heap_out_of_the_collector(unfrozen: None) -> None:
    assert lifecycle.freeze_heap() is True
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # the test process has Django and the apps loaded
    assert metrics.FROZEN_OBJECTS._value.get() == frozen  # type: ignore[attr-defined]


@override_settings(OCX_GC_FREEZE=False)
def test_freeze_can_be_turned_off(unfrozen: None) -> None:
    metrics.FROZEN_OBJECTS.set(12345)  # a stale count must not survive
    assert lifecycle.freeze_heap() is False
    assert gc.get_freeze_count() == 0
    assert metrics.FROZEN_OBJECTS._value.get() == 0  # type: ignore[attr-defined]


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
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
