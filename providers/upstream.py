"""One upstream attempt over httpx: build the request, enforce the timeouts, apply the
streaming commit rule, translate between protocols, and report an `Outcome`.

Credentials: a provider's own key goes only to its own `baseUrl` (the URL is always built
from it); the caller's bearer goes only to `chatgpt` providers; `x-ocx-key`, cookies and
hop-by-hop headers are never forwarded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import httpx

from providers.http1 import POOL_SLOT, POOL_WAIT, Body, Http1Transport, LocalOverload
from providers.masking import NO_MASK, Masker
from providers.wire import chat
from providers.wire.commit import (
    CommitScanner,
    Decision,
    EndState,
    EventClass,
    Phase,
    StreamFailure,
    classify_payload,
    terminal_error_frame,
    truncation_failure,
)
from providers.wire.sse import DONE_FRAME, SSEEvent
from providers.wire.toolcalls import declared_tools, undeclared_at, undeclared_in_answer
from providers.wire.usage import Usage, extract_usage
from routing.attempts import Outcome
from routing.classify import FAILURE_BODY_LIMIT, Failure, failure_from_response, redact
from routing.types import ProviderSpec, TargetSpec

Protocol_ = Literal["responses", "chat", "anthropic"]
UPSTREAM_PROTOCOL: Mapping[str, Protocol_] = {
    "openai-responses": "responses",
    "chatgpt": "responses",
    "openai-chat": "chat",
    "anthropic": "anthropic",
}
PATHS: Mapping[str, str] = {
    "responses": "/responses",
    "chat": "/chat/completions",
    "anthropic": "/messages",
}
# Caller headers a `chatgpt` (caller-forward) provider receives; nothing else is forwarded.
CHATGPT_FORWARD = (
    "authorization",
    "chatgpt-account-id",
    "openai-beta",
    "originator",
    "session_id",
    "version",
    "x-codex-beta-features",
    "x-openai-subagent",
)
MAX_BODY = 64 * 1024 * 1024
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Responder(Protocol):
    """The client side of one request: `commit` sends the status line and headers once."""

    async def commit(
        self, status: int, headers: list[tuple[bytes, bytes]], target: TargetSpec
    ) -> None: ...

    async def write(self, data: bytes) -> None: ...


@dataclass(frozen=True)
class Caller:
    """What the caller sent that an upstream may need (only `chatgpt` gets `headers`)."""

    headers: Mapping[str, str]
    request_id: str
    # Masks the request's known credential values in upstream error frames (issue #26).
    masker: Masker = NO_MASK


class MissingCredential(Exception):
    pass


# Defaults when Django settings are not loaded; `OCX_UPSTREAM_MAX_CONNECTIONS` and
# `OCX_UPSTREAM_MAX_KEEPALIVE` set them, a provider's `maxConnections` overrides the first.
POOL_CONNECTIONS = 1024
# Idle connections kept per origin (until `keepalive_expiry`): with fewer than the requests in
# flight, a worker at 64 in-flight requests closed and reopened about one upstream connection in
# four (bench/README.md); beyond it a burst's extra connections close as they finish.
POOL_KEEPALIVE = 64


def pool_limits(provider: ProviderSpec) -> tuple[int, int]:
    """(connections, idle keep-alive connections) of `provider`'s pool in one worker."""
    from django.conf import settings

    default: int = getattr(settings, "OCX_UPSTREAM_MAX_CONNECTIONS", POOL_CONNECTIONS)
    connections = provider.max_connections or default
    keepalive: int = getattr(settings, "OCX_UPSTREAM_MAX_KEEPALIVE", POOL_KEEPALIVE)
    return connections, min(connections, keepalive)


@functools.cache
def _tls() -> ssl.SSLContext:
    # Every client would otherwise build its own context and load the CA bundle into it
    # (about 1 MB each); verification is the same for all.
    context = httpx.create_ssl_context()
    context.set_alpn_protocols(["http/1.1"])  # as httpcore offered: HTTP/1.1 only
    return context


