"""gateway/otlp.py writes OTLP/protobuf by hand: what it writes must parse with the generated
classes (opentelemetry-proto) into exactly what the SDK's own encoder makes of the same spans."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import otlp

pytest.importorskip("opentelemetry.exporter.otlp.proto.common")
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags  # noqa: E402

RESOURCE = {
    "service.name": "ocx",
    "telemetry.sdk.language": "python",
    "deployment.environment": "t",
}
KINDS = {otlp.KIND_SERVER: SpanKind.SERVER, otlp.KIND_CLIENT: SpanKind.CLIENT}


def sdk_span(fields: dict[str, Any]) -> ReadableSpan:
    parent = (
        SpanContext(fields["trace_id"], fields["parent_id"], is_remote=fields["remote_parent"])
        if fields["parent_id"]
        else None
    )
    return ReadableSpan(
        name=fields["name"],
        context=SpanContext(
            fields["trace_id"], fields["span_id"], False, trace_flags=TraceFlags(1)
        ),
        parent=parent,
        resource=Resource(RESOURCE),
        attributes=fields["attrs"],
        kind=KINDS[fields["kind"]],
        start_time=fields["start_ns"],
        end_time=fields["end_ns"],
        status=Status(
            StatusCode.ERROR if fields["status"] == otlp.STATUS_ERROR else StatusCode.UNSET
        ),
        instrumentation_scope=InstrumentationScope("ocx", "1.2.3"),
    )


def ours(spans: list[dict[str, Any]]) -> ExportTraceServiceRequest:
    body = otlp.export_request(
        otlp.resource(RESOURCE), otlp.scope("ocx", "1.2.3"), [otlp.span(**s) for s in spans]
    )
    return ExportTraceServiceRequest.FromString(body)


def span_fields(**over: Any) -> dict[str, Any]:
    return {
        "trace_id": 0x4BF92F3577B34DA6A3CE929D0E0E4736,
        "span_id": 0x00F067AA0BA902B7,
        "parent_id": 0,
        "remote_parent": False,
        "name": "chat combo/main",
        "kind": otlp.KIND_SERVER,
        "start_ns": 1_764_950_000_123_456_789,
        "end_ns": 1_764_950_000_923_456_789,
        "attrs": {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "combo/main",
            "gen_ai.usage.input_tokens": 60,
            "ocx.stream": True,
            "ocx.cost": 0.25,
        },
        "status": otlp.STATUS_UNSET,
        **over,
    }


def test_a_request_and_its_attempts_encode_as_the_sdk_encodes_them() -> None:
    request = span_fields()
    failed = span_fields(
        span_id=0x1111,
        parent_id=request["span_id"],
        kind=otlp.KIND_CLIENT,
        name="chat a",
        attrs={"ocx.outcome": "failed", "http.response.status_code": 500, "error.type": "500"},
        status=otlp.STATUS_ERROR,
    )
    served = span_fields(span_id=0x2222, parent_id=request["span_id"], kind=otlp.KIND_CLIENT)
    expected = encode_spans([sdk_span(s) for s in (request, failed, served)])
    got = ours([request, failed, served])
    assert got == expected
    (resource_spans,) = got.resource_spans
    (scope_spans,) = resource_spans.scope_spans
    assert [s.name for s in scope_spans.spans] == ["chat combo/main", "chat a", "chat combo/main"]
    assert scope_spans.spans[1].status.code == 2
    assert scope_spans.spans[1].parent_span_id == bytes.fromhex("00f067aa0ba902b7")


def test_a_remote_parent_is_flagged_as_the_sdk_flags_it() -> None:
    child = span_fields(parent_id=0xABC, remote_parent=True)
    assert ours([child]) == encode_spans([sdk_span(child)])
    assert ours([child]).resource_spans[0].scope_spans[0].spans[0].flags == 0x300


def test_cached_attributes_encode_the_same_the_second_time() -> None:
    once = ours([span_fields()])
    assert ours([span_fields()]) == once


def test_a_lone_surrogate_is_replaced_so_the_batch_stays_valid_utf8() -> None:
    got = ours([span_fields(attrs={"gen_ai.request.model": "bad\ud800model"})])
    attr = got.resource_spans[0].scope_spans[0].spans[0].attributes[0]
    assert attr.value.string_value == "bad?model"


def test_varint_of_negative_numbers_is_ten_bytes_of_twos_complement() -> None:
    assert otlp.varint(-1) == b"\xff" * 9 + b"\x01"
    assert otlp.varint(300) == b"\xac\x02"


values = st.one_of(
    st.text(max_size=40),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)


@settings(max_examples=150, deadline=None)
@given(
    attrs=st.dictionaries(st.text(min_size=1, max_size=20), values, max_size=12),
    name=st.text(max_size=60),
    trace_id=st.integers(min_value=1, max_value=2**128 - 1),
    span_id=st.integers(min_value=1, max_value=2**64 - 1),
    parent_id=st.integers(min_value=0, max_value=2**64 - 1),
    remote=st.booleans(),
    start=st.integers(min_value=0, max_value=2**63),
    length=st.integers(min_value=0, max_value=10**12),
    error=st.booleans(),
)
def test_any_span_encodes_as_the_sdk_encodes_it(
    attrs: dict[str, Any],
    name: str,
    trace_id: int,
    span_id: int,
    parent_id: int,
    remote: bool,
    start: int,
    length: int,
    error: bool,
) -> None:
    # The SDK's span drops invalid UTF-8 text; ocx never has any (its strings are decoded).
    attrs = {k: v for k, v in attrs.items() if _utf8(k) and (not isinstance(v, str) or _utf8(v))}
    fields = span_fields(
        attrs=attrs,
        name=name if _utf8(name) else "n",
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent_id,
        remote_parent=remote and bool(parent_id),
        start_ns=start,
        end_ns=start + length,
        status=otlp.STATUS_ERROR if error else otlp.STATUS_UNSET,
    )
    assert ours([fields]) == encode_spans([sdk_span(fields)])


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
