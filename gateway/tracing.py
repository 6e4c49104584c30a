"""OpenTelemetry traces of proxied requests, opt-in (`pip install 'ocx[otel]'`).

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, unless
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The standard variables are read
as the Python SDK reads them: `OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`, `…_TIMEOUT` (seconds),
`…_COMPRESSION` (gzip, deflate), `…_CERTIFICATE`, `…_CLIENT_KEY`, `…_CLIENT_CERTIFICATE`,
`OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_BSP_*`; the resource (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, detectors) comes from the SDK's `Resource.create`.

One span per proxied request (kind SERVER) with a child per upstream attempt (kind CLIENT),
with the OpenTelemetry GenAI semantic-convention attributes (`gen_ai.operation.name`,
`gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.provider.name`,
`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`) plus `ocx.combo`, `ocx.target` and
`ocx.outcome`. Never a prompt, an answer, a header or a secret. A caller's W3C `traceparent`
makes the request's span a child of the caller's (and its sampled flag decides, with the
default `parentbased_always_on` sampler); nothing is propagated upstream.

Why not the SDK's tracer and exporter: two SDK spans and its OTLP encoder cost +27–37 % CPU
per request (bench/README.md, #45). Here a span is a small object, encoded to OTLP/protobuf
bytes (`gateway.otlp`) when it ends, after the response has gone; a thread of the worker
posts the batches (never the event loop), retries with backoff and drops, counted, what
overflows its queue.

Off (the default) it costs one `TRACER is not None` check per hook, and `opentelemetry` is
never imported.
"""

from __future__ import annotations

import asyncio
import atexit
import gzip
import logging
import os
import random
import re
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from gateway import otlp
from server import lifecycle, metrics

log = logging.getLogger("ocx.tracing")

OPERATION = "chat"  # Responses and Chat Completions are both GenAI "chat" operations
SCOPE_NAME = "ocx"
_SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
_RETRYABLE = frozenset({429, 502, 503, 504})
_ID64 = (1 << 64) - 1


def wanted(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


@dataclass(frozen=True)
class Settings:
    endpoint: str
    headers: dict[str, str]
    timeout_s: float
    compression: str  # "", "gzip" or "deflate"
    verify: bool | str
    cert: tuple[str, str] | None
    sampler: str
    ratio: float
    schedule_delay_s: float
    max_queue: int
    max_batch: int


def settings_from(env: Mapping[str, str]) -> Settings:
    """The standard variables, read like the Python SDK; a bad value is logged, then defaulted."""

    def pick(name: str) -> str:
        return (
            env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
            or env.get(f"OTEL_EXPORTER_OTLP_{name}")
            or ""
        ).strip()

    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not endpoint:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
        endpoint = f"{base.removesuffix('/')}/v1/traces"
    compression = pick("COMPRESSION").lower()
    if compression in ("", "none"):
        compression = ""
    elif compression not in ("gzip", "deflate"):
        log.warning("OTEL_EXPORTER_OTLP_COMPRESSION=%r is not gzip or deflate: none", compression)
        compression = ""
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if sampler not in _SAMPLERS:
        log.warning("OTEL_TRACES_SAMPLER=%r is not known: parentbased_always_on", sampler)
        sampler = "parentbased_always_on"
    ratio = _number(env, "OTEL_TRACES_SAMPLER_ARG", 1.0) if "traceidratio" in sampler else 1.0
    if not 0.0 <= ratio <= 1.0:
        log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not within [0, 1]: 1.0", ratio)
        ratio = 1.0
    key, certificate = pick("CLIENT_KEY"), pick("CLIENT_CERTIFICATE")
    max_queue = max(1, int(_number(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)))
    return Settings(
        endpoint=endpoint,
        headers=_headers(pick("HEADERS")),
        timeout_s=_timeout(pick("TIMEOUT")),
        compression=compression,
        verify=pick("CERTIFICATE") or True,
        cert=(certificate, key) if key and certificate else None,
        sampler=sampler,
        ratio=ratio,
        schedule_delay_s=max(0.0, _number(env, "OTEL_BSP_SCHEDULE_DELAY", 5000)) / 1000,
        max_queue=max_queue,
        max_batch=min(max_queue, max(1, int(_number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)))),
    )


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        log.warning("%s=%r is not a number: %s", name, raw, default)
        return default


