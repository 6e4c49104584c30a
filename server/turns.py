"""Openings take turns: a burst of new proxy requests never freezes the streams already running
in the worker (issue 24).

Opening a stream costs the worker about half a millisecond of CPU (Daphne's parse, routing, the
upstream connect and request), and asyncio runs every callback that is ready at the start of a
loop pass before it polls the sockets again. 256 requests arriving together were opened in a
few long passes, and every running stream's next event waited for them. Now a
pass starts at most `PER_TURN` openings; the rest wait in arrival order for the next passes, and
what the sockets brought meanwhile (the running streams' events) is handled in between.

An idle worker never waits here: the first `PER_TURN` openings of a pass go on at once. The
wait is not a resource limit (nothing is refused): a burst is opened as fast as the worker can,
interleaved with everything else.
"""

from __future__ import annotations

import asyncio
from collections import deque

from server import metrics

# About 16 ms of opening work per loop pass on the benchmark's machine (bench/README.md,
# "Results, seventeenth run": 8, 16, 32 and 64 were tried).
PER_TURN = 32


class Turns:
    """One event loop's openings, at most `per_turn` per loop pass, first come first served."""

    def __init__(self, per_turn: int = PER_TURN) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self.per_turn = per_turn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._left = per_turn
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False

    def take(self) -> asyncio.Future[None] | None:
        """None to go on now, or a future to await: done when this opening's turn has come
        (cancelling the awaiting task gives the turn to the next in line)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A new loop (tests start one per test): nothing carried over from the old one.
            self._loop, self._left, self._waiting, self._scheduled = (
                loop,
                self.per_turn,
                deque(),
                False,
            )
        self._schedule(loop)
        if self._left and not self._waiting:
            self._left -= 1
            return None
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiting.append(waiter)
        metrics.OPENINGS_DEFERRED.inc()
        return waiter

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        # `call_soon` from inside a pass runs in the next one: that is the turn boundary.
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        self._left = self.per_turn
        while self._waiting and self._left:
            waiter = self._waiting.popleft()
            if waiter.done():  # its task was cancelled (the client left while it waited)
                continue
            waiter.set_result(None)
            self._left -= 1
        if self._waiting and self._loop is not None:
            self._schedule(self._loop)
