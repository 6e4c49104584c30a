"""Interleaved A/B of two ocx checkouts on this machine: CPU per request of one worker.

    python bench/ab.py --a /tmp/ocx-old --b . [--rounds 4] [--duration 5]
        [--points chat:json:1,chat:json:16,chat:stream:16,responses:stream:16]
        [--env-a K=V] [--env-b K=V] [--redis [--budget [a|b]]] [--alerts a|b] [--otlp a|b]
        [--out FILE]

Both instances run side by side (one Daphne worker each, in front of one mock upstream), and
only one is loaded at a time: every round runs each point on A then B, or B then A on odd
rounds, so slow drift of the machine falls on both. `git worktree add /tmp/ocx-old HEAD` gives
a checkout of the last commit; its processes run from that directory (`cwd`), so its code is
what they import. `--alerts b` gives B one alert destination with every event (a webhook to a
loopback receiver in this process), `--otlp b` sets B's `OTEL_EXPORTER_OTLP_ENDPOINT` to that
receiver (it accepts and drops; the posts it got are printed), `--budget b` budgets B's key only.
A single run of `bench/run.py` cannot tell differences of 5-10 % from this
machine's noise; this can, when the ranges do not overlap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


ALERT_EVENTS = [
    "budget",
    "target_cooled",
    "target_recovered",
    "combo_unavailable",
    "quota_low",
    "key_expiring",
    "provider_auth_failed",
]


def receiver() -> tuple[str, dict[str, int]]:
    """A loopback HTTP server that answers every POST 200 and counts them by path (an alert
    webhook, an OTLP/HTTP collector that drops what it gets)."""
    counts: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                counts[self.path] = counts.get(self.path, 0) + 1
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}", counts


def add_alert(t: Any, url: str) -> None:
    body = {"name": "bench", "alert": {"kind": "webhook", "url": url, "events": ALERT_EVENTS}}
    st, got = run.http("PUT", f"{t.base}/api/alerts", body, run.ADMIN_TOKEN)
    assert st == 200, got


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
        "--budget",
        nargs="?",
        const="ab",
        default="",
        choices=["a", "b", "ab"],
        help="with --redis: a key and a user budget (ocx-full); on both sides, or only a or b",
    )
    p.add_argument("--alerts", default="", choices=["a", "b", "ab"], help="alert destination")
    p.add_argument("--otlp", default="", choices=["a", "b", "ab"], help="tracing on")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    points = [
        (a, s == "stream", int(c)) for a, s, c in (x.split(":") for x in args.points.split(","))
    ]
    sink, posts = receiver() if args.alerts or args.otlp else ("", {})
    envs = {"a": pairs(args.env_a), "b": pairs(args.env_b)}
    for side in args.otlp:
        envs[side]["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink
    try:
        mock_proc, mock_base = run.start_mock()
        mock = run.Target("mock", mock_base, mock_proc.pid, None, {})
        a, b = (
            start_from(
                Path(root).resolve(), name, mock_base, args.redis, side in args.budget, envs[side]
            )
            for root, name, side in ((args.a, "ocx-a", "a"), (args.b, "ocx-b", "b"))
        )
        for side in args.alerts:
            add_alert(a if side == "a" else b, f"{sink}/alert")
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
    if posts:
        print(f"receiver got POSTs: {posts}\n")
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
            json.dumps(
                {"args": vars(args), "cpu_ms_per_req": got, "p99_ms": p99, "posts": posts},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
