"""Incremental, split-safe Server-Sent Events framing.

`SSEParser.feed(chunk)` turns arbitrary byte chunks into complete frames. Every frame, including
comment-only keep-alives and stray blank lines, is returned as an `SSEEvent` whose `raw` holds the
exact bytes of that frame, so the concatenation of all `raw` values equals the input: a
pass-through proxy can forward `raw` unchanged and never re-encode JSON. Lines may end in `\\n`,
`\\r\\n` or `\\r`; the result is identical for every way the input is split into chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024
DONE_DATA = "[DONE]"
DONE_FRAME = b"data: [DONE]\n\n"
_BOM = b"\xef\xbb\xbf"


class SSEFrameTooLarge(ValueError):
    """A single SSE frame grew past the parser's byte bound (no blank line in time)."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One SSE frame. `data` joins the frame's `data:` lines with `\\n`; `has_data` is False for
    comment-only / empty frames (which a consumer should skip but a pass-through may forward)."""

    event: str | None
    data: str
    raw: bytes
    id: str | None = None
    has_data: bool = True
    # `json()`'s result (or its decode error), so the commit scanner, the usage and tool-call
    # checks and a translator decode a frame once between them.
    _parsed: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def is_done(self) -> bool:
        """True for the Chat Completions `data: [DONE]` sentinel."""
        return self.has_data and self.data.strip() == DONE_DATA

    def json(self) -> Any:
        """The `data` payload decoded as JSON; raises `ValueError` when it is not JSON. Decoded
        once and shared by every caller: treat the result as read-only."""
        parsed = self._parsed
        if parsed is None:
            try:
                parsed = (json.loads(self.data),)
            except ValueError as exc:
                parsed = exc
            object.__setattr__(self, "_parsed", parsed)  # a cache, not a change of value
        if isinstance(parsed, ValueError):
            raise parsed.with_traceback(None)
        return parsed[0]


class SSEParser:
    """Incremental SSE parser over byte chunks; bounded by `max_frame_bytes` per frame.

    `feed(chunk)` returns the frames completed by that chunk. `finish()` is called once at end of
    stream: it returns a trailing frame that lacked its final blank line (lenient, so a body
    ending in `data: [DONE]\\n` is still seen) and resets nothing else. An over-long frame raises
    `SSEFrameTooLarge`.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._frame_start = 0  # offset of the current frame in _buf
        self._line_start = 0  # offset of the current (incomplete) line
        self._scan_from = 0  # where to resume looking for a line terminator
        self._started = False  # BOM check done
        self._event: str | None = None
        self._id: str | None = None
        self._data: list[str] = []
        self._has_data = False

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the current incomplete frame."""
        return len(self._buf) - self._frame_start

    def take_pending(self) -> bytes | None:
        """Hand the bytes of the incomplete frame to another reader and forget them (the parser
        is then at a frame boundary, as after a blank line). None, and nothing changes, when
        they cannot be read apart from this parser: a CR (maybe half a CRLF) or the stream's
        BOM in them."""
        rest = bytes(self._buf[self._frame_start :])
        if b"\r" in rest or (
            self._frame_start == 0 and self._line_start > 0 and rest.startswith(_BOM)
        ):
            return None
        self._buf.clear()
        self._frame_start = self._line_start = self._scan_from = 0
        self._reset_fields()
        return rest

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add bytes and return every frame they complete, in order."""
        if not chunk:
            return []
        self._buf += chunk
        if not self._started:
            if len(self._buf) < len(_BOM) and _BOM.startswith(bytes(self._buf)):
                return []
            self._started = True
            if self._buf.startswith(_BOM):
                self._line_start = self._scan_from = len(_BOM)
        out = self._scan(final=False)
        self._compact()
        if self.pending_bytes > self._max:
            raise SSEFrameTooLarge(
                f"SSE frame exceeds {self._max} bytes without a terminating blank line"
            )
        return out

    def finish(self) -> list[SSEEvent]:
        """End of stream: flush a final unterminated line/frame (if it carries any field)."""
        self._started = True
        out = self._scan(final=True)
        if self._line_start < len(self._buf):
            self._field(bytes(self._buf[self._line_start :]))
            self._line_start = len(self._buf)
        if self._frame_start < len(self._buf) and (self._has_data or self._event is not None):
            out.append(self._emit(len(self._buf)))
        self._buf.clear()
        self._frame_start = self._line_start = self._scan_from = 0
        self._reset_fields()
        return out

    def _scan(self, *, final: bool) -> list[SSEEvent]:
        buf = self._buf
        out: list[SSEEvent] = []
        pos = self._scan_from
        nl = buf.find(b"\n", pos)
        cr = buf.find(b"\r", pos)
        while True:
            if nl != -1 and nl < pos:
                nl = buf.find(b"\n", pos)
            if cr != -1 and cr < pos:
                cr = buf.find(b"\r", pos)
            if nl == -1 and cr == -1:
                pos = len(buf)
                break
            if cr != -1 and (nl == -1 or cr < nl):
                if cr + 1 == len(buf) and not final:
                    # A lone trailing CR may be the first half of CRLF: decide on the next chunk.
                    pos = cr
                    break
                end = cr + 2 if nl == cr + 1 else cr + 1
                line_end = cr
            else:
                end = nl + 1
                line_end = nl
            line = bytes(buf[self._line_start : line_end])
            self._line_start = pos = end
            if line:
                self._field(line)
            else:
                out.append(self._emit(end))
        self._scan_from = pos
        return out

    def _field(self, line: bytes) -> None:
        if line.startswith(b":"):
            return
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        text = value.decode("utf-8", errors="replace")
        if name == b"data":
            self._data.append(text)
            self._has_data = True
        elif name == b"event":
            self._event = text or None
        elif name == b"id" and "\x00" not in text:
            self._id = text

    def _emit(self, end: int) -> SSEEvent:
        ev = SSEEvent(
            event=self._event,
            data="\n".join(self._data),
            raw=bytes(self._buf[self._frame_start : end]),
            id=self._id,
            has_data=self._has_data,
        )
        self._frame_start = end
        self._reset_fields()
        return ev

    def _reset_fields(self) -> None:
        self._event = None
        self._id = None
        self._data = []
        self._has_data = False

    def _compact(self) -> None:
        # Drop emitted frames once per feed so deletion stays linear in the input size.
        cut = self._frame_start
        if cut:
            del self._buf[:cut]
            self._frame_start = 0
            self._line_start -= cut
            self._scan_from -= cut


def encode_event(event: str | None, data: str) -> bytes:
    """Encode one SSE frame: optional `event:` line, one `data:` line per line of `data`."""
    parts: list[str] = []
    if event:
        parts.append(f"event: {event}\n")
    for line in data.split("\n"):
        parts.append(f"data: {line}\n")
    parts.append("\n")
    return "".join(parts).encode("utf-8")


def dumps(obj: Any) -> str:
    """Compact JSON as used on the wire (no spaces, UTF-8 kept as is)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def encode_json_event(event: str | None, payload: Any) -> bytes:
    """Encode `payload` as compact one-line JSON in an SSE frame."""
    return encode_event(event, dumps(payload))
