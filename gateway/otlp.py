"""OTLP/protobuf for ocx's spans, written straight to bytes (pure, no I/O).

Why not the SDK's encoder: it builds one protobuf object per attribute in Python, ~40 µs a
span, which alone put tracing over its 10 % budget (bench/README.md, #45). Here a span is a
few byte joins: an attribute's encoded key is cached, and so is a whole string attribute
(the same model and target names come back on every request). The wire format is the one
`opentelemetry-proto` describes (`ExportTraceServiceRequest`); tests/gateway/test_otlp.py
parses what this writes with the generated classes and compares it with the SDK's own
encoding of the same spans.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Span.SpanKind
KIND_SERVER = 2
KIND_CLIENT = 3
# Status.StatusCode
STATUS_UNSET = 0
STATUS_ERROR = 2
# SpanFlags: the span's parent-is-remote bit is known (and, with 0x200, set).
FLAG_HAS_IS_REMOTE = 0x100
FLAG_IS_REMOTE = 0x200

AttributeValue = str | bool | int | float | Sequence[Any]
_CACHE_LIMIT = 4096
_field_cache: dict[tuple[str, AttributeValue], bytes] = {}
_key_cache: dict[str, bytes] = {}
_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_fixed32 = struct.Struct("<I").pack


def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 on the wire: two's complement in ten bytes
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (`tag` is the whole first byte: field << 3 | 2)."""
    return bytes((tag,)) + varint(len(payload)) + payload


def _string(tag: int, text: str) -> bytes:
    # "replace": a lone surrogate is not UTF-8, and a collector would refuse the batch.
    return _len_field(tag, text.encode("utf-8", "replace"))


def _key(key: str) -> bytes:
    encoded = _key_cache.get(key)
    if encoded is None:
        if len(_key_cache) >= _CACHE_LIMIT:
            _key_cache.clear()
        encoded = _key_cache[key] = _string(0x0A, key)  # KeyValue.key = 1
    return encoded


def _any_value(value: AttributeValue) -> bytes:
    # AnyValue: string_value = 1, bool_value = 2, int_value = 3, double_value = 4
    if isinstance(value, str):
        return _string(0x0A, value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + _double(value)
    # A sequence (a resource detector's): ArrayValue (array_value = 5) of AnyValue (values = 1)
    return _len_field(0x2A, b"".join([_len_field(0x0A, _any_value(v)) for v in value]))


def key_value(key: str, value: AttributeValue) -> bytes:
    """One `KeyValue` message, without its own field tag."""
    return _key(key) + _len_field(0x12, _any_value(value))


def attributes(tag: int, attrs: Mapping[str, AttributeValue]) -> bytes:
    return b"".join([_len_field(tag, key_value(k, v)) for k, v in attrs.items()])


def _span_attributes(attrs: Mapping[str, AttributeValue]) -> bytes:
    """A span's attributes (field 9), the request path's hot loop: a string attribute's whole
    field is cached (the same names come back on every request), an integer's is two joins."""
    out = []
    for key, value in attrs.items():
        kind = type(value)
        if kind is str:
            field = _field_cache.get((key, value))
            if field is None:
                if len(_field_cache) >= _CACHE_LIMIT:
                    _field_cache.clear()
                field = _len_field(0x4A, key_value(key, value))
                _field_cache[(key, value)] = field
            out.append(field)
        elif kind is int:
            number = b"\x18" + varint(value)  # type: ignore[arg-type]
            inner = _key(key) + b"\x12" + bytes((len(number),)) + number
            out.append(b"\x4a" + varint(len(inner)) + inner)
        else:
            out.append(_len_field(0x4A, key_value(key, value)))
    return b"".join(out)


def span(
    *,
    trace_id: int,
    span_id: int,
    parent_id: int,
    remote_parent: bool,
    name: str,
    kind: int,
    start_ns: int,
    end_ns: int,
    attrs: Mapping[str, AttributeValue],
    status: int,
) -> bytes:
    """One `Span` message, without its own field tag."""
    parts = [
        b"\x0a\x10" + trace_id.to_bytes(16, "big"),  # trace_id = 1
        b"\x12\x08" + span_id.to_bytes(8, "big"),  # span_id = 2
    ]
    if parent_id:
        parts.append(b"\x22\x08" + parent_id.to_bytes(8, "big"))  # parent_span_id = 4
    parts.append(_string(0x2A, name))  # name = 5
    parts.append(b"\x30" + varint(kind))  # kind = 6
    parts.append(b"\x39" + _fixed64(start_ns))  # start_time_unix_nano = 7
    parts.append(b"\x41" + _fixed64(end_ns))  # end_time_unix_nano = 8
    parts.append(_span_attributes(attrs))  # attributes = 9
    parts.append(b"\x7a\x02\x18\x02" if status == STATUS_ERROR else b"\x7a\x00")  # status = 15
    flags = FLAG_HAS_IS_REMOTE | (FLAG_IS_REMOTE if remote_parent else 0)
    parts.append(b"\x85\x01" + _fixed32(flags))  # flags = 16 (fixed32)
    return b"".join(parts)


def resource(attrs: Mapping[str, AttributeValue]) -> bytes:
    """A `Resource` message (attributes = 1), encoded once per process."""
    return attributes(0x0A, attrs)


def scope(name: str, version: str) -> bytes:
    """An `InstrumentationScope` message (name = 1, version = 2)."""
    return _string(0x0A, name) + (_string(0x12, version) if version else b"")


def export_request(
    resource_bytes: bytes, scope_bytes: bytes, spans: Sequence[bytes] | Iterable[bytes]
) -> bytes:
    """An `ExportTraceServiceRequest` of one resource and one scope holding `spans`."""
    scope_spans = _len_field(0x0A, scope_bytes) + b"".join(
        [_len_field(0x12, s) for s in spans]
    )  # ScopeSpans: scope = 1, spans = 2
    resource_spans = _len_field(0x0A, resource_bytes) + _len_field(0x12, scope_spans)
    return _len_field(0x0A, resource_spans)  # ExportTraceServiceRequest.resource_spans = 1
