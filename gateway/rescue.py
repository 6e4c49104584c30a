"""After-commit rescue on the wire: the client-side stream of a combo's `afterCommit` policy.

The decisions are `routing.rescue`'s; this module holds the responders an attempt writes its
client bytes (already in the client's protocol, Chat or Responses) to:

- `ContinueResponder` passes the first attempt through while it watches the text, and holds
  back the explicit error a broken stream ends with, so a continuation can take over.
- `Splicer` writes a continuation into the same client stream: one answer, one terminal, the
  ids, output indexes and sequence numbers of the first attempt, the usage of both.
- `BufferResponder` holds a whole answer back until it is complete (`afterCommit: "buffer"`).

`Rescue.dispatch` wraps the gateway's dispatch for the attempt loop. With the default policy
("error") none of this runs: the proxy's hot path is unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway import buffer_budget
from gateway.buffer_budget import BufferBudget
from providers.upstream import SSE_HEADERS
from providers.wire.sse import SSEEvent, SSEParser, encode_json_event
from providers.wire.usage import Usage
from routing.attempts import AttemptRecord, Outcome, RouteResult
from routing.classify import Failure, classify
from routing.rescue import continuation_body, continuation_targets, is_break, prefill_for, seam
from routing.types import ComboSpec, ProviderSpec, TargetSpec
from server import metrics

log = logging.getLogger("ocx.proxy")

Inbound = Literal["responses", "chat"]
# Responses lifecycle events a continuation's own start sends: the client already had them.
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_FAILURES = frozenset({"response.failed", "error"})
# A comment that keeps a buffered stream's connection open (clients and proxies ignore it).
KEEPALIVE_FRAME = b": ocx buffering the answer\n\n"


def add_usage(first: Usage | None, second: Usage | None) -> Usage | None:
    """Two attempts' usage summed field by field (a field neither reported stays unknown)."""
    if first is None or second is None:
        return first or second

    def plus(a: int | None, b: int | None) -> int | None:
        return None if a is None and b is None else (a or 0) + (b or 0)

    return Usage(
        plus(first.input, second.input),
        plus(first.output, second.output),
        plus(first.cached, second.cached),
        plus(first.reasoning, second.reasoning),
        first.bad or second.bad,
    )


class Exchange(Protocol):
    """What of `gateway.exchange.Exchange` the rescue uses."""

    started: bool
    upstream_done: bool

    async def commit(
        self, status: int, headers: list[tuple[bytes, bytes]], target: TargetSpec
    ) -> None: ...

    async def write(self, data: bytes) -> None: ...


@dataclass
class _Item:
    id: str
    index: int
    content_index: int = 0
    open: bool = True


