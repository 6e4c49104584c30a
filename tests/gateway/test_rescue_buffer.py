"""`afterCommit: "buffer"` at the unit level (`gateway.rescue.Rescue`): keep-alive comments while
the answer is held, one status line, a broken answer turned into a failure before commit, the
byte bound. The sleep between keep-alives is injected."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.rescue import KEEPALIVE_FRAME, BufferOverflow, Rescue
from routing.attempts import Outcome
from routing.classify import Failure
from routing.types import ComboSpec, TargetSpec
from tests.gateway.test_rescue_property import Client

A, B = TargetSpec("a", "m"), TargetSpec("b", "m")
COMBO = ComboSpec(id="c", targets=(A, B), after_commit="buffer", buffer_max_bytes=1024)
BROKEN = Failure(status=502, error_code="upstream_stream_truncated", message="Upstream cut")


def _rescue(client: Client, dispatch: Any, sleep: Any = None) -> Rescue:
    async def eligible(target: TargetSpec) -> bool:
        return True

    async def never(_s: float) -> None:
        await asyncio.Event().wait()

    return Rescue(
        combo=COMBO,
        providers={},
        inbound="chat",
        request={},
        exchange=client,
        dispatch=dispatch,
        eligible=eligible,
        sleep=sleep or never,
    )


def test_keep_alive_then_the_whole_answer_under_one_status_line() -> None:
    client = Client()
    ticks = 0

    async def twice(_s: float) -> None:
        nonlocal ticks
        ticks += 1
        if ticks > 2:
            await asyncio.Event().wait()

    async def dispatch(target: TargetSpec, last: bool, *, responder: Any, **_: Any) -> Outcome:
        await responder.commit(200, [], target)
        await responder.write(b"data: one\n\n")
        for _ in range(5):
            await asyncio.sleep(0)  # the keep-alive runs meanwhile
        await responder.write(b"data: two\n\n")
        return Outcome(True)

    async def run() -> Outcome:
        rescue = _rescue(client, dispatch, twice)
        try:
            return await rescue.dispatch(A, False)
        finally:
            await rescue.close()

    assert asyncio.run(run()).committed
    assert client.started
    assert bytes(client.data) == KEEPALIVE_FRAME * 2 + b"data: one\n\ndata: two\n\n"


def test_a_broken_answer_is_a_failure_before_commit() -> None:
    client = Client()

    async def dispatch(target: TargetSpec, last: bool, *, responder: Any, **_: Any) -> Outcome:
        await responder.commit(200, [], target)
        await responder.write(b"data: partial\n\n")
        return Outcome(True, BROKEN, usage=None)

    async def run() -> tuple[Outcome, Rescue]:
        rescue = _rescue(client, dispatch)
        try:
            return await rescue.dispatch(A, False), rescue
        finally:
            await rescue.close()

    outcome, rescue = asyncio.run(run())
    assert not outcome.committed and outcome.failure is BROKEN
    assert not client.started and bytes(client.data) == b""
    role = rescue.role_of(0)
    assert role is not None and role.role == "restart"


def test_an_answer_over_the_bound_stops() -> None:
    client = Client()

    async def dispatch(target: TargetSpec, last: bool, *, responder: Any, **_: Any) -> Outcome:
        await responder.commit(200, [], target)
        await responder.write(b"x" * 1000)
        await responder.write(b"x" * 25)
        return Outcome(True)

    async def run() -> None:
        rescue = _rescue(client, dispatch)
        try:
            await rescue.dispatch(A, False)
        finally:
            await rescue.close()

    with pytest.raises(BufferOverflow, match="1024"):
        asyncio.run(run())
    assert bytes(client.data) == b""
