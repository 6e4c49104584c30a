from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers.wire.sse import (
    DONE_FRAME,
    SSEEvent,
    SSEFrameTooLarge,
    SSEParser,
    encode_event,
    encode_json_event,
)

STREAM = (
    b": keep-alive\n\n"
    b'event: response.created\ndata: {"type":"response.created"}\n\n'
    b"data: line one\r\ndata: line two\r\n\r\n"
    b"event: x\rdata: cr only\r\r"
    b"id: 7\ndata: caf\xc3\xa9\n\n"
    b"data: [DONE]\n\n"
)


def parse_all(chunks: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    out.extend(parser.finish())
    return out


def test_parses_all_line_endings_comments_and_done() -> None:
    events = parse_all([STREAM])
    data_events = [e for e in events if e.has_data]
    assert [(e.event, e.data) for e in data_events] == [
        ("response.created", '{"type":"response.created"}'),
        (None, "line one\nline two"),
        ("x", "cr only"),
        (None, "café"),
        (None, "[DONE]"),
    ]
    assert data_events[3].id == "7"
    assert [e.is_done for e in data_events] == [False, False, False, False, True]
    # The comment frame is kept (has_data False) so raw bytes are complete.
    assert events[0] == SSEEvent(event=None, data="", raw=b": keep-alive\n\n", has_data=False)
    assert b"".join(e.raw for e in events) == STREAM


def test_raw_is_exact_frame_bytes() -> None:
    events = parse_all([STREAM])
    assert events[2].raw == b"data: line one\r\ndata: line two\r\n\r\n"
    assert events[3].raw == b"event: x\rdata: cr only\r\r"


def test_trailing_cr_waits_for_possible_lf() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r\n\r") == []
    # The LF belongs to the CRLF blank line: one frame, no extra empty frame.
    events = parser.feed(b"\ndata: b\n\n")
    assert [(e.data, e.raw) for e in events] == [
        ("a", b"data: a\r\n\r\n"),
        ("b", b"data: b\n\n"),
    ]


def test_finish_flushes_unterminated_frame_and_drops_comment_tail() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]\n") == []
    tail = parser.finish()
    assert len(tail) == 1 and tail[0].is_done
    parser = SSEParser()
    parser.feed(b": just a comment")
    assert parser.finish() == []


def test_field_without_space_and_unknown_fields() -> None:
    events = parse_all([b"data:x\nretry: 5\nfoo: bar\ndata\n\n"])
    assert events[0].data == "x\n"


def test_bom_is_ignored_but_kept_in_raw() -> None:
    events = parse_all([b"\xef\xbb", b"\xbfdata: a\n\n"])
    assert events[0].data == "a"
    assert events[0].raw == b"\xef\xbb\xbfdata: a\n\n"


def test_frame_bound_raises() -> None:
    parser = SSEParser(max_frame_bytes=16)
    assert parser.feed(b"data: 0123456789") == []  # 16 bytes: at the bound, allowed
    with pytest.raises(SSEFrameTooLarge):
        parser.feed(b"x")


def test_bound_counts_only_the_current_frame() -> None:
    parser = SSEParser(max_frame_bytes=16)
    events = parser.feed(b"data: 012345678\n\n" * 10)
    assert len(events) == 10
    assert parser.pending_bytes == 0


def test_encode_event_round_trips() -> None:
    assert encode_event("a.b", "x\ny") == b"event: a.b\ndata: x\ndata: y\n\n"
    assert encode_event(None, "[DONE]") == DONE_FRAME
    frame = encode_json_event("t", {"k": "é", "n": 1})
    assert frame == 'event: t\ndata: {"k":"é","n":1}\n\n'.encode()
    (event,) = parse_all([frame])
    assert event.json() == {"k": "é", "n": 1}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_split_invariance(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert parse_all(chunks) == parse_all([STREAM])


_LINE = st.sampled_from(
    [b"data: a", b'data: {"x": 1}', b"event: e", b": c", b"", b"id: 1", b"data:", b"d\xc3\xa9"]
)
_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_LINE, _EOL), max_size=20), st.data())
def test_split_invariance_random_streams(
    lines: list[tuple[bytes, bytes]], data: st.DataObject
) -> None:
    stream = b"".join(line + eol for line, eol in lines)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=10))
    points = sorted(set(cuts))
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    whole = parse_all([stream])
    assert parse_all(chunks) == whole
    # Frames cover the stream exactly, except a trailing fragment with no field at EOF.
    assert stream.startswith(b"".join(e.raw for e in whole))
