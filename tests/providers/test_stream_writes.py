"""`upstream._stream` writes what one upstream read brings as one write to the client, passed
through (frames forwarded as received) or translated, and still reads usage and terminals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from providers import upstream
from routing.types import TargetSpec


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def cdelta(i: int) -> bytes:
    choice = {"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}
    return f"data: {dumps({'id': 'c', 'choices': [choice]})}\n\n".encode()


FINISH = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\n'


class Sink:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def commit(self, status: int, headers: list[tuple[bytes, bytes]], target: Any) -> None:
        pass

    async def write(self, data: bytes) -> None:
        self.writes.append(data)


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def stream(chunks: list[bytes], inbound: str) -> tuple[Any, Sink]:
    sink = Sink()

    async def go() -> Any:
        resp = httpx.Response(200, stream=Chunks(chunks))
        return await upstream._stream(
            resp,
            inbound,  # type: ignore[arg-type]
            "chat",
            TargetSpec("p", "m"),
            sink,
            upstream.Caller({}, "req1"),
            5000,
            5000,
            declared=frozenset(),
        )

    return asyncio.run(go()), sink


# Each chunk after the first holds several frames, one split across two chunks.
BODY = b"".join(cdelta(i) for i in range(9)) + FINISH + USAGE + b"data: [DONE]\n\n"
CHUNKS = [cdelta(0), cdelta(1) + cdelta(2) + cdelta(3)[:20], cdelta(3)[20:] + cdelta(4) + cdelta(5)]
CHUNKS += [
    b"".join(cdelta(i) for i in range(6, 9)) + FINISH,
    USAGE[:-2],
    USAGE[-2:] + b"data: [DONE]\n\n",
]


def test_a_pass_through_stream_is_one_write_per_upstream_read_and_keeps_its_usage() -> None:
    assert b"".join(CHUNKS) == BODY
    outcome, sink = stream(CHUNKS, "chat")
    assert outcome.committed and outcome.failure is None
    assert (outcome.usage.input, outcome.usage.output) == (3, 7)
    assert b"".join(sink.writes) == BODY
    # One write per read; the read that ends inside the usage frame has nothing whole to send.
    assert sink.writes == [
        CHUNKS[0],
        cdelta(1) + cdelta(2),
        cdelta(3) + cdelta(4) + cdelta(5),
        CHUNKS[3],
        USAGE + b"data: [DONE]\n\n",
    ]


def test_a_translated_stream_is_one_write_per_upstream_read() -> None:
    outcome, sink = stream(CHUNKS, "responses")
    assert outcome.committed and outcome.failure is None
    assert (outcome.usage.input, outcome.usage.output) == (3, 7)
    # The preamble and first output at commit, then one write per read with whole frames, and
    # the closing events.
    assert len(sink.writes) == 1 + 3 + 1 + 1
    text = b"".join(sink.writes).decode()
    assert text.count("response.output_text.delta") == 9 * 2  # event line + type field
    assert text.rstrip().endswith("}") and "response.completed" in text


def test_an_error_after_commit_ends_the_pass_through_with_it() -> None:
    error = b'data: {"error":{"type":"server_error","code":"server_error","message":"boom"}}\n\n'
    outcome, sink = stream([cdelta(0), cdelta(1) + error], "chat")
    assert outcome.committed and outcome.failure is not None
    assert outcome.failure.status == 500
    assert sink.writes == [cdelta(0), cdelta(1) + error]  # forwarded as received, no [DONE]


class Handle:
    def __init__(self, loop: FakeLoop, when: float) -> None:
        self._loop, self._when = loop, when

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self._loop.timers = [(w, c) for w, c in self._loop.timers if w != self._when]


class FakeLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> Any:
        self.timers.append((when, callback))
        self.timers.sort(key=lambda t: t[0])
        return Handle(self, when)


class FakeTask:
    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1


def fire(loop: FakeLoop) -> None:
    when, callback = loop.timers.pop(0)
    loop.now = max(loop.now, when)
    callback()


def test_the_read_timer_arms_once_and_moves_lazily() -> None:
    loop, task = FakeLoop(), FakeTask()
    timer = upstream._ReadTimer(loop, task)  # type: ignore[arg-type]
    timer.start(5.0)  # first byte within 5 s
    assert [w for w, _ in loop.timers] == [5.0]
    timer.waiting = False
    loop.now = 1.0
    timer.start(2.0)  # the first idle read: the 5 s timer is brought forward to 3.0
    assert [w for w, _ in loop.timers] == [3.0]
    for t in (2.0, 3.0):  # two more chunks, each within the idle bound: no new timer
        timer.waiting = False
        loop.now = t
        timer.start(2.0)
    assert [w for w, _ in loop.timers] == [3.0]
    fire(loop)  # at 3.0: early (the last read started at 3.0), re-armed at 5.0
    assert task.cancels == 0 and [w for w, _ in loop.timers] == [5.0]
    fire(loop)
    assert task.cancels == 1 and timer.fired


def test_the_read_timer_re_arms_when_it_fires_early_and_sleeps_between_reads() -> None:
    loop, task = FakeLoop(), FakeTask()
    timer = upstream._ReadTimer(loop, task)  # type: ignore[arg-type]
    timer.start(1.0)
    timer.waiting = False
    loop.now = 0.9
    timer.start(1.0)  # due 1.9 now
    fire(loop)  # at 1.0: early, re-armed at 1.9
    assert task.cancels == 0 and [w for w, _ in loop.timers] == [1.9]
    timer.waiting = False  # the consumer is busy with a chunk: its time does not count
    fire(loop)
    assert task.cancels == 0 and loop.timers == []
    loop.now = 10.0
    timer.start(1.0)  # the next read arms it again
    assert [w for w, _ in loop.timers] == [11.0]
    timer.close()
    assert task.cancels == 0 and not timer.fired