@dataclass
class ClientStream:
    """What the client has received so far, read from its own protocol's frames."""

    inbound: Inbound
    text: str = ""
    # False once anything but assistant text started (a tool or function call, reasoning, a
    # refusal): such an answer is never continued.
    text_only: bool = True
    finished: bool = False
    # Responses
    response_id: str | None = None
    seq: int | None = None
    message: _Item | None = None  # the assistant message item still open, if any
    items: dict[int, Any] = field(default_factory=dict)  # output_index -> done item
    item_text: dict[int, str] = field(default_factory=dict)
    last_index: int = -1
    # Chat
    chat_id: str | None = None
    model: str | None = None
    created: Any = None

    def observe(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            return
        if self.inbound == "chat":
            self._observe_chat(payload)
        else:
            self._observe_responses(payload)

    def _observe_chat(self, payload: Mapping[str, Any]) -> None:
        if self.chat_id is None and isinstance(payload.get("id"), str):
            self.chat_id = payload["id"]
            self.model = payload.get("model")
            self.created = payload.get("created")
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                content = delta.get("content")
                if isinstance(content, str):
                    self.text += content
                for key in ("tool_calls", "function_call", "reasoning_content", "reasoning"):
                    if delta.get(key):
                        self.text_only = False
                if delta.get("refusal"):
                    self.text_only = False
            if choice.get("finish_reason"):
                self.finished = True

    def _observe_responses(self, payload: Mapping[str, Any]) -> None:
        seq = payload.get("sequence_number")
        if isinstance(seq, int) and not isinstance(seq, bool):
            self.seq = seq if self.seq is None else max(self.seq, seq)
        kind = payload.get("type")
        index = payload.get("output_index")
        if isinstance(index, int):
            self.last_index = max(self.last_index, index)
        if kind == "response.created" and self.response_id is None:
            response = payload.get("response")
            if isinstance(response, Mapping) and isinstance(response.get("id"), str):
                self.response_id = response["id"]
        elif kind == "response.output_item.added":
            item = payload.get("item")
            if isinstance(item, Mapping) and item.get("type") == "message":
                if isinstance(index, int):
                    self.message = _Item(str(item.get("id", "")), index)
            else:
                self.text_only = False
        elif kind == "response.content_part.added":
            part = payload.get("part")
            if isinstance(part, Mapping) and part.get("type") != "output_text":
                self.text_only = False
            if self.message is not None and index == self.message.index:
                content = payload.get("content_index")
                self.message.content_index = content if isinstance(content, int) else 0
        elif kind == "response.output_text.delta":
            delta = payload.get("delta")
            if isinstance(delta, str) and isinstance(index, int):
                self.text += delta
                self.item_text[index] = self.item_text.get(index, "") + delta
        elif kind == "response.output_item.done":
            if isinstance(index, int):
                self.items[index] = payload.get("item")
                if self.message is not None and self.message.index == index:
                    self.message.open = False
        elif kind in ("response.completed", "response.incomplete"):
            self.finished = True


def _frames(parser: SSEParser, data: bytes) -> list[SSEEvent]:
    return list(parser.feed(data))


def _payload(event: SSEEvent) -> Any:
    if not event.has_data or event.is_done:
        return None
    try:
        return event.json()
    except ValueError:
        return None


def _is_failure(inbound: Inbound, payload: Any) -> bool:
    if not isinstance(payload, Mapping):
        return False
    if inbound == "chat":
        return payload.get("error") is not None and "choices" not in payload
    return payload.get("type") in _FAILURES


class ContinueResponder:
    """The first attempt of a "continue" combo: everything passes through at once, except the
    failure frame a broken stream ends with (and anything after it), held until the rescue
    decides (`release` sends it as it was)."""

    def __init__(self, exchange: Exchange, inbound: Inbound) -> None:
        self._exchange = exchange
        self.stream = ClientStream(inbound)
        self._parser = SSEParser()
        self.held: list[bytes] = []

    async def commit(
        self, status: int, headers: list[tuple[bytes, bytes]], target: TargetSpec
    ) -> None:
        await self._exchange.commit(status, headers, target)

    async def write(self, data: bytes) -> None:
        out: list[bytes] = []
        for event in _frames(self._parser, data):
            payload = _payload(event)
            if self.held or _is_failure(self.stream.inbound, payload):
                self.held.append(event.raw)
                continue
            self.stream.observe(payload)
            out.append(event.raw)
        if out:
            await self._exchange.write(b"".join(out))

    async def release(self) -> None:
        held, self.held = self.held, []
        if held:
            await self._exchange.write(b"".join(held))


class Splicer:
    """A continuation's client bytes rewritten into the first attempt's stream: its own start
    dropped, its text joined to the open message (ids, indexes and sequence numbers of the
    first attempt), its terminal carrying the whole output and both attempts' usage. A failure
    frame is held, like `ContinueResponder`'s."""

    def __init__(
        self, exchange: Exchange, stream: ClientStream, trailing: str, prior: Usage | None
    ) -> None:
        self._exchange = exchange
        self.stream = stream
        self._parser = SSEParser()
        self._pending = trailing  # whitespace the client has and the prefill did not carry
        self._prior = prior
        self._index: dict[int, int] = {}  # the continuation's output_index -> the client's
        self._merged: int | None = None  # the continuation index joined to the open message
        self.held: list[bytes] = []
        self.committed = False

    async def commit(
        self, status: int, headers: list[tuple[bytes, bytes]], target: TargetSpec
    ) -> None:
        self.committed = True  # the client's status line went out with the first attempt

    async def write(self, data: bytes) -> None:
        out: list[bytes] = []
        for event in _frames(self._parser, data):
            payload = _payload(event)
            if self.held or _is_failure(self.stream.inbound, payload):
                self.held.append(event.raw)
                continue
            if payload is None:
                if event.is_done:
                    out.append(event.raw)
                continue  # comments and keep-alives of the continuation
            frame = self._chat(payload) if self.stream.inbound == "chat" else self._resp(payload)
            if frame is not None:
                out.append(frame)
        if out:
            await self._exchange.write(b"".join(out))

    def _text(self, piece: str) -> str:
        if not self._pending:
            return piece
        piece, self._pending = seam(piece, self._pending)
        return piece

    def _chat(self, payload: dict[str, Any]) -> bytes | None:
        s = self.stream
        payload = dict(payload)
        for key, value in (("id", s.chat_id), ("model", s.model), ("created", s.created)):
            if value is not None and key in payload:
                payload[key] = value
        choices = payload.get("choices")
        if isinstance(choices, list):
            kept = []
            for choice in choices:
                if not isinstance(choice, Mapping):
                    kept.append(choice)
                    continue
                choice = dict(choice)
                delta = choice.get("delta")
                if isinstance(delta, Mapping):
                    delta = {k: v for k, v in delta.items() if k != "role"}
                    if isinstance(delta.get("content"), str):
                        delta["content"] = self._text(delta["content"])
                        if not delta["content"]:
                            del delta["content"]
                    choice["delta"] = delta
                    if not delta and not choice.get("finish_reason"):
                        continue  # nothing left of it: the role chunk, a trimmed seam
                kept.append(choice)
            if not kept and "usage" not in payload:
                return None
            payload["choices"] = kept
        usage = payload.get("usage")
        if isinstance(usage, Mapping) and self._prior is not None:
            payload["usage"] = _chat_usage_plus(usage, self._prior)
        s.observe(payload)
        return encode_json_event(None, payload)

    def _resp(self, payload: dict[str, Any]) -> bytes | None:
        s = self.stream
        kind = payload.get("type")
        if kind in _LIFECYCLE:
            return None
        payload = dict(payload)
        index = payload.get("output_index")
        if kind == "response.output_item.added" and isinstance(index, int):
            item = payload.get("item")
            message = s.message
            if (
                isinstance(item, Mapping)
                and item.get("type") == "message"
                and message is not None
                and message.open
                and self._merged is None
            ):
                self._merged = index  # the continuation writes on into the open message
                self._index[index] = message.index
                return None
            self._index[index] = s.last_index + 1
        merged = isinstance(index, int) and index == self._merged
        if kind == "response.content_part.added" and merged:
            return None
        if isinstance(index, int):
            payload["output_index"] = self._index.get(index, index)
        if merged:
            assert s.message is not None
            if "item_id" in payload:
                payload["item_id"] = s.message.id
            if "content_index" in payload:
                payload["content_index"] = s.message.content_index
            full = s.item_text.get(s.message.index, "")
            if kind == "response.output_text.delta" and isinstance(payload.get("delta"), str):
                payload["delta"] = self._text(payload["delta"])
                if not payload["delta"]:
                    return None
            elif kind == "response.output_text.done":
                payload["text"] = full
            elif kind == "response.content_part.done" and isinstance(payload.get("part"), Mapping):
                payload["part"] = {**payload["part"], "text": full}
            elif kind == "response.output_item.done" and isinstance(payload.get("item"), Mapping):
                payload["item"] = _message_with(payload["item"], s.message.id, full)
        if kind in ("response.completed", "response.incomplete"):
            payload["response"] = self._final(payload.get("response"))
        if "sequence_number" in payload and s.seq is not None:
            payload["sequence_number"] = s.seq + 1
        s.observe(payload)
        return encode_json_event(str(kind) if isinstance(kind, str) else None, payload)

    def _final(self, response: Any) -> Any:
        if not isinstance(response, Mapping):
            return response
        s = self.stream
        response = dict(response)
        if s.response_id is not None:
            response["id"] = s.response_id
        response["output"] = [s.items[i] for i in sorted(s.items)]
        usage = response.get("usage")
        if isinstance(usage, Mapping) and self._prior is not None:
            response["usage"] = _responses_usage_plus(usage, self._prior)
        return response


def _message_with(item: Mapping[str, Any], item_id: str, text: str) -> dict[str, Any]:
    out = {**item, "id": item_id}
    content = item.get("content")
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, Mapping)]
        texts = [p for p in parts if p.get("type") == "output_text"]
        if texts:
            rest = [p for p in parts if p.get("type") != "output_text"]
            out["content"] = [{**texts[0], "text": text}, *rest]
    return out


