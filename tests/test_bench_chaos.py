"""bench/chaos.py without running the soak: the fault plan, what counts as refused by ocx,
and the report of a dry run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def chaos() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_chaos", ROOT / "bench" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_of_a_ten_minute_run() -> None:
    assert chaos().plan(10) == [
        (120.0, "redis-stop"),
        (150.0, "redis-start"),
        (270.0, "pg-restart"),
        (390.0, "kill-worker"),
        (480.0, "sighup"),
    ]


def test_short_runs_keep_the_redis_outage_within_a_fifth() -> None:
    events = dict((e, at) for at, e in chaos().plan(1))
    assert events["redis-start"] - events["redis-stop"] == 12.0


def test_what_counts_as_refused_by_ocx() -> None:
    module = chaos()
    outcome = module.soak.Outcome("chat", False, "combo/soak")
    outcome.status, outcome.code = 502, "internal_error"
    assert module.ocx_refused(outcome)
    outcome.code = "ocx_shutting_down"
    assert module.ocx_refused(outcome)
    outcome.status, outcome.code = 429, "rate_limit_exceeded"  # an upstream's answer
    assert not module.ocx_refused(outcome)
    outcome.status, outcome.code, outcome.error = 0, None, "ConnectionRefusedError"
    assert module.ocx_refused(outcome)


def test_dry_run_prints_the_plan_and_a_report() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--dry-run", "--minutes", "10"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert "| redis-stop | 120.0 |" in out
    assert "| sighup | 480.0 |" in out
    assert "| refused because of ocx's own dependencies | 0" in out
    assert "| truncated answers presented as success | 0 |" in out