def _timeout(raw: str) -> float:
    try:
        value = float(raw) if raw else 10.0
    except ValueError:
        log.warning("OTEL_EXPORTER_OTLP_TIMEOUT=%r is not a number of seconds: 10", raw)
        return 10.0
    return value if value > 0 else 10.0


def _headers(raw: str) -> dict[str, str]:
    from opentelemetry.util.re import parse_env_headers

    # The values are usually a vendor's API key: never logged, never in an error.
    return {k.lower(): v for k, v in parse_env_headers(raw, liberal=True).items()}


class Sampler:
    """`OTEL_TRACES_SAMPLER` as the SDK decides it, for a root span or a caller's parent."""

    def __init__(self, name: str, ratio: float) -> None:
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        if root == "always_on":
            self.bound = _ID64 + 1
        elif root == "always_off":
            self.bound = 0
        else:
            self.bound = round(ratio * (_ID64 + 1))

    def sampled(self, trace_id: int, parent_sampled: bool | None) -> bool:
        if parent_sampled is not None and self.parent_based:
            return parent_sampled
        return (trace_id & _ID64) < self.bound


_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_traceparent(value: bytes) -> tuple[int, int, bool] | None:
    """A W3C `traceparent`: (trace id, parent span id, sampled), or None when invalid."""
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace, span, flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


