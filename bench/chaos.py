"""Chaos soak: the soak's mixed, faulty traffic while ocx's own parts fail (issue 16).

    python bench/chaos.py [--minutes 10] [--concurrency 12] [--out FILE.md] [--dry-run]

Loopback only, bounded. Starts its own `redis-server` and a throwaway PostgreSQL cluster
(`initdb`/`pg_ctl` on free ports, as the tests do: tests/ocxsite/deps.py), the mock upstream
and `ocx serve --workers 3` on them, with the soak's providers, combos, traffic mix and
upstream faults (bench/soak.py). During the run, at fixed shares of its length:

* 20 %: Redis is stopped for 30 s (shorter runs: at most a fifth of the run), then started
  again empty (no persistence);
* 45 %: PostgreSQL is restarted (stopped, 5 s, started);
* 65 %: one worker is killed with SIGKILL;
* 80 %: `ocx serve` gets SIGHUP (the workers are restarted one at a time).

Reported: requests; served; failures explained by an injected upstream fault; unexplained
failures; truncated answers presented as success; requests refused because of ocx's own
dependencies (a 502 `internal_error`, a 503 `ocx_shutting_down`, a refused connection); cut
connections (expected only on the killed worker); time to resync after Redis returns (until
every worker that lost Redis logged that it merged its state back); RSS and open fds of the
workers at the start and the end (the set of worker processes changes on the kill and the
reload, so the totals are compared).

`--dry-run` checks the plan and the report with a tiny fake result, starting nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import run as bench  # noqa: E402  (process helpers)
import soak  # noqa: E402  (traffic, faults, classification)

WORKERS = 3
REDIS_OUTAGE_S = 30.0
PG_DOWN_S = 5.0


def plan(minutes: float) -> list[tuple[float, str]]:
    """(seconds from the start, event) for a run of `minutes`."""
    total = minutes * 60
    outage = min(REDIS_OUTAGE_S, total / 5)
    return sorted(
        [
            (0.20 * total, "redis-stop"),
            (0.20 * total + outage, "redis-start"),
            (0.45 * total, "pg-restart"),
            (0.65 * total, "kill-worker"),
            (0.80 * total, "sighup"),
        ]
    )


def ocx_refused(o: soak.Outcome) -> bool:
    """Refused because of ocx itself, not an upstream: what the issue's target is 0 for."""
    if o.code in ("internal_error", "ocx_shutting_down"):
        return True
    return o.error == "ConnectionRefusedError"  # no worker accepted the connection


