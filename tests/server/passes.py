"""Counting an event loop's passes in a test: in which pass did something happen."""

from __future__ import annotations

import asyncio
from types import TracebackType


class Passes:
    """A callback that queues itself again runs once per pass of the running loop: `n` is the
    pass it is in, `mark(k)` notes that `k` happened in it. Stops counting on leaving `with`."""

    def __init__(self) -> None:
        self.n = 0
        self.marks: list[tuple[int, int]] = []
        self._on = True
        asyncio.get_running_loop().call_soon(self._tick)

    def mark(self, k: int) -> None:
        self.marks.append((k, self.n))

    def _tick(self) -> None:
        self.n += 1
        if self._on:
            asyncio.get_running_loop().call_soon(self._tick)

    def __enter__(self) -> Passes:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._on = False
