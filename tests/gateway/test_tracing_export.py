"""gateway/tracing.py below the server: the standard OTEL_* variables as the Python SDK reads
them, the sampler decided as the SDK decides it, a caller's `traceparent`, and the export
thread's batches, retries, compression, headers and bounded queue against a real receiver."""

from __future__ import annotations

import gzip
import random
import socket
import time

import pytest

from gateway import otlp, tracing
from server import metrics
from tests.alerts.receiver import Receiver

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace.sampling import (  # noqa: E402
    ParentBased,
    TraceIdRatioBased,
)
from opentelemetry.trace import (  # noqa: E402
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    set_span_in_context,
)


def test_settings_read_the_standard_variables_like_the_sdk() -> None:
    s = tracing.settings_from(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "Api-Key=secret%20value,x-team=ocx",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
            "OTEL_BSP_SCHEDULE_DELAY": "250",
            "OTEL_BSP_MAX_QUEUE_SIZE": "100",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "400",
        }
    )
    assert s.endpoint == "http://collector:4318/v1/traces"
    assert s.headers == {"api-key": "secret value", "x-team": "ocx"}
    assert (s.timeout_s, s.compression, s.sampler, s.ratio) == (3.0, "gzip", s.sampler, 0.25)
    assert s.sampler == "parentbased_traceidratio"
    assert (s.schedule_delay_s, s.max_queue, s.max_batch) == (0.25, 100, 100)


def test_the_traces_variables_win_and_bad_values_fall_back() -> None:
    s = tracing.settings_from(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c.example/custom/path",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "soon",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "brotli",
            "OTEL_TRACES_SAMPLER": "sometimes",
            "OTEL_BSP_SCHEDULE_DELAY": "x",
        }
    )
    assert s.endpoint == "https://c.example/custom/path"
    assert (s.timeout_s, s.compression, s.sampler) == (10.0, "", "parentbased_always_on")
    assert (s.schedule_delay_s, s.max_queue, s.max_batch) == (5.0, 2048, 512)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 1.0])
def test_ratio_sampling_decides_as_the_sdk_decides(ratio: float) -> None:
    ours = tracing.Sampler("traceidratio", ratio)
    sdk = TraceIdRatioBased(ratio)
    rng = random.Random(7)
    ids = [rng.getrandbits(128) or 1 for _ in range(2000)]
    got = [ours.sampled(t, None) for t in ids]
    assert got == [sdk.should_sample(None, t, "n").decision.is_sampled() for t in ids]
    if 0 < ratio < 1:
        assert 0 < sum(got) < len(ids)


@pytest.mark.parametrize("parent_sampled", [True, False])
def test_parent_based_follows_the_callers_flag_as_the_sdk_does(parent_sampled: bool) -> None:
    ours = tracing.Sampler("parentbased_traceidratio", 0.5)
    sdk = ParentBased(TraceIdRatioBased(0.5))
    rng = random.Random(3)
    for _ in range(200):
        trace_id = rng.getrandbits(128) or 1
        parent = NonRecordingSpan(
            SpanContext(trace_id, 5, is_remote=True, trace_flags=TraceFlags(int(parent_sampled)))
        )
        expected = sdk.should_sample(set_span_in_context(parent), trace_id, "n").decision
        assert ours.sampled(trace_id, parent_sampled) is expected.is_sampled()
    # Not parent-based: the sampler decides, whatever the caller's flag.
    assert tracing.Sampler("always_on", 1.0).sampled(1, False) is True
    assert tracing.Sampler("always_off", 1.0).sampled(1, True) is False
    assert tracing.Sampler("parentbased_always_off", 1.0).sampled(1, None) is False
    assert tracing.Sampler("parentbased_always_off", 1.0).sampled(1, True) is True


