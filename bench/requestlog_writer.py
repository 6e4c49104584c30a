"""CPU per row of the request-log writer: the ORM's `bulk_create` against the writer's own
statement (`COPY` on PostgreSQL, a prepared `INSERT` with `executemany` on SQLite).

    python bench/requestlog_writer.py [--batches 30] [--rows 200] [--database-url postgres://…]

Runs in a throwaway data directory (SQLite) or the given database (its tables are created by
`migrate`; use a scratch database). Prints the process CPU per row of each, twice, interleaved.
The writer runs in a background thread of the worker, so this is the CPU a request pays.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--rows", type=int, default=200, help="rows per batch (the writer's batch)")
    p.add_argument("--database-url", default="")
    args = p.parse_args(argv)
    os.environ["OCX_DATA_DIR"] = tempfile.mkdtemp(prefix="ocx-writer-bench-")
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from usage import requestlog
    from usage.models import RequestLog

    call_command("migrate", verbosity=0)

    def entries(n: int) -> list[requestlog.RequestEntry]:
        now = time.time()
        return [
            requestlog.RequestEntry(
                request_id=f"r{i}",
                at=now,
                key_prefix="ocx_abcd",
                user="bench",
                requested_model="combo/bench",
                combo="bench",
                target="mock/m",
                status=200,
                outcome="ok",
                duration_ms=3,
                input_tokens=10,
                output_tokens=20,
                cached_tokens=0,
                attempts=[{"target": "mock/m", "status": 200, "reason": "ok", "ms": 3}],
            )
            for i in range(n)
        ]

    not_logged = ("reasoning_tokens", "key_id", "ttft_ms")

    def orm(batch: list[requestlog.RequestEntry]) -> None:
        rows = []
        for e in batch:
            data: dict[str, Any] = dict(vars(e))
            for name in not_logged:
                del data[name]
            data["at"] = dt.datetime.fromtimestamp(e.at, tz=dt.UTC)
            rows.append(RequestLog(**data))
        RequestLog.objects.bulk_create(rows)

    print(f"{connection.vendor}: {args.batches} batches of {args.rows} rows")
    for name, fn in (("bulk_create", orm), ("writer", requestlog._write_log)) * 2:
        batches = [entries(args.rows) for _ in range(args.batches)]
        started = time.process_time()
        for batch in batches:
            with transaction.atomic():
                fn(batch)
        per_row = (time.process_time() - started) / (args.batches * args.rows)
        print(f"  {name:12s} {per_row * 1e6:6.1f} µs CPU per row")
    RequestLog.objects.all().delete()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
