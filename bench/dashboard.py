"""Dashboard render time with a large request log (issue 13: < 300 ms with 1 million rows).

Fills a throwaway database with `--rows` request-log rows spread over the last 7 days, written
through the real writer path (`requestlog._write_log` + `usage.services.record_requests`, in
batches as the background writer does) and downsampled (`usage.services.compact`), then times
`GET /admin/` (the dashboard) and its live parts with Django's test client as a staff user.

    python bench/dashboard.py                      # SQLite in a temp dir, 1 000 000 rows
    python bench/dashboard.py --rows 200000 --renders 50
    python bench/dashboard.py --database-url postgres://postgres@127.0.0.1:5432/ocx_bench_dash

With --database-url the database must exist and is emptied first (its tables are migrated).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
USERS = [f"user{i:02d}" for i in range(20)]
COMBOS = {f"combo{i}": [f"prov{i}a/m{i}", f"prov{i}b/m{i}", f"prov{i}c/m{i}"] for i in range(5)}
WEEK_S = 7 * 86400


def setup_django(database_url: str | None, data_dir: str | None) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["OCX_DATA_DIR"] = data_dir or tempfile.mkdtemp(prefix="ocx-bench-dash-")
    os.environ.pop("REDIS_URL", None)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if database_url:
        call_command("flush", interactive=False, verbosity=0)


def configure() -> None:
    from combos.services import combo_set
    from providers.services import provider_set

    for combo, targets in COMBOS.items():
        for target in targets:
            name, model = target.split("/")
            provider_set(
                name=name,
                raw={
                    "adapter": "openai-responses",
                    "baseUrl": "http://127.0.0.1:9/v1",
                    "apiKey": f"sk-{name}",
                    "models": {model: {"contextWindow": 100000}},
                },
            )
        combo_set(
            combo_id=combo,
            raw={
                "targets": [
                    dict(zip(("provider", "model"), t.split("/"), strict=True)) for t in targets
                ]
            },
        )


def fill(rows: int, *, batch: int = 5000, seed: int = 7) -> float:
    """Write `rows` requests over the last week; returns the seconds it took."""
    from django.db import transaction
    from django.utils import timezone

    from usage import services as usage_services
    from usage.requestlog import RequestEntry, _write_log

    rng = random.Random(seed)
    now = time.time()
    started = time.monotonic()
    combos = list(COMBOS.items())
    for first in range(0, rows, batch):
        entries = []
        for i in range(first, min(rows, first + batch)):
            combo, targets = combos[rng.randrange(len(combos))]
            hopped = rng.random() < 0.05
            failed = rng.random() < 0.02
            target = targets[1] if hopped else targets[0]
            entries.append(
                RequestEntry(
                    request_id=f"req-{i}",
                    at=now - WEEK_S * (1 - i / rows),  # oldest first, the newest now
                    # Two keys per user.
                    key_id=(key := rng.randrange(2 * len(USERS))) + 1,
                    key_prefix=f"ocx_{key:04d}",
                    user=USERS[key // 2],
                    requested_model=f"combo/{combo}",
                    combo=combo,
                    target="" if failed else target,
                    status=502 if failed else 200,
                    outcome="error" if failed else "ok",
                    stream=True,
                    duration_ms=int(rng.lognormvariate(6.5, 0.8)),
                    input_tokens=None if failed else rng.randrange(100, 8000),
                    output_tokens=None if failed else rng.randrange(10, 2000),
                    ttft_ms=None if failed else int(rng.lognormvariate(5.5, 0.7)),
                    attempts=[
                        *(
                            [{"target": targets[0], "status": 429, "outcome": "hop"}]
                            if hopped
                            else []
                        ),
                        {"target": target, "status": 502 if failed else 200, "outcome": "served"},
                    ],
                )
            )
        with transaction.atomic():
            _write_log(entries)
            usage_services.record_requests(records=entries)
        if first // batch % 20 == 0:
            print(f"  {first + len(entries):>9} rows", file=sys.stderr, flush=True)
    folded, _ = usage_services.compact(now=timezone.now(), retention_days=30)
    print(f"  folded {folded} minute rows into hours", file=sys.stderr)
    return time.monotonic() - started


def timed(client: Any, url: str, n: int, *, cold: bool = False) -> dict[str, float]:
    from dashboard import selectors

    samples = []
    for _ in range(n):
        if cold:
            selectors.clear_cache()
        t0 = time.perf_counter()
        r = client.get(url)
        samples.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, (url, r.status_code)
    samples.sort()
    return {
        "p50": statistics.median(samples),
        "p95": samples[min(len(samples) - 1, int(len(samples) * 0.95))],
        "max": samples[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--renders", type=int, default=30)
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--data-dir", default=None, help="an OCX_DATA_DIR to keep; filled once, reused after"
    )
    args = parser.parse_args()
    setup_django(args.database_url, args.data_dir)

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from usage.models import RequestLog, UsageRollup

    if not RequestLog.objects.exists():
        configure()
        print(f"filling {args.rows} request-log rows ({connection.vendor}) …", file=sys.stderr)
        seconds = fill(args.rows)
        print(f"filled in {seconds:.0f} s", file=sys.stderr)
    logged, rollups = RequestLog.objects.count(), UsageRollup.objects.count()

    user = get_user_model().objects.filter(username="bench").first()
    if user is None:
        user = get_user_model().objects.create_superuser("bench", "b@example.com", "bench-pw-12")
    client = Client()
    client.force_login(user)
    client.get("/admin/")  # warm-up: template loading, first queries
    results = {
        "GET /admin/ (dashboard, 1 h charts)": timed(client, "/admin/", args.renders),
        "GET /admin/dashboard/live/": timed(client, "/admin/dashboard/live/", args.renders),
        "charts 1 h": timed(client, "/admin/dashboard/charts/?range=1h", args.renders),
        "charts 24 h (computed)": timed(
            client, "/admin/dashboard/charts/?range=24h", args.renders, cold=True
        ),
        "charts 7 d (computed)": timed(
            client, "/admin/dashboard/charts/?range=7d", args.renders, cold=True
        ),
        "charts 7 d (cached, < 60 s old)": timed(
            client, "/admin/dashboard/charts/?range=7d", args.renders
        ),
    }
    print(f"\n{connection.vendor}: {logged} request-log rows, {rollups} rollup rows")
    print("| what | p50 ms | p95 ms | max ms |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['p50']:.0f} | {r['p95']:.0f} | {r['max']:.0f} |")


if __name__ == "__main__":
    main()
