"""OpenTelemetry traces (issue 45): a real `ocx serve` started with the standard `OTEL_*`
variables posts its spans over OTLP/HTTP to a real receiver in the test, which decodes the
protobuf (opentelemetry-proto). One span per request, a child per attempt,
GenAI attributes plus `ocx.*`; no prompt, answer or secret. Off, nothing is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gateway import tracing
from tests.alerts.receiver import Receiver
from tests.conftest import ROOT, Mock, start_server

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

API_KEY = "sk-test-tracing-aaaaaaaaaaaaaaaaaaaaaaaa"
PROMPT = "the-secret-prompt-text-9f8e7d"
USAGE = {"input_tokens": 60, "output_tokens": 40}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def spans(collector: Receiver) -> list[dict[str, Any]]:
    out = []
    for received in list(collector.received):
        request = ExportTraceServiceRequest()
        request.ParseFromString(received.body)
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for span in ss.spans:
                    out.append(
                        {
                            "name": span.name,
                            "kind": span.kind,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "status": span.status.code,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "resource": resource,
                        }
                    )
    return out


def test_spans_reach_an_otlp_receiver_with_genai_attributes(
    tmp_path: Path, mock: Mock, collector: Receiver
) -> None:
    server, stop = start_server(
        tmp_path,
        extra_env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
        },
    )
    try:
        server.put_provider(
            "p",
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": API_KEY,
                "models": {"a": {"contextWindow": 100000}, "b": {"contextWindow": 100000}},
            },
        )
        server.put_combo(
            "t", {"targets": [{"provider": "p", "model": "a"}, {"provider": "p", "model": "b"}]}
        )
        server.wait_synced()
        key = server.create_key("tracer")
        mock.script("a", [{"status": 500}])
        mock.script("b", [], then={"usage": USAGE})
        r = server.http.post(
            "/v1/responses",
            json={"model": "combo/t", "input": PROMPT},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200, r.text

        deadline = time.monotonic() + 20
        while not any(s["name"] == "chat combo/t" for s in spans(collector)):
            assert time.monotonic() < deadline, spans(collector)
            time.sleep(0.05)
        found = spans(collector)
        (request,) = [s for s in found if s["name"] == "chat combo/t"]
        children = [s for s in found if s["parent"] == request["id"]]
        assert request["parent"] == ""
        assert request["kind"] == 2  # SERVER
        assert request["resource"]["service.name"] == "ocx"
        assert request["resource"]["deployment.environment"] == "test"
        attrs = request["attributes"]
        assert {k: attrs[k] for k in attrs if k != "url.path"} == {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "combo/t",
            "gen_ai.response.model": "b",
            "gen_ai.provider.name": "p",
            "gen_ai.usage.input_tokens": 60,
            "gen_ai.usage.output_tokens": 40,
            "ocx.stream": False,
            "ocx.combo": "t",
            "ocx.target": "p/b",
            "ocx.outcome": "ok",
            "ocx.attempts": 2,
            "http.response.status_code": 200,
        }
        assert attrs["url.path"] == "/v1/responses"
        assert [c["name"] for c in children] == ["chat a", "chat b"]
        first, second = (c["attributes"] for c in children)
        assert {c["trace"] for c in children} == {request["trace"]}
        assert [c["kind"] for c in children] == [3, 3]  # CLIENT
        assert (first["ocx.outcome"], first["http.response.status_code"]) == ("failed", 500)
        assert first["gen_ai.request.model"] == "a" and first["ocx.target"] == "p/a"
        assert children[0]["status"] == 2  # ERROR
        assert second == {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "p",
            "gen_ai.request.model": "b",
            "gen_ai.response.model": "b",
            "gen_ai.usage.input_tokens": 60,
            "gen_ai.usage.output_tokens": 40,
            "ocx.adapter": "openai-responses",
            "ocx.target": "p/b",
            "ocx.outcome": "served",
            "http.response.status_code": 200,
        }
        raw = b"".join(r.body for r in collector.received)
        assert PROMPT.encode() not in raw
        assert API_KEY.encode() not in raw and key.encode() not in raw
        assert collector.received[0].path == "/v1/traces"
        assert collector.received[0].headers["content-type"] == "application/x-protobuf"

        # A caller's W3C traceparent: ocx's span joins the caller's trace; a caller that
        # did not sample its trace gets no span (the default parentbased_always_on sampler).
        caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        for flags in ("00", "01"):
            mock.script("b", [], then={"usage": USAGE})
            r = server.http.post(
                "/v1/responses",
                json={"model": "p/b", "input": "x"},
                headers={
                    "Authorization": f"Bearer {key}",
                    "traceparent": f"00-{caller_trace}-{caller_span}-{flags}",
                },
            )
            assert r.status_code == 200, r.text
        deadline = time.monotonic() + 20
        while not any(s["trace"] == caller_trace for s in spans(collector)):
            assert time.monotonic() < deadline, spans(collector)
            time.sleep(0.05)
        joined = [s for s in spans(collector) if s["trace"] == caller_trace]
        (joined_request,) = [s for s in joined if s["parent"] == caller_span]
        assert joined_request["name"] == "chat p/b"
        assert [s["name"] for s in joined if s["parent"] == joined_request["id"]] == ["chat b"]
        assert len(joined) == 2  # the unsampled caller's request left no span
    finally:
        stop()


def test_off_by_default_and_nothing_imported() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import django, os, sys; os.environ['DJANGO_SETTINGS_MODULE']='ocxsite.settings'; "
        "django.setup(); from gateway import proxy, tracing; proxy.ProxyApp(); "
        "print(tracing.TRACER, sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "OCX_DATA_DIR": env.get("OCX_DATA_DIR") or str(ROOT / "var")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "None []"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ],
)
def test_wanted_follows_the_standard_variables(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on
