"""The worker's CPU per opening: a burst of new streams, measured before any of them streams.

    python bench/opening_cpu.py [--streams 1024] [--rounds 3] [--a /tmp/ocx-old]

One ocx worker (`ocx-1w`, no Redis) and the mock upstream on 127.0.0.1 (bench/run.py). Each
round opens `--streams` streams at once through the worker (`long_streams.py client`) whose
first event the mock sends only after 5 s, and reads the worker's CPU 4 s after the burst
began: what accepting, parsing, routing, connecting upstream and committing those streams cost,
with nothing else in it (issue #24, eighteenth run). Rounds after the first also show what the
previous round's streams left behind (garbage the collector frees during the next burst).

With `--a DIR` the rounds alternate between that checkout (`a`) and this one (`b`), each with
its own worker, in the order a b b a.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_streams as ls  # noqa: E402 - the paced streaming client and its point
import run  # noqa: E402 - bench/run.py: processes, targets, /proc readers

FIRST_EVENT_MS = 5000
READ_AT_S = 4.0


def rounds(code: Path, streams: int, count: int) -> list[dict[str, Any]]:
    mock_proc, mock_base = run.start_mock()
    mock = run.Target("mock", mock_base, mock_proc.pid, "", {"chat": "m", "responses": "m"})
    saved, run.ROOT = run.ROOT, code  # the worker runs from `code` (as stream_cpu.py's --a)
    try:
        target = run.start_ocx("ocx-1w", mock_base, extra_env={"PYTHONPATH": str(code)})
    finally:
        run.ROOT = saved
    out = []
    try:
        for _ in range(count):
            run.mock_script(mock_base, {"delta_ms": FIRST_EVENT_MS, "deltas": 1})
            pids = target.workers()
            result: dict[str, Any] = {}
            c0 = run.cpu_seconds(pids)
            thread = threading.Thread(
                target=lambda found=result: found.update(
                    ls.point(target, "chat", streams, 60, mock, True)
                )
            )
            thread.start()
            time.sleep(READ_AT_S)
            cpu = run.cpu_seconds(pids) - c0
            thread.join()
            out.append(
                {
                    "us_per_opening": round(cpu / streams * 1e6, 1),
                    "completed": result.get("completed"),
                    "ttft_p99_ms": result.get("ttft_p99_ms"),
                }
            )
            run.log(f"{code}: {out[-1]}")
            ls.quiesce(target)
    finally:
        ls.stop(target)
        mock_proc.terminate()
        mock_proc.wait(timeout=15)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--a", type=Path, help="another checkout, measured interleaved")
    args = p.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    a, b = (args.a, "a"), (here, "b")
    order = [b] if args.a is None else [a, b, b, a]
    results = []
    try:
        for code, name in order:
            for i, r in enumerate(rounds(code.resolve(), args.streams, args.rounds)):
                results.append({"code": name, "round": i, **r})
    finally:
        run.cleanup()
    print(json.dumps({"speed": round(ls.machine_speed(), 3), "results": results}))
    for name in ("a", "b"):
        steady = [r["us_per_opening"] for r in results if r["code"] == name and r["round"] > 0]
        if steady:
            print(f"{name}: µs of worker CPU per opening (rounds after the first): {steady}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
