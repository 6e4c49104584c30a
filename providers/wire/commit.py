"""Pre-output buffering and the streaming commit rule (behaviour reference §4, PRODUCT §5.4).

A `CommitScanner` is fed the raw byte chunks of one upstream SSE attempt. While nothing visible
has been produced it keeps the chunks (bounded: 4 MiB and 4096 chunks) and answers `BUFFERING`;
the first output commits (`COMMITTED`: replay `buffered()` then stream the rest through); a
retryable zero-output terminal (`response.failed`, `response.incomplete` with an EOF-like reason,
a bare `error` event, a Chat chunk with an `error` object) answers `FAILED` with a
`StreamFailure` for the attempt loop to classify (hop or stop). After commit the scanner keeps
watching the same stream so `end_state()` tells a clean end from an upstream failure or a
truncation; `terminal_error_frame()` gives the explicit terminal error to send in the latter case.

A stream is judged by its content (PRODUCT §5.4): once its terminal signal is seen (Chat
`finish_reason`, `response.completed`/`incomplete`, `message_stop`), a missing `[DONE]`, a cut
or a stall after it does not make it a truncation (`terminal_seen`). A frame whose data is not
JSON is `MALFORMED`: neither output nor terminal, so it never commits on its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from providers.wire.sse import SSEEvent, SSEFrameTooLarge, SSEParser, encode_json_event

WireProtocol = Literal["responses", "chat", "anthropic"]

MAX_BUFFER_BYTES = 4 * 1024 * 1024
MAX_BUFFER_CHUNKS = math.ceil(MAX_BUFFER_BYTES / 1024)

RESPONSES_CONTROL_EVENTS = frozenset(
    {"response.created", "response.in_progress", "response.queued", "response.heartbeat"}
)
RESPONSES_TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.incomplete"}
)
# `response.incomplete` reasons that mean "the upstream broke", not "the model stopped".
RETRYABLE_INCOMPLETE_REASONS = frozenset(
    {None, "adapter_eof", "missing_terminal_event", "upstream_stall_timeout"}
)

DEFAULT_PRE_OUTPUT_ERROR: Mapping[str, str] = {
    "type": "upstream_error",
    "code": "upstream_server_error",
    "message": "Provider stream failed before producing output",
}

# Status for an error that carries no HTTP status of its own (reference §4, newest behaviour).
_CODE_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "context_length_exceeded": 400,
    "invalid_prompt": 400,
    "cyber_policy": 400,
    "invalid_api_key": 401,
    "authentication_error": 401,
    "payment_required": 402,
    "permission_denied": 403,
    "permission_error": 403,
    "subscription_required": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "request_too_large": 413,
    "rate_limit_exceeded": 429,
    "rate_limit_error": 429,
    "insufficient_quota": 429,
    "usage_limit_reached": 429,
    "api_error": 500,
    "server_error": 500,
    "upstream_server_error": 502,
    "server_is_overloaded": 503,
    "slow_down": 503,
    "overloaded_error": 529,
}


class Phase(Enum):
    BUFFERING = "buffering"
    COMMITTED = "committed"
    FAILED = "failed"


class EndState(Enum):
    """How a (committed) stream ended."""

    OPEN = "open"  # no terminal seen and not finished yet
    COMPLETED = "completed"  # Responses `response.completed`; Chat `[DONE]` after a finish_reason
    FAILED = "failed"  # the upstream sent its own failure terminal (already forwarded as is)
    INCOMPLETE = "incomplete"  # Responses `response.incomplete` (the client saw it as is)
    TRUNCATED = "truncated"  # ended without a terminal: the proxy must send terminal_error_frame


@dataclass(frozen=True, slots=True)
class StreamFailure:
    """A stream failure for the attempt loop: `status` is the HTTP status to classify with,
    `error` the OpenAI-shaped error object, `usage` any usage the terminal reported."""

    status: int
    type: str
    code: str
    message: str
    error: Mapping[str, Any] = field(default_factory=dict)
    usage: Mapping[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        """The failure body of reference §4: `{"error": …, "response": {"error", "usage"?}}`."""
        err = dict(self.error) or {"type": self.type, "code": self.code, "message": self.message}
        response: dict[str, Any] = {"error": err}
        if self.usage is not None:
            response["usage"] = dict(self.usage)
        return {"error": err, "response": response}


@dataclass(frozen=True, slots=True)
class Decision:
    """The scanner's answer for one chunk: the phase after it, why, the failure (FAILED only),
    and the frames completed by the chunk (for callers that translate rather than pass through;
    after `forward_raw()`, a run of plain output frames is one data-less frame)."""

    phase: Phase
    reason: str
    failure: StreamFailure | None = None
    events: tuple[SSEEvent, ...] = ()


class EventClass(Enum):
    NEUTRAL = "neutral"  # no data (comment, keep-alive) or a sentinel with no meaning pre-output
    CONTROL = "control"  # replayable lifecycle event
    OUTPUT = "output"  # commits
    COMPLETED = "completed"  # clean terminal (commits, the stream is done)
    INCOMPLETE = "incomplete"  # non-retryable response.incomplete (commits)
    FINISH = "finish"  # Chat chunk carrying a finish_reason without content
    DONE = "done"  # Chat `[DONE]`
    FAILURE = "failure"  # failure terminal / error event
    # Data that is not JSON: neither output nor a terminal. A pass-through stream forwards it
    # as received (held with the buffer before commit); a translated stream stops on it.
    MALFORMED = "malformed"


def _status_from(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 100 <= value <= 599:
        return value
    if isinstance(value, str) and len(value) == 3 and value.isdigit() and 400 <= int(value) <= 599:
        return int(value)
    return None


def _explicit_status(*objs: Any) -> int | None:
    for obj in objs:
        if isinstance(obj, Mapping):
            for key in ("status", "status_code", "http_status"):
                status = _status_from(obj.get(key))
                if status is not None:
                    return status
    return None


def failure_from_error(
    error: Any,
    *,
    status: int | None = None,
    usage: Mapping[str, Any] | None = None,
    default_status: int = 502,
) -> StreamFailure:
    """Build a `StreamFailure` from an upstream error object (or string). The status is
    `status` if given, else the error's own `status`/`status_code`/`http_status`, else derived
    from its code/type (e.g. `server_is_overloaded` → 503), else `default_status`."""
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, Mapping) or not error:
        error = dict(DEFAULT_PRE_OUTPUT_ERROR)
    code = error.get("code")
    etype = error.get("type")
    code_s = str(code) if code is not None else ""
    type_s = str(etype) if isinstance(etype, str) else ""
    message = error.get("message")
    message_s = message if isinstance(message, str) else json.dumps(message)
    if status is None:
        status = _explicit_status(error)
    if status is None and not isinstance(code, bool) and isinstance(code, int | str):
        # OpenRouter-style gateways put the HTTP status in `error.code`.
        status = _status_from(code if isinstance(code, int) and code >= 400 else str(code))
    if status is None:
        status = _CODE_STATUS.get(code_s.lower()) or _CODE_STATUS.get(type_s.lower())
    return StreamFailure(
        status=status or default_status,
        type=type_s or "upstream_error",
        code=code_s or type_s or "upstream_error",
        message=message_s if message is not None else "",
        error=dict(error),
        usage=usage,
    )


def truncation_failure(reason: str = "stream ended before completion") -> StreamFailure:
    """The failure to report when an upstream stream ends, stalls or breaks without a terminal."""
    return StreamFailure(
        status=502,
        type="upstream_error",
        code="upstream_stream_truncated",
        message=f"Upstream {reason}",
    )


def _chat_delta_has_output(delta: Any) -> bool:
    if not isinstance(delta, Mapping):
        return False
    for key in ("content", "reasoning_content", "reasoning", "refusal"):
        value = delta.get(key)
        if value:
            return True
    return bool(delta.get("tool_calls")) or bool(delta.get("function_call"))


def classify_payload(protocol: WireProtocol, event: SSEEvent) -> EventClass:
    """Classify one parsed SSE frame for the commit rule of `protocol`."""
    if not event.has_data:
        return EventClass.NEUTRAL
    if event.is_done:
        return EventClass.DONE if protocol == "chat" else EventClass.NEUTRAL
    try:
        payload = event.json()
    except ValueError:
        return EventClass.MALFORMED
    if not isinstance(payload, dict):
        return EventClass.OUTPUT
    if protocol == "responses":
        return _classify_responses(payload)
    return _classify_chat(payload)


def _classify_responses(payload: Mapping[str, Any]) -> EventClass:
    etype = payload.get("type")
    if not isinstance(etype, str):
        return EventClass.OUTPUT
    if etype == "response.created":
        response = payload.get("response")
        output = response.get("output") if isinstance(response, Mapping) else None
        return EventClass.OUTPUT if output else EventClass.CONTROL
    if etype in RESPONSES_CONTROL_EVENTS:
        return EventClass.CONTROL
    if etype == "response.completed":
        return EventClass.COMPLETED
    if etype in ("response.failed", "error"):
        return EventClass.FAILURE
    if etype == "response.incomplete":
        response = payload.get("response")
        details = response.get("incomplete_details") if isinstance(response, Mapping) else None
        reason = details.get("reason") if isinstance(details, Mapping) else None
        if reason in RETRYABLE_INCOMPLETE_REASONS:
            return EventClass.FAILURE
        return EventClass.INCOMPLETE
    return EventClass.OUTPUT


def _classify_chat(payload: Mapping[str, Any]) -> EventClass:
    if payload.get("error") is not None or payload.get("type") == "error":
        return EventClass.FAILURE
    choices = payload.get("choices")
    if not isinstance(choices, list):
        # Usage-only chunks and vendor keep-alives carry no choices.
        return EventClass.CONTROL if "usage" in payload or "id" in payload else EventClass.OUTPUT
    finished = False
    for choice in choices:
        if not isinstance(choice, Mapping):
            return EventClass.OUTPUT
        if _chat_delta_has_output(choice.get("delta")) or _chat_delta_has_output(
            choice.get("message")
        ):
            return EventClass.OUTPUT
        if choice.get("finish_reason"):
            finished = True
    return EventClass.FINISH if finished else EventClass.CONTROL


def failure_from_payload(protocol: WireProtocol, event: SSEEvent) -> StreamFailure:
    """The `StreamFailure` for a frame classified `FAILURE` (or a retryable incomplete)."""
    try:
        payload = event.json()
    except ValueError:
        payload = {}
    if not isinstance(payload, Mapping):
        payload = {}
    response = payload.get("response")
    response = response if isinstance(response, Mapping) else {}
    usage = response.get("usage") if isinstance(response.get("usage"), Mapping) else None
    if protocol == "responses" and payload.get("type") == "response.incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        return failure_from_error(
            {
                "type": "upstream_error",
                "code": "upstream_server_error",
                "message": f"Provider stream ended incomplete ({reason or 'no reason'})",
            },
            status=_explicit_status(payload, response),
            usage=usage,
        )
    error = response.get("error") if response else None
    if error is None:
        error = payload.get("error")
    status = _explicit_status(payload, response, error)
    if error is None and payload.get("type") == "error":
        # Bare `{"type":"error","code":…,"message":…}` without a nested object.
        error = {k: v for k, v in payload.items() if k in ("code", "message", "param")}
        error["type"] = payload.get("code") or "upstream_error"
    return failure_from_error(error, status=status, usage=usage)


class _EndTracker:
    """Watches terminals to tell a clean end from a failure or truncation.

    It holds no reference back to its scanner (the failure is read by the scanner): a cycle
    would keep every stream's parsed events alive until the cyclic collector ran, which at
    64 concurrent streams held megabytes of them (bench/README.md, seventh run)."""

    def __init__(self, protocol: WireProtocol) -> None:
        self.protocol = protocol
        self.state = EndState.OPEN
        self.finish_seen = False
        self.done_seen = False
        self.failure: StreamFailure | None = None

    def observe(self, cls: EventClass, event: SSEEvent) -> bool:
        """Track one frame; True when it is the stream's failure terminal (the caller sets
        `failure` from it)."""
        if self.state in (EndState.FAILED, EndState.COMPLETED, EndState.INCOMPLETE):
            return False
        if cls is EventClass.FAILURE:
            self.state = EndState.FAILED
            return True
        if cls is EventClass.COMPLETED:
            self.state = EndState.COMPLETED
        elif cls is EventClass.INCOMPLETE:
            self.state = EndState.INCOMPLETE
        elif self.protocol == "chat":
            if cls is EventClass.FINISH or (cls is EventClass.OUTPUT and _chunk_finishes(event)):
                self.finish_seen = True
            elif cls is EventClass.DONE:
                self.done_seen = True
                self.state = EndState.COMPLETED if self.finish_seen else EndState.TRUNCATED
        return False

    def close(self, *, cut: bool = False) -> None:
        """End of stream. A Chat stream that sent its `finish_reason` is complete without the
        `[DONE]` trailer (judged by content, PRODUCT §5.4), unless the stream was `cut` (a
        runaway frame): only a stream with no terminal signal at all is truncated."""
        if self.state is EndState.OPEN:
            complete = self.protocol == "chat" and self.finish_seen and not cut
            self.state = EndState.COMPLETED if complete else EndState.TRUNCATED


def _chunk_finishes(event: SSEEvent) -> bool:
    try:
        payload = event.json()
    except ValueError:
        return False
    choices = payload.get("choices") if isinstance(payload, Mapping) else None
    return isinstance(choices, list) and any(
        isinstance(c, Mapping) and c.get("finish_reason") for c in choices
    )


_RESPONSES_TERMINAL_TYPES = frozenset(t.encode() for t in RESPONSES_TERMINAL_EVENTS)
_RESPONSES_DATA = b'data: {"type":"response.'


def _plain_output_frame(protocol: WireProtocol, frame: bytes) -> bool:
    """Whether a frame of a committed pass-through stream is a plain output delta, by byte tests
    alone: one `data:` line holding a JSON object that is not a terminal or an error, carries no
    usage and names no tool (so the end, usage and undeclared-tool checks have nothing to read
    in it). Anything else, or any doubt (another layout, `\r`, a second `type` key), is False
    and the frame is parsed."""
    if (
        not frame.endswith(b"}\n\n")
        or b'"usage"' in frame
        or b'"name"' in frame
        or b'"error"' in frame
    ):
        return False
    if protocol == "chat":
        # A content chunk: every choice still open (`"finish_reason":null`), on one line.
        return (
            frame.startswith(b"data: {")
            and frame.find(b"\n") == len(frame) - 2
            and 0 < frame.count(b'"finish_reason"') == frame.count(b'"finish_reason":null')
        )
    at = frame.find(_RESPONSES_DATA)
    if at < 0 or frame.find(b"\n", at) != len(frame) - 2 or frame.count(b'"type"') != 1:
        return False
    # Only an `event:` line may come before the data line.
    if at and not (frame.startswith(b"event:") and frame.find(b"\n") == at - 1):
        return False
    start = at + len(b'data: {"type":"')
    end = frame.find(b'"', start)
    return frame[start:end] not in _RESPONSES_TERMINAL_TYPES


class CommitScanner:
    """The per-attempt pre-commit scanner for a `responses` or `chat` SSE stream.

    Call `feed(chunk)` for each upstream chunk and act on the returned `Decision.phase`:
    `BUFFERING` → keep reading; `COMMITTED` (first time) → send `buffered()` to the client and
    pass every later chunk through (keep calling `feed` so the end is tracked); `FAILED` → cancel
    the upstream and hand `decision.failure` to the hop/stop classifier. At end of stream call
    `finish()`: before commit, a stream that ended with no output and no terminal is a failure
    (a cut connection hops, PRODUCT §5.2); after it, `end_state()` is `TRUNCATED` unless a
    terminal was seen. Buffer overflow (bytes or chunks) commits at once, without inspection.
    """

    def __init__(
        self,
        protocol: WireProtocol,
        *,
        max_bytes: int = MAX_BUFFER_BYTES,
        max_chunks: int = MAX_BUFFER_CHUNKS,
        max_frame_bytes: int = MAX_BUFFER_BYTES,
    ) -> None:
        self.protocol: WireProtocol = protocol
        self._max_bytes = max_bytes
        self._max_chunks = max_chunks
        self._parser = SSEParser(max_frame_bytes)
        self._max_frame = max_frame_bytes
        self._chunks: list[bytes] = []
        self._size = 0
        self._phase = Phase.BUFFERING
        self._failure: StreamFailure | None = None
        self._events: list[SSEEvent] = []
        self._end = _EndTracker(protocol)
        # Frames classified MALFORMED so far (counted here: every frame is decoded once).
        self.malformed = 0
        # `forward_raw()`: after commit, plain output frames are passed on without parsing.
        self._raw = False
        self._rest = b""

    def forward_raw(self) -> None:
        """The stream is passed through as received (not translated): after commit, frames that
        `_plain_output_frame` shows to be plain output deltas are not parsed, and a run of them
        comes back in `Decision.events` as one data-less frame whose `raw` holds their bytes.
        Every other frame is parsed and tracked as before; the bytes are the same."""
        self._raw = self.protocol in ("responses", "chat")

    def plain(self, chunk: bytes) -> bool:
        """Whether `chunk` of a committed pass-through is exactly one whole plain output frame
        (`_plain_output_frame`) with nothing held from an earlier chunk. Such a frame holds no
        end, usage, tool name or error, so what `feed` would do with it changes nothing: the
        caller forwards it as it came and does not `feed` it (a streamed event is usually
        one such chunk)."""
        return (
            self._raw
            and self._phase is Phase.COMMITTED
            and not self._rest
            and not self._parser.pending_bytes
            and chunk.find(b"\n\n") == len(chunk) - 2
            and b"\r" not in chunk
            and _plain_output_frame(self.protocol, chunk)
        )

    def classify(self, event: SSEEvent) -> EventClass:
        """The commit-rule class of one frame (overridden per protocol)."""
        return classify_payload(self.protocol, event)

    def failure_of(self, event: SSEEvent) -> StreamFailure:
        """The failure a FAILURE-class frame reports (overridden per protocol)."""
        return failure_from_payload(self.protocol, event)

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def failure(self) -> StreamFailure | None:
        """The pre-output failure (FAILED) or the upstream's own post-commit failure terminal."""
        return self._failure or self._end.failure

    def buffered(self) -> list[bytes]:
        """The chunks held before commit (including the committing chunk), to replay in order."""
        return list(self._chunks)

    def buffered_events(self) -> list[SSEEvent]:
        """The frames parsed from `buffered()` chunks, in order (for translated streams)."""
        return list(self._events)

    def end_state(self) -> EndState:
        return self._end.state

    @property
    def terminal_seen(self) -> bool:
        """Whether the stream sent its terminal signal (`response.completed`/`failed`/
        `incomplete`, `message_stop`, a Chat `finish_reason`): what follows (a `[DONE]`, a
        clean close, a cut) cannot make the answer incomplete."""
        end = self._end
        if end.state in (EndState.COMPLETED, EndState.FAILED, EndState.INCOMPLETE):
            return True
        return end.state is EndState.OPEN and self.protocol == "chat" and end.finish_seen

    @property
    def done_seen(self) -> bool:
        """Whether a Chat stream sent its `[DONE]` trailer (a pass-through adds it if not)."""
        return self._end.done_seen

    def feed(self, chunk: bytes) -> Decision:
        """Inspect one upstream chunk and return the phase after it."""
        if self._phase is Phase.FAILED:
            return Decision(Phase.FAILED, "failed", self._failure)
        if self._phase is Phase.COMMITTED:
            return self._after_commit(chunk)
        if self._size + len(chunk) > self._max_bytes or len(self._chunks) + 1 > self._max_chunks:
            self._chunks.append(chunk)
            self._phase = Phase.COMMITTED
            events = self._parse_and_track(chunk)
            self._events.extend(events)
            return Decision(Phase.COMMITTED, "buffer_cap", None, events)
        self._chunks.append(chunk)
        self._size += len(chunk)
        try:
            events = tuple(self._parser.feed(chunk))
        except SSEFrameTooLarge:
            self._phase = Phase.COMMITTED
            return Decision(Phase.COMMITTED, "buffer_cap")
        return self._inspect(events, "lifecycle")

    def finish(self) -> Decision:
        """End of the upstream stream (clean close, cut connection, or idle timeout)."""
        if self._rest:
            # An unterminated last frame (it holds no blank line): the parser judges it.
            self._parser.feed(self._rest)
            self._rest = b""
        try:
            events = tuple(self._parser.finish())
        except SSEFrameTooLarge:
            events = ()
        decision = self._inspect(events, "end") if events else None
        if decision is not None and decision.phase is Phase.FAILED:
            return decision
        self._end.close()
        if self._phase is Phase.BUFFERING:
            self._phase = Phase.FAILED
            self._failure = truncation_failure("stream ended before producing output")
            return Decision(Phase.FAILED, "ended_without_output", self._failure, events)
        return Decision(self._phase, self._end.state.value, self.failure, events)

    def _after_commit(self, chunk: bytes) -> Decision:
        if self._raw:
            return Decision(Phase.COMMITTED, "committed", None, self._scan_raw(chunk))
        return Decision(Phase.COMMITTED, "committed", None, self._parse_and_track(chunk))

    def _scan_raw(self, chunk: bytes) -> tuple[SSEEvent, ...]:
        """`_parse_and_track` for a pass-through stream: frame boundaries by `bytes.find`, and
        only the frames that are not plain output are parsed (by the same parser, which is at a
        frame boundary whenever it is handed a frame here)."""
        parser = self._parser
        if parser.pending_bytes:
            pending = parser.take_pending()
            if pending is None:
                self._raw = False  # an odd start: the parser keeps the stream
                return self._parse_and_track(chunk)
            self._rest = pending
        buf = self._rest + chunk if self._rest else chunk
        last = buf.rfind(b"\n\n")
        end = last + 2 if last >= 0 else 0
        if b"\r" in chunk or len(buf) - end > self._max_frame:
            # CR line ends, or a runaway frame: the parser's rules, from a frame boundary on.
            self._raw = False
            self._rest = b""
            return self._parse_and_track(buf)
        if not end:
            self._rest = buf
            return ()
        self._rest = buf[end:]
        out: list[SSEEvent] = []
        run_from = -1
        pos = 0
        while pos < end:
            stop = buf.find(b"\n\n", pos) + 2
            frame = buf if pos == 0 and stop == len(buf) else buf[pos:stop]
            if _plain_output_frame(self.protocol, frame):
                if run_from < 0:
                    run_from = pos
            else:
                if run_from >= 0:
                    out.append(_opaque(buf[run_from:pos]))
                    run_from = -1
                out.extend(self._track(tuple(parser.feed(frame))))
            pos = stop
        if run_from >= 0:
            out.append(_opaque(buf if run_from == 0 and end == len(buf) else buf[run_from:end]))
        return tuple(out)

    def _track(self, events: tuple[SSEEvent, ...]) -> tuple[SSEEvent, ...]:
        for event in events:
            cls = self.classify(event)
            if cls is EventClass.MALFORMED:
                self.malformed += 1
            if self._end.observe(cls, event):
                self._end.failure = self.failure_of(event)
        return events

    def _parse_and_track(self, chunk: bytes) -> tuple[SSEEvent, ...]:
        try:
            events = tuple(self._parser.feed(chunk))
        except SSEFrameTooLarge:
            # Post-commit a runaway frame is malformed data: the stream counts as truncated.
            self._end.close(cut=True)
            return ()
        return self._track(events)

    def _inspect(self, events: tuple[SSEEvent, ...], idle_reason: str) -> Decision:
        reason = idle_reason
        if self._phase is Phase.BUFFERING:
            self._events.extend(events)
        for event in events:
            cls = self.classify(event)
            if cls is EventClass.MALFORMED:
                self.malformed += 1
            if self._phase is Phase.BUFFERING:
                if cls is EventClass.FAILURE or (
                    cls is EventClass.DONE and not self._end.finish_seen
                ):
                    if cls is EventClass.DONE:
                        failure = truncation_failure("stream ended before producing output")
                    else:
                        failure = self.failure_of(event)
                    self._phase = Phase.FAILED
                    self._failure = failure
                    return Decision(Phase.FAILED, "pre_output_failure", failure, events)
                if cls in (
                    EventClass.OUTPUT,
                    EventClass.COMPLETED,
                    EventClass.INCOMPLETE,
                    EventClass.FINISH,
                ):
                    self._phase = Phase.COMMITTED
                    reason = "output" if cls is EventClass.OUTPUT else "terminal"
            if self._end.observe(cls, event):
                self._end.failure = self.failure_of(event)
        return Decision(self._phase, reason, None, events)


def _opaque(raw: bytes) -> SSEEvent:
    """Plain output frames forwarded as one unit: no data of their own to read."""
    return SSEEvent(event=None, data="", raw=raw, has_data=False)


def terminal_error_frame(
    protocol: WireProtocol,
    failure: StreamFailure,
    *,
    response_id: str | None = None,
    sequence_number: int | None = None,
) -> bytes:
    """The explicit terminal error to send after commit when the upstream broke: a
    `response.failed` event for Responses, an `error` data frame (and never `[DONE]`) for Chat."""
    error = {"type": failure.type, "code": failure.code, "message": failure.message}
    if protocol == "chat":
        return encode_json_event(None, {"error": error})
    payload: dict[str, Any] = {"type": "response.failed"}
    if sequence_number is not None:
        payload["sequence_number"] = sequence_number
    payload["response"] = {
        "id": response_id or "resp_ocx_failed",
        "object": "response",
        "status": "failed",
        "error": {"code": failure.code, "message": failure.message, "type": failure.type},
    }
    return encode_json_event("response.failed", payload)
