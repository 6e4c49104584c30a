"""The CPU of a traced request's spans, in one process: ocx's tracer against the SDK's.

    OCX_DATA_DIR=$(mktemp -d) python -m bench tracing-micro [--n 1000] [--rounds 5]

The four hooks the proxy calls for a served request with one attempt (`start_request`,
`start_attempt`, `end_attempt`, `end_request`, with the attributes a served chat request
sets), each way in turn, in rounds:

- `off`: tracing off (the `TRACER is not None` checks only);
- `ocx`: gateway/tracing.py, every request sampled, its export thread posting OTLP/HTTP to a
  loopback receiver (a process of its own: its CPU is not counted);
- `ocx 10 %`: the same with `OTEL_TRACES_SAMPLER=traceidratio`, `…_ARG=0.1`;
- `sdk`: for scale, the same two spans through the OpenTelemetry SDK's tracer,
  `BatchSpanProcessor` and `OTLPSpanExporter` to the same receiver (what ocx did before #45's
  second round).

CPU is the whole process's (`time.process_time`, the export threads included), the flush of
the last batch included. Rounds of `--n` requests stay below the export queue (2,048 spans),
so nothing is dropped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import tracing  # noqa: E402

ENTRY = SimpleNamespace(
    requested_model="combo/bench",
    target="mock/m",
    combo="bench",
    input_tokens=12,
    output_tokens=8,
    attempts=[object()],
    stream=False,
    status=200,
)
OUTCOME = SimpleNamespace(
    failure=None, status=200, committed=True, usage=SimpleNamespace(input=12, output=8)
)
HEADERS = [(b"host", b"127.0.0.1"), (b"authorization", b"Bearer ocx_x"), (b"accept", b"*/*")]


def serve() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


def ocx_request() -> None:
    if tracing.TRACER is None:
        return
    span = tracing.start_request("/v1/chat/completions", HEADERS)
    if span is None:
        return
    attempt = tracing.start_attempt(span, "mock", "openai-chat", "mock/m", "m")
    tracing.end_attempt(attempt, OUTCOME)
    tracing.end_request(span, ENTRY, "ok")


def sdk_hooks(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """The same two spans and attributes through the SDK (the code ocx had before)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, set_span_in_context

    provider = TracerProvider(resource=Resource.create({"service.name": "ocx"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
    tracer = provider.get_tracer("ocx")

    def one() -> None:
        span = tracer.start_span(
            "/v1/chat/completions", kind=SpanKind.SERVER, attributes={"url.path": "/v1/chat"}
        )
        attempt = tracer.start_span(
            "chat m",
            context=set_span_in_context(span),
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "mock",
                "gen_ai.request.model": "m",
                "ocx.adapter": "openai-chat",
                "ocx.target": "mock/m",
            },
        )
        for k, v in (
            ("http.response.status_code", 200),
            ("ocx.outcome", "served"),
            ("gen_ai.response.model", "m"),
            ("gen_ai.usage.input_tokens", 12),
            ("gen_ai.usage.output_tokens", 8),
        ):
            attempt.set_attribute(k, v)
        attempt.end()
        span.update_name("chat combo/bench")
        for k, v in (
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", "combo/bench"),
            ("ocx.target", "mock/m"),
            ("gen_ai.provider.name", "mock"),
            ("gen_ai.response.model", "m"),
            ("ocx.combo", "bench"),
            ("gen_ai.usage.input_tokens", 12),
            ("gen_ai.usage.output_tokens", 8),
            ("ocx.outcome", "ok"),
            ("ocx.attempts", 1),
            ("ocx.stream", False),
            ("http.response.status_code", 200),
        ):
            span.set_attribute(k, v)
        span.end()

    def flush() -> None:
        provider.force_flush()

    return one, flush


def per_request_us(one: Callable[[], None], flush: Callable[[], None], n: int) -> float:
    for _ in range(200):
        one()
    flush()
    t0 = time.process_time()
    for _ in range(n):
        one()
    flush()
    return (time.process_time() - t0) / n * 1e6


def ocx_on(url: str, ratio: float | None = None) -> None:
    if tracing.TRACER is not None:
        tracing.TRACER.exporter.shutdown()  # one export thread at a time
    tracing.TRACER = None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "1000"}
    if ratio is not None:
        env |= {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(ratio)}
    assert tracing.setup(env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000, help="requests per round and way")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-sdk", action="store_true", help="skip the SDK way")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve()
        return 0
    sink = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None
    url = sink.stdout.readline().strip()
    try:
        sdk = None if args.no_sdk else sdk_hooks(url)
        for r in range(args.rounds):
            got = {}
            ocx_on(url)
            tracing.TRACER = None
            got["off"] = per_request_us(ocx_request, tracing.flush, args.n)
            ocx_on(url)
            got["ocx"] = per_request_us(ocx_request, tracing.flush, args.n)
            ocx_on(url, 0.1)
            got["ocx 10 %"] = per_request_us(ocx_request, tracing.flush, args.n)
            if sdk is not None:
                got["sdk"] = per_request_us(*sdk, args.n)
            print(f"round {r}: " + " · ".join(f"{k} {v:.1f} µs/request" for k, v in got.items()))
    finally:
        sink.terminate()
        sink.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