def _plus(value: Any, extra: int | None) -> Any:
    if extra is None or not isinstance(value, int) or isinstance(value, bool):
        return value
    return value + extra


def _chat_usage_plus(usage: Mapping[str, Any], prior: Usage) -> dict[str, Any]:
    out = dict(usage)
    out["prompt_tokens"] = _plus(usage.get("prompt_tokens"), prior.input)
    out["completion_tokens"] = _plus(usage.get("completion_tokens"), prior.output)
    out["total_tokens"] = _plus(usage.get("total_tokens"), (prior.input or 0) + (prior.output or 0))
    return out


def _responses_usage_plus(usage: Mapping[str, Any], prior: Usage) -> dict[str, Any]:
    out = dict(usage)
    out["input_tokens"] = _plus(usage.get("input_tokens"), prior.input)
    out["output_tokens"] = _plus(usage.get("output_tokens"), prior.output)
    out["total_tokens"] = _plus(usage.get("total_tokens"), (prior.input or 0) + (prior.output or 0))
    return out


class BufferOverflow(Exception):
    """A buffered answer grew past the combo's `bufferMaxBytes`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"The answer exceeded the combo's bufferMaxBytes ({limit} bytes)")
        self.limit = limit


class BufferBudgetExhausted(BufferOverflow):
    """Holding more would pass the worker's budget for all buffered answers (issue #43)."""

    def __init__(self, limit: int) -> None:
        Exception.__init__(
            self, f"The answers buffered in this worker reached OCX_BUFFER_BUDGET_BYTES ({limit})"
        )
        self.limit = limit


