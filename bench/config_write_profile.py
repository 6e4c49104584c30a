"""CPU profile of one config write at 10,000 keys / 500 combos (issue #24).

    DATABASE_URL=postgres://…/ocx_scratch python bench/config_write_profile.py [--keys 10000]
        [--combos 500] [--writes 20] [--top 25] [--fill]

Runs in one process: a runtime serving on an event loop in a thread (as a Daphne worker's),
then `--writes` combo writes (`PUT /api/combos`) and key writes (`POST` + `DELETE /api/keys`)
through Django's test client, each under cProfile in the calling thread (the writing worker's
request thread: validation, the ORM writes, the read of the write's delta and its hand-over
to the loop). Prints CPU ms per write (request thread and loop thread, unprofiled) and the top functions by cumulative thread CPU time.
`--fill` first empties the database's keys and combos and fills it as `config_size.py` does.
CPU profiles hold on a loaded machine; wall-clock times do not.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import threading
import time
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
sys.path.insert(0, str(here.parent))
TOKEN = "bench-config-size-token-0123456789"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--combos", type=int, default=500)
    parser.add_argument("--writes", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--fill", action="store_true")
    parser.add_argument("--callees", help="also print what functions matching this regex call")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    os.environ["OCX_ADMIN_TOKEN"] = TOKEN
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.fill:
        sys.path.insert(0, str(here))
        import config_size

        from accounts.models import ClientKey
        from combos.models import Combo
        from providers.models import Provider

        ClientKey.objects.all().delete()
        Combo.objects.all().delete()
        Provider.objects.all().delete()
        from django.contrib.auth import get_user_model

        get_user_model().objects.all().delete()
        config_size.fill(args.keys, args.combos)

    from django.test import Client

    from gateway import runtime

    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    assert loop_thread.ident is not None
    loop_clock = time.pthread_getcpuclockid(loop_thread.ident)
    rt = runtime.get_runtime()
    asyncio.run_coroutine_threadsafe(rt.ready(), loop).result(120)
    print(f"runtime: {len(rt.keys)} keys, {len(rt.snapshot.combos)} combos")  # type: ignore[union-attr]
    client = Client(headers={"Authorization": f"Bearer {TOKEN}"})

    def combo_write(i: int) -> None:
        body = {"id": "bench", "combo": {"targets": [{"provider": "p", "model": "mn"[i % 2]}]}}
        r = client.put("/api/combos", body, content_type="application/json")
        assert r.status_code == 200, r.content

    def key_write(i: int) -> None:
        r = client.post("/api/keys", {"user": f"writer{i % 3}"}, content_type="application/json")
        assert r.status_code == 201, r.content
        r = client.delete(f"/api/keys/{r.json()['id']}")
        assert r.status_code == 200, r.content

    for name, write, per in (("combo write", combo_write, 1), ("key create+revoke", key_write, 2)):
        write(-1)  # warm
        # Unprofiled first: the CPU of the request thread and of the loop thread per write.
        t0, l0 = time.thread_time(), time.clock_gettime(loop_clock)
        for i in range(args.writes):
            write(i)
        cpu = (time.thread_time() - t0) * 1000 / (args.writes * per)
        loop_cpu = (time.clock_gettime(loop_clock) - l0) * 1000 / (args.writes * per)
        # Then profiled, in thread CPU time (waits on the database or the loop cost nothing).
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        for i in range(args.writes):
            write(i)
        prof.disable()
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out).sort_stats("cumulative")
        stats.print_stats(args.top)
        if args.callees:
            stats.print_callees(args.callees)
        print(
            f"\n=== {name}: {cpu:.1f} ms CPU per write in the request thread, "
            f"{loop_cpu:.1f} ms in the serving loop's ==="
        )
        print(out.getvalue())
    loop.call_soon_threadsafe(loop.stop)


if __name__ == "__main__":
    main()
