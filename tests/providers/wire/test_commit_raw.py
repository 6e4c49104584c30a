"""`CommitScanner.forward_raw()`: a committed pass-through stream is split into frames by byte
search, and only the frames that can end it, carry usage, name a tool or fail are parsed."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from providers.wire.commit import CommitScanner, EndState, Phase, WireProtocol
from providers.wire.sse import SSEEvent


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))  # compact, as upstreams send it


def rframe(etype: str, **fields: Any) -> bytes:
    return f"event: {etype}\ndata: {dumps({'type': etype, **fields})}\n\n".encode()


def cframe(payload: Any) -> bytes:
    return f"data: {dumps(payload)}\n\n".encode()


def delta(i: int) -> bytes:
    return rframe("response.output_text.delta", item_id="m", output_index=0, delta=f"w{i} ")


def cdelta(i: int) -> bytes:
    return cframe(
        {
            "id": "c",
            "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}],
        }
    )


R_CREATED = rframe("response.created", response={"id": "r", "output": []})
R_COMPLETED = rframe(
    "response.completed",
    response={"id": "r", "status": "completed", "usage": {"input_tokens": 3, "output_tokens": 5}},
)
C_FINISH = cframe({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
C_USAGE = cframe({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
DONE = b"data: [DONE]\n\n"

RESPONSES = R_CREATED + b"".join(delta(i) for i in range(12)) + R_COMPLETED
CHAT = b"".join(cdelta(i) for i in range(12)) + C_FINISH + C_USAGE + DONE


def run(
    protocol: WireProtocol, chunks: list[bytes], raw: bool
) -> tuple[CommitScanner, list[SSEEvent]]:
    scanner = CommitScanner(protocol)
    if raw:
        scanner.forward_raw()
    events: list[SSEEvent] = []
    for chunk in chunks:
        decision = scanner.feed(chunk)
        assert decision.phase is not Phase.FAILED
        if decision.phase is Phase.COMMITTED and not events:
            events.extend(scanner.buffered_events())
        elif decision.phase is Phase.COMMITTED:
            events.extend(decision.events)
    events.extend(scanner.finish().events)
    return scanner, events


def splits(data: bytes, rng: random.Random, n: int) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), n))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("protocol,stream", [("responses", RESPONSES), ("chat", CHAT)])
def test_any_split_forwards_the_same_bytes_and_reaches_the_same_end(
    protocol: WireProtocol, stream: bytes
) -> None:
    rng = random.Random(7)
    for n in (1, 2, 5, 17, 60):
        for _ in range(20):
            chunks = splits(stream, rng, n)
            fast, fast_events = run(protocol, chunks, raw=True)
            slow, slow_events = run(protocol, chunks, raw=False)
            assert b"".join(e.raw for e in fast_events) == stream
            assert fast.end_state() is slow.end_state() is EndState.COMPLETED
            assert fast.terminal_seen and fast.malformed == slow.malformed == 0

            # Every frame other than a plain delta comes back parsed, in order.
            def others(events: list[SSEEvent]) -> list[str]:
                return [e.data for e in events if e.has_data and '"w' not in e.data]

            assert others(fast_events) == others(slow_events) and len(others(slow_events)) >= 2
            if n >= 17:  # committed early: most deltas arrive after commit, unparsed
                assert sum(e.has_data for e in fast_events) < sum(e.has_data for e in slow_events)


def test_a_batch_of_plain_deltas_is_one_unparsed_unit_and_the_terminal_is_parsed() -> None:
    scanner = CommitScanner("responses")
    scanner.forward_raw()
    assert scanner.feed(R_CREATED + delta(0)).phase is Phase.COMMITTED
    batch = b"".join(delta(i) for i in range(1, 6))
    decision = scanner.feed(batch + R_COMPLETED)
    assert len(decision.events) == 2
    run_of_deltas, completed = decision.events
    assert (run_of_deltas.has_data, run_of_deltas.raw) == (False, batch)
    assert completed.has_data and completed.json()["response"]["usage"]["output_tokens"] == 5
    assert scanner.end_state() is EndState.COMPLETED and scanner.terminal_seen


def test_a_frame_split_across_chunks_is_held_until_whole() -> None:
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    scanner.feed(cdelta(0))
    one = cdelta(1)
    assert scanner.feed(one[:10]).events == ()
    assert scanner.feed(one[10:-1]).events == ()  # the blank line is not complete yet
    (event,) = scanner.feed(one[-1:] + C_FINISH[:5]).events
    assert event.raw == one and not event.has_data
    (finish,) = scanner.feed(C_FINISH[5:]).events
    assert finish.raw == C_FINISH and finish.has_data
    assert scanner.terminal_seen


def test_usage_in_the_last_unterminated_frame_is_read_at_the_end() -> None:
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    scanner.feed(cdelta(0))
    scanner.feed(cdelta(1) + C_FINISH)
    assert scanner.feed(C_USAGE[:-2]).events == ()  # no blank line: the upstream closes here
    end = scanner.finish()
    (usage,) = end.events
    assert usage.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 5}
    assert end.phase is Phase.COMMITTED and scanner.end_state() is EndState.COMPLETED


def test_an_error_frame_after_commit_is_the_streams_failure() -> None:
    scanner = CommitScanner("responses")
    scanner.forward_raw()
    scanner.feed(R_CREATED + delta(0))
    failed = rframe(
        "response.failed",
        response={
            "id": "r",
            "status": "failed",
            "error": {"code": "server_error", "message": "boom"},
        },
    )
    decision = scanner.feed(delta(1) + failed)
    assert [e.has_data for e in decision.events] == [False, True]
    assert scanner.end_state() is EndState.FAILED
    assert scanner.failure is not None and scanner.failure.code == "server_error"
    chat = CommitScanner("chat")
    chat.forward_raw()
    chat.feed(cdelta(0))
    chat.feed(cframe({"error": {"type": "server_error", "message": "boom"}}))
    assert chat.end_state() is EndState.FAILED


def test_a_stream_without_its_terminal_is_truncated() -> None:
    scanner = CommitScanner("responses")
    scanner.forward_raw()
    scanner.feed(R_CREATED + delta(0))
    scanner.feed(delta(1) + delta(2))
    scanner.finish()
    assert scanner.end_state() is EndState.TRUNCATED and not scanner.terminal_seen


def test_a_malformed_frame_after_commit_is_parsed_and_counted() -> None:
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    scanner.feed(cdelta(0))
    decision = scanner.feed(cdelta(1) + b"data: {not json\n\n" + cdelta(2))
    assert [e.has_data for e in decision.events] == [False, True, False]
    assert scanner.malformed == 1


def test_crlf_line_ends_after_commit_go_back_to_the_parser() -> None:
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    scanner.feed(cdelta(0))
    crlf = cdelta(1).replace(b"\n", b"\r\n")
    decision = scanner.feed(cdelta(2)[:7])
    assert decision.events == ()
    decision = scanner.feed(cdelta(2)[7:] + crlf + C_FINISH.replace(b"\n", b"\r\n"))
    assert b"".join(e.raw for e in decision.events) == cdelta(2) + crlf + C_FINISH.replace(
        b"\n", b"\r\n"
    )
    assert all(e.has_data for e in decision.events)  # parsed frame by frame again
    assert scanner.terminal_seen


@pytest.mark.parametrize(
    "frame",
    [
        C_FINISH,  # a finish_reason
        C_USAGE,  # usage
        DONE,
        cframe(
            {"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}]}
        ),  # no finish_reason
        cframe(
            {
                "id": "c",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]},
                        "finish_reason": None,
                    }
                ],
            }
        ),
        b'data: {"id":"c",\ndata: "choices":[],"finish_reason":null}\n\n',  # two data lines
        b'data:{"id":"c","choices":[{"delta":{"content":"x"},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","choices":[{"delta":{"content":"x"},"finish_reason":null}]\n\n',
    ],
)
def test_chat_frames_that_are_parsed(frame: bytes) -> None:
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    scanner.feed(cdelta(0))
    (event,) = scanner.feed(frame).events
    assert event.has_data


@pytest.mark.parametrize(
    "frame",
    [
        R_COMPLETED,
        rframe(
            "response.incomplete",
            response={"id": "r", "incomplete_details": {"reason": "max_output_tokens"}},
        ),
        rframe("error", code="server_error", message="x"),
        rframe(
            "response.output_item.added",
            output_index=0,
            item={"type": "function_call", "name": "f"},
        ),
        # a second "type" key: the last one is what a JSON parser reads
        b'data: {"type":"response.output_text.delta","delta":"x","type":"response.completed"}\n\n',
        b'event: x\nid: 1\ndata: {"type":"response.output_text.delta","delta":"x"}\n\n',
        b'data: {"sequence_number":1,"type":"response.output_text.delta","delta":"x"}\n\n',
    ],
)
def test_responses_frames_that_are_parsed(frame: bytes) -> None:
    scanner = CommitScanner("responses")
    scanner.forward_raw()
    scanner.feed(R_CREATED + delta(0))
    events = scanner.feed(frame).events
    assert events and all(e.has_data for e in events)


def test_without_forward_raw_every_frame_is_parsed() -> None:
    scanner = CommitScanner("responses")
    scanner.feed(R_CREATED + delta(0))
    events = scanner.feed(delta(1) + delta(2)).events
    assert [e.has_data for e in events] == [True, True]


# ---------------------------------------------------------------------------------------------
# `plain()`: a whole plain delta is forwarded without being fed


def frames_of(stream: bytes) -> list[bytes]:
    return [f + b"\n\n" for f in stream.split(b"\n\n") if f]


def run_with_plain(protocol: WireProtocol, chunks: list[bytes]) -> tuple[CommitScanner, bytes, int]:
    """As the streaming proxy reads: after commit a chunk that `plain()` accepts is forwarded
    as it came and never fed. Returns the scanner, the forwarded bytes and how many chunks
    took that way."""
    scanner = CommitScanner(protocol)
    scanner.forward_raw()
    out: list[bytes] = []
    shortcuts = 0
    committed = False
    for chunk in chunks:
        if committed and scanner.plain(chunk):
            out.append(chunk)
            shortcuts += 1
            continue
        decision = scanner.feed(chunk)
        assert decision.phase is not Phase.FAILED
        if decision.phase is Phase.COMMITTED and not committed:
            committed = True
            out.extend(e.raw for e in scanner.buffered_events())
        elif decision.phase is Phase.COMMITTED:
            out.extend(e.raw for e in decision.events)
    out.extend(e.raw for e in scanner.finish().events)
    return scanner, b"".join(out), shortcuts


@pytest.mark.parametrize("protocol,stream", [("responses", RESPONSES), ("chat", CHAT)])
def test_plain_deltas_skipped_past_feed_leave_the_same_bytes_and_end(
    protocol: WireProtocol, stream: bytes
) -> None:
    rng = random.Random(11)
    frames = frames_of(stream)
    for _ in range(40):
        # Frame-aligned chunks of 1-3 frames (the shortcut's case), then some cut anywhere.
        chunks: list[bytes] = []
        i = 0
        while i < len(frames):
            k = rng.randint(1, 3)
            chunks.append(b"".join(frames[i : i + k]))
            i += k
        for chunked in (chunks, splits(stream, rng, 9)):
            scanner, sent, _ = run_with_plain(protocol, chunked)
            assert sent == stream
            assert scanner.end_state() is EndState.COMPLETED and scanner.terminal_seen
    _, _, shortcuts = run_with_plain(protocol, frames)
    assert shortcuts == 11  # every delta after the committing one


def test_plain_accepts_only_one_whole_plain_delta_after_commit() -> None:
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    assert not scanner.plain(cdelta(0))  # before commit: the scanner must see it
    assert scanner.feed(cdelta(0)).phase is Phase.COMMITTED
    assert scanner.plain(cdelta(1))
    assert not scanner.plain(cdelta(1) + cdelta(2))  # two frames: fed (one unit)
    for other in (C_FINISH, C_USAGE, DONE, cframe({"error": {"message": "x"}})):
        assert not scanner.plain(other)
    assert not scanner.plain(cdelta(1).replace(b"\n\n", b"\r\n\r\n"))
    tool = cframe(
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"function": {"name": "x"}}]},
                    "finish_reason": None,
                }
            ],
        }
    )
    assert not scanner.plain(tool)
    half = cdelta(2)[:15]
    scanner.feed(half)  # a frame held open: the next chunk is its rest, not a frame of its own
    assert not scanner.plain(cdelta(3))


def test_plain_is_never_true_for_a_translated_or_responses_terminal_stream() -> None:
    translated = CommitScanner("chat")  # no forward_raw(): every frame goes to the translator
    translated.feed(cdelta(0))
    assert not translated.plain(cdelta(1))
    responses = CommitScanner("responses")
    responses.forward_raw()
    responses.feed(R_CREATED + delta(0))
    assert responses.plain(delta(1))
    assert not responses.plain(R_COMPLETED)
    assert not responses.plain(rframe("response.failed", response={"id": "r"}))
