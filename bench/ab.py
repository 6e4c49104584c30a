"""Interleaved A/B of two ocx checkouts on this machine: CPU per request of one worker.

    python bench/ab.py --a /tmp/ocx-old --b . [--rounds 4] [--duration 5]
        [--points chat:json:1,chat:json:16,chat:stream:16,responses:stream:16]
        [--env-a K=V] [--env-b K=V] [--redis [--budget]] [--out FILE]

Both instances run side by side (one Daphne worker each, in front of one mock upstream), and
only one is loaded at a time: every round runs each point on A then B, or B then A on odd
rounds, so slow drift of the machine falls on both. `git worktree add /tmp/ocx-old HEAD` gives
a checkout of the last commit; its processes run from that directory (`cwd`), so its code is
what they import. A single run of `bench/run.py` cannot tell differences of 5-10 % from this
machine's noise; this can, when the ranges do not overlap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402 - bench/run.py, the harness this reuses


def start_from(
    root: Path, name: str, mock_base: str, redis: bool, budget: bool, env: dict[str, str]
) -> Any:
    saved = run.ROOT
    run.ROOT = root
    try:
        return run.start_ocx(name, mock_base, redis=redis, extra_env=env, budget=budget)
    finally:
        run.ROOT = saved


def pairs(values: list[str]) -> dict[str, str]:
    return dict(v.split("=", 1) for v in values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="checkout A (e.g. a worktree of the last commit)")
    p.add_argument("--b", default=str(run.ROOT), help="checkout B (default: this one)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument(
        "--points", default="chat:json:1,chat:json:16,chat:stream:16,responses:stream:16"
    )
    p.add_argument("--env-a", action="append", default=[], help="K=V for A's processes")
    p.add_argument("--env-b", action="append", default=[], help="K=V for B's processes")
    p.add_argument("--redis", action="store_true", help="both with REDIS_URL (ocx-prod)")
    p.add_argument(
        "--budget", action="store_true", help="with --redis: a key and a user budget (ocx-full)"
    )
    p.add_argument("--out", default=None)
    args = p.parse_args()
    points = [
        (a, s == "stream", int(c)) for a, s, c in (x.split(":") for x in args.points.split(","))
    ]
    try:
        mock_proc, mock_base = run.start_mock()
        mock = run.Target("mock", mock_base, mock_proc.pid, None, {})
        a, b = (
            start_from(Path(root).resolve(), name, mock_base, args.redis, args.budget, pairs(env))
            for root, name, env in (
                (args.a, "ocx-a", args.env_a),
                (args.b, "ocx-b", args.env_b),
            )
        )
        for t in (a, b):  # warm both: connections, caches, first-request imports
            for api, stream, conc in points:
                run.wrk(t, api, stream, conc, 1, [])
        got: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
        p99: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
        for rnd in range(args.rounds):
            order = [("a", a), ("b", b)] if rnd % 2 == 0 else [("b", b), ("a", a)]
            for api, stream, conc in points:
                key = f"{api} {'stream' if stream else 'json'} c={conc}"
                for side, t in order:
                    r = run.wrk(t, api, stream, conc, args.duration, [mock])
                    if "error" in r or r["non2xx"]:
                        raise SystemExit(f"{side} {key}: {r}")
                    got[side].setdefault(key, []).append(r["cpu_ms_per_req"])
                    p99[side].setdefault(key, []).append(r["p99_ms"])
                    run.log(
                        f"round {rnd} {side} {key}: {r['cpu_ms_per_req']} ms/req "
                        f"{r['rps']} req/s p99 {r['p99_ms']} ms"
                    )
    finally:
        run.cleanup()
    for title, data in (("CPU ms/req", got), ("p99 ms", p99)):
        lines = [f"| point | A {title} (median, range) | B | B ÷ A |", "|---|---|---|---|"]
        for key in data["a"]:
            ra, rb = data["a"][key], data["b"][key]
            ma, mb = statistics.median(ra), statistics.median(rb)
            lines.append(
                f"| {key} | {ma:.3f} ({min(ra):.3f}–{max(ra):.3f}) "
                f"| {mb:.3f} ({min(rb):.3f}–{max(rb):.3f}) | {mb / ma:.3f} |"
            )
        print("\n".join(lines) + "\n")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"args": vars(args), "cpu_ms_per_req": got, "p99_ms": p99}, indent=1)
        )


if __name__ == "__main__":
    main()
