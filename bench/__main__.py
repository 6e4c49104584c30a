"""One entry point for every benchmark: `python -m bench <question> [its options]`.

    python -m bench                       # the questions, each with its script
    python -m bench long-streams --help   # a question's own options
    python -m bench matrix --quick

Each question runs its script (bench/<script>.py) as if started directly, with the rest of the
command line: the scripts keep their logic and options; this only names them by what they
answer. bench/README.md has the same table with the last figures of each.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# question -> (script, what it answers)
QUESTIONS: dict[str, tuple[str, str]] = {
    "matrix": (
        "run.py",
        "CPU per request, req/s, latency, TTFT, RSS: direct vs ocx vs LiteLLM (wrk)",
    ),
    "ab": ("ab.py", "did a change cost CPU per request? (two checkouts, interleaved)"),
    "long-streams": (
        "long_streams.py",
        "64-1,024 concurrent paced streams: completed, TTFT, gaps, CPU/event, RSS vs LiteLLM",
    ),
    "stream-cpu": ("stream_cpu.py", "worker CPU per streamed event (pass-through, translated)"),
    "opening-cpu": ("opening_cpu.py", "worker CPU per stream opened, a burst of 1,024"),
    "relay-micro": ("relay_micro.py", "Python cost of relaying one event, in isolation"),
    "config-size": (
        "config_size.py",
        "10 vs 10,000 keys, 5 vs 500 combos: write -> served, worker CPU per write, admin",
    ),
    "config-write-profile": ("config_write_profile.py", "where one config write's CPU goes"),
    "propagation": ("propagation.py", "write -> visible on every worker (Redis notice)"),
    "redis-roundtrip": ("redis_roundtrip.py", "CPU of one request-path Redis call, by layer"),
    "requestlog-writer": ("requestlog_writer.py", "request-log writer CPU per row"),
    "rss-stages": ("rss_stages.py", "a worker's RSS after each point, then by mapping"),
    "body-limits": ("body_limits.py", "a worker's memory under oversized bodies without a key"),
    "dashboard": ("dashboard.py", "admin dashboard render time with 1M request-log rows"),
    "soak": ("soak.py", "minutes of mixed traffic with faults: unexplained failures, RSS growth"),
    "chaos": ("chaos.py", "the soak while Redis, PostgreSQL and workers are taken away"),
    "tracing-micro": (
        "tracing_micro.py",
        "CPU of a traced request's two spans, ocx's tracer against the SDK's",
    ),
    "ttft": ("stream_client.py", "TTFB / TTFT of streaming requests to one URL"),
}


def usage() -> str:
    width = max(map(len, QUESTIONS))
    rows = "\n".join(
        f"  {q:<{width}}  {what}  (bench/{script})" for q, (script, what) in QUESTIONS.items()
    )
    return (
        f"usage: python -m bench <question> [options]   (--help after one: its options)\n\n{rows}\n"
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0
    question, rest = argv[0], argv[1:]
    if question not in QUESTIONS:
        print(f"bench: no question {question!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    script = BENCH / QUESTIONS[question][0]
    sys.argv = [str(script), *rest]
    sys.path.insert(0, str(BENCH))  # the scripts import each other (`import run`)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