class BufferResponder:
    """Holds one attempt's whole answer (status, headers, bytes) until `flush`; what it holds
    is taken from the worker's `budget` and given back by `release`."""

    def __init__(self, limit: int, budget: BufferBudget | None = None) -> None:
        self._limit = limit
        self._size = 0
        self._budget = budget
        self.chunks: list[bytes] = []
        self.head: tuple[int, list[tuple[bytes, bytes]], TargetSpec] | None = None

    def release(self) -> None:
        if self._budget is not None:
            self._budget.give(self._size)
            self._size = 0

    async def commit(
        self, status: int, headers: list[tuple[bytes, bytes]], target: TargetSpec
    ) -> None:
        self.head = (status, headers, target)

    async def write(self, data: bytes) -> None:
        if self._size + len(data) > self._limit:
            raise BufferOverflow(self._limit)
        if self._budget is not None and not self._budget.take(len(data)):
            metrics.BUFFER_BUDGET_EXCEEDED.inc()
            raise BufferBudgetExhausted(self._budget.limit)
        self._size += len(data)
        self.chunks.append(data)


Dispatch = Callable[..., Awaitable[Outcome]]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Role:
    """A request-log note on one attempt of the route trace: its role and why."""

    role: str
    detail: str = ""


class Rescue:
    """One streaming request's after-commit policy around the gateway's `dispatch`.

    `dispatch(target, last, *, body=None, responder=None)` runs one upstream attempt (the
    gateway's, with its quota and metrics bookkeeping). `eligible(target)` says whether a target
    may be asked now (credential, cooldown, request-local predicate)."""

    def __init__(
        self,
        *,
        combo: ComboSpec,
        providers: Mapping[str, ProviderSpec],
        inbound: Inbound,
        request: Mapping[str, Any],
        exchange: Exchange,
        dispatch: Dispatch,
        eligible: Callable[[TargetSpec], Awaitable[bool]],
        keepalive_s: float = 10.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.combo = combo
        self.providers = providers
        self.inbound = inbound
        self.request = request
        self.exchange = exchange
        self._dispatch = dispatch
        self._eligible = eligible
        self._keepalive_s = keepalive_s
        self._sleep = sleep
        # Records that follow the attempt loop's (continuations), and roles by attempt number.
        self.extra: list[AttemptRecord] = []
        self.roles: dict[int, Role] = {}
        self._calls = 0  # attempt loop dispatches so far
        self.continued = False
        self.usage: Usage | None = None
        self.attempted: list[str] = []
        self._keepalive: asyncio.Task[None] | None = None
        self._current: TargetSpec | None = None

    async def dispatch(self, target: TargetSpec, last: bool) -> Outcome:
        self._calls += 1
        self.attempted.append(target.key)
        if self.combo.after_commit == "buffer":
            return await self._buffered(target, last)
        return await self._continuing(target, last)

    # -- continue ---------------------------------------------------------------------------

    async def _continuing(self, target: TargetSpec, last: bool) -> Outcome:
        first = ContinueResponder(self.exchange, self.inbound)
        outcome = await self._dispatch(target, last, responder=first)
        stream = first.stream
        if not (
            outcome.committed
            and is_break(outcome.failure)
            and stream.text_only
            and stream.text.strip()
            and not stream.finished
        ):
            if outcome.committed and outcome.failure is not None and first.held:
                why = "tool call started" if not stream.text_only else "not a break"
                self.roles[self._calls] = Role("not_continued", why)
            await first.release()
            return outcome
        held = first.held
        usage = outcome.usage
        broken = target.key
        self.exchange.upstream_done = False  # the client's disconnect cancels again
        for _ in range(self.combo.max_continuations):
            candidates = [
                t
                for t in continuation_targets(
                    self.combo, self.providers, broken=broken, attempted=self.attempted
                )
                if await self._eligible(t)
            ]
            if not candidates:
                self.roles[self._calls] = Role("not_continued", "no prefill-capable target")
                break
            nxt = candidates[0]
            prefill = prefill_for(stream.text)
            splicer = Splicer(self.exchange, stream, prefill.trailing, usage)
            body = continuation_body(self.request, self.inbound, prefill.text)
            started = time.monotonic()
            again = await self._dispatch(nxt, False, body=body, responder=splicer)
            ms = int((time.monotonic() - started) * 1000)
            self.attempted.append(nxt.key)
            if again.committed:
                usage = add_usage(usage, again.usage)
            if again.committed and again.failure is None:
                self.extra.append(
                    AttemptRecord(nxt.key, again.status, "continuation", "", None, ms)
                )
                self.continued = True
                self.usage = usage
                self.exchange.upstream_done = True
                return outcome
            failure = again.failure
            reason = "" if failure is None else classify(failure).reason
            if not again.committed:
                # Refused before output (e.g. 400 invalid_prefill): the client gets the error of
                # the original break, never the refusal.
                status = None if failure is None else failure.status
                self.extra.append(
                    AttemptRecord(nxt.key, status, "continuation_refused", reason, None, ms)
                )
                continue
            self.extra.append(
                AttemptRecord(nxt.key, again.status, "continuation_failed", reason, None, ms)
            )
            if not (splicer.held and is_break(failure) and stream.text_only):
                held = splicer.held or held
                break
            held, broken = splicer.held, nxt.key
        self.usage = usage
        self.exchange.upstream_done = True
        if held:
            await self.exchange.write(b"".join(held))
        return dataclasses.replace(outcome, usage=usage)

    # -- buffer -----------------------------------------------------------------------------

    async def _buffered(self, target: TargetSpec, last: bool) -> Outcome:
        self._current = target
        if self._keepalive is None:
            self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())
        held = BufferResponder(self.combo.buffer_max_bytes, buffer_budget.budget())
        try:
            return await self._buffered_attempt(target, last, held)
        finally:
            held.release()

    async def _buffered_attempt(
        self, target: TargetSpec, last: bool, held: BufferResponder
    ) -> Outcome:
        outcome = await self._dispatch(target, last, responder=held)
        if outcome.committed and outcome.failure is None:
            await self._stop_keepalive()
            assert held.head is not None
            status, headers, served = held.head
            if not self.exchange.started:
                await self.exchange.commit(status, headers, served)
            await self.exchange.write(b"".join(held.chunks))
            return outcome
        if not outcome.committed:
            return outcome
        # Broke before it was complete: the client saw nothing of it, so this is a failure
        # before commit, and the attempt loop moves on as it would for one.
        self.exchange.upstream_done = False
        self.roles[self._calls] = Role("restart", "answer broke while buffered")
        failure = outcome.failure or Failure(transport="reset", message="stream broke")
        return Outcome(
            False,
            failure,
            status=outcome.status,
            usage=outcome.usage,
            cool=outcome.cool,
            malformed=outcome.malformed,
        )

    async def _keep_alive(self) -> None:
        while True:
            await self._sleep(self._keepalive_s)
            exchange = self.exchange
            if not exchange.started:
                assert self._current is not None
                await exchange.commit(200, list(SSE_HEADERS), self._current)
            await exchange.write(KEEPALIVE_FRAME)

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # noqa: BLE001 - must not hide the error being handled
                # The client went away while a keep-alive was written: what follows finds out
                # on its own write.
                log.info("buffer keep-alive failed: %s", exc)

    async def close(self) -> None:
        await self._stop_keepalive()

    # -- the route trace --------------------------------------------------------------------

    def apply(self, result: RouteResult) -> None:
        """Fold the rescue into the attempt loop's result: a continued break is no failure
        after commit, its usage is both attempts', the continuations follow in the trace."""
        if self.continued:
            result.failed_after_commit = False
            result.failure = None
            result.attempts = [
                dataclasses.replace(r, outcome="continued")
                if r.outcome == "failed_after_commit"
                else r
                for r in result.attempts
            ]
        if self.usage is not None:
            result.usage = self.usage
        result.attempts.extend(self.extra)

    def role_of(self, index: int) -> Role | None:
        """The role of the attempt loop's `index`-th record (0-based), if the rescue gave one."""
        return self.roles.get(index + 1)
