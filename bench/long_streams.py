"""Long streams (issue 24): many concurrent paced streams, ocx beside direct and LiteLLM.

    python bench/long_streams.py [--streams 64,256,1024] [--paces 20:500,100:100]
                                 [--skip-litellm] [--no-workers2] [--uvicorn] [--api chat]
                                 [--out FILE]

Starts on 127.0.0.1 the mock upstream, ocx with one Daphne worker (`ocx-1w`, no REDIS_URL),
ocx with `--workers 2` and REDIS_URL (`ocx-w2`), with `--uvicorn` one `--server uvicorn` worker
(`ocx-uv`), and LiteLLM's proxy (one worker), with the helpers of bench/run.py. For each pace (ms between events : events per stream) and each
number of concurrent streams, every target in turn gets that many streams at once, one stream
per connection, from one asyncio client process (`long_streams.py client`, uvloop when
installed). Per point: completed and failed streams (by kind), the target's CPU per event
(every event the client received, of every stream), peak RSS of the whole process tree (ocx's
supervisor included, as LiteLLM's is) and of its largest process, TTFT p50/p99 and event-gap
p99 over every stream started (a stream that failed or timed out counts with what it waited:
a lower bound; definitions in bench/README.md, "Long streams"), plus the client's own CPU so a
saturated client shows. Every system is started afresh (and warmed up) before each of its
points (`--no-fresh`: one instance for the whole run), so no point inherits a previous one's
backlog or heap.

Writes bench/results/long-streams-<stamp>.json (or --out) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402 - bench/run.py: processes, targets, /proc readers
import stream_client as sc  # noqa: E402 - the streaming request

# Per ocx worker; read by providers/upstream.py once OCX_UPSTREAM_MAX_CONNECTIONS lands (issue
# 24). Before that the pool is 64 per provider per worker: stream 65 onwards gets a 502.
OCX_ENV = {"OCX_UPSTREAM_MAX_CONNECTIONS": "4096"}
SATURATED = 0.9  # client CPU seconds per wall second at which the client may be the bottleneck


# --------------------------------------------------------------------------- pure computation


class Gaps:
    """The largest gap between consecutive arrival times (of text events), fed one at a time;
    the times are kept for the gap after the opening burst (`steady_gap`)."""

    __slots__ = ("count", "last", "largest", "times")

    def __init__(self) -> None:
        self.count = 0
        self.last: float | None = None
        self.largest = 0.0
        self.times: list[float] = []

    def see(self, t: float) -> None:
        if self.last is not None:
            self.largest = max(self.largest, t - self.last)
        self.last = t
        self.count += 1
        self.times.append(t)


def steady_gap(times: list[float], settled: float) -> float | None:
    """The largest gap between consecutive times that starts at or after `settled` (the moment
    every stream of the point had its first event: the opening burst is over)."""
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if a >= settled]
    return max(gaps) if gaps else None


# A text-bearing event, found without parsing JSON so the client stays cheap at 1,024 streams:
# Chat `"content": "<something>"` (not "" or null), Responses `response.output_text.delta`.
_CHAT_TEXT = re.compile(rb'"content":\s*"[^"]')


def is_text(api: str, data: bytes) -> bool:
    if api == "chat":
        return _CHAT_TEXT.search(data) is not None
    return b"response.output_text.delta" in data


def is_terminal(api: str, data: bytes) -> bool:
    if api == "chat":
        return data.strip() == b"[DONE]"
    return b"response.completed" in data


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p % of the values at or below it."""
    if not values:
        return None
    xs = sorted(values)
    rank = max(1, -(-len(xs) * p // 100))  # ceil(n * p / 100), at least 1
    return xs[int(rank) - 1]


@dataclass
class Stream:
    """One stream as the client saw it; times in seconds from just before its connect."""

    status: int = 0
    events: int = 0
    ttft: float | None = None  # to the first text event
    max_gap: float | None = None  # largest gap between consecutive text events
    # The same after the opening burst (gaps starting once every stream had its first event).
    steady_gap: float | None = None
    times: list[float] | None = None  # arrival of each text event (perf_counter, absolute)
    complete: bool = False
    failure: str | None = None  # "http_<status>", "timeout", "connect" or "cut"
    last: float | None = None  # the last text event
    ended: float | None = None  # when the stream ended or the client gave up on it


def waited(s: Stream) -> tuple[float | None, float | None]:
    """(TTFT, largest gap) of a stream counted with what it waited: a stream that never sent
    text waited its whole life for the first (its TTFT, and its gap); one that failed after
    text waited from its last text event to its end (when longer than its gaps). For a stream
    that failed these are lower bounds: the client gave up, the wait did not end."""
    if s.failure is None:
        return s.ttft, s.max_gap
    if s.ttft is None:
        return s.ended, s.ended
    tail = None if s.ended is None or s.last is None else s.ended - s.last
    gaps = [g for g in (s.max_gap, tail) if g is not None]
    return s.ttft, max(gaps) if gaps else None


def failure_kind(status: int, complete: bool, error: str | None) -> str | None:
    """Why a stream did not complete, or None when it did.

    A status other than 200 is `http_<status>` (whatever happened after); a timeout is
    `timeout`; an error before the status line is `connect`; a 200 whose body ended (closed,
    reset or finished) without the terminal event is `cut`."""
    if status and status != 200:
        return f"http_{status}"
    if error == "timeout":
        return "timeout"
    if status == 0:
        return "connect"
    return None if complete else "cut"


def summarize(streams: list[Stream]) -> dict[str, Any]:
    """Completed / failed by kind; TTFT p50/p99 and event-gap p50/p99 over every stream, the
    failed ones counted with what they waited (`waited`), and the same over completed streams
    only (`*_completed_ms`, the definition before issue #41) (ms)."""
    done = [s for s in streams if s.failure is None]
    failed: dict[str, int] = {}
    for s in streams:
        if s.failure is not None:
            failed[s.failure] = failed.get(s.failure, 0) + 1
    waits = [waited(s) for s in streams]
    ttft = [t * 1000 for t, _ in waits if t is not None]
    gaps = [g * 1000 for _, g in waits if g is not None]
    ttft_done = [s.ttft * 1000 for s in done if s.ttft is not None]
    gaps_done = [s.max_gap * 1000 for s in done if s.max_gap is not None]
    steady = [s.steady_gap * 1000 for s in done if s.steady_gap is not None]

    def ms(x: float | None) -> float | None:
        return None if x is None else round(x, 1)

    return {
        "streams": len(streams),
        "completed": len(done),
        "failed": dict(sorted(failed.items())),
        "events": sum(s.events for s in streams),
        "events_completed": sum(s.events for s in done),
        "ttft_p50_ms": ms(percentile(ttft, 50)),
        "ttft_p99_ms": ms(percentile(ttft, 99)),
        "gap_p50_ms": ms(percentile(gaps, 50)),
        "gap_p99_ms": ms(percentile(gaps, 99)),
        "gap_max_ms": ms(max(gaps) if gaps else None),
        # A failed stream's figures are lower bounds: how many of them are in the above.
        "censored": len(streams) - len(done),
        "ttft_p99_completed_ms": ms(percentile(ttft_done, 99)),
        "gap_p99_completed_ms": ms(percentile(gaps_done, 99)),
        # After the opening burst: what a stream sees once every stream is running.
        "steady_gap_p50_ms": ms(percentile(steady, 50)),
        "steady_gap_p99_ms": ms(percentile(steady, 99)),
        "steady_streams": len(steady),
    }


def machine_speed() -> float:
    """Seconds for `sum(range(10**7))`, best of 3: how fast this machine runs Python, so that
    runs on different machines can be compared (CPU per event scales with it)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        sum(range(10**7))
        best = min(best, time.perf_counter() - t0)
    return round(best, 3)


def per(amount: float, count: int, scale: float) -> float | None:
    return round(amount * scale / count, 2) if count else None


# --------------------------------------------------------------------------- client


def raise_nofile() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def one_stream(host: str, port: int, request: bytes, api: str, timeout: float) -> Stream:
    s = Stream()
    gaps = Gaps()
    error: str | None = None
    t0 = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    buf = b""

    def feed(data: bytes) -> None:
        nonlocal buf
        now = time.perf_counter()
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.startswith(b"data:"):
                continue
            s.events += 1
            if is_text(api, line):
                gaps.see(now)
                if s.ttft is None:
                    s.ttft = now - t0
            elif is_terminal(api, line[5:]):
                s.complete = True

    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("closed before the status line")
            s.status = int(status_line.split()[1])
            chunked = False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "transfer-encoding":
                    chunked = "chunked" in value.lower()
            if s.status == 200:
                if chunked:
                    while True:
                        size_line = await reader.readline()
                        if not size_line:
                            raise ConnectionError("closed inside a chunked body")
                        size = int(size_line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            break
                        feed((await reader.readexactly(size + 2))[:-2])
                else:
                    while chunk := await reader.read(65536):
                        feed(chunk)
                feed(b"\n")
    except TimeoutError:
        error = "timeout"
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
        error = type(exc).__name__
    finally:
        if writer is not None:
            writer.close()
    s.ended = time.perf_counter() - t0
    s.last = None if gaps.last is None else gaps.last - t0
    s.max_gap = gaps.largest if gaps.count > 1 else None
    s.times = gaps.times
    s.failure = failure_kind(s.status, s.complete, error)
    return s


async def client(args: argparse.Namespace) -> dict[str, Any]:
    host, port, request = sc.build_request(args.url, args.api, args.model, args.key)
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    streams = await asyncio.gather(
        *(one_stream(host, port, request, args.api, args.timeout) for _ in range(args.streams))
    )
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - w0
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    firsts = [s.times[0] for s in streams if s.times]
    settled = max(firsts) if firsts else None
    if settled is not None:
        for s in streams:
            s.steady_gap = steady_gap(s.times or [], settled)
            s.times = None
    out = summarize(list(streams))
    # When the last stream had its first event: the opening burst's length.
    out["settled_ms"] = None if settled is None else round((settled - w0) * 1000, 1)
    out["client"] = {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "cpu_util": round(cpu / wall, 3) if wall else None,
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
    }
    return out


def client_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="long_streams.py client")
    p.add_argument("--url", required=True)
    p.add_argument("--api", choices=("chat", "responses"), default="chat")
    p.add_argument("--model", default="m")
    p.add_argument("--key", default=None)
    p.add_argument("--streams", type=int, required=True)
    p.add_argument("--timeout", type=float, required=True, help="per stream, seconds")
    p.add_argument("--no-uvloop", action="store_true")
    args = p.parse_args(argv)
    raise_nofile()
    loop_factory = None
    if not args.no_uvloop:
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        out = runner.run(client(args))
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


# --------------------------------------------------------------------------- orchestrator


@dataclass
class Instance:
    """A target and how to start it again (an ocx whose target cooled must not carry it on)."""

    target: run.Target
    restart: Any = None
    restarts: int = 0


def stop(t: run.Target) -> None:
    for proc in list(run._procs):
        if proc.pid == t.pid:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            run._procs.remove(proc)


def point(
    t: run.Target,
    api: str,
    streams: int,
    timeout: float,
    mock: run.Target,
    uvloop: bool,
    profile: str | None = None,
) -> dict[str, Any]:
    cmd = [run.PY, str(Path(__file__).resolve()), "client", "--url", t.base + run.PATHS[api]]
    cmd += ["--api", api, "--model", t.models[api], "--streams", str(streams)]
    cmd += ["--timeout", str(timeout)] + ([] if uvloop else ["--no-uvloop"])
    if t.key:
        cmd += ["--key", t.key]
    pids = t.pids()
    mock_pids = mock.pids()
    c0, m0, w0 = run.cpu_seconds(pids), run.cpu_seconds(mock_pids), time.monotonic()
    s0 = run.sched_ns(pids)
    spy = None
    if profile and t.name.startswith("ocx"):
        # py-spy (pip install py-spy): collapsed stacks of the (first) worker, sampled.
        spy = subprocess.Popen(
            [
                "py-spy",
                "record",
                "--nonblocking",
                "-p",
                str(t.workers()[0]),
                "-f",
                "raw",
                "-r",
                os.environ.get("BENCH_SPY_RATE", "100"),
            ]
            + ["-o", f"{profile}-{t.name}-{streams}.txt"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    with run.RssSampler(t.pids, workers_fn=t.workers) as rss:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    wall = time.monotonic() - w0
    cpu, mock_cpu = run.cpu_seconds(pids) - c0, run.cpu_seconds(mock_pids) - m0
    s1 = run.sched_ns(pids)
    try:
        r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (proc.stdout + proc.stderr)[-800:]}
    r["cpu_s"] = round(cpu, 3)
    # Per stream started and per event received: dividing by completed streams only made a
    # system that completes few look expensive per stream and one that completes none free.
    r["cpu_ms_per_stream"] = per(cpu, r["streams"], 1e3)
    r["cpu_us_per_event"] = per(cpu, r["events"], 1e6)
    r["cpu_util"] = round(cpu / wall, 3)
    r["runqueue_wait_share"] = round((s1[1] - s0[1]) / 1e9 / wall, 3)
    if t is not mock:
        r["mock_cpu_us_per_event"] = per(mock_cpu, r["events"], 1e6)
    r["peak_rss_mb"] = round(rss.peak / 2**20, 1)
    r["peak_worker_rss_mb"] = round(rss.peak_worker / 2**20, 1)
    r["client"]["saturated"] = (r["client"]["cpu_util"] or 0) >= SATURATED
    return r


def quiesce(t: run.Target, limit: float = 60.0) -> float:
    """Wait until `t` is idle (under 5 % of a core over 0.5 s), at most `limit` s: a proxy
    still serving streams the client gave up on must not load the next point."""
    w0 = time.monotonic()
    while time.monotonic() - w0 < limit:
        c0 = run.cpu_seconds(t.pids())
        time.sleep(0.5)
        if run.cpu_seconds(t.pids()) - c0 < 0.025:
            break
    return round(time.monotonic() - w0, 1)


def fmt(x: Any) -> str:
    return "–" if x is None else str(x)


def report(res: dict[str, Any]) -> str:
    lines = [
        f"## Long streams ({res['stamp']}, {res['config']['api']}, load "
        f"{res['machine']['loadavg_before']} → {res['machine'].get('loadavg_after', '?')}, "
        f"machine speed {res['machine'].get('speed_s', '?')} s)\n",
        "| pace | streams | target | completed | failed | CPU µs/event | CPU ms/stream | "
        "peak RSS MB: tree / largest process | TTFT p50 / p99 ms (all) | gap p99 ms (all) | "
        "TTFT / gap p99 ms (completed) | burst over at ms | steady gap p50 / p99 ms | "
        "client CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, by_t in res["points"].items():
        pace, n = key.split("|")
        for name, r in by_t.items():
            if "error" in r:
                lines.append(f"| {pace} | {n} | {name} | error: {r['error'][-120:]!r} |")
                continue
            failed = ", ".join(f"{v} × {k}" for k, v in r["failed"].items()) or "0"
            c = r["client"]
            low = "≥ " if r.get("censored") else ""  # failed streams in it: a lower bound
            lines.append(
                f"| {pace} | {n} | {name} | {r['completed']}/{r['streams']} | {failed} | "
                f"{fmt(r['cpu_us_per_event'])} | {fmt(r['cpu_ms_per_stream'])} | "
                f"{r['peak_rss_mb']} / {r['peak_worker_rss_mb']} | "
                f"{fmt(r['ttft_p50_ms'])} / {low}{fmt(r['ttft_p99_ms'])} | "
                f"{low}{fmt(r['gap_p99_ms'])} | "
                f"{fmt(r.get('ttft_p99_completed_ms'))} / {fmt(r.get('gap_p99_completed_ms'))} | "
                f"{fmt(r.get('settled_ms'))} | "
                f"{fmt(r.get('steady_gap_p50_ms'))} / {fmt(r.get('steady_gap_p99_ms'))} | "
                f"{c['cpu_util']}{' **saturated**' if c['saturated'] else ''} |"
            )
    return "\n".join(lines) + "\n"


def parse_paces(text: str) -> list[tuple[int, int]]:
    """`20:500,100:100` → [(20, 500), (100, 100)]: ms between events, events per stream."""
    out = []
    for part in text.split(","):
        ms, _, n = part.partition(":")
        if not ms.strip().isdigit() or not n.strip().isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(f"pace {part!r}: expected MS:EVENTS, e.g. 20:500")
        out.append((int(ms), int(n)))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    p = argparse.ArgumentParser(description="long streams (see bench/README.md)")
    p.add_argument("--streams", default="64,256,1024", help="comma list of concurrent streams")
    p.add_argument(
        "--paces",
        type=parse_paces,
        default=parse_paces("20:500,100:100"),
        help="comma list of MS:EVENTS (ms between events : text deltas per stream)",
    )
    p.add_argument("--api", choices=("chat", "responses"), default="chat")
    p.add_argument("--skip-litellm", action="store_true")
    p.add_argument("--no-workers2", action="store_true", help="skip ocx --workers 2 with Redis")
    p.add_argument(
        "--uvicorn", action="store_true", help="also ocx-uv: one `--server uvicorn` worker"
    )
    p.add_argument("--no-uvloop", action="store_true", help="client on asyncio's own loop")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between points")
    p.add_argument(
        "--no-fresh",
        action="store_true",
        help="one instance of each system for the whole run (default: started afresh and "
        "warmed up before each of its points)",
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="per stream (default 3 × its length + 30 s)"
    )
    p.add_argument("--out", default=None, help="default bench/results/long-streams-<stamp>.json")
    p.add_argument("--nice", type=int, default=0, help="niceness (negative needs root)")
    p.add_argument(
        "--profile", default=None, help="py-spy each ocx worker per point to PREFIX-*.txt"
    )
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.streams.split(",")]
    if args.nice:
        os.nice(args.nice)
    nofile = raise_nofile()  # the mock, ocx and LiteLLM inherit it
    import atexit

    atexit.register(run.cleanup)
    signal.signal(signal.SIGTERM, run._on_signal)
    signal.signal(signal.SIGINT, run._on_signal)
    run.RAW.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    t_start = time.monotonic()

    run.log("starting mock upstream")
    mock_proc, mock_base = run.start_mock()
    mock = run.Target("direct", mock_base, mock_proc.pid, None, {"chat": "m", "responses": "m"})
    instances = [Instance(mock)]

    def ocx(name: str, workers: int, redis: bool, server: str = "daphne") -> Instance:
        inst = Instance(
            run.start_ocx(name, mock_base, workers, redis, server=server, extra_env=OCX_ENV)
        )

        def again() -> None:
            # A new name: a fresh data dir and Redis key prefix, so no cooldown carries over.
            stop(inst.target)
            inst.restarts += 1
            fresh = run.start_ocx(
                f"{name}-r{inst.restarts}",
                mock_base,
                workers,
                redis,
                server=server,
                extra_env=OCX_ENV,
            )
            fresh.name = name
            inst.target = fresh

        inst.restart = again
        return inst

    run.log("starting ocx-1w (1 Daphne worker, no REDIS_URL)")
    instances.append(ocx("ocx-1w", 1, False))
    if args.uvicorn:
        run.log("starting ocx-uv (1 uvicorn worker, no REDIS_URL)")
        instances.append(ocx("ocx-uv", 1, False, server="uvicorn"))
    redis_ok = (
        subprocess.run(
            ["redis-cli", "-u", run.REDIS_URL, "ping"], capture_output=True, text=True
        ).stdout.strip()
        == "PONG"
    )
    if args.no_workers2:
        pass
    elif redis_ok:
        run.log(f"starting ocx-w2 (--workers 2, REDIS_URL={run.REDIS_URL})")
        instances.append(ocx("ocx-w2", 2, True))
    else:
        run.log(f"Redis at {run.REDIS_URL} not answering: no ocx-w2")
    if not args.skip_litellm:
        run.log("starting LiteLLM proxy (1 worker, no database)")
        litellm = Instance(run.start_litellm(mock_base))

        def litellm_again() -> None:
            stop(litellm.target)
            litellm.restarts += 1
            litellm.target = run.start_litellm(mock_base)

        litellm.restart = litellm_again
        instances.append(litellm)

    res: dict[str, Any] = {
        "stamp": stamp,
        "config": {
            "streams": sizes,
            "paces": [{"delta_ms": ms, "deltas": n} for ms, n in args.paces],
            "api": args.api,
            "ocx_env": OCX_ENV,
            "rlimit_nofile": nofile,
            "redis": run.REDIS_URL if redis_ok and not args.no_workers2 else None,
            "uvloop_client": not args.no_uvloop,
            "fresh_per_point": not args.no_fresh,
            # Since issue #41: percentiles over every stream (failed ones with what they
            # waited), CPU per event and per stream started, RSS of the whole tree.
            "definitions": 2,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": run._cpu_model(),
            "loadavg_before": run._loadavg(),
            "speed_s": machine_speed(),
        },
        "git": run.git_info(),
        "versions": run.versions(),
        "targets": [i.target.name for i in instances],
        "points": {},
        "restarts": {},
    }
    run.log("warm-up: 16 unpaced streams per target")
    for inst in instances:
        point(inst.target, args.api, 16, 30, mock, not args.no_uvloop)
    for ms, n_events in args.paces:
        length = ms * n_events / 1000
        timeout = args.timeout or 3 * length + 30
        run.mock_script(mock_base, {"delta_ms": ms, "deltas": n_events})
        for n in sizes:
            key = f"{ms}ms×{n_events}|{n}"
            res["points"][key] = {}
            for inst in instances:
                if not args.no_fresh and inst.restart is not None:
                    # Fresh for this point: nothing left of the previous one (streams it still
                    # serves, a grown heap), then the same warm-up as every system had.
                    inst.restart()
                    run.mock_script(mock_base, {})
                    point(inst.target, args.api, 16, 30, mock, not args.no_uvloop)
                    run.mock_script(mock_base, {"delta_ms": ms, "deltas": n_events})
                t = inst.target
                r = point(t, args.api, n, timeout, mock, not args.no_uvloop, args.profile)
                res["points"][key][t.name] = r
                run.log(
                    f"{key:18s} {t.name:8s} {r.get('completed')}/{n} failed {r.get('failed')} "
                    f"cpu {r.get('cpu_us_per_event')} µs/event  rss {r.get('peak_worker_rss_mb')} MB  "
                    f"ttft p99 {r.get('ttft_p99_ms')}  gap p99 {r.get('gap_p99_ms')}  "
                    f"steady gap p99 {r.get('steady_gap_p99_ms')}  "
                    f"client {(r.get('client') or {}).get('cpu_util')} {r.get('error', '')[:300]}"
                )
                failed = r.get("failed") or "error" in r
                if args.no_fresh and inst.restart is not None and failed:
                    run.log(f"restarting {t.name}: failed streams may have cooled its target")
                    inst.restart()
                time.sleep(args.settle)
                r["quiesce_s"] = quiesce(inst.target)
    run.mock_script(mock_base, {})
    res["restarts"] = {i.target.name: i.restarts for i in instances if i.restarts}
    res["machine"]["loadavg_after"] = run._loadavg()
    res["elapsed_s"] = round(time.monotonic() - t_start, 1)
    md = report(res)
    out = Path(args.out) if args.out else run.RESULTS / f"long-streams-{stamp}.json"
    text = json.dumps(res, indent=1)
    (run.RAW / f"long-streams-{stamp}.json").write_text(text)
    out.write_text(text)
    out.with_suffix(".md").write_text(md)
    print(md)
    run.log(f"done in {res['elapsed_s']} s: {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
