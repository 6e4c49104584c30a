"""The proxy opens a burst of requests a turn at a time (`server.turns`), before any of a
request's own work, and answers every one of them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.proxy import ProxyApp
from server.turns import Turns
from tests.gateway.direct import post


class Entries:
    def submit(self, entry: Any) -> None:
        pass


class Runtime:
    """Records the loop pass in which each request got past its turn, then fails it (a 502:
    the shortest way through the proxy)."""

    def __init__(self, passes: list[int]) -> None:
        self.requestlog = Entries()
        self.passes = passes
        self.reached: list[int] = []

    async def ready(self) -> Any:
        self.reached.append(self.passes[0])
        raise ConnectionError("state backend unreachable")


def test_a_burst_of_requests_is_started_two_per_pass_and_every_one_answered() -> None:
    answers: list[int] = []

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        passes = [0]
        ticking = [True]

        def tick() -> None:
            passes[0] += 1
            if ticking[0]:
                loop.call_soon(tick)

        loop.call_soon(tick)
        runtime = Runtime(passes)
        app = ProxyApp(runtime=runtime)  # type: ignore[arg-type]
        app.turns = Turns(per_turn=2)

        async def one() -> None:
            sent = await post(app)
            assert json.loads(sent[1]["body"])["error"]["code"] == "internal_error"
            answers.append(sent[0]["status"])

        await asyncio.gather(*(one() for _ in range(5)))
        ticking[0] = False
        return runtime.reached

    reached = asyncio.run(main())
    first = reached[0]
    # Two in the pass they came in, then two and one in the passes after the turns.
    assert [n - first for n in reached] == [0, 0, 2, 2, 3]
    assert answers == [502] * 5