def test_the_default_sampler_samples_every_root_span() -> None:
    sampler = tracing.Sampler(tracing.settings_from({}).sampler, 1.0)
    rng = random.Random(5)
    assert all(sampler.sampled(rng.getrandbits(128), None) for _ in range(500))


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True),
        ),
        (
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, False),
        ),
        # A later version may append fields; version 00 may not.
        (
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz",
            (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, True),
        ),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz", None),
        (b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
        (b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", None),
        (b"00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),
        (b"00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01", None),
        (b"garbage", None),
    ],
)
def test_traceparent(header: bytes, parsed: tuple[int, int, bool] | None) -> None:
    assert tracing.parse_traceparent(header) == parsed


def exporter(collector_url: str, backoff_s: float = 0.01, **env: str) -> tracing.Exporter:
    settings = tracing.settings_from({"OTEL_EXPORTER_OTLP_ENDPOINT": collector_url, **env})
    return tracing.Exporter(
        settings,
        otlp.resource({"service.name": "ocx"}),
        otlp.scope("ocx", "9"),
        backoff_s=backoff_s,
    )


def encoded(n: int) -> bytes:
    return otlp.span(
        trace_id=1,
        span_id=n,
        parent_id=0,
        remote_parent=False,
        name=f"chat s{n}",
        kind=otlp.KIND_SERVER,
        start_ns=1,
        end_ns=2,
        attrs={"ocx.outcome": "ok"},
        status=otlp.STATUS_UNSET,
    )


def names(body: bytes) -> list[str]:
    request = ExportTraceServiceRequest.FromString(body)
    return [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def counted(result: str) -> float:
    return metrics.TRACE_SPANS.labels(result)._value.get()


def test_batches_of_the_configured_size_with_headers_and_gzip(collector: Receiver) -> None:
    exp = exporter(
        collector.url,
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2",
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20vendor-key",
        OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
    )
    before = counted("exported")
    for n in range(1, 6):
        exp.add(encoded(n))
    exp.flush()
    posts = collector.received
    assert [r.path for r in posts] == ["/v1/traces"] * 3
    assert posts[0].headers["content-encoding"] == "gzip"
    assert posts[0].headers["content-type"] == "application/x-protobuf"
    assert posts[0].headers["authorization"] == "Bearer vendor-key"
    assert [names(gzip.decompress(r.body)) for r in posts] == [
        ["chat s1", "chat s2"],
        ["chat s3", "chat s4"],
        ["chat s5"],
    ]
    assert counted("exported") - before == 5
    assert not exp.queue


def test_a_refusing_collector_is_retried_with_backoff_until_it_takes_the_batch(
    collector: Receiver,
) -> None:
    collector.statuses = [503, 429, 502]
    exp = exporter(collector.url)
    exp.add(encoded(1))
    exp.flush()
    assert collector.attempts == 4
    assert [names(r.body) for r in collector.received] == [["chat s1"]]


def test_a_bad_request_is_not_retried_and_counts_as_failed(
    collector: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    collector.statuses = [400]
    exp = exporter(collector.url, OTEL_EXPORTER_OTLP_HEADERS="api-key=never-logged-9d8c")
    before = counted("failed")
    exp.add(encoded(1))
    exp.add(encoded(2))
    exp.flush()
    assert collector.attempts == 1 and not collector.received
    assert counted("failed") - before == 2
    assert "OTLP export failed (HTTP 400)" in caplog.text
    assert "never-logged-9d8c" not in caplog.text


def test_a_collector_that_is_down_costs_only_its_spans_within_the_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    exp = exporter(f"http://127.0.0.1:{port}", OTEL_EXPORTER_OTLP_TIMEOUT="0.3")
    before = counted("failed")
    exp.add(encoded(1))
    exp.flush()
    assert counted("failed") - before == 1
    assert not exp.queue


def test_an_exiting_worker_waits_for_one_failed_post_not_one_per_batch() -> None:
    posts: list[bytes] = []

    def refused(body: bytes) -> int:
        posts.append(body)
        return 503

    settings = tracing.settings_from(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2"}
    )
    exp = tracing.Exporter(settings, b"", b"", post=refused, backoff_s=0.01)
    before = counted("failed")
    for n in range(1, 6):
        exp.add(encoded(n))
    exp.shutdown()
    assert len(posts) == 1  # stopping: no retry, and the other batches are not tried
    assert counted("failed") - before == 5
    assert not exp.queue


def test_a_full_queue_drops_and_counts_what_overflows(collector: Receiver) -> None:
    exp = exporter(collector.url, OTEL_BSP_MAX_QUEUE_SIZE="3")
    before = counted("dropped")
    for n in range(1, 6):
        exp.add(encoded(n))
    assert (len(exp.queue), exp.dropped, counted("dropped") - before) == (3, 2, 2)
    exp.flush()
    assert names(collector.received[0].body) == ["chat s1", "chat s2", "chat s3"]


def test_the_thread_exports_on_its_schedule_and_when_a_batch_is_full(collector: Receiver) -> None:
    exp = exporter(
        collector.url, OTEL_BSP_SCHEDULE_DELAY="60000", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2"
    )
    exp.start()
    try:
        exp.add(encoded(1))
        exp.add(encoded(2))  # a full batch wakes the thread long before its minute
        collector.wait_for(1, timeout=10)
        assert names(collector.received[0].body) == ["chat s1", "chat s2"]
        for n in range(3, 8):
            exp.add(encoded(n))
        collector.wait_for(3, timeout=10)
        assert [names(r.body) for r in collector.received[1:]] == [
            ["chat s3", "chat s4"],
            ["chat s5", "chat s6"],
        ]
        time.sleep(0.3)
        # Not a post per span that trickles in: the last one waits for the schedule (or a flush).
        assert collector.attempts == 3 and list(exp.queue) == [encoded(7)]
    finally:
        exp.shutdown()
