"""Write → visible latency across workers (issue #12): how long after a config write every
worker serves it.

    python bench/propagation.py [--writes 200] [--workers 3] [--redis-url URL]
                                [--database-url URL] [--poll-ms 500]

Starts `ocx serve --workers N` on 127.0.0.1 with Redis (and the given database; default a
fresh SQLite file), opens one keep-alive connection to each worker (the worker process that
accepted it is read from /proc), starts every worker's runtime, then repeats: change a combo
with `PUT /api/combos` (on a connection of its own, so the write lands on any worker) and poll
`/healthz` (`configVersion`, the snapshot the worker serves) on every worker's connection until
all serve the new version. Reported, over all writes (ms): the PUT's own time, the time from
sending the PUT until the last worker serves it, and how many writes every worker already
served when the PUT returned. Bounded: at most 5 s per write; the server is stopped on exit.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-propagation-token-0123456789"
PER_WRITE_S = 5.0


def _hex_port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1], 16)


def worker_pid(server_port: int, client_port: int) -> int | None:
    """The pid of the process owning the server side of this loopback connection."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if _hex_port(fields[1]) == server_port and _hex_port(fields[2]) == client_port:
                inode = fields[9]
    if inode is None:
        return None
    link = f"socket:[{inode}]"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == link for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:
            continue
    return None


def start(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    data = tempfile.mkdtemp(prefix="ocx-bench-prop-")
    env = {
        **os.environ,
        "OCX_DATA_DIR": data,
        "OCX_ADMIN_TOKEN": TOKEN,
        "REDIS_URL": args.redis_url,
        "OCX_STATE_KEY_PREFIX": f"ocx-bench-prop-{os.getpid()}",
        "OCX_CONFIG_POLL_MS": str(args.poll_ms),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    else:
        env.pop("DATABASE_URL", None)
    cmd = [sys.executable, "-m", "ocxsite.cli", "serve", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--workers", str(args.workers)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    atexit.register(lambda: _stop(proc))
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        if "ocx listening on " in line:
            url = line.split("ocx listening on ")[1].split(" ")[0]
            break
        if time.monotonic() > deadline:
            raise SystemExit("ocx did not start")
    else:
        raise SystemExit("ocx exited before listening")
    threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    return proc, url


# From the writing worker's log: publish → the last worker's acknowledgement (ms), per write.
RELOADED = re.compile(r"(\d+) of (\d+) workers reloaded in ([0-9.]+) ms")
acks_ms: list[float] = []


def _drain(proc: subprocess.Popen[str]) -> None:
    # Keep the pipe drained so the server never blocks on its output.
    for line in proc.stdout or ():
        match = RELOADED.search(line)
        if match and match.group(1) == match.group(2):
            acks_ms.append(float(match.group(3)))


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def one_per_worker(url: str, workers: int) -> dict[int, httpx.Client]:
    port = int(url.rsplit(":", 1)[1])
    by_pid: dict[int, httpx.Client] = {}
    for _ in range(200):
        client = httpx.Client(base_url=url, timeout=10)
        r = client.get("/healthz")
        pid = worker_pid(port, r.extensions["network_stream"].get_extra_info("client_addr")[1])
        if pid is not None and pid not in by_pid:
            by_pid[pid] = client
            if len(by_pid) == workers:
                return by_pid
        else:
            client.close()
    raise SystemExit(f"connections reached only {len(by_pid)} of {workers} workers")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", ""))
    parser.add_argument("--poll-ms", type=int, default=500)
    args = parser.parse_args()

    _, url = start(args)
    api = {"Authorization": f"Bearer {TOKEN}"}
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    model = {"m": {"contextWindow": 8000}, "n": {"contextWindow": 8000}}
    provider = {"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1", "models": model}
    with httpx.Client(base_url=url, timeout=10, headers=api) as admin:
        r = admin.put("/api/providers", json={"name": "p", "provider": provider})
        r.raise_for_status()
    clients = one_per_worker(url, args.workers)
    for client in clients.values():
        client.get("/v1/models")  # starts the worker's runtime (401 without a key is fine)

    put_ms: list[float] = []
    visible_ms: list[float] = []
    at_return = 0
    for i in range(args.writes):
        combo = {"targets": [{"provider": "p", "model": "mn"[i % 2]}]}
        with httpx.Client(base_url=url, timeout=10, headers=api) as writer:
            version = writer.get("/readyz").json()["configVersion"] + 1  # the only writer
            started = time.perf_counter()
            r = writer.put("/api/combos", json={"id": "bench", "combo": combo})
            r.raise_for_status()
            returned = time.perf_counter()
        put_ms.append((returned - started) * 1000)
        pending = dict(clients)
        first_round = True
        while pending:
            for pid, client in list(pending.items()):
                if (client.get("/healthz").json().get("configVersion") or -1) >= version:
                    del pending[pid]
            if first_round and not pending:
                at_return += 1
            first_round = False
            if time.perf_counter() - started > PER_WRITE_S:
                raise SystemExit(f"write {i}: {len(pending)} worker(s) still on the old version")
        visible_ms.append((time.perf_counter() - started) * 1000)

    print(f"{args.writes} writes, {args.workers} workers, poll {args.poll_ms} ms")
    print(f"PUT /api/combos answered: p50 {pct(put_ms, 50):.1f} ms, p99 {pct(put_ms, 99):.1f} ms")
    print(
        f"served by every worker (from sending the PUT): p50 {pct(visible_ms, 50):.1f} ms, "
        f"p99 {pct(visible_ms, 99):.1f} ms, max {max(visible_ms):.1f} ms, "
        f"mean {statistics.mean(visible_ms):.1f} ms"
    )
    print(f"every worker already served it when the PUT returned: {at_return}/{args.writes}")
    time.sleep(0.5)  # the last log lines
    if acks_ms:
        print(
            f"publish → every worker reloaded and acknowledged ({len(acks_ms)} writes): "
            f"p50 {pct(acks_ms, 50):.1f} ms, p99 {pct(acks_ms, 99):.1f} ms, "
            f"max {max(acks_ms):.1f} ms"
        )


if __name__ == "__main__":
    main()
