"""Helpers shared by the pure-core tests."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

R = TypeVar("R")


def sync(coro: Coroutine[Any, Any, R]) -> R:
    """Drive a `MemoryStateStore` coroutine to completion without an event loop.

    The memory store never awaits, so its coroutines finish on the first step; this also works
    inside a running loop (e.g. in a fake clock's sleep hook) and asserts that property.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("a MemoryStateStore coroutine suspended")
