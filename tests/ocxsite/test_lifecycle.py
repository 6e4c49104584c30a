"""`ocxsite.lifecycle.freeze_heap` (the drain itself is tested on real workers in
test_worker_lifecycle.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ocxsite import lifecycle, metrics


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_moves_the_heap_out_of_the_collector(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OCX_GC_FREEZE", raising=False)
    assert lifecycle.freeze_heap() is True
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # the test process has Django and the apps loaded
    assert metrics.FROZEN_OBJECTS._value.get() == frozen  # type: ignore[attr-defined]


def test_freeze_can_be_turned_off(unfrozen: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCX_GC_FREEZE", "0")
    assert lifecycle.freeze_heap() is False
    assert gc.get_freeze_count() == 0
    assert metrics.FROZEN_OBJECTS._value.get() == 0  # type: ignore[attr-defined]
