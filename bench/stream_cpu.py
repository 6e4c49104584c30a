"""CPU per streamed event of one ocx worker: long paced streams, pass-through and translated.

    python bench/stream_cpu.py [--streams 64] [--events 500] [--delta-ms 20] [--rounds 3]
        [--pairs responses:responses,chat:chat,responses:chat] [--a /tmp/ocx-old] [--out FILE]

Starts `ocx mock-upstream` and one `ocx serve` worker (Daphne, no Redis, the bench config of
bench/run.py: `combo/bench` is an `openai-chat` provider, `combo/bench-r` an
`openai-responses` one), then runs `--streams` concurrent streams of `--events` text deltas,
`--delta-ms` apart, once per pair `client:upstream` (`responses:responses` and `chat:chat` are
pass-through, `responses:chat` is Chat → Responses translation, `chat:responses` the reverse).
It reads the worker's utime+stime from /proc before and after each run and prints the CPU
per event (µs, events = streams × deltas) and per stream (ms).

With `--a DIR`, a second worker runs from checkout DIR (e.g. `git worktree add /tmp/ocx-old
HEAD`) in front of the same mock, and every round runs each pair on A then B (B then A on odd
rounds): an A/B on the same machine under the same conditions. Medians and ranges over rounds.
"""

from __future__ import annotations

import argparse
import atexit
import json
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402 - bench/run.py, the harness this reuses

MODELS = {"chat": "combo/bench", "responses": "combo/bench-r"}


def start_from(root: Path, name: str, mock_base: str) -> run.Target:
    saved = run.ROOT
    run.ROOT = root
    try:
        return run.start_ocx(name, mock_base, extra_env={"PYTHONPATH": str(root)})
    finally:
        run.ROOT = saved


def one_run(
    t: run.Target, client: str, upstream: str, streams: int, events: int, profile: str | None
) -> dict[str, Any]:
    cmd = [
        run.PY,
        str(run.BENCH / "stream_client.py"),
        "--url",
        t.base + run.PATHS[client],
        "--api",
        client,
        "--model",
        MODELS[upstream],
        "-c",
        str(streams),
        "-n",
        str(streams),
        "-d",
        "600",
        "--timeout",
        "120",
    ]
    if t.key:
        cmd += ["--key", t.key]
    workers = t.workers()
    c0 = run.cpu_seconds(workers)
    spy = None
    if profile:
        # py-spy (pip install py-spy): collapsed stacks of the worker (the tree's last process,
        # not the supervisor) while it streams.
        spy = subprocess.Popen(
            ["py-spy", "record", "-p", str(workers[-1]), "-f", "raw", "-r", "200"]
            + ["-o", f"{profile}-{t.name}-{client}-{upstream}.txt"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=30)
    c1 = run.cpu_seconds(workers)
    try:
        r = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (proc.stdout + proc.stderr)[-500:]}
    n = r["complete"]
    cpu = c1 - c0
    return {
        "complete": n,
        "failed": streams - n,
        "cpu_s": round(cpu, 3),
        "us_per_event": round(cpu * 1e6 / (n * events), 1) if n else None,
        "ms_per_stream": round(cpu * 1e3 / n, 2) if n else None,
        "ttft_p99_ms": r["ttft_ms"].get("p99"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--events", type=int, default=500, help="text deltas per stream")
    p.add_argument("--delta-ms", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--pairs", default="responses:responses,chat:chat,responses:chat")
    p.add_argument("--a", default=None, help="checkout A to compare with this one (B)")
    p.add_argument("--out", default=None)
    p.add_argument("--profile", default=None, help="py-spy each run (first round) to PREFIX-*.txt")
    args = p.parse_args()
    atexit.register(run.cleanup)
    signal.signal(signal.SIGTERM, run._on_signal)  # noqa: SLF001
    signal.signal(signal.SIGINT, run._on_signal)  # noqa: SLF001

    _, mock_base = run.start_mock()
    run.mock_script(mock_base, {"deltas": args.events, "delta_ms": args.delta_ms})
    targets: list[run.Target] = []
    if args.a:
        targets.append(start_from(Path(args.a).resolve(), "A", mock_base))
    targets.append(start_from(run.ROOT, "B" if args.a else "ocx", mock_base))
    pairs = [tuple(s.split(":")) for s in args.pairs.split(",")]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rnd in range(args.rounds):
        order = targets if rnd % 2 == 0 else list(reversed(targets))
        for client, upstream in pairs:
            pair = f"{client}:{upstream}"
            for t in order:
                prof = args.profile if rnd == 0 else None
                r = one_run(t, client, upstream, args.streams, args.events, prof)
                results.setdefault(pair, {}).setdefault(t.name, []).append(r)
                run.log(f"round {rnd} {pair:20s} {t.name}: {r}")
    summary: dict[str, dict[str, Any]] = {}
    for pair, by_t in results.items():
        for name, rs in by_t.items():
            us = [r["us_per_event"] for r in rs if r.get("us_per_event") is not None]
            summary.setdefault(pair, {})[name] = {
                "us_per_event_median": round(statistics.median(us), 1) if us else None,
                "us_per_event_range": [min(us), max(us)] if us else None,
                "failed": sum(r.get("failed", 0) for r in rs),
                "runs": rs,
            }
    out = {
        "streams": args.streams,
        "events": args.events,
        "delta_ms": args.delta_ms,
        "rounds": args.rounds,
        "summary": summary,
    }
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print("pair                  target  µs/event (median, range)   failed")
    for pair, by_t in summary.items():
        for name, s in by_t.items():
            print(
                f"{pair:21s} {name:7s} {s['us_per_event_median']!s:8s} "
                f"{s['us_per_event_range']!s:22s} {s['failed']}"
            )


if __name__ == "__main__":
    main()
