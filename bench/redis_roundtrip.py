"""CPU of one Redis round trip on the request path, layer by layer, in one process.

    python bench/redis_roundtrip.py [--url redis://127.0.0.1:6379/12] [--n 5000]

Sequential calls (as at c=1) against a real Redis: the bare client (`state.resp`), then the
breaker's bound (`state.redis_guard`), the routing state's compare-and-set check (a healthy
pick), the guarded store around it, the quota gate's read, and a key's and a user's token
budgets: their admission read on its own (a request with a window budget still makes it; with
token budgets only the quota gate's read carries it) and their charge, and (issue #42) the
reservation of a request's expected cost against a key token, a user token and a team dollar
budget (`usage.reservations`: one script call at admission) and its release at the end (one
more). CPU (user+sys of this process)
and wall time per call: what a request pays for each round trip it makes, and how much of it
is the round trip itself (a PING) rather than ocx's code around it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def measure(name: str, op: Callable[[], Awaitable[Any]], n: int) -> None:
    for _ in range(200):
        await op()
    (u0, s0), w0 = cpu(), time.perf_counter()
    for _ in range(n):
        await op()
    (u1, s1), w1 = cpu(), time.perf_counter()
    us = 1e6 / n
    print(
        f"{name:40s} {(u1 - u0 + s1 - s0) * us:6.1f} µs CPU ({(u1 - u0) * us:5.1f} user, "
        f"{(s1 - s0) * us:5.1f} sys)  {(w1 - w0) * us:6.1f} µs wall"
    )


async def run(url: str, n: int) -> None:
    from quota.tracker import QuotaTracker
    from state.redis_guard import GuardedJsonStore, GuardedStateStore, RedisBreaker
    from state.redis_state import RedisStateStore
    from state.redis_store import RedisJsonStore
    from state.resp import RespClient

    prefix = f"ocxrt{os.getpid()}"
    client = RespClient(url)
    await measure("PING (the round trip itself)", client.ping, n)
    await measure("GET", lambda: client.get(f"{prefix}:none"), n)
    breaker = RedisBreaker(url, timeout_s=0.05)
    await measure("GET under the breaker", lambda: breaker.call(lambda: client.get("x")), n)
    state = RedisStateStore(url, prefix)

    def keep(s: Any) -> tuple[Any, None]:
        return s, None

    await measure("routing state check (healthy pick)", lambda: state.update("c", keep), n)
    guarded = GuardedStateStore(state, breaker)
    await measure("  the same, guarded", lambda: guarded.update("c", keep), n)
    tracker = QuotaTracker(GuardedJsonStore(RedisJsonStore(url, prefix), breaker))
    pairs = [("p", "k1")]
    await measure(
        "quota gate, one credential, guarded",
        lambda: tracker.gate(pairs, now=int(time.time() * 1000), shared=True),
        n,
    )
    # A key and a user token budget, as ocx-full has (`bench/run.py`): admission, then charge.
    from state.budget_store import RedisBudgetStore
    from state.redis_guard import GuardedBudgetStore
    from usage.budget_gate import BudgetGate
    from usage.budgets import ScopedBudget, TokenBudget

    gate = BudgetGate(
        GuardedBudgetStore(RedisBudgetStore(url), breaker, 1), prefix=prefix, tz="UTC"
    )
    budget = TokenBudget(tokens=10**15, period="day")
    budgets = (
        ScopedBudget(kind="key", scope="k1", owner="key k", budget=budget),
        ScopedBudget(kind="user", scope="u1", owner="user u", budget=budget),
    )
    now = lambda: int(time.time() * 1000)  # noqa: E731
    await measure("budget admission, two budgets, guarded", lambda: gate.admit(budgets, now()), n)
    await measure(
        "budget charge, two budgets, guarded",
        lambda: gate.charge(budgets, tokens=30, served=None, now_ms=now()),
        n,
    )
    # Issue #42: the reservation ocx-full's key makes per request (`bench/run.py`), both ends.
    from usage.budgets import UsdBudget
    from usage.reservations import Hold, Reservations

    reservations = Reservations(gate)
    held = (
        *budgets,
        ScopedBudget(
            kind="team", scope="t1", owner="team t", budget=UsdBudget(usd=10**9, period="month")
        ),
    )

    async def reserve() -> Any:
        return await reservations.reserve(held, tokens=30, micros=40, now_ms=now())

    first = await reserve()
    assert isinstance(first, Hold) and first.shared, first
    holds: list[Any] = []

    async def reserve_kept() -> None:
        holds.append(await reserve())

    await measure("reservation, three budgets, guarded", reserve_kept, n)
    await measure("  its release", lambda: reservations.release(holds.pop()), n)
    await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12"))
    p.add_argument("--n", type=int, default=5000)
    args = p.parse_args()
    os.environ.setdefault("OCX_DATA_DIR", tempfile.mkdtemp(prefix="ocx-rt-bench-"))
    os.environ["REDIS_URL"] = args.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    asyncio.run(run(args.url, args.n))


if __name__ == "__main__":
    main()
