"""The proxy opens a burst of requests a turn at a time (`server.turns`), before any of a
request's own work, and answers every one of them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.proxy import ProxyApp
from server.turns import Turns
from tests.gateway.direct import post
from tests.server.passes import Passes


class Entries:
    def submit(self, entry: Any) -> None:
        pass


class Runtime:
    """Marks the loop pass in which each request got past its turn, then fails it (a 502: the
    shortest way through the proxy)."""

    def __init__(self, passes: Passes) -> None:
        self.requestlog = Entries()
        self.passes = passes

    async def ready(self) -> Any:
        self.passes.mark(len(self.passes.marks))
        raise ConnectionError("state backend unreachable")


def test_a_burst_of_requests_is_started_two_per_pass_and_every_one_answered() -> None:
    answers: list[int] = []

    async def main() -> list[int]:
        with Passes() as passes:
            app = ProxyApp(runtime=Runtime(passes))  # type: ignore[arg-type]
            app.turns = Turns(per_turn=2)

            async def one() -> None:
                sent = await post(app)
                assert json.loads(sent[1]["body"])["error"]["code"] == "internal_error"
                answers.append(sent[0]["status"])

            await asyncio.gather(*(one() for _ in range(5)))
        return [n for _, n in passes.marks]

    reached = asyncio.run(main())
    first = reached[0]
    # Two in the pass they came in, then two and one in the passes after the turns.
    assert [n - first for n in reached] == [0, 0, 2, 2, 3]
    assert answers == [502] * 5
