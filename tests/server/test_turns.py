"""Openings take turns (`server.turns`): at most `per_turn` new requests start per loop pass,
the rest in arrival order in later passes, with the loop's other work in between."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from server import metrics
from server.turns import Turns
from tests.server.passes import Passes

T = TypeVar("T")


def _run(main: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(main())`, failing after 5 s: a waiter left behind must fail the test, not
    hang it."""

    async def bounded() -> T:
        async with asyncio.timeout(5):
            return await main()

    return asyncio.run(bounded())


async def _opening(turns: Turns, k: int, then: Callable[[int], object]) -> None:
    """Request `k`: its turn, then `then(k)` (what it does once it may start)."""
    turn = turns.take()
    if turn is not None:
        await turn
    then(k)


def test_a_burst_is_opened_per_turn_in_arrival_order() -> None:
    async def main() -> list[tuple[int, int]]:
        turns = Turns(per_turn=8)
        with Passes() as passes:
            await asyncio.gather(*(_opening(turns, k, passes.mark) for k in range(100)))
        return passes.marks

    before = metrics.OPENINGS_DEFERRED._value.get()  # type: ignore[attr-defined]
    log = _run(main)
    assert [k for k, _ in log] == list(range(100))  # first come, first served
    per_pass: dict[int, int] = {}
    for _, n in log:
        per_pass[n] = per_pass.get(n, 0) + 1
    # The first eight went on at once; the other 92 came eight per pass, one pass after another
    # from the pass after the first turn (a waiter let go in one pass runs in the next).
    assert list(per_pass.values()) == [8] * 12 + [4]
    first, *rest = sorted(per_pass)
    assert rest == list(range(first + 2, first + 14))
    assert metrics.OPENINGS_DEFERRED._value.get() - before == 92  # type: ignore[attr-defined]


def test_what_the_loop_brought_meanwhile_runs_before_the_deferred_openings() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        turns = Turns(per_turn=2)
        order: list[str] = []
        tasks = [
            asyncio.create_task(_opening(turns, k, lambda k: order.append(f"open{k}")))
            for k in range(5)
        ]
        await asyncio.sleep(0)  # their first pass: two open, three wait
        assert order == ["open0", "open1"]
        # A running stream's read, as the poll of the next pass queues it.
        loop.call_soon(order.append, "read")
        await asyncio.gather(*tasks)
        return order

    assert _run(main) == ["open0", "open1", "read", "open2", "open3", "open4"]


def test_a_request_that_comes_after_a_turn_waits_behind_those_it_let_go() -> None:
    async def main() -> list[int]:
        turns = Turns(per_turn=2)
        opened: list[int] = []
        tasks = [asyncio.create_task(_opening(turns, k, opened.append)) for k in range(3)]
        await asyncio.sleep(0)  # 0 and 1 opened, 2 waits; the next pass's turn lets it go
        assert opened == [0, 1]
        # 3 takes its turn in that next pass, after the turn: 2 has not run yet, 3 must not
        # go ahead of it though the turn had room for two.
        tasks.append(asyncio.create_task(_opening(turns, 3, opened.append)))
        await asyncio.gather(*tasks)
        return opened

    assert _run(main) == [0, 1, 2, 3]


def test_the_pass_that_ends_a_backlog_opens_no_more_than_a_turn() -> None:
    async def main() -> list[tuple[int, int]]:
        turns = Turns(per_turn=2)
        with Passes() as passes:
            tasks = [asyncio.create_task(_opening(turns, k, passes.mark)) for k in range(4)]
            await asyncio.sleep(0)  # 0 and 1 opened, 2 and 3 wait
            await asyncio.sleep(0)  # this pass's turn let 2 and 3 go: they open in the next
            # 4 and 5 take their turns in that next pass, after 2 and 3 have opened in it.
            tasks += [asyncio.create_task(_opening(turns, k, passes.mark)) for k in (4, 5)]
            await asyncio.gather(*tasks)
        return passes.marks

    log = _run(main)
    assert [k for k, _ in log] == [0, 1, 2, 3, 4, 5]
    first = log[0][1]
    assert [n - first for _, n in log] == [0, 0, 2, 2, 4, 4]


def test_a_turn_used_up_by_a_burst_is_given_back() -> None:
    async def main() -> tuple[list[bool], float]:
        turns = Turns(per_turn=4)
        # A burst of exactly two turns: the last turn lets four go and has nothing left.
        await asyncio.gather(*(_opening(turns, k, lambda k: None) for k in range(8)))
        for _ in range(3):
            await asyncio.sleep(0)
        before = metrics.OPENINGS_DEFERRED._value.get()  # type: ignore[attr-defined]
        went = []
        for _ in range(3):  # later, one request per pass: each goes on at once
            went.append(turns.take() is None)
            await asyncio.sleep(0)
        return went, metrics.OPENINGS_DEFERRED._value.get() - before  # type: ignore[attr-defined]

    assert _run(main) == ([True, True, True], 0)


def test_an_idle_worker_never_waits() -> None:
    async def main() -> list[bool]:
        turns = Turns(per_turn=2)
        went: list[bool] = []
        for _ in range(5):  # one request per pass: each goes on at once
            went.append(turns.take() is None)
            await asyncio.sleep(0)
        return went

    assert _run(main) == [True] * 5


def test_a_waiter_that_left_gives_its_turn_to_the_next() -> None:
    async def main() -> list[int]:
        turns = Turns(per_turn=2)
        opened: list[int] = []
        tasks = [asyncio.create_task(_opening(turns, k, opened.append)) for k in range(6)]
        await asyncio.sleep(0)  # 0 and 1 opened; 2, 3, 4, 5 wait
        tasks[2].cancel()  # 2 was cancelled while it waited (a worker's shutdown grace ran out)
        await asyncio.sleep(0)  # the next turn: 3 and 4, not 2 and 3
        await asyncio.sleep(0)
        snapshot = list(opened)
        await asyncio.gather(*tasks, return_exceptions=True)
        assert tasks[2].cancelled()
        return snapshot + [-1] + opened

    assert _run(main) == [0, 1, 3, 4, -1, 0, 1, 3, 4, 5]


def test_a_new_event_loop_starts_with_a_full_turn() -> None:
    turns = Turns(per_turn=1)

    async def burst() -> tuple[bool, bool]:
        first, second = turns.take(), turns.take()
        assert second is not None
        return first is None, second.done()

    # The old loop ends with a waiter left behind; the new loop neither waits for it nor on it.
    assert asyncio.run(burst()) == (True, False)
    assert asyncio.run(burst()) == (True, False)


def test_a_loop_that_still_runs_keeps_its_own_line() -> None:
    turns = Turns(per_turn=1)
    loop_a = asyncio.new_event_loop()
    try:

        async def three() -> list[asyncio.Future[None] | None]:
            return [turns.take() for _ in range(3)]

        # On A: one went, one was let go by the turn of the next pass, one waits for the next.
        first, second, third = loop_a.run_until_complete(three())
        assert first is None and second is not None and third is not None
        assert second.done() and not third.done()

        async def one() -> bool:
            return turns.take() is None

        assert asyncio.run(one())  # meanwhile another loop takes a turn of its own
        loop_a.run_until_complete(asyncio.sleep(0))  # A's next turn comes: it lets 3 go
        assert third.done()
    finally:
        loop_a.close()


def test_a_turn_of_less_than_one_opening_is_refused() -> None:
    with pytest.raises(ValueError, match="per_turn must be at least 1"):
        Turns(per_turn=0)
