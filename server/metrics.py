"""Prometheus metrics (`/metrics`). With several workers, prometheus_client's multiprocess
mode aggregates them (`ocx serve` sets PROMETHEUS_MULTIPROC_DIR)."""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

REQUESTS = Counter(
    "ocx_requests_total",
    "Proxy requests by combo, serving target and status",
    ["combo", "target", "status"],
)
HOPS = Counter("ocx_hops_total", "Failovers to another target, by reason", ["combo", "reason"])
SAME_TARGET_RETRIES = Counter(
    "ocx_same_target_retries_total",
    "Retries of the same target before a hop (retrySameTarget), by reason",
    ["combo", "reason"],
)
COOLDOWNS = Counter("ocx_cooldowns_started_total", "Cooldowns set on a target", ["combo", "target"])
UPSTREAM_LATENCY = Histogram(
    "ocx_upstream_latency_seconds",
    "Upstream attempt duration",
    ["provider"],
    buckets=LATENCY_BUCKETS,
)
UPSTREAM_TTFB = Histogram(
    "ocx_upstream_ttfb_seconds",
    "Upstream time to response headers",
    ["provider"],
    buckets=LATENCY_BUCKETS,
)
PROXY_OVERHEAD = Histogram(
    "ocx_proxy_overhead_seconds",
    "Time spent in ocx outside upstream attempts",
    buckets=OVERHEAD_BUCKETS,
)
MALFORMED_FRAMES = Counter(
    "ocx_malformed_frames_total",
    "Upstream stream frames whose data was not JSON (forwarded in a pass-through stream, "
    "ended a translated one), by provider",
    ["provider"],
)
LOCAL_OVERLOAD = Counter(
    "ocx_local_overload_total",
    "Upstream attempts stopped by ocx's own limits, never counted against the target: "
    "pool_full, fd_limit, no_local_port, no_memory",
    ["cause"],
)
BUFFER_BUDGET_EXCEEDED = Counter(
    "ocx_buffer_budget_exceeded_total",
    "Buffered streams (afterCommit buffer) ended with the safe error because the worker's "
    "OCX_BUFFER_BUDGET_BYTES was in use",
)
OPENINGS_DEFERRED = Counter(
    "ocx_openings_deferred_total",
    "Proxy requests that waited for a later loop pass to start, behind a burst of new "
    "requests (server/turns.py); never refused",
)
REQUEST_LOG_DROPPED = Counter(
    "ocx_request_log_dropped_total", "Request log entries dropped because the queue was full"
)
RECORDS_REJECTED = Counter(
    "ocx_records_rejected_total",
    "Records the database refused alone (written row by row after a batch failed), by writer",
    ["writer"],
)
COOLING = Gauge(
    "ocx_cooldowns_active",
    "Targets cooling right now (set at scrape time)",
    ["combo"],
    multiprocess_mode="mostrecent",
)
QUOTA_STATE = Gauge(
    "ocx_quota_limited",
    "1 while a provider credential is limited by an exhausted quota window",
    ["provider", "credential"],
    multiprocess_mode="max",
)

REDIS_DEGRADED = Gauge(
    "ocx_redis_degraded",
    "1 while a worker routes on its own state because Redis is unreachable",
    multiprocess_mode="livemax",
)
CONFIG_RELOADS = Counter(
    "ocx_config_reloads",
    "Whole reloads of a worker's config snapshot or key map (domain: config, keys)",
    ["domain"],
)
CONFIG_PATCHES = Counter(
    "ocx_config_patches",
    "Config writes a worker applied entry by entry from a notice (domain: config, keys)",
    ["domain"],
)
REDIS_OUTAGES = Counter(
    "ocx_redis_outages", "Times a worker lost Redis and switched to its own state"
)
TRACE_SPANS = Counter(
    "ocx_trace_spans_total",
    "OpenTelemetry spans by what became of them (exported, failed: the collector refused or "
    "was down past the retries, dropped: the export queue was full)",
    ["result"],
)
FROZEN_OBJECTS = Gauge(
    "ocx_worker_frozen_objects",
    "Objects a worker moved out of the garbage collector's sight at start (0: it did not; "
    "the smallest over the living workers)",
    multiprocess_mode="livemin",
)


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