class Span:
    """A span being recorded; `end` encodes it and hands it to the exporter."""

    __slots__ = ("trace_id", "span_id", "parent_id", "remote", "name", "kind", "start_ns", "attrs")

    def __init__(
        self,
        trace_id: int,
        span_id: int,
        parent_id: int,
        remote: bool,
        name: str,
        kind: int,
        attrs: dict[str, Any],
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.remote = remote
        self.name = name
        self.kind = kind
        self.start_ns = time.time_ns()
        self.attrs = attrs


class Exporter:
    """Encoded spans in a bounded queue; a thread posts them in batches over OTLP/HTTP."""

    def __init__(
        self,
        settings: Settings,
        resource: bytes,
        scope: bytes,
        *,
        post: Callable[[bytes], int] | None = None,
        backoff_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.resource = resource
        self.scope = scope
        self.queue: deque[bytes] = deque()
        self.dropped = 0
        self.backoff_s = backoff_s
        self._post = post or self._http_post
        self._client: httpx.Client | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one export at a time: the thread's or a flush's
        self._failing = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ocx-otlp-export", daemon=True)
        self._thread.start()

    def add(self, encoded: bytes) -> None:
        queue = self.queue
        if len(queue) >= self.settings.max_queue:
            self.dropped += 1
            metrics.TRACE_SPANS.labels("dropped").inc()
            return
        queue.append(encoded)
        if len(queue) == self.settings.max_batch:
            self._wake.set()

    def flush(self) -> None:
        with self._lock:
            self._export_queued()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.settings.timeout_s + 1)
        self.flush()
        if self._client is not None:
            self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            full = self._wake.wait(self.settings.schedule_delay_s)
            self._wake.clear()
            with self._lock:
                self._export_queued(full_only=full)

    def _export_queued(self, full_only: bool = False) -> None:
        """Post what is queued now, in batches: only full ones when a full batch woke the
        thread (the rest waits for the schedule). Spans that arrive meanwhile wait too: under
        steady traffic, "until the queue is empty" was a post of a few spans after each post."""
        queue, size = self.queue, self.settings.max_batch
        pending = len(queue)
        while pending >= (size if full_only else 1):
            batch = [queue.popleft() for _ in range(min(size, pending))]
            pending -= len(batch)
            sent = self._send(otlp.export_request(self.resource, self.scope, batch))
            metrics.TRACE_SPANS.labels("exported" if sent else "failed").inc(len(batch))
            if not sent and self._stop.is_set():
                # A worker exiting past a dead collector waits for one post, not one per batch.
                rest = len(queue)
                queue.clear()
                metrics.TRACE_SPANS.labels("failed").inc(rest)
                return

    def _send(self, body: bytes) -> bool:
        """Post one batch; retry a refused or unreachable collector with backoff until the
        export timeout. A collector that is down costs its own spans, nothing else."""
        deadline = time.monotonic() + self.settings.timeout_s
        delay = self.backoff_s
        while True:
            try:
                status = self._post(body)
            except httpx.HTTPError as exc:
                status, reason = 0, type(exc).__name__
            else:
                reason = f"HTTP {status}"
                if 200 <= status < 300:
                    if self._failing:
                        log.info("OTLP export recovered")
                    self._failing = False
                    return True
            retry = status == 0 or status in _RETRYABLE
            if not retry or time.monotonic() + delay > deadline or self._stop.is_set():
                if not self._failing:
                    log.warning("OTLP export failed (%s): this batch of spans is lost", reason)
                self._failing = True
                return False
            self._stop.wait(delay)
            delay *= 2

    def _http_post(self, body: bytes) -> int:
        s = self.settings
        if self._client is None:
            self._client = httpx.Client(verify=s.verify, cert=s.cert, timeout=s.timeout_s)
        headers = {**s.headers, "content-type": "application/x-protobuf"}
        if s.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
            headers["content-encoding"] = "gzip"
        elif s.compression == "deflate":
            body = zlib.compress(body)
            headers["content-encoding"] = "deflate"
        return self._client.post(s.endpoint, content=body, headers=headers).status_code


class Tracer:
    def __init__(self, settings: Settings, exporter: Exporter) -> None:
        self.sampler = Sampler(settings.sampler, settings.ratio)
        self.exporter = exporter
        # Seeded from the OS here, in the worker: forked workers never share trace ids.
        self.ids = random.Random().getrandbits

    def end(self, span: Span, status: int) -> None:
        self.exporter.add(
            otlp.span(
                trace_id=span.trace_id,
                span_id=span.span_id,
                parent_id=span.parent_id,
                remote_parent=span.remote,
                name=span.name,
                kind=span.kind,
                start_ns=span.start_ns,
                end_ns=time.time_ns(),
                attrs=span.attrs,
                status=status,
            )
        )


TRACER: Tracer | None = None  # while tracing is on


def setup(env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when the environment asks for it (once per process); True when on."""
    global TRACER
    env = os.environ if env is None else env
    if TRACER is not None or not wanted(env):
        return TRACER is not None
    try:
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed "
            "(pip install 'ocx[otel]'): tracing stays off"
        )
        return False
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": "ocx"})
    settings = settings_from(env)
    # What OTLP's AnyValue holds here: text, numbers, flags and their sequences.
    attrs = {
        k: v
        for k, v in resource.attributes.items()
        if isinstance(v, str | bool | int | float | tuple | list)
    }
    exporter = Exporter(
        settings,
        otlp.resource(attrs),
        otlp.scope(SCOPE_NAME, _version()),
    )
    exporter.start()
    atexit.register(exporter.shutdown)
    lifecycle.on_flush(_drain)
    TRACER = Tracer(settings, exporter)
    log.info("OpenTelemetry tracing on: spans go to the OTLP/HTTP endpoint of OTEL_* settings")
    return True


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ocx")
    except PackageNotFoundError:
        return ""


def flush(timeout_ms: int = 5000) -> None:
    """Export what is queued now (a drain, a test); `timeout_ms` bounds each post's retries."""
    if TRACER is not None:
        TRACER.exporter.flush()


async def _drain() -> None:
    """A draining worker posts what it queued before it exits."""
    if TRACER is not None:
        await asyncio.to_thread(TRACER.exporter.flush)


def start_request(path: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> Span | None:
    """The request's span, or None when the sampler leaves this request out."""
    tracer = TRACER
    assert tracer is not None
    parent = None
    for name, value in headers:
        if name == b"traceparent":
            parent = parse_traceparent(value)
            break
    if parent is None:
        trace_id, parent_id, parent_sampled = tracer.ids(128) or 1, 0, None
    else:
        trace_id, parent_id, parent_sampled = parent
    if not tracer.sampler.sampled(trace_id, parent_sampled):
        return None
    # Named for what it asked once that is known (`end_request`); `/v1/models` stays a path.
    return Span(
        trace_id,
        tracer.ids(64) or 1,
        parent_id,
        parent is not None,
        path,
        otlp.KIND_SERVER,
        {"url.path": path},
    )


def end_request(span: Span, entry: Any, outcome: str) -> None:
    """The request's span, ended with what the request log knows (`RequestEntry`)."""
    attrs = span.attrs
    model = entry.requested_model
    if model:
        span.name = f"{OPERATION} {model}"
        attrs["gen_ai.operation.name"] = OPERATION
        attrs["gen_ai.request.model"] = model
    if entry.target:
        provider, _, served = entry.target.partition("/")
        attrs["ocx.target"] = entry.target
        attrs["gen_ai.provider.name"] = provider
        attrs["gen_ai.response.model"] = served
    if entry.combo:
        attrs["ocx.combo"] = entry.combo
    _usage(attrs, entry.input_tokens, entry.output_tokens)
    attrs["ocx.outcome"] = outcome
    attrs["ocx.attempts"] = len(entry.attempts)
    attrs["ocx.stream"] = bool(entry.stream)
    if entry.status:
        attrs["http.response.status_code"] = entry.status
    failed = outcome != "ok" or entry.status >= 500
    if failed:
        attrs["error.type"] = outcome
    _end(span, failed)


def start_attempt(parent: Span, provider: str, adapter: str, target: str, model: str) -> Span:
    tracer = TRACER
    assert tracer is not None
    return Span(
        parent.trace_id,
        tracer.ids(64) or 1,
        parent.span_id,
        False,
        f"{OPERATION} {model}",
        otlp.KIND_CLIENT,
        {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "ocx.adapter": adapter,
            "ocx.target": target,
        },
    )


def end_attempt(span: Span, outcome: Any) -> None:
    """An attempt's span; `outcome` None: it raised (a client abort, a bound hit)."""
    attrs = span.attrs
    if outcome is None:
        attrs["ocx.outcome"] = "aborted"
        attrs["error.type"] = "aborted"
        _end(span, True)
        return
    failure = outcome.failure
    status = failure.status if failure is not None and failure.status else outcome.status
    if status:
        attrs["http.response.status_code"] = status
    failed = not outcome.committed or failure is not None
    if not failed:
        attrs["ocx.outcome"] = "served"
        attrs["gen_ai.response.model"] = attrs["gen_ai.request.model"]
    else:
        kind = "failed_after_commit" if outcome.committed else "failed"
        attrs["ocx.outcome"] = kind
        code = getattr(failure, "error_code", None) or (
            str(failure.status) if failure is not None and failure.status else kind
        )
        attrs["error.type"] = str(code)
    usage = outcome.usage
    if usage is not None:
        _usage(attrs, usage.input, usage.output)
    _end(span, failed)


def _usage(attrs: dict[str, Any], input_tokens: int | None, output_tokens: int | None) -> None:
    if input_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = input_tokens
    if output_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = output_tokens


def _end(span: Span, failed: bool) -> None:
    tracer = TRACER
    if tracer is not None:  # turned off meanwhile (a test): the span is dropped
        tracer.end(span, otlp.STATUS_ERROR if failed else otlp.STATUS_UNSET)
