"""The worker's budget for buffered answers (issue #43, point 4): past it a buffered stream ends
with the safe error (502 `buffer_limit_exceeded`, nothing of the answer shown), counted in
`/metrics`; what an answer held is given back when it ends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.buffer_budget import BufferBudget
from gateway.rescue import BufferBudgetExhausted, BufferOverflow, BufferResponder
from tests.conftest import Mock, Server, start_server
from tests.gateway.test_rescue import ask, setup, whole_answer

BUDGET = 4096


def test_responders_share_the_budget_and_give_it_back() -> None:
    async def run() -> None:
        budget = BufferBudget(100)
        one, two = BufferResponder(1000, budget), BufferResponder(1000, budget)
        await one.write(b"x" * 60)
        with pytest.raises(BufferBudgetExhausted):
            await two.write(b"y" * 41)
        assert budget.used == 60 and two.chunks == []
        await two.write(b"y" * 40)
        one.release()
        two.release()
        assert budget.used == 0
        # A stream's own bound still comes first, with its own message.
        with pytest.raises(BufferOverflow) as raised:
            await BufferResponder(10, budget).write(b"z" * 11)
        assert not isinstance(raised.value, BufferBudgetExhausted)

    asyncio.run(run())


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, stop = start_server(
        Path(tmp_path_factory.mktemp("ocx-budget")),
        extra_env={"OCX_BUFFER_BUDGET_BYTES": str(BUDGET)},
    )
    try:
        yield server
    finally:
        stop()


def exceeded(server: Server) -> float:
    text = server.http.get("/metrics").text
    found = re.search(r"^ocx_buffer_budget_exceeded_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_past_the_budget_a_buffered_stream_gets_the_safe_error(
    budget_server: Server, mock: Mock
) -> None:
    server = budget_server
    model, key, (a, b) = setup(server, mock, "chat", afterCommit="buffer", bufferMaxBytes=1 << 20)
    before = exceeded(server)
    mock.script(a, [{"text": "word " * 2000, "deltas": 40}], {"text": "short answer", "deltas": 2})
    r = ask(server, "responses", model, key)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "buffer_limit_exceeded"
    assert "OCX_BUFFER_BUDGET_BYTES" in r.json()["error"]["message"]
    assert "word" not in r.text
    assert exceeded(server) == before + 1
    assert mock.hits(b) == 0
    # What the refused answer held was given back: the next one is served whole.
    r = ask(server, "responses", model, key)
    assert whole_answer("responses", r) == "short answer"
