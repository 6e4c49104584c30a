"""OpenTelemetry traces of proxied requests, opt-in (`pip install 'ocx[otel]'`).

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, unless
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`; every other standard `OTEL_*` variable
(headers, timeout, sampler, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`) is
read by the SDK itself. Spans leave through the SDK's batch processor (its own thread, OTLP over
HTTP/protobuf), never on the event loop.

One span per proxied request (kind SERVER) with a child per upstream attempt (kind CLIENT),
with the OpenTelemetry GenAI semantic-convention attributes (`gen_ai.operation.name`,
`gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.provider.name`,
`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`) plus `ocx.combo`, `ocx.target` and
`ocx.outcome`. Never a prompt, an answer, a header or a secret.

Off (the default) it costs one `TRACER is not None` check per hook, and `opentelemetry` is
never imported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("ocx.tracing")

TRACER: Any = None  # the SDK's tracer while tracing is on
_PROVIDER: Any = None
OPERATION = "chat"  # Responses and Chat Completions are both GenAI "chat" operations


def wanted(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def setup(env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when the environment asks for it (once per process); True when on."""
    global TRACER, _PROVIDER
    env = os.environ if env is None else env
    if TRACER is not None or not wanted(env):
        return TRACER is not None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
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
    _PROVIDER = TracerProvider(resource=resource)  # shut down (and flushed) at exit
    _PROVIDER.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    TRACER = _PROVIDER.get_tracer("ocx")
    log.info("OpenTelemetry tracing on: spans go to the OTLP/HTTP endpoint of OTEL_* settings")
    return True


def flush(timeout_ms: int = 5000) -> None:
    if _PROVIDER is not None:
        _PROVIDER.force_flush(timeout_ms)


def start_request(path: str) -> Any:
    from opentelemetry.trace import SpanKind

    # Named for what it asked once that is known (`end_request`); `/v1/models` stays a path.
    return TRACER.start_span(path, kind=SpanKind.SERVER, attributes={"url.path": path})


def end_request(span: Any, entry: Any, outcome: str) -> None:
    """The request's span, ended with what the request log knows (`RequestEntry`)."""
    model = entry.requested_model
    if model:
        span.update_name(f"{OPERATION} {model}")
        span.set_attribute("gen_ai.operation.name", OPERATION)
        span.set_attribute("gen_ai.request.model", model)
    if entry.target:
        provider, _, served = entry.target.partition("/")
        span.set_attribute("ocx.target", entry.target)
        span.set_attribute("gen_ai.provider.name", provider)
        span.set_attribute("gen_ai.response.model", served)
    if entry.combo:
        span.set_attribute("ocx.combo", entry.combo)
    _usage(span, entry.input_tokens, entry.output_tokens)
    span.set_attribute("ocx.outcome", outcome)
    span.set_attribute("ocx.attempts", len(entry.attempts))
    span.set_attribute("ocx.stream", bool(entry.stream))
    if entry.status:
        span.set_attribute("http.response.status_code", entry.status)
    if outcome != "ok" or entry.status >= 500:
        _error(span, outcome)
    span.end()


def start_attempt(parent: Any, provider: str, adapter: str, target: str, model: str) -> Any:
    from opentelemetry.trace import SpanKind, set_span_in_context

    return TRACER.start_span(
        f"{OPERATION} {model}",
        context=set_span_in_context(parent),
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "ocx.adapter": adapter,
            "ocx.target": target,
        },
    )


def end_attempt(span: Any, outcome: Any) -> None:
    """An attempt's span; `outcome` None: it raised (a client abort, a bound hit)."""
    if outcome is None:
        span.set_attribute("ocx.outcome", "aborted")
        _error(span, "aborted")
        span.end()
        return
    failure = outcome.failure
    status = failure.status if failure is not None and failure.status else outcome.status
    if status:
        span.set_attribute("http.response.status_code", status)
    if outcome.committed and failure is None:
        span.set_attribute("ocx.outcome", "served")
        span.set_attribute("gen_ai.response.model", span_model(span))
    else:
        kind = "failed_after_commit" if outcome.committed else "failed"
        span.set_attribute("ocx.outcome", kind)
        code = getattr(failure, "error_code", None) or (
            str(failure.status) if failure is not None and failure.status else kind
        )
        _error(span, str(code))
    usage = outcome.usage
    if usage is not None:
        _usage(span, usage.input, usage.output)
    span.end()


def span_model(span: Any) -> str:
    attributes = getattr(span, "attributes", None) or {}
    return str(attributes.get("gen_ai.request.model", ""))


def _usage(span: Any, input_tokens: int | None, output_tokens: int | None) -> None:
    if input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    if output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)


def _error(span: Any, kind: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR))
