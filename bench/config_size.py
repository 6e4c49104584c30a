"""Config size (issue #24): 10 vs 10,000 keys and 5 vs 500 combos.

    python bench/config_size.py [--writes 20] [--workers 2] [--code DIR ...]
                                [--database-url postgres://…/postgres] [--redis-url URL]

For each checkout in `--code` (default: this one; give `/work/main` too for a before/after) and
each size, on a fresh PostgreSQL database and its own Redis prefix: starts `ocx serve --workers
N` (poll 500 ms, the default), bulk-inserts the keys (over one user per 10 keys) and combos
(two targets each) through the ORM in a child process running that checkout, bumps both
versions once, opens one kept-alive connection per worker (the worker is found from /proc, see
`propagation.py`) and measures:

* key write → served: `POST /api/keys`, then `GET /v1/models` with the new key on every
  worker's connection until all answer 200 (p50/p95 ms from sending the POST);
* combo write → served: `PUT /api/combos`, then `/healthz` `configVersion` on every worker
  until all serve it (p50/p95);
* worker CPU per write: the workers' utime + stime (/proc) over `--writes` key writes and as
  many combo writes with no polling, minus the same time idle, divided by the writes, per
  worker (the highest);
* whole reloads while writing: `ocx_config_reloads_total` (keys, config) summed over the
  workers, from before the first write to after the idle baseline: a write is patched in, so
  these stay at 0 unless a notice was missed;
* `GET /admin/combos/combo/` (100 rows per page, logged in): median of 5;
* `GET /api/keys`: time and size of the default page, and of walking every page (when the
  response has `nextCursor`).

Prints one table per run; the servers and databases are removed on exit.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
import propagation as prop  # noqa: E402 - the sibling bench script's helpers

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-config-size-token-0123456789"
STAFF = ("bench-admin", "bench-admin-password-0123")
PER_WRITE_S = 10.0
SIZES = ((10, 5), (10_000, 500))
PROVIDER = {
    "adapter": "openai-responses",
    "baseUrl": "http://127.0.0.1:9/v1",
    "models": {"m": {"contextWindow": 8000}, "n": {"contextWindow": 8000}},
}


# --- the child: bulk insert through the ORM of the checkout under test ----------------------


def fill(keys: int, combos: int) -> None:
    # bench/ holds scripts named like ocx's packages (dashboard.py): the checkout comes first.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    django.setup()
    import hashlib

    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.db import transaction

    from accounts.models import ClientKey
    from combos.models import Combo, ComboTarget
    from providers import services
    from providers.models import Provider

    user_model = get_user_model()
    with transaction.atomic():
        services.provider_set(name="p", raw=PROVIDER)
        provider = Provider.objects.get(name="p")
        users = user_model.objects.bulk_create(
            user_model(username=f"user{i:05d}", password=make_password(None))
            for i in range(max(1, keys // 10))
        )
        ClientKey.objects.bulk_create(
            ClientKey(
                user=users[i % len(users)],
                name=f"k{i}",
                prefix=f"ocx_b{i:05d}"[:10],
                digest=hashlib.sha256(f"ocx_bench-secret-{i}".encode()).hexdigest(),
                allowed_models=[],
            )
            for i in range(keys)
        )
        rows = Combo.objects.bulk_create(Combo(combo_id=f"c{i:04d}") for i in range(combos))
        ComboTarget.objects.bulk_create(
            ComboTarget(combo=c, provider=provider, model=m, position=j)
            for c in rows
            for j, m in enumerate("mn")
        )
        staff = user_model(username=STAFF[0], is_staff=True, is_superuser=True)
        staff.set_password(STAFF[1])
        staff.save()
        services.config_bump()
        services.keys_bump()


# --- the parent -------------------------------------------------------------------------------


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def whole_reloads(client: httpx.Client) -> dict[str, float]:
    """`ocx_config_reloads_total` by domain, summed over the workers (`/metrics`): a write that
    reached a worker as a notice is patched in, so these stay flat while the bench writes."""
    out = {"config": 0.0, "keys": 0.0}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "ocx_config_reloads_total":
                domain = sample.labels["domain"]
                out[domain] = out.get(domain, 0.0) + sample.value
    return out


def pct(values: list[float], p: float) -> float:
    return prop.pct(values, p)


def create_db(base: str) -> tuple[str, str]:
    import psycopg

    parts = urlsplit(base)
    name = f"ocx_bench_cfg_{uuid.uuid4().hex[:8]}"
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    atexit.register(drop)
    return urlunsplit(parts._replace(path=f"/{name}")), name


def start(code: Path, env: dict[str, str], workers: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ocxsite.cli", "serve", "--port", "0", "--workers", str(workers)],
        cwd=code,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    atexit.register(lambda: prop._stop(proc))
    assert proc.stdout is not None
    for line in proc.stdout:
        if "ocx listening on " in line:
            url = line.split("ocx listening on ")[1].split(" ")[0]
            break
    else:
        raise SystemExit("ocx exited before listening")
    threading.Thread(target=prop._drain, args=(proc,), daemon=True).start()
    return proc, url


def until_all(clients: dict[int, httpx.Client], seen: object, started: float) -> float:
    """ms from `started` until `seen(client)` holds on every worker's connection."""
    pending = dict(clients)
    while pending:
        for pid, client in list(pending.items()):
            if seen(client):  # type: ignore[operator]
                del pending[pid]
        if time.perf_counter() - started > PER_WRITE_S:
            raise SystemExit(f"{len(pending)} worker(s) never served the write")
    return (time.perf_counter() - started) * 1000