def summarize(
    outcomes: list[soak.Outcome],
    attempts: dict[str, list[dict[str, Any]]],
    events: list[dict[str, Any]],
    resources: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    base = soak.classify(outcomes, attempts, args, {}, {}, {}, {}, {}, {}, 0)
    refused = [o for o in outcomes if not o.aborted and ocx_refused(o)]
    cut = [o for o in outcomes if o.error is not None and not ocx_refused(o)]
    by_kind = collections.Counter(f"{o.status} {o.code or o.error}" for o in refused)
    return {
        **base,
        "workers": WORKERS,
        "events": events,
        "refused_by_ocx_total": len(refused),
        "refused_by_ocx_kinds": dict(by_kind.most_common()),
        "cut_or_client_errors_total": len(cut),
        "cut_kinds": dict(collections.Counter(o.error for o in cut).most_common()),
        **resources,
    }


def markdown(r: dict[str, Any], git: dict[str, Any], note: str) -> str:
    c = r["counts"]
    lines = [f"# ocx chaos soak — {dt.date.today().isoformat()}\n"]
    if note:
        lines.append(note + "\n")
    lines += [
        f"`python bench/chaos.py --minutes {r['minutes']:g}` at ocx `{git['rev'][:10]}`"
        f"{' (dirty work tree)' if git['dirty'] else ''}; `ocx serve --workers {r['workers']}` "
        f"on its own Redis and PostgreSQL, {r['concurrency']} concurrent clients, the soak's "
        "upstream faults.\n",
        "| event | at (s) | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {e['event']} | {e['at_s']} | {e.get('detail', '')} |" for e in r["events"]]
    lines += [
        "",
        "| measure | value |",
        "|---|---|",
        f"| requests | {c.get('total', 0)} |",
        f"| served (200, complete) | {c.get('served', 0)} |",
        f"| failures explained by an injected upstream fault | {r['explained_total']} |",
        f"| failures unexplained (includes the rows below) | {r['unexplained_total']} |",
        f"| refused because of ocx's own dependencies | {r['refused_by_ocx_total']} "
        f"{r['refused_by_ocx_kinds'] or ''} |",
        f"| cut connections / client errors | {r['cut_or_client_errors_total']} "
        f"{r['cut_kinds'] or ''} |",
        f"| truncated answers presented as success | {r['truncated_as_success_total']} |",
        f"| client aborts (deliberate) | {c.get('client_aborted', 0)} |",
        f"| time to resync after Redis returned | {r.get('resync_s')} s |",
        f"| degraded spells logged by the workers (all causes) | {r.get('redis_spells_total')} |",
        f"| worker RSS total start → end (MB) | {r.get('rss_mb_start')} → {r.get('rss_mb_end')} |",
        f"| worker open fds total start → end | {r.get('fds_start')} → {r.get('fds_end')} |",
        f"| workers alive at the end | {r.get('workers_end')} |",
        f"| longest request | {r['longest_request_s']} s |",
    ]
    if r["unexplained_samples"]:
        lines += ["\n## Unexplained failures (first 15)\n", "```json"]
        lines += [json.dumps(x) for x in r["unexplained_samples"]] + ["```"]
    if r["truncated_as_success_samples"]:
        lines += ["\n## Truncated presented as success (first 15)\n", "```json"]
        lines += [json.dumps(x) for x in r["truncated_as_success_samples"]] + ["```"]
    return "\n".join(lines) + "\n"


def _workers(pid: int) -> list[int]:
    return [p for p in bench.tree(pid) if p != pid]


def _log_lines(needle: str) -> int:
    return sum(
        p.read_text(errors="replace").count(needle) for p in bench._tmp.glob("ocx-chaos-*.log")
    )


async def chaos(args: argparse.Namespace) -> dict[str, Any]:
    from tests.ocxsite.deps import PgCluster, RedisServer

    rng = random.Random(args.seed)
    redis_server, pg = RedisServer(), PgCluster()
    redis_server.start()
    pg.start()
    try:
        return await _run(args, rng, redis_server, pg)
    finally:
        redis_server.close()
        pg.close()


async def _run(args: argparse.Namespace, rng: random.Random, redis_server: Any, pg: Any) -> Any:
    mock_proc = bench.start(
        [bench.PY, "-m", "mockupstream", "--port", "0", "--log-limit", "20000"],
        name="mock",
    )
    mock_base = bench.read_line(mock_proc, "listening on", 20).rsplit(" ", 1)[-1]
    env = {
        "OCX_DATA_DIR": str(bench._tmp / "chaos-data"),
        "OCX_ADMIN_TOKEN": bench.ADMIN_TOKEN,
        "REDIS_URL": redis_server.url,
        "DATABASE_URL": pg.url,
        "OCX_STATE_KEY_PREFIX": "ocxchaos",
        "OCX_SHUTDOWN_GRACE_S": "10",
        "PYTHONUNBUFFERED": "1",
    }
    port = bench.free_port()
    proc = bench.start(
        [bench.PY, "-m", "ocxsite.cli", "serve", "--port", str(port), "--workers", str(WORKERS)],
        env,
        "ocx-chaos",
    )
    bench.read_line(proc, "ocx listening on", 90)
    base = f"http://127.0.0.1:{port}"
    a = bench.ADMIN_TOKEN
    for pname, adapter in (("mock", "openai-chat"), ("mockr", "openai-responses")):
        provider = {
            "adapter": adapter,
            "baseUrl": f"{mock_base}/v1",
            "apiKey": bench.UPSTREAM_KEY,
            "timeouts": soak.TIMEOUTS,
        }
        st, b = bench.http("PUT", f"{base}/api/providers", {"name": pname, "provider": provider}, a)
        assert st == 200, b
    for cid, prov in (("soak", "mock"), ("soak-r", "mockr")):
        targets = [{"provider": prov, "model": "a"}, {"provider": prov, "model": "b"}]
        st, b = bench.http(
            "PUT", f"{base}/api/combos", {"id": cid, "combo": {"targets": targets}}, a
        )
        assert st == 200, b
    st, b = bench.http("POST", f"{base}/api/keys", {"user": "chaos"}, a)
    key = b["key"]
    time.sleep(1.5)

    def rescript() -> None:
        soak.post_json(
            f"{mock_base}/_mock/script",
            [
                {"model": "a", "steps": soak.steps(rng, 0.15), "then": {"deltas": 8}},
                {"model": "b", "steps": soak.steps(rng, 0.05), "then": {"deltas": 8}},
            ],
        )

    attempts: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    last_seq = [0]

    def pull_log() -> None:
        for e in soak.get_json(f"{mock_base}/_mock/log?since={last_seq[0]}"):
            last_seq[0] = max(last_seq[0], e["seq"])
            rid = (e.get("headers") or {}).get("x-request-id")
            if rid:
                attempts[rid].append(
                    {"model": e.get("model"), "behaviour": e.get("behaviour") or {}}
                )

    rescript()
    warm = [soak.one("127.0.0.1", port, key, "chat", s, "combo/soak", False) for s in (1, 0) * 6]
    await asyncio.gather(*warm)
    await asyncio.to_thread(pull_log)
    attempts.clear()
    workers_start = _workers(proc.pid)
    rss_start = bench.rss_bytes(workers_start)
    fds_start = sum(soak.fd_count(p) for p in workers_start)
    outcomes: list[soak.Outcome] = []
    events: list[dict[str, Any]] = []
    started = time.monotonic()
    stop_at = started + args.minutes * 60
    weights = [w for w, *_ in soak.MIX]
    resync: dict[str, float] = {}

    async def client(i: int) -> None:
        crng = random.Random(args.seed * 1000 + i)
        while time.monotonic() < stop_at:
            _, api, stream, model = crng.choices(soak.MIX, weights)[0]
            abort = stream and crng.random() < soak.ABORT_SHARE
            try:
                o = await asyncio.wait_for(
                    soak.one("127.0.0.1", port, key, api, stream, model, abort),
                    soak.CLIENT_TIMEOUT_S,
                )
            except TimeoutError:
                o = soak.Outcome(api, stream, model)
                o.error, o.elapsed = "client_timeout", soak.CLIENT_TIMEOUT_S
            outcomes.append(o)
            await asyncio.sleep(0.25 if o.status in (429, 503) else crng.random() * 0.02)

    async def housekeeping() -> None:
        n = 0
        while time.monotonic() < stop_at:
            await asyncio.sleep(2)
            n += 1
            await asyncio.to_thread(pull_log)
            if n % 10 == 0:
                await asyncio.to_thread(rescript)
                bench.log(f"chaos: {len(outcomes)} requests so far")

    async def faults() -> None:
        marks = (0, 0)
        for at, event in plan(args.minutes):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            detail = ""
            if event == "redis-stop":
                # Counted from here: a worker may also have had a short spell of its own before.
                marks = (_log_lines("redis unavailable"), _log_lines("redis available again"))
                await asyncio.to_thread(redis_server.stop)
            elif event == "redis-start":
                lost = _log_lines("redis unavailable") - marks[0]
                await asyncio.to_thread(redis_server.start)
                back = time.monotonic()
                while (
                    _log_lines("redis available again") - marks[1] < lost
                    and time.monotonic() < stop_at
                ):
                    await asyncio.sleep(0.1)
                resync["s"] = round(time.monotonic() - back, 2)
                detail = f"{lost} worker(s) had lost Redis; all merged back in {resync['s']} s"
            elif event == "pg-restart":
                await asyncio.to_thread(pg.stop)
                await asyncio.sleep(PG_DOWN_S)
                await asyncio.to_thread(pg.start)
                detail = f"down {PG_DOWN_S:g} s"
            elif event == "kill-worker":
                victim = sorted(_workers(proc.pid))[0]
                os.kill(victim, signal.SIGKILL)
                detail = f"pid {victim}"
            elif event == "sighup":
                proc.send_signal(signal.SIGHUP)
            events.append(
                {"event": event, "at_s": round(time.monotonic() - started, 1), "detail": detail}
            )
            bench.log(f"chaos: {event} {detail}")

    await asyncio.gather(faults(), housekeeping(), *(client(i) for i in range(args.concurrency)))
    await asyncio.sleep(3)
    await asyncio.to_thread(pull_log)
    workers_end = _workers(proc.pid)
    resources = {
        "redis_spells_total": _log_lines("redis unavailable"),
        "resync_s": resync.get("s"),
        "rss_mb_start": round(rss_start / 2**20, 1),
        "rss_mb_end": round(bench.rss_bytes(workers_end) / 2**20, 1),
        "fds_start": fds_start,
        "fds_end": sum(soak.fd_count(p) for p in workers_end),
        "workers_end": len(workers_end),
    }
    return summarize(outcomes, attempts, events, resources, args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="ocx chaos soak (see the module docstring)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", default=None)
    p.add_argument("--note", default="", help="a line for the report (e.g. machine load)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and a sample report")
    args = p.parse_args(argv)
    if args.dry_run:
        fake = soak.Outcome("chat", True, "combo/soak")
        fake.rid, fake.status, fake.complete = "r1", 200, True
        r = summarize(
            [fake], {}, [{"event": e, "at_s": at} for at, e in plan(args.minutes)], {}, args
        )
        print(markdown(r, {"rev": "dry-run", "dirty": False}, "dry run: nothing was started"))
        return 0
    import atexit

    atexit.register(bench.cleanup)
    signal.signal(signal.SIGTERM, bench._on_signal)
    signal.signal(signal.SIGINT, bench._on_signal)
    bench.RAW.mkdir(parents=True, exist_ok=True)
    r = asyncio.run(chaos(args))
    md = markdown(r, bench.git_info(), args.note)
    stamp = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    out = Path(args.out) if args.out else bench.RESULTS / f"chaos-{stamp}.md"
    out.write_text(md)
    (bench.RAW / f"chaos-{stamp}.json").write_text(json.dumps(r, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
