"""Where a worker's memory goes: its RSS after each point of the matrix, then what holds it.

    python bench/rss_stages.py [--duration 2] [--redis [--budget]] [--server daphne]

One ocx instance (as `bench/run.py` starts it) in front of the mock. After start-up and the
configuration calls, after each wrk point (Chat and Responses, JSON and stream, c = 1/16/64)
and after 64 paced streams, it prints the worker's RSS; at the end the worker's memory by
mapping (`/proc/<pid>/smaps`: the brk heap, anonymous mappings such as Python's 1 MiB arenas
and the threads' malloc arenas, and each shared library). A line that grows from point to
point and stays grown is memory held, not memory in use: find what holds it before you tune
the allocator.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402 - bench/run.py, the harness this reuses


def smaps(pid: int) -> dict[str, float]:
    """RSS in MB by mapping: file mappings by file name, anonymous ones by size class."""
    out: dict[str, float] = {}
    name = ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":") and "-" in parts[0]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                path = parts[5] if len(parts) > 5 else ""
                if path.startswith("/"):
                    name = os.path.basename(path)
                elif path:
                    name = path
                else:
                    name = "[anon, 1 MiB]" if hi - lo == 1 << 20 else "[anon]"
            elif parts[0] == "Rss:":
                out[name] = out.get(name, 0.0) + int(parts[1]) / 1024
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=2.0, help="seconds per wrk point")
    p.add_argument("--redis", action="store_true", help="REDIS_URL set (as ocx-prod)")
    p.add_argument("--budget", action="store_true", help="with --redis: budgets (as ocx-full)")
    p.add_argument("--server", default="daphne")
    args = p.parse_args()
    _, mock_base = run.start_mock()
    t = run.start_ocx("ocx", mock_base, server=args.server, redis=args.redis, budget=args.budget)
    worker = t.workers()[0]

    def show(stage: str) -> None:
        print(f"{stage:32s} {run.rss_bytes([worker]) / 2**20:6.1f} MB", flush=True)

    show("configured, first requests")
    for api in ("chat", "responses"):
        for stream in (False, True):
            for c in (1, 16, 64):
                r = run.wrk(t, api, stream, c, args.duration, [])
                show(f"{api} {'stream' if stream else 'json'} c={c} ({r.get('rps')}/s)")
    run.mock_script(mock_base, {"delta_ms": 10})
    for api in ("chat", "responses"):
        r = run.stream_client(t, api, 64, max(args.duration, 3))
        show(f"64 paced {api} streams")
    held = smaps(worker)
    print(f"\nby mapping (total {sum(held.values()):.1f} MB):")
    for name, mb in sorted(held.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {mb:6.1f}  {name}")
    run.cleanup()


if __name__ == "__main__":
    main()
