"""Openings take turns: a burst of new proxy requests never freezes the streams already running
in the worker (issue 24).

asyncio runs every callback that is ready at the start of a loop pass before it polls the
sockets again. Opening a stream costs the worker about half a millisecond of CPU, and 256
requests arriving together were opened in a few long passes while every running stream's next
event waited. So the proxy takes a turn before its own part of an opening (routing, the upstream
connect and request, the commit; Twisted's accept and parse and Daphne's scope come before it
and are not covered): `PER_TURN` openings a turn, a turn a loop pass, the rest waiting in
arrival order, and what the sockets bring in between (the running streams' events) is handled
between the turns.

An idle worker never waits here: the first `PER_TURN` openings go on at once. The wait is not a
resource limit (nothing is refused): a burst is opened as fast as the worker can, interleaved
with everything else.
"""

from __future__ import annotations

import asyncio
from collections import deque

from server import metrics

# ocx's own part of an opening (what follows the turn) is about 0.3 ms of the worker's CPU on
# the benchmark's machine: about 10 ms of it per pass (bench/README.md, "Results, seventeenth
# run": 8, 16, 32 and 64 were tried).
PER_TURN = 32


class _Line:
    """One event loop's openings: what is left of the current turn, who waits, what the last
    turn let go, and whether the next turn is due."""

    __slots__ = ("loop", "left", "waiting", "let_go", "due")

    def __init__(self, loop: asyncio.AbstractEventLoop, per_turn: int) -> None:
        self.loop = loop
        self.left = per_turn
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.let_go = 0
        self.due = False


class Turns:
    """A worker's openings, `per_turn` per turn and a turn per loop pass, first come first
    served."""

    def __init__(self, per_turn: int = PER_TURN) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self.per_turn = per_turn
        self._line: _Line | None = None

    def take(self) -> asyncio.Future[None] | None:
        """None to go on now, or a future to await: done when this opening's turn has come."""
        loop = asyncio.get_running_loop()
        line = self._line
        if line is None or line.loop is not loop:
            # Another loop (tests start one per test): a line of its own. A loop that still
            # runs keeps its own line through the turns it has scheduled.
            line = self._line = _Line(loop, self.per_turn)
        if not line.due:
            # `call_soon` from inside a pass runs in the next one: that is the turn boundary.
            line.due = True
            loop.call_soon(self._turn, line)
        if line.left:  # never while anyone waits: a turn that lets someone go leaves 0
            line.left -= 1
            return None
        waiter: asyncio.Future[None] = loop.create_future()
        line.waiting.append(waiter)
        metrics.OPENINGS_DEFERRED.inc()
        return waiter

    def _turn(self, line: _Line) -> None:
        line.due = False
        # What the last turn let go has just run (its wake-ups were queued before this call),
        # in this pass: it is this pass's share.
        ran, released = line.let_go, 0
        while line.waiting and released < self.per_turn:
            waiter = line.waiting.popleft()
            if not waiter.done():  # done: its task was cancelled while it waited
                waiter.set_result(None)
                released += 1
        line.let_go = released
        # Those let go now run in the next pass: nobody goes ahead of them meanwhile (first come,
        # first served). Otherwise what is left of this pass's share goes at once.
        line.left = 0 if released or line.waiting else self.per_turn - ran
        if line.left < self.per_turn:
            # The next turn gives the share back: a used-up turn must not make a later lone
            # request wait.
            line.due = True
            line.loop.call_soon(self._turn, line)