class ProviderClient:
    """The HTTP client of one provider in this process: one keep-alive pool per origin.

    Requests go straight to the transport. httpx's `AsyncClient` around it added a cookie
    jar (an upstream's cookies would have been sent back on every caller's requests),
    redirect and auth handling ocx never uses, and about a tenth of a worker's CPU."""

    def __init__(self, provider: ProviderSpec) -> None:
        t = provider.timeouts
        connections, keepalive = pool_limits(provider)
        self.transport = Http1Transport(
            ssl_context=_tls(),
            max_connections=connections,
            max_keepalive=keepalive,
            keepalive_expiry=30,
        )
        # Read timeouts are the attempt's own (first byte, idle, total); see `attempt`. A wait
        # for a free connection is bounded by the first-byte window, streaming or not: past it
        # the request gets `ocx_overloaded` (a non-streaming answer's totalMs is far too long
        # to hold a caller for ocx's own pool).
        self.timeout = {
            "connect": t.connect_ms / 1000,
            "read": None,
            "write": t.total_ms / 1000,
            "pool": t.first_byte_ms / 1000,
        }
        self._urls: dict[str, httpx.URL] = {}

    def request(self, url: str, headers: Mapping[str, str], content: bytes) -> httpx.Request:
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        return httpx.Request(
            "POST", parsed, headers=headers, content=content, extensions={"timeout": self.timeout}
        )

    async def send(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.transport.aclose()


# What httpx's client sent before requests went straight to the transport: upstreams see
# the same request as before.
_BASE_HEADERS = {
    "accept": "*/*",
    "connection": "keep-alive",
    "user-agent": f"python-httpx/{httpx.__version__}",
}


def upstream_headers(
    provider: ProviderSpec, credential: str | None, caller: Caller
) -> dict[str, str]:
    headers = {**_BASE_HEADERS, "content-type": "application/json", "accept-encoding": "identity"}
    headers.update(dict(provider.headers))
    if provider.adapter == "chatgpt":
        for name in CHATGPT_FORWARD:
            value = caller.headers.get(name)
            if value is not None:
                headers[name] = value
    elif provider.adapter == "anthropic":
        if credential:
            headers["x-api-key"] = credential
        headers.setdefault("anthropic-version", "2023-06-01")
    elif credential:
        headers["authorization"] = f"Bearer {credential}"
    headers["x-request-id"] = caller.request_id
    return headers


def _now_ms() -> int:
    return int(time.time() * 1000)


def upstream_body(
    inbound: Literal["responses", "chat"], upstream: Protocol_, body: Mapping[str, Any], model: str
) -> dict[str, Any]:
    if inbound == upstream:
        out = dict(body)
        out["model"] = model
        if upstream == "chat" and out.get("stream") is True and not client_wants_usage(body):
            # Usage accounting needs the final usage chunk; it is dropped again before the
            # client sees it (`_client_frames`).
            options = out.get("stream_options")
            out["stream_options"] = {
                **(options if isinstance(options, Mapping) else {}),
                "include_usage": True,
            }
        return out
    if inbound == "responses" and upstream == "chat":
        return chat.responses_request_to_chat(body, model=model)
    if inbound == "chat" and upstream == "responses":
        return chat.chat_request_to_responses(body, model=model)
    from providers.wire import anthropic

    if inbound == "responses":
        return anthropic.responses_request_to_messages(body, model=model)
    return anthropic.chat_request_to_messages(body, model=model)


def client_wants_usage(body: Mapping[str, Any]) -> bool:
    """Whether a Chat client asked for the final usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def _is_usage_chunk(event: SSEEvent) -> bool:
    """A Chat usage-only chunk (`choices: []` plus `usage`), which a client that did not set
    `include_usage` never asked for."""
    if b'"usage"' not in event.raw:
        return False
    try:
        payload = event.json()
    except ValueError:
        return False
    return (
        isinstance(payload, Mapping)
        and payload.get("choices") == []
        and isinstance(payload.get("usage"), Mapping)
    )


def _client_events(events: tuple[SSEEvent, ...], drop_usage: bool) -> tuple[SSEEvent, ...]:
    if not drop_usage:
        return events
    return tuple(e for e in events if not _is_usage_chunk(e))


def local_failure(cause: str, message: str) -> Failure:
    """ocx's own limit stopped the attempt before the upstream was reached (`LocalOverload`):
    never the target's fault (`classify` gives a local hop that cools nothing)."""
    return Failure(transport="local", error_code=cause, message=redact(message))


def _failure_from_stream(sf: StreamFailure, event: str | None = None) -> Failure:
    return Failure(
        status=sf.status,
        error_type=sf.type,
        error_code=sf.code,
        message=redact(sf.message),
        stream_event=event,
        body=sf.body(),
    )


class _Translator(Protocol):
    def feed_event(self, event: SSEEvent) -> bytes: ...

    def close(self) -> bytes: ...

    def fail(self, failure: StreamFailure) -> bytes: ...


def _stream_translator(
    inbound: Literal["responses", "chat"],
    upstream: Protocol_,
    model: str,
    request_id: str,
    custom_tools: frozenset[str] = frozenset(),
    include_usage: bool = True,
) -> tuple[_Translator | None, bytes]:
    created = int(time.time())
    rid = "resp_" + request_id.replace("-", "")
    if inbound == upstream:
        return None, b""
    if inbound == "responses" and upstream == "chat":
        t = chat.ChatToResponsesStream(
            response_id=rid, model=model, created_at=created, custom_tools=custom_tools
        )
        return t, t.start()
    if inbound == "chat" and upstream == "responses":
        return chat.ResponsesToChatStream(
            chat_id="chatcmpl-" + request_id.replace("-", ""),
            model=model,
            created=created,
            include_usage=include_usage,
        ), b""
    from providers.wire import anthropic

    if inbound == "responses":
        a = anthropic.MessagesToResponsesStream(
            response_id=rid, model=model, created_at=created, custom_tools=custom_tools
        )
        return a, a.start()
    m = anthropic.MessagesToChatStream(
        chat_id="chatcmpl-" + request_id.replace("-", ""),
        model=model,
        created=created,
        include_usage=include_usage,
    )
    return m, b""


def _scanner(upstream: Protocol_) -> CommitScanner:
    if upstream == "anthropic":
        from providers.wire import anthropic

        return anthropic.AnthropicCommitScanner()  # type: ignore[return-value]
    return CommitScanner(upstream)


def _translate_json(
    inbound: Literal["responses", "chat"],
    upstream: Protocol_,
    data: Any,
    model: str,
    rid: str,
    custom_tools: frozenset[str] = frozenset(),
) -> Any:
    if inbound == upstream:
        return None
    created = int(time.time())
    if inbound == "responses" and upstream == "chat":
        return chat.chat_response_to_responses(
            data,
            response_id="resp_" + rid,
            created_at=created,
            model=model,
            custom_tools=custom_tools,
        )
    if inbound == "chat" and upstream == "responses":
        return chat.responses_response_to_chat(data, chat_id="chatcmpl-" + rid, model=model)
    from providers.wire import anthropic

    if inbound == "responses":
        return anthropic.messages_response_to_responses(
            data,
            response_id="resp_" + rid,
            created_at=created,
            model=model,
            custom_tools=custom_tools,
        )
    return anthropic.messages_response_to_chat(
        data, chat_id="chatcmpl-" + rid, created=created, model=model
    )


async def _read_bounded(resp: httpx.Response, limit: int, deadline_s: float) -> bytes:
    out = bytearray()
    async with asyncio.timeout(deadline_s):
        async for chunk in resp.aiter_raw():
            out += chunk
            if len(out) > limit:
                break
    return bytes(out)


async def _send_request(
    client: ProviderClient, request: httpx.Request, stream: bool, wait_ms: int
) -> httpx.Response | Outcome:
    """Send the request; its answer's status line and headers, or the failed attempt's
    `Outcome`. A stream must start within firstByteMs; a non-streaming answer arrives whole
    (headers included) when it is done, so it gets totalMs for everything (PRODUCT §3.1)."""
    wait_s = wait_ms / 1000
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(wait_s) as window:
            # Time spent waiting for ocx's own pool is not the upstream's: its window starts
            # again when a connection frees (the wait itself is bounded, `ProviderClient`).
            request.extensions[POOL_SLOT] = lambda: window.reschedule(loop.time() + wait_s)
            return await client.send(request)
    except LocalOverload as exc:
        return Outcome(False, local_failure(exc.cause, str(exc)), cool=False)
    except TimeoutError:
        if request.extensions.get(POOL_WAIT):
            # The attempt's window ended while it still waited for ocx's own pool.
            return Outcome(
                False, local_failure("pool_full", "no free upstream connection"), cool=False
            )
        kind = "timeout_first_byte" if stream else "timeout_total"
        return Outcome(False, Failure(transport=kind, message="no response"))
    except httpx.ConnectTimeout:
        return Outcome(False, Failure(transport="timeout_connect", message="connect timeout"))
    except httpx.ConnectError:
        return Outcome(False, Failure(transport="connect", message="connection failed"))
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return Outcome(False, Failure(transport="reset", message="connection reset"))
    except httpx.HTTPError as exc:
        return Outcome(False, Failure(transport="connect", message=type(exc).__name__))


async def _refused(
    resp: httpx.Response, resp_headers: Mapping[str, str], upstream: Protocol_, idle_ms: int
) -> Outcome:
    """An error status: the failed attempt, with as much of its body as classification needs."""
    try:
        raw = await _read_bounded(resp, FAILURE_BODY_LIMIT, idle_ms / 1000)
    except (TimeoutError, httpx.HTTPError):
        raw = b""
    if upstream == "anthropic":
        from providers.wire import anthropic

        raw = _anthropic_error_bytes(anthropic, resp.status_code, raw)
    return Outcome(False, failure_from_response(resp.status_code, resp_headers, raw))


async def attempt(
    *,
    client: ProviderClient,
    provider: ProviderSpec,
    target: TargetSpec,
    credential: str | None,
    inbound: Literal["responses", "chat"],
    body: Mapping[str, Any],
    stream: bool,
    caller: Caller,
    responder: Responder,
    observe: Callable[[int, Mapping[str, str]], Awaitable[None] | None] | None = None,
) -> Outcome:
    """Run one attempt against `target`. Never raises for upstream trouble: it returns an
    `Outcome`. Cancellation (client abort) propagates after closing the upstream response."""
    upstream = UPSTREAM_PROTOCOL[provider.adapter]
    out_body = upstream_body(inbound, upstream, body, target.model)
    url = provider.base_url.rstrip("/") + PATHS[upstream]
    headers = upstream_headers(provider, credential, caller)
    payload = json.dumps(out_body, separators=(",", ":"), ensure_ascii=False).encode()
    t = provider.timeouts
    request = client.request(url, headers, payload)
    started = time.monotonic()
    resp = await _send_request(client, request, stream, t.first_byte_ms if stream else t.total_ms)
    if isinstance(resp, Outcome):
        return resp
    try:
        resp_headers = {k.lower(): v for k, v in resp.headers.items()}
        if observe is not None:
            maybe = observe(resp.status_code, resp_headers)
            if maybe is not None:
                await maybe
        if resp.status_code >= 300:
            return await _refused(resp, resp_headers, upstream, t.idle_ms)
        # Freeform (`custom`) tools are sent as functions; their calls go back as
        # `custom_tool_call` items (codex-wire §3.3).
        custom = chat.custom_tool_names(body) if inbound == "responses" else frozenset()
        # The tools the upstream was offered, by the names it sees (PRODUCT §5.4).
        declared = declared_tools(upstream, out_body)
        if not stream:
            left_ms = max(1, t.total_ms - int((time.monotonic() - started) * 1000))
            return await _non_stream(
                resp, inbound, upstream, target, responder, caller, left_ms, custom, declared
            )
        return await _stream(
            resp,
            inbound,
            upstream,
            target,
            responder,
            caller,
            t.first_byte_ms,
            t.idle_ms,
            custom,
            include_usage=inbound != "chat" or client_wants_usage(body),
            declared=declared,
        )
    finally:
        await resp.aclose()


def _anthropic_error_bytes(anthropic: Any, status: int, raw: bytes) -> bytes:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    return json.dumps(anthropic.anthropic_error_to_openai(status, body)).encode()


async def _non_stream(
    resp: httpx.Response,
    inbound: Literal["responses", "chat"],
    upstream: Protocol_,
    target: TargetSpec,
    responder: Responder,
    caller: Caller,
    total_ms: int,
    custom_tools: frozenset[str] = frozenset(),
    declared: frozenset[str] | None = None,
) -> Outcome:
    try:
        raw = await _read_bounded(resp, MAX_BODY, total_ms / 1000)
    except TimeoutError:
        return Outcome(False, Failure(transport="timeout_total", message="response too slow"))
    except httpx.HTTPError:
        return Outcome(False, Failure(transport="reset", message="connection reset"))
    # A success body that is not JSON (truncated, an HTML page) is a failed attempt, never
    # passed through as an answer; checked before commit so the combo can still hop.
    try:
        data = json.loads(raw)
    except ValueError:
        return Outcome(
            False,
            Failure(status=502, transport="malformed", message="upstream sent malformed JSON"),
        )
    if not isinstance(data, dict) or data.get("error") not in (None, {}):
        # A 200 carrying an error (some gateways do this) or no object at all is a failed
        # attempt, classified like any other upstream failure.
        lowered = {k.lower(): v for k, v in resp.headers.items()}
        return Outcome(False, failure_from_response(502, lowered, raw[:FAILURE_BODY_LIMIT]))
    # Nothing is sent before the whole answer is read, so an undeclared call anywhere hops.
    tool = undeclared_in_answer(upstream, data, declared)
    if tool is not None:
        return Outcome(False, _undeclared(tool), cool=False)
    if inbound != upstream:
        try:
            translated = _translate_json(
                inbound,
                upstream,
                data,
                target.model,
                caller.request_id.replace("-", ""),
                custom_tools,
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            # A body of the right type but an unexpected shape: not an answer we can pass on.
            return Outcome(
                False,
                Failure(
                    status=502, transport="malformed", message="upstream sent an unexpected body"
                ),
            )
        raw = json.dumps(translated, separators=(",", ":"), ensure_ascii=False).encode()
    if caller.masker.holds(raw):
        raw = caller.masker.secrets_only(raw)  # an answer that spells a credential (#43)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
    ]
    usage = extract_usage(data) if isinstance(data, Mapping) else None
    # The upstream answered: a client that leaves from here on is charged this usage.
    _note_usage(responder, target, usage)
    await responder.commit(resp.status_code, headers, target)
    await responder.write(raw)
    return Outcome(True, status=resp.status_code, usage=usage)


def _note_usage(responder: Responder, target: TargetSpec, usage: Usage | None) -> None:
    """Hand the usage known so far to a responder that keeps it (`note_usage`): a client that
    leaves before the attempt returns is still charged what the upstream reported."""
    note = getattr(responder, "note_usage", None)
    if note is not None:
        note(target, usage)


_COMMITTING = (EventClass.OUTPUT, EventClass.COMPLETED, EventClass.INCOMPLETE, EventClass.FINISH)


def _undeclared_message(tool: str) -> str:
    return f"Model called a tool the request did not declare: {tool[:100]!r}"


def _undeclared(tool: str) -> Failure:
    """An undeclared tool call: a model-output problem (hop, no cooldown), PRODUCT §5.4."""
    return Failure(transport="undeclared_tool", message=_undeclared_message(tool))


def _undeclared_stream_failure(tool: str) -> StreamFailure:
    return StreamFailure(
        status=502,
        type="upstream_error",
        code="undeclared_tool",
        message=_undeclared_message(tool),
    )


def _frames(events: tuple[SSEEvent, ...]) -> bytes:
    """The exact bytes of complete frames. Pass-through forwards these rather than the chunks
    as read, so a frame split across reads is sent whole or not at all: never half a frame that
    turns out malformed, or that an appended terminal error would run into."""
    return b"".join(e.raw for e in events)


# `"error"` unescaped is a JSON key or value (an error event or frame); quoted text inside a
# delta is escaped (`\"error\"`), so normal content is never pattern-redacted. One search of
# the whole batch first: a batch without an error or a known secret (raw or JSON-escaped,
# `Masker.holds`) is passed on as it came (issues #26, #43).
_ERROR = b'"error"'


def _masked_outputs(outputs: list[bytes], masker: Masker) -> bytes:
    """The client bytes of a batch of frames, credentials masked in its error frames and any
    frame that spells a known secret."""
    data = b"".join(outputs)
    if _ERROR not in data and not masker.holds(data):
        return data
    return b"".join(_masked_output(o, masker) for o in outputs)


def _masked_output(output: bytes, masker: Masker) -> bytes:
    if _ERROR in output:
        return masker.frame(output)
    return masker.secrets_only(output) if masker.holds(output) else output


def _masked_frames(events: tuple[SSEEvent, ...], masker: Masker) -> bytes:
    data = _frames(events)
    if _ERROR not in data and not masker.holds(data):
        return data
    return _masked_outputs([e.raw for e in events], masker)


def _last_frame(events: tuple[SSEEvent, ...], masker: Masker = NO_MASK) -> bytes:
    """A final frame the upstream did not terminate (`finish()`): forwarded with its blank line
    (a client drops an unterminated event at end of stream), unless its data is malformed."""
    if not events or _malformed_at(events) is not None:
        return b""
    data = _masked_frames(events, masker)
    if data.endswith((b"\n\n", b"\r\n\r\n", b"\r\r")):
        return data
    for ending in (b"\r\n", b"\n", b"\r"):
        if data.endswith(ending):
            return data + ending
    return data + b"\n\n"


def _malformed(events: tuple[SSEEvent, ...]) -> list[int]:
    """Indexes of the frames whose data is not JSON (`[DONE]` aside)."""
    out = []
    for i, event in enumerate(events):
        if event.has_data and not event.is_done:
            try:
                event.json()  # decoded once: the commit scanner has already done it
            except ValueError:
                out.append(i)
    return out


def _malformed_at(events: tuple[SSEEvent, ...]) -> int | None:
    """Index of the first frame whose data is not JSON (`[DONE]` aside), else None."""
    found = _malformed(events)
    return found[0] if found else None


def _commits(upstream: Protocol_, events: tuple[SSEEvent, ...]) -> bool:
    """Whether any of `events` is output or a terminal (the commit point of reference §4)."""
    if upstream == "anthropic":
        from providers.wire import anthropic

        return any(anthropic.classify_anthropic_event(e) in ("output", "completed") for e in events)
    return any(classify_payload(upstream, e) in _COMMITTING for e in events)


def _scan_usage(events: tuple[SSEEvent, ...], usage: Usage | None) -> Usage | None:
    # A cheap byte test first: only terminal/usage frames are decoded.
    for event in events:
        if b'"usage"' in event.raw:
            try:
                payload = event.json()
            except ValueError:
                continue
            found = extract_usage(payload) if isinstance(payload, Mapping) else None
            if found is not None:
                usage = found if usage is None else usage.merge(found)
    return usage


class _ReadTimer:
    """The first-byte and idle timeouts of one stream's reads, with one timer that moves lazily.

    `asyncio.timeout` around every read armed and cancelled a timer per chunk (a heap push and
    a cancelled handle per streamed event). Here a read only records its deadline; the timer,
    armed when a read starts and none is pending, re-arms itself at the later deadline when it
    fires early, and cancels the task only while a read is still waiting past its deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self._loop = loop
        self._task = task
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self.waiting = False
        self.fired = False

    def start(self, seconds: float) -> None:
        self.waiting = True
        self._due = self._loop.time() + seconds
        handle = self._handle
        if handle is None:
            self._handle = self._loop.call_at(self._due, self._check)
        elif handle.when() > self._due:
            # Armed for a later deadline (a first byte allowed longer than the idle gap): an
            # idle read must not wait for it.
            handle.cancel()
            self._handle = self._loop.call_at(self._due, self._check)

    def _check(self) -> None:
        self._handle = None
        if not self.waiting:
            return  # the next read arms it again
        if self._loop.time() < self._due:
            self._handle = self._loop.call_at(self._due, self._check)
            return
        self.fired = True
        self._task.cancel()

    def moved(self, seconds: float) -> None:
        """A read that is still waiting got data it handed on (`Body.wait`'s sink): its window
        starts again now."""
        self._due = self._loop.time() + seconds

    def close(self) -> None:
        self.waiting = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def reading(self, seconds: float) -> _ReadTimer:
        """`with timer.reading(s): await …`: a read that must end within `s`; the task's
        cancellation by this timer comes out as TimeoutError."""
        self.start(seconds)
        return self

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type[BaseException] | None, error: object, tb: object) -> None:
        self.waiting = False
        if kind is asyncio.CancelledError and self.fired and self._task.uncancel() == 0:
            raise TimeoutError from None


class _Push:
    """What `_stream` hands chunks to while `_chunks` waits: `sink(chunk)` takes a chunk at
    once, from the connection's data callback (True), or leaves it to the loop (False)."""

    __slots__ = ("sink",)

    def __init__(self) -> None:
        self.sink: Callable[[bytes], bool] | None = None


class _Fed(NamedTuple):
    """One upstream chunk read by `_stream`'s scanner: its decision and, unless it failed,
    where the batch must stop (`cut_at`)."""

    decision: Decision
    cut: tuple[int, StreamFailure, str | None] | None


async def _chunks(
    resp: httpx.Response, first_ms: int, idle_ms: int, push: _Push | None = None
) -> AsyncIterator[bytes]:
    """The body's chunks; TimeoutError when the first takes over `first_ms` or a later one over
    `idle_ms` (time spent by the consumer between reads does not count). While it waits, a chunk
    `push.sink` takes is not yielded (ocx's own transport only); it counts as a read."""
    task = asyncio.current_task()
    assert task is not None
    timer = _ReadTimer(asyncio.get_running_loop(), task)
    limit = first_ms / 1000
    push = push or _Push()

    def pushed(chunk: bytes) -> bool:
        # Data arrived: a read, whether the sink takes it or leaves it to this loop. A deadline
        # due in the same loop turn (timers run after the socket's callbacks) must not cancel
        # the task before it gets a chunk the sink declined after reading it.
        timer.moved(limit)
        sink = push.sink
        return sink is not None and sink(chunk)

    try:
        body = resp.stream
        if isinstance(body, Body):
            # ocx's own transport: read the connection itself, not through httpx's generators.
            resp.is_stream_consumed = True
            while (chunk := body.ready()) != b"":
                if chunk is None:
                    with timer.reading(limit):
                        await body.wait(pushed if push.sink is not None else None)
                else:
                    limit = idle_ms / 1000
                    yield chunk
            await resp.aclose()
            return
        it = resp.aiter_raw().__aiter__()
        while True:
            try:
                with timer.reading(limit):
                    chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            limit = idle_ms / 1000
            if chunk:
                yield chunk
    finally:
        timer.close()


async def _stream(
    resp: httpx.Response,
    inbound: Literal["responses", "chat"],
    upstream: Protocol_,
    target: TargetSpec,
    responder: Responder,
    caller: Caller,
    first_byte_ms: int,
    idle_ms: int,
    custom_tools: frozenset[str] = frozenset(),
    *,
    include_usage: bool = True,
    declared: frozenset[str] | None = None,
) -> Outcome:
    reader = _StreamReader(
        inbound, upstream, target, responder, caller, custom_tools, include_usage, declared
    )
    return await reader.run(_chunks(resp, first_byte_ms, idle_ms, reader.push))


class _StreamReader:
    """One streamed answer, from the upstream's chunks to the client's writes, in named steps:
    read a chunk (`read`: the commit scanner, usage, where it must be cut), hold it until the
    commit rule says output began (`commit_with`), relay it (`_relay`), then end: the upstream's
    body ended (`_finish`, `_end_state`, `_complete`), it broke after commit (`_broke`), it timed
    out or was cut (`_timed_out`, `_cut_off`), or the client left (`_client_left`). Before commit
    any trouble is a failed attempt (the loop may hop); after it, the client gets an explicit
    terminal error."""

    __slots__ = (
        "inbound",
        "upstream",
        "target",
        "responder",
        "caller",
        "declared",
        "scanner",
        "translator",
        "drop_usage",
        "pending",
        "committed",
        "broken",
        "undeclared",
        "usage",
        "cut_malformed",
        "stalled",
        "push",
        "declined",
    )

    def __init__(
        self,
        inbound: Literal["responses", "chat"],
        upstream: Protocol_,
        target: TargetSpec,
        responder: Responder,
        caller: Caller,
        custom_tools: frozenset[str],
        include_usage: bool,
        declared: frozenset[str] | None,
    ) -> None:
        self.inbound = inbound
        self.upstream = upstream
        self.target = target
        self.responder = responder
        self.caller = caller
        self.declared = declared
        self.scanner = _scanner(upstream)
        self.translator, preamble = _stream_translator(
            inbound, upstream, target.model, caller.request_id, custom_tools, include_usage
        )
        if self.translator is None:
            self.scanner.forward_raw()
        # Pass-through Chat: the usage chunk ocx asked for is not shown to a client that did not.
        self.drop_usage = self.translator is None and upstream == "chat" and not include_usage
        self.pending: list[bytes] = [preamble] if preamble else []
        self.committed = False
        self.broken: StreamFailure | None = None
        self.undeclared: str | None = None
        self.usage: Usage | None = None
        self.cut_malformed = 0  # translated streams stop at their first malformed frame
        self.stalled = False
        self.push = _Push()
        # A chunk the sink read and then left to the loop (the scanner cannot read a chunk
        # twice): what it read of it.
        self.declined: _Fed | None = None

    async def run(self, chunks: AsyncIterator[bytes]) -> Outcome:
        try:
            try:
                ended = await self._relay(chunks)
            except TimeoutError:
                ended = self._timed_out()
            except httpx.HTTPError:
                ended = self._cut_off()
            except asyncio.CancelledError:
                self._client_left()
                raise
        finally:
            # The sink reaches this reader, which holds `push`: a cycle that would leave each
            # stream's parser, scanner and closures to the collector.
            self.push.sink = None
        if ended is not None:
            return ended
        if self.broken is None:
            ended = await self._finish()
            if ended is not None:
                return ended
        if self.broken is None:
            ended = await self._end_state()
            if ended is not None:
                return ended
        if self.broken is not None:
            return await self._broke()
        return await self._complete()

    def bad_frames(self) -> int:
        # A pass-through forwards every malformed frame; the scanner counted them as it read.
        return self.scanner.malformed if self.translator is None else self.cut_malformed

    def translate(self, events: tuple[SSEEvent, ...]) -> bytes:
        translator = self.translator
        if translator is None:
            return _masked_frames(_client_events(events, self.drop_usage), self.caller.masker)
        return _masked_outputs([translator.feed_event(e) for e in events], self.caller.masker)

    def cut_at(
        self, events: tuple[SSEEvent, ...], seen_bad: int
    ) -> tuple[int, StreamFailure, str | None] | None:
        """Where this batch must stop: a malformed frame in a translated stream (a pass-through
        forwards it as received, PRODUCT §5.4) or a call to an undeclared tool; else None.
        `seen_bad` is the scanner's malformed count before it read `events`: the frames are
        only searched when that count went up."""
        found: list[tuple[int, StreamFailure, str | None]] = []
        searched = self.translator is not None and self.scanner.malformed > seen_bad
        bad = _malformed_at(events) if searched else None
        if bad is not None:
            found.append((bad, truncation_failure("sent malformed stream data"), None))
        tool = undeclared_at(self.upstream, events, self.declared)
        if tool is not None:
            found.append((tool[0], _undeclared_stream_failure(tool[1]), tool[1]))
        return min(found, key=lambda f: f[0]) if found else None

    def read(self, chunk: bytes) -> _Fed:
        scanner = self.scanner
        seen_bad = scanner.malformed
        decision = scanner.feed(chunk)
        if decision.phase is Phase.FAILED:
            return _Fed(decision, None)
        self.usage = _scan_usage(decision.events, self.usage)
        return _Fed(decision, self.cut_at(decision.events, seen_bad))

    async def commit_with(self, data: bytes) -> None:
        self.committed = True
        responder = self.responder
        await responder.commit(200, list(SSE_HEADERS), self.target)
        await responder.write(b"".join(self.pending) + data)
        self.pending = []
        # From here on, what a chunk needs is usually only a write: when the server can write
        # at once (`server.body_now`; issue #24), each chunk is handled from the upstream
        # connection's callback, without a wake-up of this task, exactly as the loop would
        # (its plain-delta branch, or `read` and the last branch). A chunk that cuts the
        # stream is left to the loop with what was read of it.
        writer_now = getattr(responder, "writer_now", None)
        write = writer_now() if writer_now is not None else None
        if write is not None:
            self.push.sink = self._sink(write)

    def _sink(self, write: Callable[[bytes], None]) -> Callable[[bytes], bool]:
        translator, scanner, masker = self.translator, self.scanner, self.caller.masker
        read, translate = self.read, self.translate

        def now(chunk: bytes) -> bool:
            if translator is None and scanner.plain(chunk) and not masker.holds(chunk):
                write(chunk)
                return True
            fed = read(chunk)  # never FAILED once committed: only a cut ends it early
            if fed.cut is not None:
                self.declined = fed
                return False
            data = translate(fed.decision.events)
            if data:
                write(data)
            return True

        return now

    async def _relay(self, chunks: AsyncIterator[bytes]) -> Outcome | None:
        """Read and relay each chunk: an Outcome when the attempt fails before commit, None when
        the body ended or a cut broke the stream (`broken`)."""
        scanner, translator, responder = self.scanner, self.translator, self.responder
        masker = self.caller.masker
        async for chunk in chunks:
            fed, self.declined = self.declined, None  # read already by the sink, which left it
            if fed is None:
                if (
                    self.committed
                    and translator is None
                    and scanner.plain(chunk)
                    and not masker.holds(chunk)
                ):
                    # One plain output delta of a pass-through (the usual streamed event) that
                    # spells no secret: nothing in it for the usage, tool-call, masking or end
                    # checks below.
                    await responder.write(chunk)
                    continue
                fed = self.read(chunk)
            decision, cut = fed
            if decision.phase is Phase.FAILED:
                return self._failed(decision)
            if cut is not None:
                return await self._cut(decision, cut)
            data = self.translate(decision.events)
            if not self.committed:
                if decision.phase is Phase.COMMITTED:
                    await self.commit_with(data)
                elif data:
                    self.pending.append(data)
            elif data:
                await responder.write(data)
        return None

    def _failed(self, decision: Decision) -> Outcome:
        """The upstream's stream failed before commit (a failure frame): a failed attempt."""
        assert decision.failure is not None
        # A failure stops the scan at the failing frame, so search the whole batch.
        if self.translator is not None and _malformed_at(decision.events) is not None:
            self.cut_malformed = 1  # Anthropic: malformed data is a failure frame
        return Outcome(
            False, _failure_from_stream(decision.failure, "error"), malformed=self.bad_frames()
        )

    def _failed_before_commit(self, tool: str | None) -> Outcome:
        if tool is not None:
            return Outcome(False, _undeclared(tool), cool=False, malformed=self.bad_frames())
        return Outcome(
            False,
            Failure(
                status=502, transport="malformed", message="upstream sent malformed stream data"
            ),
            malformed=self.bad_frames(),
        )

    async def _cut(
        self, decision: Decision, cut: tuple[int, StreamFailure, str | None]
    ) -> Outcome | None:
        """A batch that must stop (a malformed frame, an undeclared tool): before output this
        is a failed attempt (hop); after commit the client gets what preceded it, then an
        explicit terminal error (PRODUCT §5.4)."""
        self.cut_malformed = int(cut[2] is None)
        good = decision.events[: cut[0]]
        data = self.translate(good)
        if not self.committed:
            if not _commits(self.upstream, good):
                return self._failed_before_commit(cut[2])
            await self.commit_with(data)
        else:
            await self.responder.write(data)
        self.broken, self.undeclared = cut[1], cut[2]
        return None

    def _timed_out(self) -> Outcome | None:
        if not self.committed:
            kind = "timeout_idle" if self.scanner.buffered() else "timeout_first_byte"
            return Outcome(
                False,
                Failure(transport=kind, message="Upstream sent no output before the timeout"),
                malformed=self.bad_frames(),
            )
        # After its terminal signal a stream that goes quiet is complete (judged by content).
        if not self.scanner.terminal_seen:
            self.broken, self.stalled = truncation_failure("stalled (idle timeout)"), True
        return None

    def _cut_off(self) -> Outcome | None:
        if not self.committed:
            return Outcome(
                False,
                Failure(transport="reset", message="Upstream connection was cut"),
                malformed=self.bad_frames(),
            )
        if not self.scanner.terminal_seen:
            self.broken = truncation_failure("connection was cut")
        return None

    def _client_left(self) -> None:
        usage = self.usage
        if self.committed and usage is not None:
            # The client left: the upstream's figures so far (final once its end was seen;
            # before it, only the input is, as Anthropic reports it first).
            known = usage if self.scanner.terminal_seen else Usage(usage.input, None, usage.cached)
            _note_usage(self.responder, self.target, known)

    async def _finish(self) -> Outcome | None:
        """The upstream's body ended: what the scanner still held, cut, committed or relayed."""
        scanner = self.scanner
        seen_bad = scanner.malformed
        decision = scanner.finish()
        self.usage = _scan_usage(decision.events, self.usage)
        if not self.committed and decision.phase is Phase.FAILED:
            return self._failed(decision)
        events = decision.events
        cut = self.cut_at(events, seen_bad)
        if cut is not None:
            self.cut_malformed = int(cut[2] is None)
            events = events[: cut[0]]
            self.broken, self.undeclared = cut[1], cut[2]
            if not self.committed and not _commits(self.upstream, events):
                return self._failed_before_commit(self.undeclared)
        tail = (
            _last_frame(_client_events(events, self.drop_usage), self.caller.masker)
            if self.translator is None
            else self.translate(events)
        )
        if not self.committed:
            # The stream completed without visible output (e.g. an empty answer): commit it.
            await self.commit_with(tail)
        elif tail:
            await self.responder.write(tail)
        return None

    async def _end_state(self) -> Outcome | None:
        """How the stream's content says it ended: truncated or open is broken; an upstream
        `response.failed` after output is the attempt's outcome."""
        scanner = self.scanner
        end = scanner.end_state()
        if end is EndState.TRUNCATED or end is EndState.OPEN:
            self.broken = truncation_failure("stream ended before completion")
        elif end is EndState.FAILED:
            sf = scanner.failure or truncation_failure("failed")
            if self.translator is not None:
                await self.responder.write(self.translator.close())
            return Outcome(
                True,
                _failure_from_stream(sf, "response.failed"),
                status=200,
                usage=self.usage,
                malformed=self.bad_frames(),
            )
        return None

    async def _broke(self) -> Outcome:
        """Broken after commit: the client gets an explicit terminal error, never a clean end."""
        broken, undeclared = self.broken, self.undeclared
        assert broken is not None
        if self.translator is not None:
            await self.responder.write(self.translator.fail(broken))
        else:
            await self.responder.write(terminal_error_frame(self.inbound, broken))
        failure = (
            _undeclared(undeclared) if undeclared is not None else _failure_from_stream(broken)
        )
        if self.stalled:
            failure = dataclasses.replace(failure, timed_out=True)  # never retried (#43)
        return Outcome(
            True,
            failure,
            status=200,
            usage=self.usage,
            malformed=self.bad_frames(),
            cool=undeclared is None,
        )

    async def _complete(self) -> Outcome:
        if self.translator is not None:
            await self.responder.write(self.translator.close())
        elif self.upstream == "chat" and not self.scanner.done_seen:
            # A Chat stream complete without its `[DONE]` trailer: the client still gets one.
            await self.responder.write(DONE_FRAME)
        return Outcome(True, status=200, usage=self.usage, malformed=self.bad_frames())
