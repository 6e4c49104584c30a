"""Soak test: ocx `--workers 2` sharing Redis, mixed traffic, random mock faults.

    python bench/soak.py [--minutes 10] [--warmup-s 60] [--concurrency 12] [--out FILE.md]

Starts (127.0.0.1 only) the mock upstream and `ocx serve --workers 2` with REDIS_URL, two chat
targets `mock/a` (primary, ~15 % of its attempts get a fault) and `mock/b` (secondary, ~5 %),
the same pair behind an `openai-responses` provider, and combos `soak` / `soak-r` that fail
over a -> b. The faults are the PRODUCT.md §10 list (429 with/without Retry-After, 500, 503,
reset, no response, slow first byte, stream cut, stall, malformed chunk, missing terminal
event, context overflow, content filter, failure after output, usage limit), drawn at random
and re-scripted every 20 s. Traffic: Chat and Responses, streaming and not, through the combos
and straight to `mock/a` (no failover), plus a few clients that go away mid-stream.

Every request carries ocx's `x-ocx-request-id`; ocx forwards it upstream as `x-request-id`,
so each client outcome is joined with the mock's attempt log:
* served: 200 and complete (terminal event / valid JSON with text);
* explained failure: an error status or an in-stream error event, where the mock log shows a
  fault on an attempt of that request, or a 503/429 from cooled-down targets;
* unexplained failure: everything else that failed (connection errors, failures with only
  healthy attempts upstream);
* truncated-as-success: a 200 that ended cleanly but without the terminal event (or with
  unparseable JSON) and without an error event — the thing ocx must never do.
At the end: RSS per worker at start (taken after --warmup-s seconds of the same traffic, so
the growth is the steady state's, not first-use allocations) and end, open fds, upstream
connections held, and the longest request against the configured bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import os
import random
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (process helpers)

TIMEOUTS = {"connectMs": 2000, "firstByteMs": 3000, "idleMs": 3000, "totalMs": 30000}
# The documented bound of one attempt is totalMs (a stalled non-streaming body is cut by it);
# failover before commit adds at most 2 more attempts that wait out firstByteMs, plus
# Retry-After sleeps of <= 1 s here. Anything longer is a hang.
BOUND_S = TIMEOUTS["totalMs"] / 1000 + 2 * TIMEOUTS["firstByteMs"] / 1000 + 2
CLIENT_TIMEOUT_S = 60.0

FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("429+retry-after", {"status": 429, "headers": {"Retry-After": "1"}}),
    ("429", {"status": 429}),
    ("500", {"status": 500}),
    ("503", {"status": 503}),
    ("reset", {"reset": True}),
    ("no_response", {"no_response": True}),
    ("slow_first_byte", {"delay_first_byte_ms": 1500}),
    ("cut", {"cut_after_events": 5}),
    ("stall_1s", {"stall_after_events": 3, "stall_ms": 1000}),
    ("stall_forever", {"stall_after_events": 3}),
    ("malformed", {"malformed_after_events": 2}),
    ("omit_done", {"omit_done": True}),
    (
        "context_overflow",
        {
            "status": 400,
            "body": {
                "error": {
                    "code": "context_length_exceeded",
                    "message": "too long",
                    "type": "invalid_request_error",
                }
            },
        },
    ),
    (
        "content_filter",
        {
            "status": 400,
            "body": {
                "error": {
                    "code": "content_filter",
                    "message": "blocked",
                    "type": "invalid_request_error",
                }
            },
        },
    ),
    ("fail_after_output", {"fail": "after_output"}),
    ("usage_limit", {"usage_limit": {"resets_in_seconds": 5}}),
]
BENIGN = {"deltas", "delta_ms", "usage", "text", "headers", "rate_limits"}
MIX = [  # (weight, api, stream, model)
    (30, "chat", True, "combo/soak"),
    (20, "chat", False, "combo/soak"),
    (15, "responses", True, "combo/soak-r"),
    (10, "responses", False, "combo/soak-r"),
    (8, "chat", True, "mock/a"),
    (7, "chat", False, "mock/a"),
    (5, "responses", True, "combo/soak"),  # Responses client through the chat provider (translated)
    (5, "chat", True, "combo/soak-r"),  # Chat client through the Responses provider (translated)
]
ABORT_SHARE = 0.02


def steps(rng: random.Random, fault_share: float, n: int = 300) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        if rng.random() < fault_share:
            out.append({"deltas": 8, **rng.choice(FAULTS)[1]})
        else:
            out.append({"deltas": 8})
    return out


def is_fault(behaviour: dict[str, Any]) -> bool:
    if behaviour.get("status", 200) != 200:
        return True
    return (
        any(k not in BENIGN and k != "status" for k in behaviour)
        or behaviour.get("auth") == "rejected"
    )


def fault_name(behaviour: dict[str, Any]) -> str:
    for name, b in FAULTS:
        if all(behaviour.get(k) == v for k, v in b.items()):
            return name
    return json.dumps(behaviour, sort_keys=True)[:60]


class Outcome:
    __slots__ = (
        "rid",
        "api",
        "stream",
        "model",
        "status",
        "complete",
        "error_event",
        "clean_end",
        "error",
        "elapsed",
        "aborted",
        "code",
        "text_ok",
    )

    def __init__(self, api: str, stream: bool, model: str) -> None:
        self.api, self.stream, self.model = api, stream, model
        self.rid = ""
        self.status = 0
        self.complete = False
        self.error_event = False
        self.clean_end = False
        self.error: str | None = None
        self.elapsed = 0.0
        self.aborted = False
        self.code: str | None = None
        self.text_ok = False


async def one(
    host: str, port: int, key: str, api: str, stream: bool, model: str, abort: bool
) -> Outcome:
    o = Outcome(api, stream, model)
    body = {"model": model, "stream": stream, **bench_bodies()[api]}
    raw = json.dumps(body).encode()
    req = (
        f"POST {bench.PATHS[api]} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nConnection: close\r\nContent-Length: {len(raw)}\r\n\r\n"
    ).encode() + raw
    t0 = time.monotonic()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(req)
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("closed before status line")
        o.status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            n, _, v = line.decode("latin-1").partition(":")
            headers[n.strip().lower()] = v.strip()
        o.rid = headers.get("x-ocx-request-id", "")
        data = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readline()
                if not size_line:
                    raise ConnectionError("connection closed inside chunked body")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    o.clean_end = True
                    break
                data += (await reader.readexactly(size + 2))[:-2]
                if abort and data:
                    o.aborted = True
                    return o
        elif "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
            o.clean_end = True
        else:
            data = await reader.read()
            o.clean_end = True
        text = data.decode("utf-8", "replace")
        if o.status != 200:
            try:
                err = json.loads(text)["error"]
                o.code = str(err.get("code") or err.get("type"))
            except (ValueError, KeyError, TypeError, AttributeError):
                o.code = "non-json-error-body"
        elif stream:
            parse_stream(o, text)
        else:
            try:
                obj = json.loads(text)
                if api == "chat":
                    content = obj["choices"][0]["message"].get("content") or ""
                else:
                    content = "".join(
                        c.get("text", "")
                        for item in obj.get("output", [])
                        for c in item.get("content", []) or []
                    )
                o.complete = True
                o.text_ok = content.startswith("mock reply from")
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                o.complete = False
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        o.error = type(exc).__name__
    finally:
        o.elapsed = time.monotonic() - t0
        if writer is not None:
            writer.close()
    return o


def parse_stream(o: Outcome, text: str) -> None:
    pieces: list[str] = []
    for line in text.splitlines():
        if line.startswith("event:") and any(
            x in line for x in ("response.failed", "response.incomplete", "error")
        ):
            o.error_event = True
        if not line.startswith("data:"):
            continue
        d = line[5:].strip()
        if d == "[DONE]":
            o.complete = o.api == "chat"
            continue
        try:
            obj = json.loads(d)
        except ValueError:
            continue
        if isinstance(obj, dict):
            if "error" in obj and obj.get("type") != "response.output_text.delta":
                o.error_event = True
            t = obj.get("type")
            if t in ("response.failed", "response.incomplete", "error"):
                o.error_event = True
            if t == "response.completed" and o.api == "responses":
                o.complete = True
            if t == "response.output_text.delta":
                pieces.append(obj.get("delta", ""))
            for ch in obj.get("choices") or []:
                pieces.append((ch.get("delta") or {}).get("content") or "")
    o.text_ok = "".join(pieces).startswith("mock reply from")


def bench_bodies() -> dict[str, dict[str, Any]]:
    return {
        "chat": {"messages": [{"role": "user", "content": "Say hello in one short sentence."}]},
        "responses": {"input": [{"role": "user", "content": "Say hello in one short sentence."}]},
    }


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def post_json(url: str, body: Any) -> Any:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def upstream_conns(pid: int, port: int) -> int:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return -1
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[9] in inodes and int(f[2].rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    mock_proc = bench.start(
        [bench.PY, "-m", "mockupstream", "--port", "0", "--log-limit", "20000"],
        name="mock",
    )
    mock_base = bench.read_line(mock_proc, "listening on", 20).rsplit(" ", 1)[-1]
    mock_port = int(mock_base.rsplit(":", 1)[1])
    env = {
        "OCX_DATA_DIR": str(bench._tmp / "soak-data"),
        "OCX_ADMIN_TOKEN": bench.ADMIN_TOKEN,
        "REDIS_URL": bench.REDIS_URL,
        "OCX_STATE_KEY_PREFIX": f"ocxsoak{os.getpid()}",
    }
    port = bench.free_port()
    proc = bench.start(
        [bench.PY, "-m", "ocxsite.cli", "serve", "--port", str(port), "--workers", "2"],
        env,
        "ocx-soak",
    )
    bench.read_line(proc, "ocx listening on", 60)
    base = f"http://127.0.0.1:{port}"
    a = bench.ADMIN_TOKEN
    for pname, adapter in (("mock", "openai-chat"), ("mockr", "openai-responses")):
        st, b = bench.http(
            "PUT",
            f"{base}/api/providers",
            {
                "name": pname,
                "provider": {
                    "adapter": adapter,
                    "baseUrl": f"{mock_base}/v1",
                    "apiKey": bench.UPSTREAM_KEY,
                    "timeouts": TIMEOUTS,
                },
            },
            a,
        )
        assert st == 200, b
    for cid, prov in (("soak", "mock"), ("soak-r", "mockr")):
        st, b = bench.http(
            "PUT",
            f"{base}/api/combos",
            {
                "id": cid,
                "combo": {
                    "targets": [{"provider": prov, "model": "a"}, {"provider": prov, "model": "b"}]
                },
            },
            a,
        )
        assert st == 200, b
    st, b = bench.http("POST", f"{base}/api/keys", {"user": "soak"}, a)
    key = b["key"]
    time.sleep(1.5)
    workers = [p for p in bench.tree(proc.pid) if p != proc.pid]

    def rescript() -> None:
        post_json(
            f"{mock_base}/_mock/script",
            [
                {"model": "a", "steps": steps(rng, 0.15), "then": {"deltas": 8}},
                {"model": "b", "steps": steps(rng, 0.05), "then": {"deltas": 8}},
            ],
        )

    # Warm-up: healthy upstreams first, then --warmup-s of the same mixed, faulty traffic as the
    # measured part (every route, protocol and error path has run once), then the starting RSS.
    post_json(f"{mock_base}/_mock/script", {"model": "*", "steps": [], "then": {"deltas": 8}})
    await asyncio.gather(
        *(one("127.0.0.1", port, key, "chat", s, "combo/soak", False) for s in (True, False) * 20)
    )
    rescript()
    weights = [w for w, *_ in MIX]
    warm_outcomes: list[Outcome] = []
    warm_until = time.monotonic() + args.warmup_s

    attempts: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    last_seq = [0]
    lost_log = [0]

    def pull_log() -> None:
        entries = get_json(f"{mock_base}/_mock/log?since={last_seq[0]}")
        if entries and entries[0]["seq"] > last_seq[0] + 1:
            lost_log[0] += entries[0]["seq"] - last_seq[0] - 1
        for e in entries:
            last_seq[0] = max(last_seq[0], e["seq"])
            rid = (e.get("headers") or {}).get("x-request-id")
            if rid:
                attempts[rid].append(
                    {"model": e.get("model"), "behaviour": e.get("behaviour") or {}}
                )

    outcomes: list[Outcome] = []

    async def client(i: int, stop_at: float, sink: list[Outcome]) -> None:
        crng = random.Random(args.seed * 1000 + i)
        while time.monotonic() < stop_at:
            _, api, stream, model = crng.choices(MIX, weights)[0]
            abort = stream and crng.random() < ABORT_SHARE
            try:
                o = await asyncio.wait_for(
                    one("127.0.0.1", port, key, api, stream, model, abort), CLIENT_TIMEOUT_S
                )
            except TimeoutError:
                o = Outcome(api, stream, model)
                o.error, o.elapsed = "client_timeout", CLIENT_TIMEOUT_S
            sink.append(o)
            # a polite client backs off when told the targets are cooling down
            await asyncio.sleep(0.25 if o.status in (429, 503) else crng.random() * 0.02)

    async def housekeeping(stop_at: float) -> None:
        n = 0
        while time.monotonic() < stop_at:
            await asyncio.sleep(2)
            n += 1
            await asyncio.to_thread(pull_log)
            if n % 10 == 0:
                await asyncio.to_thread(rescript)
                bench.log(f"soak: {len(outcomes)} requests so far")

    if args.warmup_s > 0:
        await asyncio.gather(
            housekeeping(warm_until),
            *(client(i, warm_until, warm_outcomes) for i in range(args.concurrency)),
        )
        bench.log(f"soak: warm-up done ({len(warm_outcomes)} requests, not counted)")
        await asyncio.to_thread(pull_log)
        attempts.clear()
    rss_start = {p: bench.rss_bytes([p]) for p in workers}
    fds_start = {p: fd_count(p) for p in workers}
    stop_at = time.monotonic() + args.minutes * 60
    await asyncio.gather(
        housekeeping(stop_at), *(client(i, stop_at, outcomes) for i in range(args.concurrency))
    )
    post_json(f"{mock_base}/_mock/script", {"model": "*", "steps": [], "then": {"deltas": 8}})
    post_json(
        f"{mock_base}/_mock/script",
        [
            {"model": "a", "steps": [], "then": {"deltas": 8}},
            {"model": "b", "steps": [], "then": {"deltas": 8}},
        ],
    )
    await asyncio.sleep(3)
    pull_log()
    await asyncio.sleep(2)
    rss_end = {p: bench.rss_bytes([p]) for p in workers}
    fds_end = {p: fd_count(p) for p in workers}
    conns_end = {p: upstream_conns(p, mock_port) for p in workers}
    alive = {p: Path(f"/proc/{p}").exists() for p in workers}
    return classify(
        outcomes,
        attempts,
        args,
        rss_start,
        rss_end,
        fds_start,
        fds_end,
        conns_end,
        alive,
        lost_log[0],
    )


def classify(
    outcomes: list[Outcome],
    attempts: dict[str, list[dict[str, Any]]],
    args: argparse.Namespace,
    rss_start: dict[int, int],
    rss_end: dict[int, int],
    fds_start: dict[int, int],
    fds_end: dict[int, int],
    conns_end: dict[int, int],
    alive: dict[int, bool],
    lost_log: int,
) -> dict[str, Any]:
    c: collections.Counter[str] = collections.Counter()
    explained: collections.Counter[str] = collections.Counter()
    unexplained: list[dict[str, Any]] = []
    truncated_success: list[dict[str, Any]] = []
    faults_seen: collections.Counter[str] = collections.Counter()
    served_after_fault = 0
    for o in outcomes:
        c["total"] += 1
        tries = attempts.get(o.rid, [])
        faults = [fault_name(t["behaviour"]) for t in tries if is_fault(t["behaviour"])]
        for f in faults:
            faults_seen[f] += 1
        desc = {
            "rid": o.rid,
            "api": o.api,
            "stream": o.stream,
            "model": o.model,
            "status": o.status,
            "code": o.code,
            "error": o.error,
            "attempts": [t["behaviour"] for t in tries],
            "elapsed_s": round(o.elapsed, 2),
        }
        if o.aborted:
            c["client_aborted"] += 1
            continue
        if o.error is not None:
            unexplained.append(desc)
            continue
        if o.status == 200 and o.complete and not o.error_event:
            c["served"] += 1
            if faults:
                served_after_fault += 1
            if not o.text_ok:
                c["served_wrong_text"] += 1
            continue
        if o.status == 200 and o.clean_end and not o.error_event:
            truncated_success.append(desc)
            continue
        # a failure: an error status, or a stream that said it failed
        if faults:
            explained[
                f"{o.status} {o.code or ('stream error event' if o.error_event else '')} <- {faults[-1]}"
            ] += 1
        elif o.status in (429, 503) and not tries:
            explained[f"{o.status} {o.code} <- targets cooling down (no attempt)"] += 1
        else:
            unexplained.append(desc)
    longest = max((o.elapsed for o in outcomes if not o.aborted), default=0.0)
    short_bound = TIMEOUTS["idleMs"] / 1000 + 3 * TIMEOUTS["firstByteMs"] / 1000 + 2
    over_short = [o for o in outcomes if not o.aborted and o.elapsed > short_bound]
    slow_kinds = collections.Counter(
        f"{o.api} stream={o.stream} {o.status} {o.code or o.error or ''} <- "
        + ",".join(
            fault_name(t["behaviour"]) for t in attempts.get(o.rid, []) if is_fault(t["behaviour"])
        )
        for o in over_short
    )
    return {
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "counts": dict(c),
        "served_after_fault": served_after_fault,
        "explained": dict(explained.most_common()),
        "explained_total": sum(explained.values()),
        "unexplained_total": len(unexplained),
        "unexplained_samples": unexplained[:15],
        "truncated_as_success_total": len(truncated_success),
        "truncated_as_success_samples": truncated_success[:15],
        "faults_injected_seen": dict(faults_seen.most_common()),
        "mock_log_entries_lost": lost_log,
        "rss_mb_start": {str(p): round(v / 2**20, 1) for p, v in rss_start.items()},
        "rss_mb_end": {str(p): round(v / 2**20, 1) for p, v in rss_end.items()},
        "fds_start": {str(p): v for p, v in fds_start.items()},
        "fds_end": {str(p): v for p, v in fds_end.items()},
        "upstream_conns_end": {str(p): v for p, v in conns_end.items()},
        "workers_alive_end": {str(p): v for p, v in alive.items()},
        "longest_request_s": round(longest, 2),
        "bound_s": BOUND_S,
        "short_bound_s": short_bound,
        "over_short_bound": len(over_short),
        "over_short_bound_kinds": dict(slow_kinds.most_common(10)),
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "timeouts": TIMEOUTS,
    }


def markdown(r: dict[str, Any], shortened: bool, git: dict[str, Any]) -> str:
    c = r["counts"]
    lines = [f"# ocx soak report — {dt.date.today().isoformat()}\n"]
    if shortened:
        lines.append(
            f"**Shortened run: {r['minutes']:g} minutes instead of the specified 10** (time box).\n"
        )
    lines += [
        f"`python bench/soak.py --minutes {r['minutes']:g}` at ocx `{git['rev'][:10]}`"
        f"{' (dirty work tree)' if git['dirty'] else ''}; `ocx serve --workers 2`, REDIS_URL set, "
        f"{r['concurrency']} concurrent clients, provider timeouts {r['timeouts']}.\n",
        "| measure | value |",
        "|---|---|",
        f"| requests | {c.get('total', 0)} |",
        f"| served (200, complete) | {c.get('served', 0)} (of which {r['served_after_fault']} after a failed attempt; "
        f"{c.get('served_wrong_text', 0)} with unexpected text) |",
        f"| failures explained by an injected fault | {r['explained_total']} |",
        f"| failures unexplained | {r['unexplained_total']} |",
        f"| truncated answers presented as success | {r['truncated_as_success_total']} |",
        f"| client aborts (deliberate) | {c.get('client_aborted', 0)} |",
        "| worker RSS start → end (MB) | "
        + ", ".join(f"{r['rss_mb_start'][p]} → {r['rss_mb_end'][p]}" for p in r["rss_mb_start"])
        + " |",
        "| open fds start → end | "
        + ", ".join(f"{r['fds_start'][p]} → {r['fds_end'][p]}" for p in r["fds_start"])
        + " |",
        "| upstream connections held at the end (per worker) | "
        + ", ".join(str(v) for v in r["upstream_conns_end"].values())
        + " |",
        "| workers alive at the end | "
        + ", ".join(str(v) for v in r["workers_alive_end"].values())
        + " |",
        f"| longest request vs bound | {r['longest_request_s']} s vs {r['bound_s']} s (totalMs + 2 × firstByteMs + 2 s) |",
        f"| requests longer than idleMs + 3 × firstByteMs ({r['short_bound_s']} s) | {r['over_short_bound']} |",
        f"| mock log entries lost | {r['mock_log_entries_lost']} |",
        "\n## Explained failures (status code <- last fault of that request)\n",
        "| outcome | n |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in r["explained"].items()]
    lines += ["\n## Faulty attempts seen upstream\n", "| fault | attempts |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["faults_injected_seen"].items()]
    if r["over_short_bound_kinds"]:
        lines += [
            "\n## Requests longer than idleMs + 3 × firstByteMs\n",
            "| request <- faults | n |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v} |" for k, v in r["over_short_bound_kinds"].items()]
    if r["unexplained_samples"]:
        lines += ["\n## Unexplained failures (first 15)\n", "```json"]
        lines += [json.dumps(x) for x in r["unexplained_samples"]] + ["```"]
    if r["truncated_as_success_samples"]:
        lines += ["\n## Truncated presented as success (first 15)\n", "```json"]
        lines += [json.dumps(x) for x in r["truncated_as_success_samples"]] + ["```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="ocx soak test (see the module docstring)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--warmup-s",
        type=float,
        default=60.0,
        help="seconds of the same traffic before the starting RSS is taken (not counted)",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import atexit
    import signal

    atexit.register(bench.cleanup)
    signal.signal(signal.SIGTERM, bench._on_signal)
    signal.signal(signal.SIGINT, bench._on_signal)
    bench.RAW.mkdir(parents=True, exist_ok=True)
    r = asyncio.run(soak(args))
    git = bench.git_info()
    date = dt.date.today().isoformat()
    out = Path(args.out) if args.out else bench.RESULTS / f"soak-{date}.md"
    md = markdown(r, args.minutes < 10, git)
    out.write_text(md)
    (bench.RAW / f"soak-{dt.datetime.now().strftime('%Y-%m-%dT%H%M')}.json").write_text(
        json.dumps(r, indent=1)
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
