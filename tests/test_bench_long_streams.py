"""bench/long_streams.py without running it: the gap, percentile and failure bookkeeping."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def long_streams() -> ModuleType:
    if "bench_long_streams" in sys.modules:
        return sys.modules["bench_long_streams"]
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(
        "bench_long_streams", ROOT / "bench" / "long_streams.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_long_streams"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_largest_gap_between_consecutive_arrivals() -> None:
    gaps = long_streams().Gaps()
    for t in (10.0, 10.1, 10.2, 10.45, 10.5):
        gaps.see(t)
    assert gaps.count == 5
    assert gaps.largest == pytest.approx(0.25)


def test_one_arrival_has_no_gap() -> None:
    gaps = long_streams().Gaps()
    gaps.see(3.0)
    assert (gaps.count, gaps.largest) == (1, 0.0)


def test_nearest_rank_percentile() -> None:
    pct = long_streams().percentile
    xs = [float(x) for x in range(100, 0, -1)]  # 1..100, unsorted
    assert pct(xs, 50) == 50.0
    assert pct(xs, 99) == 99.0
    assert pct(xs, 100) == 100.0
    assert pct([7.0, 1.0], 99) == 7.0  # few values: p99 is the largest
    assert pct([5.0], 1) == 5.0
    assert pct([], 99) is None


def test_failure_kinds() -> None:
    kind = long_streams().failure_kind
    assert kind(200, True, None) is None
    assert kind(502, False, None) == "http_502"
    assert kind(503, False, "timeout") == "http_503"  # the status says why
    assert kind(200, False, "timeout") == "timeout"
    assert kind(0, False, "timeout") == "timeout"
    assert kind(0, False, "ConnectionRefusedError") == "connect"
    assert kind(200, False, "IncompleteReadError") == "cut"
    assert kind(200, False, None) == "cut"  # ended without the terminal event


def test_summary_counts_failures_and_takes_percentiles_over_every_stream() -> None:
    m = long_streams()
    ok = [m.Stream(200, 10, ttft=0.1 * i, max_gap=0.02 + i / 1000) for i in range(1, 5)]
    failed = [
        m.Stream(502, 0, failure="http_502", ended=0.05),
        m.Stream(0, 0, failure="timeout", ended=60.0),  # never a byte: waited 60 s for one
        m.Stream(200, 3, ttft=0.01, max_gap=9.0, failure="cut", last=9.5, ended=9.6),
    ]
    out = m.summarize(ok + failed)
    assert out["streams"] == 7
    assert out["completed"] == 4
    assert out["failed"] == {"cut": 1, "http_502": 1, "timeout": 1}
    assert out["events"] == 43
    assert out["events_completed"] == 40
    # TTFT over all seven: 10, 50, 100, 200, 300, 400, 60000 ms (nearest rank).
    assert (out["ttft_p50_ms"], out["ttft_p99_ms"]) == (200.0, 60000.0)
    # Gaps over all seven: 21..24 ms, the 502's 50, the cut stream's 9 s, the timeout's 60 s.
    assert (out["gap_p50_ms"], out["gap_p99_ms"]) == (24.0, 60000.0)
    assert out["censored"] == 3
    # The definition before issue #41, completed streams only, stays beside.
    assert (out["ttft_p99_completed_ms"], out["gap_p99_completed_ms"]) == (400.0, 24.0)


def test_a_failed_stream_counts_what_it_waited() -> None:
    m = long_streams()
    done = m.Stream(200, 5, ttft=0.2, max_gap=0.1, complete=True, last=2.0, ended=2.1)
    assert m.waited(done) == (0.2, 0.1)  # completed: its own figures
    silent = m.Stream(0, 0, failure="timeout", ended=30.0)
    assert m.waited(silent) == (30.0, 30.0)
    stalled = m.Stream(200, 4, ttft=0.2, max_gap=0.1, failure="timeout", last=1.0, ended=31.0)
    assert m.waited(stalled) == (0.2, 30.0)  # from its last text to the client giving up
    cut = m.Stream(200, 4, ttft=0.2, max_gap=0.5, failure="cut", last=1.0, ended=1.1)
    assert m.waited(cut) == pytest.approx((0.2, 0.5))  # its gaps were longer than its tail
    assert m.waited(m.Stream(502, 0, failure="http_502")) == (None, None)  # nothing known


def test_cpu_per_stream_counts_every_stream_started() -> None:
    m = long_streams()
    # 2 s of CPU over 1,000 streams of which 100 completed: 2 ms each, not 20.
    assert m.per(2.0, 1000, 1e3) == 2.0
    assert m.per(2.0, 0, 1e3) is None


def test_text_and_terminal_events() -> None:
    m = long_streams()
    assert m.is_text("chat", b'data: {"choices":[{"delta":{"content":"hi"}}]}')
    assert m.is_text("chat", b'data: {"choices": [{"delta": {"content": "hi"}}]}')
    assert not m.is_text("chat", b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}')
    assert not m.is_text("chat", b'data: {"choices":[{"delta":{"content":null}}]}')
    assert m.is_text("responses", b'data: {"type":"response.output_text.delta","delta":"x"}')
    assert m.is_terminal("chat", b" [DONE]")
    assert m.is_terminal("responses", b' {"type":"response.completed"}')
    assert not m.is_terminal("chat", b' {"choices":[]}')


def test_paces_flag() -> None:
    m = long_streams()
    assert m.parse_paces("20:500,100:100") == [(20, 500), (100, 100)]
    with pytest.raises(Exception, match="expected MS:EVENTS"):
        m.parse_paces("20")
