"""ocx benchmark: direct (the floor) vs ocx vs LiteLLM, interleaved, in one run.

    python bench/run.py [--quick] [--skip-litellm] [--duration S] [--no-profile] [--out FILE]
                        [--server daphne,uvicorn]

Starts on 127.0.0.1 only: the ocx mock upstream (8 deltas per stream), ocx bare (one Daphne
worker, no REDIS_URL), ocx-uvicorn (the same under `ocx serve --server uvicorn`, when uvicorn
is installed), ocx "production" (one Daphne worker, REDIS_URL set), ocx with `--workers 2`
(REDIS_URL set), and LiteLLM's proxy (one worker, no database; see bench/setup_litellm.sh),
all in front of the same mock. Then, for Chat Completions and Responses, streaming and not, at
concurrency 1/16/64, it runs the same `wrk` load against each of them back to back (so
every ratio compares runs made minutes apart at most), reading CPU time from
/proc/<pid>/stat (utime+stime of each proxy's whole process tree) and sampling RSS.
After the matrix:
* time to first byte / first token with bench/stream_client.py at c=1 (and c=16);
* 64 concurrent *paced* streams (10 ms between events) for peak RSS and CPU per stream;
* unless --no-profile: py-spy profiles of the ocx worker (collapsed stacks + a top list)
  under bench/results/.
Results: bench/results/raw/<stamp>.json (full), bench/results/<date>.json (same; <stamp>.json
when that file exists already) and bench/results/<date>.md (the tables pasted into bench/README.md). Every process started here
is stopped on exit (its own process group), also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
RAW = RESULTS / "raw"
PY = os.environ.get("OCX_BENCH_PYTHON") or (
    "/work/venv/bin/python" if Path("/work/venv/bin/python").exists() else sys.executable
)
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_KEY = "sk-bench-litellm-7f3a9c2e5b1d4f6a8c0e2b4d6f8a1c3e"
ADMIN_TOKEN = "bench-admin-token-0123456789"
UPSTREAM_KEY = "sk-bench-xxxxxxxxxxxxxxxxxxxx"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
DELTAS = 8
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}

_procs: list[subprocess.Popen[bytes]] = []
_tmp = Path(tempfile.mkdtemp(prefix="ocx-bench-"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes


def start(
    cmd: list[str], env: dict[str, str | None] | None = None, name: str = ""
) -> subprocess.Popen[bytes]:
    out = open(_tmp / f"{name or 'proc'}-{len(_procs)}.log", "wb")
    proc = subprocess.Popen(
        cmd,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None},
        stdout=subprocess.PIPE,
        stderr=out,
        cwd=ROOT,
        start_new_session=True,
    )
    _procs.append(proc)
    return proc


def read_line(proc: subprocess.Popen[bytes], needle: str, timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    result: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            if needle in line:
                result.append(line)
                break
        # keep draining so the child never blocks on a full pipe
        for _ in proc.stdout:
            pass

    threading.Thread(target=reader, daemon=True).start()
    while time.monotonic() < deadline and not result:
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if not result:
        logs = "".join(p.read_text(errors="replace")[-1500:] for p in _tmp.glob("*.log"))
        raise RuntimeError(f"process {proc.args!r} did not print {needle!r}: {logs}")
    return result[0]


def cleanup() -> None:
    for proc in reversed(_procs):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 8
    for proc in reversed(_procs):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _procs.clear()
    shutil.rmtree(_tmp, ignore_errors=True)


def _on_signal(signum: int, frame: object) -> None:
    cleanup()
    sys.exit(128 + signum)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / CLK


def sched_ns(pids: list[int]) -> tuple[int, int]:
    """(time on CPU, time runnable but waiting for a CPU) in ns, over every thread of `pids`."""
    run = wait = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    a, b, _ = f.read().split()
                run += int(a)
                wait += int(b)
            except (OSError, ValueError):
                pass
    return run, wait


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def hwm_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


class RssSampler:
    """Peak RSS of a process tree (sum) and of its largest single worker process."""

    def __init__(self, pids_fn: Any, interval: float = 0.1, workers_fn: Any = None) -> None:
        self.pids_fn, self.interval = pids_fn, interval
        self.workers_fn = workers_fn or pids_fn
        self.peak = 0
        self.peak_worker = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def _sample(self) -> None:
        self.peak = max(self.peak, rss_bytes(self.pids_fn()))
        self.peak_worker = max([self.peak_worker] + [rss_bytes([p]) for p in self.workers_fn()])

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._sample()


def http(
    method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 10
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


# --------------------------------------------------------------------------- targets


class Target:
    def __init__(
        self, name: str, base: str, pid: int, key: str | None, models: dict[str, str]
    ) -> None:
        self.name, self.base, self.pid, self.key, self.models = name, base, pid, key, models

    def pids(self) -> list[int]:
        return tree(self.pid)

    def workers(self) -> list[int]:
        """ocx: the Daphne/uvicorn workers (not the `ocx serve` supervisor); others: the tree."""
        if not self.name.startswith("ocx"):
            return self.pids()
        return [p for p in self.pids() if p != self.pid] or [self.pid]


def start_mock() -> tuple[subprocess.Popen[bytes], str]:
    proc = start([PY, "-m", "mockupstream", "--port", "0", "--log-limit", "200"], name="mock")
    line = read_line(proc, "listening on", 60)
    base = line.rsplit(" ", 1)[-1]
    mock_script(base, {})
    return proc, base


def mock_script(base: str, extra: dict[str, Any]) -> None:
    status, body = http(
        "POST",
        f"{base}/_mock/script",
        {"model": "*", "steps": [], "then": {"deltas": DELTAS, **extra}},
    )
    if status != 200:
        raise RuntimeError(f"mock script rejected: {body}")


# The one-worker, no-Redis ocx instance of each server (`ocx serve --server S`).
BARE = {"daphne": "ocx-bare", "uvicorn": "ocx-uvicorn"}


# What each feature variant switches (issue 17: the targets hold with them on and off).
LEAN_ENV = {"OCX_REQUEST_LOG": "0", "OCX_USAGE": "0"}
# A budget that is checked and charged on every request but never reached.
BENCH_BUDGET = {"tokens": 10**15, "period": "day"}
# ocx-full also charges dollars (issue 27): a priced model, a key and a team dollar budget.
BENCH_USD_BUDGET = {"usd": 10**9, "period": "month"}
BENCH_PRICE = {"inputPerMTok": 1.25, "cachedInputPerMTok": 0.125, "outputPerMTok": 10}


def start_ocx(
    name: str,
    mock_base: str,
    workers: int = 1,
    redis: bool = False,
    server: str = "daphne",
    extra_env: dict[str, str] | None = None,
    budget: bool = False,
) -> Target:
    data = _tmp / f"data-{name}"
    env = {
        "OCX_DATA_DIR": str(data),
        "OCX_ADMIN_TOKEN": ADMIN_TOKEN,
        "OCX_LOG_JSON": "0",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    if redis:
        env["REDIS_URL"] = REDIS_URL
        env["OCX_STATE_KEY_PREFIX"] = f"ocxbench{os.getpid()}{name.replace('-', '')}"
    else:
        env["REDIS_URL"] = ""
    port = free_port()
    proc = start(
        [PY, "-m", "ocxsite.cli", "serve", "--port", str(port), "--workers", str(workers)]
        + ["--server", server],
        env,
        name,
    )
    line = read_line(proc, "ocx listening on", 60)
    base = re.search(r"http://\S+", line).group(0)  # type: ignore[union-attr]
    a = ADMIN_TOKEN
    # A fresh server's first admin call may wait on its workers' first load (seen once at
    # >10 s with 2 workers beside a running flood): wait for it here, and say how long.
    t0 = time.monotonic()
    st, body = http("GET", f"{base}/api/providers", None, a, timeout=60)
    assert st == 200, body
    if time.monotonic() - t0 > 2:
        log(f"{name}: first admin call answered after {time.monotonic() - t0:.1f} s")
    for pname, adapter in (("mock", "openai-chat"), ("mockr", "openai-responses")):
        st, body = http(
            "PUT",
            f"{base}/api/providers",
            {
                "name": pname,
                "provider": {
                    "adapter": adapter,
                    "baseUrl": f"{mock_base}/v1",
                    "apiKey": UPSTREAM_KEY,
                    **({"models": {"m": {"price": BENCH_PRICE}}} if budget else {}),
                },
            },
            a,
        )
        assert st == 200, body
    for cid, prov in (("bench", "mock"), ("bench-r", "mockr")):
        st, body = http(
            "PUT",
            f"{base}/api/combos",
            {"id": cid, "combo": {"targets": [{"provider": prov, "model": "m"}]}},
            a,
        )
        assert st == 200, body
    key_body: dict[str, Any] = {"user": "bench"}
    if budget:
        key_body["budgets"] = [BENCH_BUDGET, BENCH_USD_BUDGET]
    st, body = http("POST", f"{base}/api/keys", key_body, a)
    assert st in (200, 201), body
    if budget:
        st, ub = http("PUT", f"{base}/api/keys/user-budgets/bench", {"budget": BENCH_BUDGET}, a)
        assert st == 200, ub
        team = {"members": ["bench"], "budgets": [BENCH_USD_BUDGET]}
        st, tb = http("PUT", f"{base}/api/teams", {"name": "bench", "team": team}, a)
        assert st == 200, tb
    target = Target(
        name, base, proc.pid, body["key"], {"chat": "combo/bench", "responses": "combo/bench-r"}
    )
    wait_ready(target)
    return target


def start_litellm(mock_base: str) -> Target:
    cfg = _tmp / "litellm.yaml"
    subprocess.run(
        ["bash", str(BENCH / "setup_litellm.sh"), f"{mock_base}/v1", str(cfg)],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "LITELLM_MASTER_KEY": LITELLM_KEY},
    )
    port = free_port()
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "DATABASE_URL": None,  # no database: LiteLLM's lightest configuration
    }
    proc = start(
        [
            str(LITELLM_VENV / "bin" / "litellm"),
            "--config",
            str(cfg),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env,
        "litellm",
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if http("GET", f"{base}/health/liveliness", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None:
            log_text = "".join(
                p.read_text(errors="replace")[-1500:] for p in _tmp.glob("litellm-*.log")
            )
            raise RuntimeError(f"litellm exited: {log_text}")
        time.sleep(0.5)
    target = Target("litellm", base, proc.pid, LITELLM_KEY, {"chat": "m", "responses": "m"})
    wait_ready(target)
    return target


def wait_ready(t: Target) -> None:
    deadline = time.monotonic() + 30
    last: Any = None
    while time.monotonic() < deadline:
        ok = True
        for api in ("chat", "responses"):
            body = {"model": t.models[api], "stream": False}
            body.update(
                {"messages": [{"role": "user", "content": "hi"}]}
                if api == "chat"
                else {"input": "hi"}
            )
            try:
                st, last = http("POST", t.base + PATHS[api], body, t.key)
            except OSError as exc:
                st, last = 0, str(exc)
            ok = ok and st == 200
        if ok:
            return
        time.sleep(0.3)
    raise RuntimeError(f"{t.name} not ready: {last}")


# --------------------------------------------------------------------------- load


def wrk(
    t: Target, api: str, stream: bool, conc: int, duration: float, aux: list[Target]
) -> dict[str, Any]:
    script = BENCH / "wrk" / f"{api}.lua"
    env = {
        "BENCH_MODEL": t.models[api],
        "BENCH_STREAM": "1" if stream else "0",
        "BENCH_KEY": t.key or "",
        "BENCH_WRK_DIR": str(BENCH / "wrk"),
    }
    cmd = [
        "wrk",
        "-t1",
        f"-c{conc}",
        f"-d{max(1, int(round(duration)))}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        t.base + PATHS[api],
    ]
    pids = t.pids()
    aux_pids = {a.name: a.pids() for a in aux}
    c0, a0, w0 = (
        cpu_seconds(pids),
        {k: cpu_seconds(v) for k, v in aux_pids.items()},
        time.monotonic(),
    )
    s0 = sched_ns(pids)
    with RssSampler(t.pids, workers_fn=t.workers) as rss:
        proc = subprocess.run(
            cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=duration + 60
        )
    wall = time.monotonic() - w0
    c1 = cpu_seconds(pids)
    s1 = sched_ns(pids)
    aux_cpu = {k: cpu_seconds(v) - a0[k] for k, v in aux_pids.items()}
    m = re.search(r"BENCHJSON (\{.*\})", proc.stdout)
    if not m:
        return {"error": (proc.stdout + proc.stderr)[-500:]}
    r = json.loads(m.group(1))
    ok = r["requests"] - r["errors"]["status"]
    secs = r["duration_us"] / 1e6
    return {
        "requests": r["requests"],
        "ok": ok,
        "non2xx": r["errors"]["status"],
        "socket_errors": {k: v for k, v in r["errors"].items() if k != "status" and v},
        "rps": round(ok / secs, 1),
        "p50_ms": r["p50"] / 1000,
        "p90_ms": r["p90"] / 1000,
        "p99_ms": r["p99"] / 1000,
        "max_ms": r["max"] / 1000,
        "cpu_s": round(c1 - c0, 3),
        "cpu_ms_per_req": round((c1 - c0) * 1000 / ok, 3) if ok else None,
        "upstream_cpu_ms_per_req": {
            k: round(v * 1000 / ok, 3) if ok else None for k, v in aux_cpu.items()
        },
        "cpu_util": round((c1 - c0) / wall, 3),
        # share of the run the proxy's threads were runnable but had no CPU (machine contention)
        "runqueue_wait_share": round((s1[1] - s0[1]) / 1e9 / wall, 3),
        "peak_rss_mb": round(rss.peak / 2**20, 1),
        "peak_worker_rss_mb": round(rss.peak_worker / 2**20, 1),
    }


def stream_client(t: Target, api: str, conc: int, duration: float) -> dict[str, Any]:
    cmd = [
        PY,
        str(BENCH / "stream_client.py"),
        "--url",
        t.base + PATHS[api],
        "--api",
        api,
        "--model",
        t.models[api],
        "-c",
        str(conc),
        "-d",
        str(duration),
    ]
    if t.key:
        cmd += ["--key", t.key]
    pids = t.pids()
    c0 = cpu_seconds(pids)
    with RssSampler(t.pids, workers_fn=t.workers) as rss:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 90)
    c1 = cpu_seconds(pids)
    try:
        r = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (proc.stdout + proc.stderr)[-500:]}
    n = r["complete"]
    r["cpu_ms_per_stream"] = round((c1 - c0) * 1000 / n, 3) if n else None
    r["peak_rss_mb"] = round(rss.peak / 2**20, 1)
    r["peak_worker_rss_mb"] = round(rss.peak_worker / 2**20, 1)
    return r


def profile(
    t: Target, api: str, stream: bool, conc: int, duration: float, stamp: str
) -> dict[str, Any] | None:
    pyspy = shutil.which("py-spy") or str(LITELLM_VENV / "bin" / "py-spy")
    if not Path(pyspy).exists():
        log("py-spy not found (pip install py-spy into bench/.venv-litellm); no profile")
        return None
    worker = t.workers()[0]
    tag = f"{api}-{'stream' if stream else 'json'}-c{conc}"
    out = RESULTS / f"profile-{stamp}-{t.name}-{tag}.txt"
    spy = subprocess.Popen(
        [
            pyspy,
            "record",
            "--pid",
            str(worker),
            "--format",
            "raw",
            "--rate",
            "250",
            "--duration",
            str(int(duration) + 1),
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.7)
    load = wrk(t, api, stream, conc, duration, [])
    try:
        _, err = spy.communicate(timeout=duration + 30)
    except subprocess.TimeoutExpired:
        spy.kill()
        return None
    if not out.exists():
        log(f"py-spy failed: {err.decode(errors='replace')[-300:]}")
        return {"error": err.decode(errors="replace")[-300:]}
    top = summarize_profile(out)
    (RESULTS / f"profile-{stamp}-{t.name}-{tag}.md").write_text(top["markdown"])
    return {
        "file": str(out.relative_to(ROOT)),
        "load": load,
        "top_self": top["self"][:15],
        "top_inclusive": top["inclusive"][:25],
        "samples": top["samples"],
    }


def _frame_name(frame: str) -> str:
    # py-spy raw frames: "function (path/to/file.py:123)"
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    fn, path = m.groups()
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{fn}"


def summarize_profile(path: Path) -> dict[str, Any]:
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    s = [(k, round(100 * v / total, 1)) for k, v in self_c.most_common(40)] if total else []
    i = [(k, round(100 * v / total, 1)) for k, v in incl.most_common(80)] if total else []
    md = [
        f"# py-spy profile `{path.name}` ({total} samples)\n",
        "## Top self time\n",
        "| % | function |",
        "|---|---|",
    ]
    md += [f"| {p} | `{k}` |" for k, p in s[:30]]
    md += ["\n## Top inclusive time\n", "| % | function |", "|---|---|"]
    md += [f"| {p} | `{k}` |" for k, p in i[:60]]
    return {"self": s, "inclusive": i, "samples": total, "markdown": "\n".join(md) + "\n"}


# --------------------------------------------------------------------------- report


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b in (None, 0):
        return None
    return round(a / b, 3)


def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def report(res: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    runs = res["wrk"]
    lines: list[str] = []
    verdict: dict[str, Any] = {}
    names = res["targets"]
    lines.append(
        f"Run `{res['stamp']}` on {res['machine']['cpus']} CPU(s) ({res['machine']['cpu_model']}), "
        f"load average before/after {res['machine']['loadavg_before']} / {res['machine']['loadavg_after']}; "
        f"{res['config']['duration']} s per point; ocx at `{res['git']['rev'][:10]}`"
        f"{' (dirty work tree)' if res['git']['dirty'] else ''}.\n"
    )
    lines.append("### Throughput, latency, CPU (wrk, one connection per concurrency slot)\n")
    lines.append(
        "| api | stream | c | target | req/s | p50 ms | p99 ms | +p50 vs direct ms | CPU ms/req | CPU vs LiteLLM | req/s vs LiteLLM | peak RSS MB | non-2xx/errors |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, by_t in runs.items():
        api, stream, c = key.split("|")
        d = by_t.get("direct", {})
        ll = by_t.get("litellm", {})
        for name in names:
            r = by_t.get(name)
            if not r or "error" in r:
                if r:
                    lines.append(
                        f"| {api} | {stream} | {c} | {name} | error: {r['error'][:60]!r} |||||||||"
                    )
                continue
            add = (
                None
                if name == "direct" or "p50_ms" not in d
                else round(r["p50_ms"] - d["p50_ms"], 2)
            )
            cpu = r["cpu_ms_per_req"] if name != "direct" else None
            errs = r["non2xx"] + sum(r["socket_errors"].values())
            lines.append(
                f"| {api} | {stream} | {c} | {name} | {fmt(r['rps'])} | {fmt(r['p50_ms'], 2)} | {fmt(r['p99_ms'], 2)} | "
                f"{fmt(add, 2)} | {fmt(cpu, 2)} | {fmt(ratio(cpu, ll.get('cpu_ms_per_req')), 3) if name.startswith('ocx') else ''} | "
                f"{fmt(ratio(r['rps'], ll.get('rps')), 1) if name.startswith('ocx') else ''} | {fmt(r['peak_rss_mb'])} | {errs} |"
            )
    lines.append(
        "\n`direct` CPU is not a proxy cost and is left out; the mock upstream's own CPU per request is in the JSON.\n"
    )
    lines.append("### Streaming: time to first byte / first token (bench/stream_client.py)\n")
    lines.append(
        "| api | c | target | streams/s | TTFB p50 ms | TTFT p50 ms | TTFT p99 ms | +TTFT p50 vs direct ms | CPU ms/stream | truncated/errors |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for key, by_t in res["ttft"].items():
        api, c = key.split("|")
        d = by_t.get("direct", {})
        for name in names:
            r = by_t.get(name)
            if not r or "error" in r:
                continue
            add = (
                None
                if name == "direct" or not d.get("ttft_ms")
                else round(r["ttft_ms"]["p50"] - d["ttft_ms"]["p50"], 2)
            )
            lines.append(
                f"| {api} | {c} | {name} | {fmt(r['streams_per_s'])} | {fmt(r['ttfb_ms']['p50'], 2)} | "
                f"{fmt(r['ttft_ms']['p50'], 2)} | {fmt(r['ttft_ms']['p99'], 2)} | {fmt(add, 2)} | "
                f"{fmt(r['cpu_ms_per_stream'] if name != 'direct' else None, 2)} | {r['truncated'] + r['non200'] + sum(r['errors'].values())} |"
            )
    lines.append("\n### 64 concurrent paced streams (10 ms between events, 8 deltas)\n")
    lines.append(
        "| api | target | streams/s | TTFT p50 ms | total p50 ms | CPU ms/stream | peak RSS MB, all processes | peak RSS MB, one worker | worker RSS vs LiteLLM | truncated/errors |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for api, by_t in res["paced"].items():
        ll = by_t.get("litellm", {})
        for name in names:
            r = by_t.get(name)
            if not r or "error" in r:
                continue
            lines.append(
                f"| {api} | {name} | {fmt(r['streams_per_s'])} | {fmt(r['ttft_ms']['p50'], 2)} | {fmt(r['total_ms']['p50'], 2)} | "
                f"{fmt(r['cpu_ms_per_stream'] if name != 'direct' else None, 2)} | {fmt(r['peak_rss_mb'])} | "
                f"{fmt(r.get('peak_worker_rss_mb'))} | "
                f"{fmt(ratio(r.get('peak_worker_rss_mb'), ll.get('peak_rss_mb')), 3) if name.startswith('ocx') else ''} | "
                f"{r['truncated'] + r['non200'] + sum(r['errors'].values())} |"
            )

    # ---- targets
    def g(key: str, name: str, field: str) -> Any:
        r = runs.get(key, {}).get(name) or {}
        return r.get(field)

    checks: list[tuple[str, str, Any, bool | None]] = []
    have_ll = "litellm" in names
    bares = [n for n in BARE.values() if n in names]
    # The CPU and throughput targets hold with every feature on and off too.
    measured = bares + [n for n in ("ocx-lean", "ocx-prod", "ocx-full") if n in names]

    def tag(bare: str) -> str:
        return "" if bare == "ocx-bare" else f" [{bare}]"

    for key in runs:
        api, stream, c = key.split("|")
        for bare in measured:
            if have_ll:
                x = ratio(g(key, bare, "cpu_ms_per_req"), g(key, "litellm", "cpu_ms_per_req"))
                checks.append(
                    (
                        "CPU/req ≤ 1/10 LiteLLM" + tag(bare),
                        f"{api} {stream} c={c}",
                        x,
                        None if x is None else x <= 0.1,
                    )
                )
                if c == "16":
                    x = ratio(g(key, bare, "rps"), g(key, "litellm", "rps"))
                    checks.append(
                        (
                            "req/s at c=16 ≥ 10× LiteLLM" + tag(bare),
                            f"{api} {stream}",
                            x,
                            None if x is None else x >= 10,
                        )
                    )
            if c == "1" and stream == "json" and bare in bares:
                b, d = g(key, bare, "p50_ms"), g(key, "direct", "p50_ms")
                x = None if b is None or d is None else round(b - d, 2)
                checks.append(
                    (
                        "added p50 at c=1 ≤ 2 ms" + tag(bare),
                        f"{api}",
                        x,
                        None if x is None else x <= 2,
                    )
                )
        x = ratio(g(key, "ocx-prod", "cpu_ms_per_req"), g(key, "ocx-bare", "cpu_ms_per_req"))
        checks.append(
            (
                "production CPU ≤ 1.3× bare",
                f"{api} {stream} c={c}",
                x,
                None if x is None else x <= 1.3,
            )
        )
        if c in ("16", "64") and g(key, "ocx-w2", "rps") is not None:
            x = ratio(g(key, "ocx-w2", "rps"), g(key, "ocx-prod", "rps"))
            checks.append(
                (
                    "--workers 2 ≥ 1.7× one worker req/s",
                    f"{api} {stream} c={c}",
                    x,
                    None if x is None else x >= 1.7,
                )
            )
    for key, by_t in res["ttft"].items():
        api, c = key.split("|")
        if c != "1":
            continue
        for bare in bares:
            b, d = (
                (by_t.get(bare) or {}).get("ttft_ms"),
                (by_t.get("direct") or {}).get("ttft_ms"),
            )
            x = None if not b or not d else round(b["p50"] - d["p50"], 2)
            checks.append(
                ("added TTFT p50 at c=1 ≤ 3 ms" + tag(bare), api, x, None if x is None else x <= 3)
            )
    if have_ll:
        for api, by_t in res["paced"].items():
            for bare in bares:
                x = ratio(
                    (by_t.get(bare) or {}).get("peak_worker_rss_mb"),
                    (by_t.get("litellm") or {}).get("peak_rss_mb"),
                )
                checks.append(
                    (
                        "peak RSS per worker, 64 streams ≤ 1/4 LiteLLM" + tag(bare),
                        api,
                        x,
                        None if x is None else x <= 0.25,
                    )
                )
    degraded = res.get("redis_degraded") or {}
    if degraded:
        spells = ", ".join(f"{name} {n}" for name, n in degraded.items())
        lines.append(
            f"\nRedis breaker openings logged by the ocx workers during the run: {spells}.\n"
        )
    lines.append("\n### Targets (per ocx worker; ocx-bare (Daphne) unless stated)\n")
    lines.append("| target | case | measured | met |")
    lines.append("|---|---|---|---|")
    for what, case, x, ok in checks:
        lines.append(
            f"| {what} | {case} | {fmt(x, 3) if isinstance(x, float) else fmt(x)} | {'–' if ok is None else ('yes' if ok else '**no**')} |"
        )
    verdict = {f"{w} [{c}]": {"value": x, "met": ok} for w, c, x, ok in checks}
    return "\n".join(lines) + "\n", verdict


# --------------------------------------------------------------------------- main


def git_info() -> dict[str, Any]:
    def run(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    dirty = run("status", "--porcelain", "--untracked-files=no")
    return {
        "rev": run("rev-parse", "HEAD"),
        "dirty": bool(dirty),
        "dirty_files": dirty.splitlines()[:50],
    }


def features() -> dict[str, Any]:
    return {
        "ocx-bare / ocx-uvicorn": "no REDIS_URL (in-process state); request log and usage "
        "rollups on (the defaults); no budget",
        "ocx-lean": "as ocx-bare with OCX_REQUEST_LOG=0 OCX_USAGE=0",
        "ocx-prod": "REDIS_URL (routing, quota and budget state in Redis); request log and usage "
        "on; no budget",
        "ocx-full": f"ocx-prod plus a key budget and a user budget ({BENCH_BUDGET}), a key "
        f"and a team dollar budget ({BENCH_USD_BUDGET}) on a priced model ({BENCH_PRICE}): "
        "checked before and charged (tokens and cost) after every request in Redis",
        "ocx-w2": "ocx-prod with --workers 2",
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    code = (
        "import importlib.metadata as m, importlib.util, json; print(json.dumps({k: m.version(k) for k in "
        "['django','daphne','twisted','channels','httpx','httpcore','uvicorn','uvloop','httptools']"
        " if importlib.util.find_spec(k.replace('-', '_'))}))"
    )
    try:
        out.update(
            json.loads(
                subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=20).stdout
            )
        )
    except ValueError:
        pass
    ll = LITELLM_VENV / "bin" / "python"
    if ll.exists():
        # LiteLLM pins few of its dependencies, and their versions move its cost: record them.
        code = (
            "import importlib.metadata as m, json; print(json.dumps({k: m.version(k) for k in "
            "['litellm','openai','httpx','aiohttp','pydantic','fastapi','uvicorn','uvloop']}))"
        )
        r = subprocess.run([str(ll), "-c", code], capture_output=True, text=True, timeout=60)
        try:
            deps = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            deps = {}
        out["litellm"] = deps.pop("litellm", "")
        out.update({f"litellm_{k}": v for k, v in deps.items()})
    if shutil.which("wrk"):  # bench/long_streams.py records versions without needing wrk
        w = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
        out["wrk"] = (w.stdout + w.stderr).split("\n")[0]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="ocx vs direct vs LiteLLM benchmark (see bench/README.md)"
    )
    p.add_argument("--quick", action="store_true", help="fewer points, 2 s each (~3 min)")
    p.add_argument("--skip-litellm", action="store_true")
    p.add_argument(
        "--duration", type=float, default=None, help="seconds per point (default 6, quick 2)"
    )
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--no-workers2", action="store_true", help="skip the --workers 2 instance")
    p.add_argument(
        "--variants",
        action="store_true",
        help="also measure ocx-lean (request log and usage off) and ocx-full (ocx-prod with "
        "key and user budgets in Redis)",
    )
    p.add_argument(
        "--server",
        default=None,
        help="comma list of `ocx serve --server` values to measure as one-worker instances: "
        "daphne (ocx-bare), uvicorn (ocx-uvicorn). Default: both when uvicorn is installed",
    )
    p.add_argument(
        "--out",
        default=None,
        help="result JSON path (default bench/results/<date>.json, or <date>T<time>.json when taken)",
    )
    p.add_argument(
        "--phases",
        default="matrix,ttft,paced,profile",
        help="comma list of matrix, ttft, paced, profile (default: all)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness for this run and every process it starts (negative needs root; "
        "use on a shared machine so other load disturbs the numbers less)",
    )
    args = p.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    if not shutil.which("wrk"):
        print("wrk not found: apt-get update && apt-get install -y wrk", file=sys.stderr)
        return 2
    duration = args.duration or (2.0 if args.quick else 6.0)
    concs = [1, 16] if args.quick else [1, 16, 64]
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    RAW.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    t_start = time.monotonic()

    log("starting mock upstream")
    mock_proc, mock_base = start_mock()
    mock_t = Target("direct", mock_base, mock_proc.pid, None, {"chat": "m", "responses": "m"})
    targets = [mock_t]
    servers = (args.server or ("daphne,uvicorn" if _has_uvicorn() else "daphne")).split(",")
    for server in servers:
        if server not in BARE:
            raise SystemExit(f"--server: unknown server {server!r} (daphne, uvicorn)")
        log(f"starting {BARE[server]} (1 {server} worker, no REDIS_URL)")
        targets.append(start_ocx(BARE[server], mock_base, server=server))
    redis_ok = (
        subprocess.run(
            ["redis-cli", "-u", REDIS_URL, "ping"], capture_output=True, text=True
        ).stdout.strip()
        == "PONG"
    )
    if args.variants:
        log("starting ocx-lean (1 Daphne worker, no REDIS_URL, request log and usage off)")
        targets.append(start_ocx("ocx-lean", mock_base, extra_env=LEAN_ENV))
    if redis_ok:
        log("starting ocx prod (1 worker, REDIS_URL)")
        targets.append(start_ocx("ocx-prod", mock_base, redis=True))
        if args.variants:
            log(
                "starting ocx-full (ocx-prod plus key, user and team budgets in tokens and dollars)"
            )
            targets.append(start_ocx("ocx-full", mock_base, redis=True, budget=True))
    else:
        log(f"Redis at {REDIS_URL} not answering: no production path, no --workers 2")
    w2 = None
    if redis_ok and not args.no_workers2:
        log("starting ocx --workers 2 (REDIS_URL)")
        w2 = start_ocx("ocx-w2", mock_base, workers=2, redis=True)
    if not args.skip_litellm:
        if not (LITELLM_VENV / "bin" / "litellm").exists():
            log("creating bench/.venv-litellm (bench/setup_litellm.sh)")
        log("starting LiteLLM proxy (1 worker, no database)")
        targets.append(start_litellm(mock_base))
    names = [t.name for t in targets] + ([w2.name] if w2 else [])
    res: dict[str, Any] = {
        "stamp": stamp,
        "config": {
            "duration": duration,
            "concurrency": concs,
            "deltas": DELTAS,
            "quick": args.quick,
            "nice": args.nice,
            "wrk": "wrk -t1 -cC -dDs --timeout 10s -s bench/wrk/<api>.lua",
            "redis": REDIS_URL if redis_ok else None,
            "servers": servers,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "loadavg_before": _loadavg(),
            "kernel": platform.release(),
        },
        "git": git_info(),
        "versions": versions(),
        "features": features(),
        "targets": names,
        "wrk": {},
        "ttft": {},
        "paced": {},
        "profiles": {},
        "rss_hwm_mb": {},
    }

    phases = set(args.phases.split(","))
    # warm-up: connections, JIT-free code paths, pools
    for t in targets + ([w2] if w2 else []):
        for api in ("chat", "responses"):
            for stream in (False,) if args.quick else (False, True):
                wrk(t, api, stream, 16, 1, [])

    log(
        f"matrix: {len(concs)} concurrencies × 4 api/stream × {len(names)} targets × {duration:g} s"
    )
    for api in ("chat", "responses") if "matrix" in phases else ():
        for stream in (False, True):
            for c in concs:
                key = f"{api}|{'stream' if stream else 'json'}|{c}"
                res["wrk"][key] = {}
                order = targets + ([w2] if w2 and c >= 16 else [])
                for t in order:
                    r = wrk(t, api, stream, c, duration, [mock_t] if t is not mock_t else [])
                    res["wrk"][key][t.name] = r
                    log(
                        f"{key:24s} {t.name:9s} {r.get('rps', '?'):>8} req/s  p50 {r.get('p50_ms', '?')} ms  "
                        f"cpu {r.get('cpu_ms_per_req', '?')} ms/req  rss {r.get('peak_rss_mb', '?')} MB  "
                        f"non2xx {r.get('non2xx', '?')} {r.get('error', '')[:200]}"
                    )
                    time.sleep(0.3)

    log("time to first token")
    for api in ("chat", "responses") if "ttft" in phases else ():
        for c in [1] if args.quick else [1, 16]:
            key = f"{api}|{c}"
            res["ttft"][key] = {}
            for t in targets:
                r = stream_client(t, api, c, duration)
                res["ttft"][key][t.name] = r
                log(
                    f"ttft {key:14s} {t.name:9s} ttft p50 {(r.get('ttft_ms') or {}).get('p50')} ms  "
                    f"{r.get('streams_per_s')} streams/s {r.get('error', '')[:200]}"
                )

    log("64 concurrent paced streams (delta_ms=10)")
    mock_script(mock_base, {"delta_ms": 10})
    try:
        for api in (["chat"] if args.quick else ["chat", "responses"]) if "paced" in phases else []:
            res["paced"][api] = {}
            for t in targets:
                r = stream_client(t, api, 64, max(duration, 3))
                res["paced"][api][t.name] = r
                log(
                    f"paced {api:9s} {t.name:9s} {r.get('streams_per_s')} streams/s  rss {r.get('peak_rss_mb')} MB "
                    f"cpu {r.get('cpu_ms_per_stream')} ms/stream {r.get('error', '')[:200]}"
                )
    finally:
        mock_script(mock_base, {})
    for t in targets + ([w2] if w2 else []):
        res["rss_hwm_mb"][t.name] = round(hwm_bytes(t.pids()) / 2**20, 1)

    if not args.no_profile and not args.quick and "profile" in phases:
        for bare in (t for t in targets if t.name in (*BARE.values(), "ocx-full")):
            for api, stream in (("chat", False), ("chat", True), ("responses", True)):
                log(f"py-spy profile of {bare.name} worker: {api} stream={stream} c=16")
                pr = profile(bare, api, stream, 16, max(duration, 5), stamp)
                if pr:
                    prefix = "" if bare.name == "ocx-bare" else f"{bare.name}|"
                    res["profiles"][f"{prefix}{api}|{'stream' if stream else 'json'}|16"] = pr

    res["machine"]["loadavg_after"] = _loadavg()
    # A Redis variant whose breaker opened (a Redis call past OCX_REDIS_TIMEOUT_MS) routed on
    # its own copy for a while, without Redis round trips: the report says how often.
    res["redis_degraded"] = {
        t.name: sum(
            p.read_text(errors="replace").count("redis unavailable")
            for p in _tmp.glob(f"{t.name}-*.log")
        )
        for t in targets + ([w2] if w2 else [])
        if t.name.startswith("ocx")
    }
    res["elapsed_s"] = round(time.monotonic() - t_start, 1)
    md, verdict = report(res)
    res["targets_check"] = verdict
    date = dt.date.today().isoformat()
    out = Path(args.out) if args.out else RESULTS / f"{date}{'-quick' if args.quick else ''}.json"
    if out.exists() and not args.out:
        out = RESULTS / f"{stamp}{'-quick' if args.quick else ''}.json"  # never overwrite a run
    text = json.dumps(res, indent=1)
    (RAW / f"{stamp}.json").write_text(text)
    out.write_text(text)
    out.with_suffix(".md").write_text(md)
    print(md)
    log(f"done in {res['elapsed_s']} s: {out} and {out.with_suffix('.md')}")
    return 0


def _has_uvicorn() -> bool:
    r = subprocess.run(
        [PY, "-c", "import uvicorn"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    return r.returncode == 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    raise SystemExit(main())
