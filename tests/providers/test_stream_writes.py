"""`upstream._stream` writes what one upstream read brings as one write to the client, passed
through (frames forwarded as received) or translated, and still reads usage and terminals."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

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


def test_a_chunk_handed_on_while_waiting_moves_the_idle_deadline() -> None:
    # A delta written from the connection's callback (`_chunks`' sink) is a read: the idle
    # window starts again there, while the task itself still waits.
    loop, task = FakeLoop(), FakeTask()
    timer = upstream._ReadTimer(loop, task)  # type: ignore[arg-type]
    timer.start(2.0)  # waiting, due 2.0
    loop.now = 1.5
    timer.moved(2.0)  # a chunk handed on at 1.5: due 3.5
    fire(loop)  # at 2.0: early, re-armed at 3.5
    assert task.cancels == 0 and [w for w, _ in loop.timers] == [3.5]
    fire(loop)  # nothing since: the stream is idle past its bound
    assert task.cancels == 1 and timer.fired


ROLE = b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}'
ROLE += b"\n\n"
DONE = b"data: [DONE]\n\n"


class NowSink(Sink):
    """A client side that can also write at once (`Exchange.writer_now`, as under Daphne)."""

    def __init__(self, now: bool) -> None:
        super().__init__()
        self.log: list[tuple[str, bytes]] = []
        self.now = now

    async def write(self, data: bytes) -> None:
        if data:  # as `Exchange.write`: an empty write sends nothing
            self.log.append(("write", data))

    def writer_now(self) -> Any:
        return self._write_now if self.now else None

    def _write_now(self, data: bytes) -> None:
        self.log.append(("now", data))


async def _through_http1(
    frames: list[bytes],
    sink: NowSink,
    *,
    idle_ms: int = 5000,
    stall_after: int | None = None,
    inbound: str = "chat",
    writes_after: list[int | None] | None = None,
    block_after: int | None = None,
) -> Any:
    """`upstream._stream` over ocx's own transport from a real socket: the upstream sends each
    frame as one chunk once the client side has everything before it (so each arrives while the
    stream waits), or stops sending after `stall_after` frames and holds the connection. A
    translated stream's output is not its input: `writes_after[i]` is then how many writes the
    client side has once frame `i` is handled (None: do not wait). After frame `block_after`
    the upstream blocks the whole loop for 1.5 idle windows, then holds the connection."""
    from providers.http1 import Http1Transport

    sent: list[bytes] = []

    def written() -> int:
        return sum(len(data) for _, data in sink.log)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        for i, frame in enumerate(frames):
            if stall_after is not None and i == stall_after:
                await asyncio.sleep(30)  # cancelled when the test ends
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
            sent.append(frame)
            if i == block_after:
                # The worker's loop busy past the idle deadline (a burst): when it runs again the
                # frame's arrival and the deadline are due in the same turn.
                time.sleep(idle_ms / 1000 * 1.5)
                await asyncio.sleep(30)  # cancelled when the test ends
            if writes_after is not None:
                count = writes_after[i]
                async with asyncio.timeout(5):
                    while count is not None and len(sink.log) < count:
                        await asyncio.sleep(0)
            elif i >= 1:  # the role chunk waits for the first delta (the commit)
                async with asyncio.timeout(5):
                    while written() < sum(map(len, sent)):
                        await asyncio.sleep(0)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = Http1Transport(ssl_context=None)
    try:
        request = httpx.Request(
            "POST", f"http://127.0.0.1:{port}/v1/chat/completions", content=b"{}"
        )
        resp = await transport.handle_async_request(request)
        return await upstream._stream(
            resp,
            inbound,  # type: ignore[arg-type]
            "chat",
            TargetSpec("p", "m"),
            sink,
            upstream.Caller({}, "req1"),
            5000,
            idle_ms,
            declared=frozenset(),
        )
    finally:
        await transport.aclose()
        server.close()


def test_a_committed_pass_through_is_written_at_once_in_order() -> None:
    frames = [ROLE] + [cdelta(i) for i in range(6)] + [FINISH, USAGE, DONE]
    for now in (True, False):
        sink = NowSink(now)
        outcome = asyncio.run(_through_http1(frames, sink))
        assert outcome.committed and outcome.failure is None
        assert (outcome.usage.input, outcome.usage.output) == (3, 7)  # read from the callback
        how = "now" if now else "write"
        # The commit (pending role chunk and first delta) goes through the task's own write;
        # every chunk after it, when the server can write at once, straight from the
        # connection's callback (plain deltas as they came, the rest as the loop would).
        assert sink.log == [
            ("write", ROLE + cdelta(0)),
            *[(how, cdelta(i)) for i in range(1, 6)],
            (how, FINISH),
            (how, USAGE),
            (how, DONE),
        ]


def test_a_committed_translated_stream_is_written_at_once_as_the_loop_would() -> None:
    # A Responses client on a Chat upstream: each chunk after the commit is read and
    # translated in the connection's callback; the client gets the same bytes either way.
    frames = [ROLE] + [cdelta(i) for i in range(6)] + [FINISH, USAGE, DONE]
    logs = {}
    for now in (True, False):
        sink = NowSink(now)
        # The role chunk is held, each delta after it one write; the finish, usage and [DONE]
        # chunks translate to nothing until the body ends.
        writes: list[int | None] = [None, 1, 2, 3, 4, 5, 6, None, None, None]
        run = _through_http1(frames, sink, inbound="responses", writes_after=writes)
        outcome = asyncio.run(run)
        assert outcome.committed and outcome.failure is None
        assert (outcome.usage.input, outcome.usage.output) == (3, 7)
        logs[now] = sink.log
    # The commit, one write per delta after it, and the closing events with the chunk that
    # ends the stream (`[DONE]`).
    assert [h for h, _ in logs[True]] == ["write"] + ["now"] * 6
    assert [h for h, _ in logs[False]] == ["write"] * 7
    assert [d for _, d in logs[True]] == [d for _, d in logs[False]]
    text = b"".join(d for _, d in logs[True]).decode()
    assert text.count("event: response.output_text.delta") == 6
    assert "response.completed" in logs[True][-1][1].decode()
    assert text.count("response.completed") == 2  # its event line and type field, once


def test_a_chunk_that_cuts_a_translated_stream_is_left_to_the_loop_with_what_was_read() -> None:
    # The scanner cannot read a chunk twice: the callback reads the malformed frame, leaves
    # the chunk and its reading to the loop, which ends the stream with the explicit error.
    bad = b"data: {not json}\n\n"
    # A delta, the malformed frame and the start of the next frame in one read: read twice,
    # the held start would be glued to the chunk's own bytes and the delta lost.
    frames = [ROLE, cdelta(0), cdelta(1), cdelta(2) + bad + b'data: {"id":"c","cho']
    frames += [cdelta(3), FINISH, DONE]
    logs = {}
    for now in (True, False):
        sink = NowSink(now)
        writes: list[int | None] = [None, 1, 2, 3]
        run = _through_http1(frames, sink, inbound="responses", stall_after=4, writes_after=writes)
        outcome = asyncio.run(run)
        assert outcome.committed and outcome.failure is not None
        assert outcome.malformed == 1
        assert "malformed" in outcome.failure.message
        logs[now] = sink.log
    # What preceded the malformed frame, then the explicit terminal error, from the loop.
    assert [h for h, _ in logs[True]] == ["write", "now", "write", "write"]
    assert [d for _, d in logs[True]] == [d for _, d in logs[False]]
    assert b'"delta":"w2 "' in logs[True][2][1]
    assert b"malformed" in logs[True][-1][1]  # once
    assert b"w3" not in b"".join(d for _, d in logs[True])  # nothing after the cut


def test_each_delta_written_at_once_restarts_the_idle_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The deltas the task never saw still count as reads: each moves the idle deadline by the
    # idle bound (what that does to the timer: the FakeLoop test above).
    moves: list[float] = []
    monkeypatch.setattr(upstream._ReadTimer, "moved", lambda self, s: moves.append(s))
    frames = [ROLE] + [cdelta(i) for i in range(7)] + [FINISH, DONE]
    sink = NowSink(True)
    outcome = asyncio.run(_through_http1(frames, sink, idle_ms=750))
    assert outcome.committed and outcome.failure is None
    assert [how for how, _ in sink.log] == ["write"] + ["now"] * 8
    assert moves == [0.75] * 8


def test_a_stream_that_stalls_after_deltas_written_at_once_still_times_out() -> None:
    frames = [ROLE] + [cdelta(i) for i in range(4)] + [FINISH, DONE]
    sink = NowSink(True)
    outcome = asyncio.run(_through_http1(frames, sink, idle_ms=100, stall_after=5))
    assert outcome.committed and outcome.failure is not None
    assert "stalled (idle timeout)" in outcome.failure.message
    assert [how for how, _ in sink.log] == ["write", "now", "now", "now", "write"]
    assert b"stalled (idle timeout)" in sink.log[-1][1]  # the explicit terminal error frame


def test_a_cut_left_to_the_loop_is_not_lost_to_an_idle_deadline_due_in_the_same_turn() -> None:
    # A call to an undeclared tool, the finish and [DONE] arrive in one read as the idle
    # deadline passes: the callback reads them (the scanner sees the end) and leaves the cut to
    # the loop. The read counts, so the deadline cannot cancel the task before it ends the
    # stream with the explicit error; the stream must not pass for complete.
    call = {"index": 0, "id": "t1", "type": "function"}
    call["function"] = {"name": "rm_rf", "arguments": "{}"}
    choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
    tool = f"data: {dumps({'id': 'c', 'choices': [choice]})}\n\n".encode()
    end = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    frames = [ROLE, cdelta(0), cdelta(1), tool + end + DONE]
    sink = NowSink(True)
    outcome = asyncio.run(_through_http1(frames, sink, idle_ms=100, block_after=3))
    assert outcome.committed and outcome.failure is not None
    assert outcome.failure.transport == "undeclared_tool", outcome.failure
    assert [how for how, _ in sink.log] == ["write", "now", "write"]
    assert b"rm_rf" in sink.log[-1][1] and b"w2" not in sink.log[-1][1]


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[list[object]]:
    """What the block left that only Python's cyclic collector frees (reference cycles)."""
    found: list[object] = []
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _ocx_objects(objects: list[object]) -> list[str]:
    names = []
    for obj in objects:
        module = obj.__module__ if isinstance(obj, types.FunctionType) else type(obj).__module__
        if module.split(".")[0] in {"providers", "gateway", "routing", "server"}:
            names.append(getattr(obj, "__qualname__", type(obj).__qualname__))
    return sorted(set(names))


def test_a_stream_and_its_closed_connection_leave_nothing_to_the_cyclic_collector() -> None:
    # The sink that writes from the connection's callback closes over the stream's parser and
    # scanner, and the connection's parser calls back into the connection: were either
    # reachable from itself, every stream would leave them (with the client's request, its
    # connection and socket) for a collection, about 90 objects a stream in a worker, which a
    # burst of new streams then paid for (bench/README.md, eighteenth run).
    frames = [ROLE] + [cdelta(i) for i in range(4)] + [FINISH, USAGE, DONE]
    for now in (True, False):
        with cyclic_garbage() as garbage:
            outcome = asyncio.run(_through_http1(frames, NowSink(now)))  # closes its connection
        assert outcome.committed and outcome.failure is None
        assert _ocx_objects(garbage) == []
        del garbage  # what it holds would be found again in the next round