def admin_login(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=120, follow_redirects=False)
    page = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token is not None, "no login form"
    r = client.post(
        "/admin/login/?next=/admin/",
        data={"csrfmiddlewaretoken": token.group(1), "username": STAFF[0], "password": STAFF[1]},
        headers={"Referer": url + "/admin/login/"},
    )
    assert r.status_code == 302, f"admin login failed: {r.status_code}"
    return client


def run_one(code: Path, keys: int, combos: int, args: argparse.Namespace) -> dict[str, object]:
    db_url, _ = create_db(args.database_url)
    prefix = f"ocx-bench-cfg-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "OCX_DATA_DIR": tempfile.mkdtemp(prefix="ocx-bench-cfg-"),
        "OCX_ADMIN_TOKEN": TOKEN,
        "REDIS_URL": args.redis_url,
        "OCX_STATE_KEY_PREFIX": prefix,
        "DATABASE_URL": db_url,
        "PYTHONPATH": str(code),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc, url = start(code, env, args.workers)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("ocx did not answer /healthz")
        time.sleep(0.2)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--fill", str(keys), str(combos)],
        cwd=code,
        env=env,
        check=True,
    )
    fill_s = time.perf_counter() - started
    api = {"Authorization": f"Bearer {TOKEN}"}
    admin = httpx.Client(base_url=url, timeout=60, headers=api)
    clients = prop.one_per_worker(url, args.workers)
    known = "ocx_bench-secret-0"
    for client in clients.values():  # every runtime loaded with the filled tables
        until_all(
            {0: client},
            lambda c: (
                c.get("/v1/models", headers={"Authorization": f"Bearer {known}"}).status_code == 200
            ),
            time.perf_counter(),
        )
    pids = list(clients)
    reloads_before = whole_reloads(admin)

    key_ms: list[float] = []
    revoke_ms: list[float] = []
    for i in range(args.writes):
        t0 = time.perf_counter()
        r = admin.post("/api/keys", json={"user": f"writer{i % 3}"})
        r.raise_for_status()
        secret, key_id = r.json()["key"], r.json()["id"]
        bearer = {"Authorization": f"Bearer {secret}"}
        key_ms.append(
            until_all(
                clients, lambda c, b=bearer: c.get("/v1/models", headers=b).status_code == 200, t0
            )
        )
        t0 = time.perf_counter()
        admin.delete(f"/api/keys/{key_id}").raise_for_status()
        revoke_ms.append(
            until_all(
                clients, lambda c, b=bearer: c.get("/v1/models", headers=b).status_code == 401, t0
            )
        )

    combo_ms: list[float] = []
    for i in range(args.writes):
        combo = {"targets": [{"provider": "p", "model": "mn"[i % 2]}]}
        version = admin.get("/readyz").json()["configVersion"] + 1
        t0 = time.perf_counter()
        admin.put("/api/combos", json={"id": "bench", "combo": combo}).raise_for_status()
        combo_ms.append(
            until_all(
                clients,
                lambda c, v=version: (c.get("/healthz").json().get("configVersion") or -1) >= v,
                t0,
            )
        )

    # CPU per write: writes back to back (each returns once every worker acknowledged), then
    # the same time idle, on the same workers.
    def cpu_of(action: object) -> tuple[dict[int, float], float]:
        before = {p: cpu_ms(p) for p in pids}
        t0 = time.perf_counter()
        action()  # type: ignore[operator]
        wall = time.perf_counter() - t0
        return {p: cpu_ms(p) - before[p] for p in pids}, wall

    def key_writes() -> None:
        for _ in range(args.writes):
            r = admin.post("/api/keys", json={"user": "cpu"})
            r.raise_for_status()
            admin.delete(f"/api/keys/{r.json()['id']}").raise_for_status()

    def combo_writes() -> None:
        for i in range(args.writes):
            combo = {"targets": [{"provider": "p", "model": "nm"[i % 2]}]}
            admin.put("/api/combos", json={"id": "bench", "combo": combo}).raise_for_status()

    key_cpu, key_wall = cpu_of(key_writes)
    combo_cpu, combo_wall = cpu_of(combo_writes)
    idle_cpu, _ = cpu_of(lambda: time.sleep(key_wall))
    # Per worker, highest first: the one that took the writes (it also served the API
    # request), then the others (the notice alone). A round is a create and a revoke.
    key_per_write = sorted(
        ((key_cpu[p] - idle_cpu[p]) / (2 * args.writes) for p in pids), reverse=True
    )
    combo_per_write = sorted(
        ((combo_cpu[p] - idle_cpu[p] * combo_wall / key_wall) / args.writes for p in pids),
        reverse=True,
    )

    reloads = {d: n - reloads_before.get(d, 0.0) for d, n in whole_reloads(admin).items()}
    staff = admin_login(url)
    staff.get("/admin/combos/combo/").raise_for_status()
    admin_ms = []
    for _ in range(5):
        t0 = time.perf_counter()
        staff.get("/admin/combos/combo/").raise_for_status()
        admin_ms.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    page = admin.get("/api/keys")
    page.raise_for_status()
    keys_page_ms = (time.perf_counter() - t0) * 1000
    keys_page_kb = len(page.content) / 1024
    listed = len(page.json()["keys"])
    t0 = time.perf_counter()
    body = page.json()
    while body.get("nextCursor"):
        nxt = admin.get("/api/keys", params={"cursor": body["nextCursor"]})
        nxt.raise_for_status()
        body = nxt.json()
        listed += len(body["keys"])
    walk_ms = keys_page_ms + (time.perf_counter() - t0) * 1000

    prop._stop(proc)
    return {
        "code": str(code),
        "keys": keys,
        "combos": combos,
        "fill s": round(fill_s, 1),
        "key write→served p50/p95 ms": f"{pct(key_ms, 50):.0f}/{pct(key_ms, 95):.0f}",
        "revoke→refused p50/p95 ms": f"{pct(revoke_ms, 50):.0f}/{pct(revoke_ms, 95):.0f}",
        "combo write→served p50/p95 ms": f"{pct(combo_ms, 50):.0f}/{pct(combo_ms, 95):.0f}",
        "CPU/key write ms (writer, other)": ", ".join(f"{v:.1f}" for v in key_per_write),
        "CPU/combo write ms (writer, other)": ", ".join(f"{v:.1f}" for v in combo_per_write),
        "whole reloads while writing (keys, config)": f"{reloads['keys']:.0f}, {reloads['config']:.0f}",
        "admin combo list ms": f"{statistics.median(admin_ms):.0f}",
        "/api/keys page ms, KB": f"{keys_page_ms:.0f}, {keys_page_kb:.0f}",
        "/api/keys all pages ms (keys)": f"{walk_ms:.0f} ({listed})",
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--fill":
        fill(int(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--code", action="append", type=Path, help="checkout(s) to measure")
    parser.add_argument("--sizes", default="10:5,10000:500", help="keys:combos,...")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args()
    sizes = [tuple(int(n) for n in s.split(":")) for s in args.sizes.split(",")]
    rows = []
    for code in args.code or [ROOT]:
        for keys, combos in sizes:
            rows.append(run_one(code.resolve(), keys, combos, args))
            print(rows[-1], flush=True)  # as it comes: a long run keeps what it measured
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
