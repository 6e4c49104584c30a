"""The upstream stream reader's steps without a server (#41): `upstream._StreamReader` fed a
list of chunks (no socket, no httpx response). The commit rule (nothing reaches the client
before output), each way a stream ends (complete, upstream broke, timed out, client left)
and the usage it saw."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from providers import upstream
from providers.wire.usage import Usage
from routing.types import TargetSpec

TARGET = TargetSpec("p", "m")


def frame(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


ROLE = frame({"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
HELLO = frame({"id": "c", "choices": [{"index": 0, "delta": {"content": "hello"}}]})
FINISH = frame({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = frame({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}})
DONE = b"data: [DONE]\n\n"
ERROR = frame({"error": {"type": "server_error", "code": "server_error", "message": "boom"}})


class Client:
    """The client side: what was committed and written, and the usage noted for a leaver."""

    def __init__(self) -> None:
        self.commits: list[int] = []
        self.writes: list[bytes] = []
        self.noted: list[Usage | None] = []

    async def commit(self, status: int, headers: list[tuple[bytes, bytes]], target: Any) -> None:
        assert not self.commits, "committed twice"
        assert (b"content-type", b"text/event-stream; charset=utf-8") in headers
        self.commits.append(status)

    async def write(self, data: bytes) -> None:
        assert self.commits, "a write before the commit"
        self.writes.append(data)

    def note_usage(self, target: TargetSpec, usage: Usage | None) -> None:
        self.noted.append(usage)


async def chunks(items: list[bytes | BaseException]) -> AsyncIterator[bytes]:
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item


def read(
    items: list[bytes | BaseException], inbound: str = "chat"
) -> tuple[upstream._StreamReader, Client, Any]:
    client = Client()
    reader = upstream._StreamReader(
        inbound,  # type: ignore[arg-type]
        "chat",
        TARGET,
        client,
        upstream.Caller({}, "req-1"),
        frozenset(),
        True,
        frozenset(),
    )

    async def go() -> Any:
        try:
            return await reader.run(chunks(items))
        except asyncio.CancelledError as exc:
            return exc

    return reader, client, asyncio.run(go())


def test_nothing_reaches_the_client_before_output_then_the_held_frames_go_first() -> None:
    reader, client, outcome = read([ROLE, HELLO, FINISH + USAGE + DONE])
    assert outcome.committed and outcome.failure is None
    assert client.commits == [200]
    assert client.writes == [ROLE + HELLO, FINISH + USAGE + DONE]
    assert (outcome.usage.input, outcome.usage.output) == (3, 7)
    assert reader.committed and reader.pending == [] and reader.broken is None


def test_a_failure_before_output_is_a_failed_attempt_and_the_client_sees_nothing() -> None:
    _, client, outcome = read([ROLE, ERROR])
    assert not outcome.committed and outcome.failure is not None
    assert outcome.failure.status == 500 and outcome.failure.stream_event == "error"
    assert client.commits == [] and client.writes == []


def test_an_upstream_that_breaks_after_output_ends_with_an_explicit_error() -> None:
    reader, client, outcome = read([ROLE, HELLO])  # its body ends with no finish
    assert outcome.committed and outcome.failure is not None
    assert reader.broken is not None and outcome.cool is True
    assert client.writes[0] == ROLE + HELLO
    assert b"error" in client.writes[-1] and DONE not in b"".join(client.writes)


def test_a_complete_chat_stream_without_its_trailer_still_gets_one() -> None:
    _, client, outcome = read([HELLO, FINISH + USAGE])
    assert outcome.committed and outcome.failure is None
    assert client.writes == [HELLO, FINISH + USAGE, DONE]


def test_an_empty_answer_is_committed_at_its_end() -> None:
    _, client, outcome = read([ROLE + FINISH + DONE])
    assert outcome.committed and outcome.failure is None and client.commits == [200]
    assert b"".join(client.writes) == ROLE + FINISH + DONE


def test_no_output_before_the_timeout_is_a_first_byte_timeout() -> None:
    _, client, outcome = read([TimeoutError()])
    assert not outcome.committed and outcome.failure.transport == "timeout_first_byte"
    assert client.commits == []


def test_a_stall_after_output_is_broken_and_never_retried() -> None:
    _, _, outcome = read([HELLO, TimeoutError()])
    assert outcome.committed and outcome.failure is not None and outcome.failure.timed_out


def test_a_quiet_stream_after_its_end_is_complete() -> None:
    _, client, outcome = read([HELLO, FINISH + USAGE + DONE, TimeoutError()])
    assert outcome.committed and outcome.failure is None
    assert b"".join(client.writes) == HELLO + FINISH + USAGE + DONE


@pytest.mark.parametrize(
    ("items", "noted"),
    [
        # Usage seen before the end: only the input is final.
        ([HELLO + USAGE], [Usage(3, None, None)]),
        # Its end seen: the whole figure.
        ([HELLO, FINISH + USAGE], [Usage(3, 7, None)]),
        # Nothing seen, or not committed: nothing to note.
        ([HELLO], []),
        ([ROLE + USAGE], []),
    ],
)
def test_a_client_that_leaves_is_charged_the_usage_seen_so_far(
    items: list[bytes | BaseException], noted: list[Usage]
) -> None:
    _, client, result = read([*items, asyncio.CancelledError()])
    assert isinstance(result, asyncio.CancelledError)
    assert [(u.input, u.output) for u in client.noted if u is not None] == [
        (u.input, u.output) for u in noted
    ]


class WritesNow(Client):
    """A server that can write at once (`server.body_now`): chunks go from the connection's
    callback straight to the client."""

    def writer_now(self) -> Any:
        return self.writes.append


def test_after_commit_chunks_are_written_from_the_sink_and_it_is_let_go_at_the_end() -> None:
    client = WritesNow()
    reader = upstream._StreamReader(
        "chat", "chat", TARGET, client, upstream.Caller({}, "r"), frozenset(), True, frozenset()
    )
    taken: list[bool] = []

    async def transport() -> AsyncIterator[bytes]:
        yield HELLO  # the commit
        sink = reader.push.sink
        assert sink is not None
        taken.append(sink(HELLO))  # a plain delta: written at once
        taken.append(sink(FINISH + USAGE))  # read (usage, end), then written
        yield DONE

    outcome = asyncio.run(reader.run(transport()))
    assert taken == [True, True]
    assert client.writes == [HELLO, HELLO, FINISH + USAGE, DONE]
    assert outcome.committed and outcome.failure is None
    assert (outcome.usage.input, outcome.usage.output) == (3, 7)
    assert reader.push.sink is None  # no cycle left through the reader
