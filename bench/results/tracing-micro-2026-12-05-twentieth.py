"""Twentieth run: the CPU of ocx's two spans per request (gateway/tracing.py), in one process.

    OCX_DATA_DIR=$(mktemp -d) python bench/results/tracing-micro-2026-12-05-twentieth.py [--n 20000]

The hooks the proxy calls for a request with one attempt (`start_request`, `start_attempt`,
`end_attempt`, `end_request`, with the attributes a served chat request sets) under the SDK's
`BatchSpanProcessor`, three ways: an exporter that drops the batch (the span API and the batch
processor), the OTLP/HTTP exporter to a loopback receiver that answers 200 (what a worker with
tracing on pays; its export thread's CPU is this process's too), and, for scale, no tracing at
all (the `TRACER is not None` checks only), and the OTLP one with a 10 % `TraceIdRatioBased`
sampler (`OTEL_TRACES_SAMPLER=traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`). CPU is the whole process's (`time.process_time`),
the flush of the last batch included.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway import tracing  # noqa: E402


def serve() -> None:
    """The receiver, in a process of its own (its CPU is not the worker's)."""

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
    failure=None,
    status=200,
    committed=True,
    usage=SimpleNamespace(input=12, output=8),
)


def one_request() -> None:
    if tracing.TRACER is None:
        return
    span = tracing.start_request("/v1/chat/completions")
    attempt = tracing.start_attempt(span, "mock", "openai-chat", "mock/m", "m")
    tracing.end_attempt(attempt, OUTCOME)
    tracing.end_request(span, ENTRY, "ok")


def per_request_us(n: int) -> float:
    for _ in range(500):
        one_request()
    tracing.flush()
    t0 = time.process_time()
    for _ in range(n):
        one_request()
    tracing.flush()
    return (time.process_time() - t0) / n * 1e6


def setup(exporter: Any, ratio: float | None = None) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": "ocx"}),
        sampler=None if ratio is None else TraceIdRatioBased(ratio),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracing._PROVIDER = provider
    tracing.TRACER = provider.get_tracer("ocx")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve()
        return 0
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sink = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    assert sink.stdout is not None
    url = sink.stdout.readline().strip()
    try:
        rounds(args, url, Drop(), OTLPSpanExporter)
    finally:
        sink.terminate()
        sink.wait()
    return 0


def rounds(args: Any, url: str, drop: Any, otlp: Any) -> None:
    for r in range(args.rounds):
        got = {}
        tracing.TRACER = tracing._PROVIDER = None
        got["off"] = per_request_us(args.n)
        setup(drop)
        got["spans, exporter drops"] = per_request_us(args.n)
        setup(otlp(endpoint=f"{url}/v1/traces"))
        got["spans, OTLP/HTTP to a loopback receiver"] = per_request_us(args.n)
        setup(otlp(endpoint=f"{url}/v1/traces"), ratio=0.1)
        got["the same, 10 % sampled"] = per_request_us(args.n)
        print(f"round {r}: " + " · ".join(f"{k} {v:.1f} µs/request" for k, v in got.items()))


if __name__ == "__main__":
    sys.exit(main())
