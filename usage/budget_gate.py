"""Budget enforcement on the proxy path (PRODUCT §9.5).

`admit` runs before routing: one read of every counter the key's budgets use (one Redis round
trip), no ORM; a used-up budget refuses the request. With Redis and token budgets only, that
read rides in the quota gate's round trip instead (`along`, then `admit_read`). `charge` runs
at request end, before the last byte reaches the client (so a client's next request already
sees it): the request's tokens go to its token budgets, and each rise of a served answer's
quota-window used-percent goes to its window budgets. A request already running is never cut,
so concurrent requests admitted together can take a budget past its limit by what they use.

Crossing 80 % and 100 % of a budget hands one event to `on_event`: counters only grow within
a period, so exactly one request (on one worker) crosses each threshold once per period.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from quota.windows import Window, windows_from_headers
from routing.pricing import PriceBook
from routing.types import ConfigSnapshot
from state.budget_store import COUNTER_GRACE_MS
from usage.budgets import (
    MICROS,
    CounterBudget,
    Period,
    ScopedBudget,
    TokenBudget,
    UsdBudget,
    WindowBudget,
    period_bounds,
    usd_text,
)

log = logging.getLogger("ocx.budget")
THRESHOLDS = (80, 100)
Pair = tuple[str, str]  # (provider, credential fingerprint)


class BudgetStore(Protocol):
    async def read(
        self, counters: Sequence[str], hashes: Sequence[str], now_ms: int
    ) -> tuple[list[int], list[dict[str, str]]]: ...

    async def add_many(self, items: Sequence[tuple[str, int, int]], now_ms: int) -> list[int]:
        """Add `amount` to each counter `(name, amount, expire_at_ms)` (one round trip)."""
        ...

    async def attribute(
        self,
        seen: str,
        hashes: Sequence[str],
        field: str,
        used: float,
        reset_ms: int,
        now_ms: int,
    ) -> tuple[float, list[float]]: ...


class HasBudgets(Protocol):
    @property
    def budgets(self) -> tuple[ScopedBudget, ...]: ...


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}".rstrip("0")


def _cents(value: float) -> str:
    return f"{value:.2f}"


@dataclass(frozen=True)
class Refusal:
    """A used-up budget: what the 429 says."""

    budget: ScopedBudget
    limit: float
    used: float
    reset_ms: int
    window: str | None = None  # the quota window of a window budget
    tz: str = "UTC"

    def message(self) -> str:
        reset = dt.datetime.fromtimestamp(self.reset_ms / 1000, ZoneInfo(self.tz))
        b = self.budget
        if isinstance(b.budget, TokenBudget):
            used = f"{_fmt(self.used)} tokens"
        elif isinstance(b.budget, UsdBudget):
            used = usd_text(self.used)
        else:
            used = f"{_fmt(self.used)} points of the {self.window} window"
        return (
            f"Budget exceeded: {b.owner} may use {b.budget.describe()} and has used {used}; "
            f"it resets at {reset.isoformat()}"
        )

    def headers(self, now_ms: int) -> list[tuple[bytes, bytes]]:
        remaining = max(0.0, self.limit - self.used)
        # A dollar budget's amounts are dollars with cents (`50.00`).
        fmt = _cents if isinstance(self.budget.budget, UsdBudget) else _fmt
        return [
            (b"x-ocx-budget-limit", fmt(self.limit).encode()),
            (b"x-ocx-budget-remaining", fmt(remaining).encode()),
            (b"x-ocx-budget-reset", str(math.ceil(self.reset_ms / 1000)).encode()),
            (b"retry-after", str(max(1, math.ceil((self.reset_ms - now_ms) / 1000))).encode()),
        ]


SeedId = tuple[str, str, Period]  # (scope, "tokens" | "usd", period): one counter series
Recorded = Callable[[Sequence[SeedId], int], Mapping[SeedId, int]]


def unit(budget: CounterBudget) -> str:
    return "tokens" if isinstance(budget, TokenBudget) else "usd"


def limit_units(budget: CounterBudget) -> int:
    """The limit in counter units: tokens, or micro-dollars."""
    return budget.tokens if isinstance(budget, TokenBudget) else budget.micros


def _scale(budget: object) -> float:
    return MICROS if isinstance(budget, UsdBudget) else 1


class BudgetGate:
    def __init__(
        self,
        store: BudgetStore,
        *,
        prefix: str,
        tz: str = "UTC",
        on_event: Callable[[dict[str, object]], None] | None = None,
        recorded: Recorded | None = None,
        seed_wait_s: float = 5.0,
        seed_retry_s: float = 5.0,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.tz_name = tz
        self.tz = ZoneInfo(tz)
        self.on_event = on_event
        self._periods: dict[Period, tuple[str, int, int]] = {}
        self._providers_of: object = None
        self._providers: frozenset[str] = frozenset()
        self.prices = PriceBook()
        # Durable counters (`seed`): what was recorded this period (request log rollups)
        # raises each counter series once per worker, and again after a Redis flush.
        self.recorded = recorded
        self.seed_wait_s = seed_wait_s
        self.seed_retry_s = seed_retry_s
        self.seeded: set[SeedId] = set()
        self.sentinel = f"{prefix}:budget-seeded"
        self._want: set[SeedId] = set()
        self._seeding: asyncio.Task[None] | None = None
        self._failed_at = -math.inf
        self.seeds = 0  # seed runs done (tests, /metrics-free introspection)
        # The key map served (set by the runtime): after a flush every key's series is seeded
        # again, since other workers still count theirs as seeded.
        self.key_map: Mapping[str, HasBudgets] = {}

    def _period(self, period: Period, now_ms: int) -> tuple[str, int, int]:
        cached = self._periods.get(period)
        if cached is None or not cached[1] <= now_ms < cached[2]:
            cached = self._periods[period] = period_bounds(period, now_ms, self.tz)
        return cached

    def _counter(self, sb: ScopedBudget, budget: CounterBudget, now_ms: int) -> tuple[str, int]:
        label, _, end = self._period(budget.period, now_ms)
        return f"{self.prefix}:budget:{sb.scope}:{unit(budget)}:{budget.period}:{label}", end

    def _token_name(self, sb: ScopedBudget, now_ms: int) -> str:
        assert isinstance(sb.budget, TokenBudget | UsdBudget)
        return self._counter(sb, sb.budget, now_ms)[0]

    def _hash(self, sb: ScopedBudget, budget: WindowBudget) -> str:
        return f"{self.prefix}:budget:{sb.scope}:window:{budget.provider}"

    def window_providers(self, keys: Mapping[str, HasBudgets]) -> frozenset[str]:
        """Providers named by any window budget of the key map (cached per map object): their
        answers' rises are tracked for every request, budgeted or not, so that each rise is
        counted against the request that reported it."""
        if keys is not self._providers_of:
            self._providers = frozenset(
                sb.budget.provider
                for info in keys.values()
                for sb in info.budgets
                if isinstance(sb.budget, WindowBudget)
            )
            self._providers_of = keys
        return self._providers

    @property
    def _shared(self) -> bool:
        return self.recorded is not None and bool(getattr(self.store, "shared_counters", False))

    # --- cost -------------------------------------------------------------------------------

    @staticmethod
    def wants_cost(budgets: Sequence[ScopedBudget]) -> bool:
        return any(isinstance(sb.budget, UsdBudget) for sb in budgets)

    def cost_micros(
        self,
        snapshot: ConfigSnapshot | None,
        target: str,
        *,
        at: float,
        input_tokens: int | None,
        cached_tokens: int | None,
        output_tokens: int | None,
    ) -> int:
        """A served request's cost in micro-dollars: the target's price (metadata first, rates
        cached per snapshot and day by `PriceBook`); 0 for a subscription target, an unpriced
        target or an answer without usage."""
        if snapshot is None or not target:
            return 0
        priced = self.prices.price(
            snapshot,
            target,
            at=at,
            input_tokens=input_tokens,
            cached_tokens=cached_tokens,
            output_tokens=output_tokens,
        )
        return round(priced.cost_usd * MICROS) if priced.cost_usd else 0

    # --- durable counters ---------------------------------------------------------------------

    def _seed_ids(self, budgets: Iterable[ScopedBudget]) -> set[SeedId]:
        return {
            (sb.scope, unit(sb.budget), sb.budget.period)
            for sb in budgets
            if isinstance(sb.budget, TokenBudget | UsdBudget)
        }

    def unseeded(self, budgets: Sequence[ScopedBudget]) -> bool:
        """Whether a counter of these budgets has not been raised to what was recorded yet
        (a set lookup per budget: the proxy's check before admission)."""
        if self.recorded is None:
            return False
        seeded = self.seeded
        for sb in budgets:
            b = sb.budget
            if not isinstance(b, WindowBudget) and (sb.scope, unit(b), b.period) not in seeded:
                return True
        return False

    def retain(self, keys: Mapping[str, HasBudgets]) -> None:
        """Forget the seeding of series no key has any more (a new map): a budget removed and
        set again later is seeded again, since nothing was charged to it in between."""
        self.key_map = keys
        live: set[SeedId] = set()
        for info in keys.values():
            live |= self._seed_ids(info.budgets)
        self.seeded &= live

    def replaced(
        self,
        keys: Mapping[str, HasBudgets],
        old: Iterable[ScopedBudget],
        new: Iterable[ScopedBudget],
    ) -> bool:
        """`retain` for a patch of a few keys (no pass over the map): the series only their
        old entries had are forgotten (one still held by another key is merely seeded again,
        which only raises); True when a series of their new entries is not seeded yet."""
        self.key_map = keys
        if self.recorded is None:
            return False
        new_ids = self._seed_ids(new)
        self.seeded -= self._seed_ids(old) - new_ids
        return bool(new_ids - self.seeded)

    async def seed(
        self,
        budgets: Iterable[ScopedBudget] | None = None,
        *,
        wait: bool = True,
        every: Mapping[str, HasBudgets] | None = None,
    ) -> None:
        """Raise the counters of `budgets` (or of every key of `every`) not seeded yet to what
        was recorded this period, in a background task (the query runs in a thread); `wait`:
        until it is done, at most `seed_wait_s`. A failed seed is tried again `seed_retry_s`
        later; meanwhile requests are admitted on the counters as they are."""
        if self.recorded is None:
            return
        if every is not None:
            budgets = [sb for info in every.values() for sb in info.budgets]
        ids = self._seed_ids(budgets or ()) - self.seeded
        if not ids:
            return
        if time.monotonic() - self._failed_at < self.seed_retry_s:
            return
        self._want |= ids
        if self._seeding is None or self._seeding.done():
            self._seeding = asyncio.get_running_loop().create_task(self._seed_loop())
        if wait:
            try:
                await asyncio.wait_for(asyncio.shield(self._seeding), self.seed_wait_s)
            except TimeoutError:
                log.warning("budget counters: seeding from the usage records takes long")

    async def _seed_loop(self) -> None:
        from server.background import in_thread

        assert self.recorded is not None
        if any(kind == "usd" for _, kind, _ in self._want):
            # The price data loads here, in a thread, not at the first dollar charge.
            from routing.pricing import provider_ids

            try:
                await in_thread(provider_ids)
            except Exception:  # noqa: BLE001 - the charge then loads it; seeding goes on
                log.exception("budget counters: could not load the price data")
        while self._want:
            ids, self._want = sorted(self._want), set()
            now_ms = int(time.time() * 1000)
            try:
                found = await in_thread(self.recorded, ids, now_ms)
                items = []
                for scope, kind, period in ids:
                    label, _, end = self._period(period, now_ms)
                    name = f"{self.prefix}:budget:{scope}:{kind}:{period}:{label}"
                    items.append(
                        (name, int(found.get((scope, kind, period), 0)), end + COUNTER_GRACE_MS)
                    )
                await self.store.raise_counters(  # type: ignore[attr-defined]
                    items, now_ms, sentinel=self.sentinel if self._shared else None
                )
            except Exception:  # noqa: BLE001 - admitted on the live counters; retried later
                log.exception("budget counters: could not seed them from the usage records")
                self._failed_at = time.monotonic()
                self._want.clear()
                return
            self.seeded.update(ids)
            self.seeds += 1

    async def _flushed(self, budgets: Sequence[ScopedBudget]) -> None:
        """The shared store lost its counters (a Redis restart or FLUSHALL): seed again."""
        log.warning("budget counters: the shared store was emptied; seeding them again")
        self.seeded.clear()
        # Every key's series, not only this request's: the sentinel this seed sets back tells
        # the other workers nothing, and they still count their series as seeded.
        every = [sb for info in self.key_map.values() for sb in info.budgets]
        await self.seed([*budgets, *every])

    def _degraded(self) -> bool:
        """The shared store is out (its breaker open): a missing sentinel means nothing then."""
        breaker = getattr(self.store, "breaker", None)
        return breaker is not None and bool(breaker.open)

    # --- admission ------------------------------------------------------------------------------

    def along(self, budgets: Sequence[ScopedBudget], now_ms: int) -> list[str] | None:
        """The Redis names of the budgets' counters when another read of the request can fetch
        them in its own round trip (`admit_along`): token and dollar budgets only (window
        budgets are hashes) and a store that keeps them in Redis (`note_read`). None: `admit`
        reads them. The seeding sentinel comes last: missing, the store was flushed."""
        if not budgets or getattr(self.store, "note_read", None) is None:
            return None
        names = []
        for sb in budgets:
            if isinstance(sb.budget, WindowBudget):
                return None
            names.append(self._token_name(sb, now_ms))
        if self._shared:
            names.append(self.sentinel)
        return names

    async def admit_along(
        self,
        budgets: Sequence[ScopedBudget],
        names: Sequence[str],
        raws: Sequence[bytes | None],
        now_ms: int,
    ) -> Refusal | None:
        """`admit` on the counters read along: `names` as `along(budgets, now_ms)` gave them,
        `raws` their values in that order."""
        if self._shared:
            if raws[-1] is None:
                await self._flushed(budgets)
                return await self.admit(budgets, now_ms, recheck=False)
            names, raws = names[:-1], raws[:-1]
        return self.admit_read(budgets, names, raws, now_ms)

    def admit_read(
        self,
        budgets: Sequence[ScopedBudget],
        names: Sequence[str],
        raws: Sequence[bytes | None],
        now_ms: int,
    ) -> Refusal | None:
        assert len(names) == len(raws) == len(budgets)
        values = [int(raw) if raw is not None else 0 for raw in raws]
        self.store.note_read(names, values)  # type: ignore[attr-defined]
        refusals = self._counter_refusals(budgets, values, now_ms)
        return max(refusals, key=lambda r: r.reset_ms) if refusals else None

    async def admit(
        self, budgets: Sequence[ScopedBudget], now_ms: int, *, recheck: bool = True
    ) -> Refusal | None:
        """The used-up budget with the latest reset (the request is refused until then)."""
        counted = [sb for sb in budgets if not isinstance(sb.budget, WindowBudget)]
        windows = [(sb, sb.budget) for sb in budgets if isinstance(sb.budget, WindowBudget)]
        names = [self._token_name(sb, now_ms) for sb in counted]
        shared = self._shared and bool(names)
        values, maps = await self.store.read(
            names + [self.sentinel] if shared else names,
            [self._hash(sb, b) for sb, b in windows],
            now_ms,
        )
        if shared:
            if not values.pop() and recheck and not self._degraded():
                await self._flushed(budgets)
                return await self.admit(budgets, now_ms, recheck=False)
        refusals = self._counter_refusals(counted, values, now_ms)
        for (sb, wb), data in zip(windows, maps, strict=True):
            for field, value in data.items():
                reset = data.get(field + "|r")
                if reset is None or int(reset) <= now_ms:
                    continue  # a reset marker, or a window that has reset since
                if float(value) >= wb.percent - 1e-9:
                    window = field.rsplit("|", 1)[-1]
                    refusals.append(
                        Refusal(sb, wb.percent, float(value), int(reset), window, self.tz_name)
                    )
        return max(refusals, key=lambda r: r.reset_ms) if refusals else None

    def _counter_refusals(
        self, counted: Sequence[ScopedBudget], values: Sequence[int], now_ms: int
    ) -> list[Refusal]:
        refusals = []
        for sb, used in zip(counted, values, strict=True):
            b = sb.budget
            assert isinstance(b, TokenBudget | UsdBudget)
            if used >= limit_units(b):
                end = self._period(b.period, now_ms)[2]
                scale = _scale(b)
                refusals.append(
                    Refusal(sb, limit_units(b) / scale, used / scale, end, tz=self.tz_name)
                )
        return refusals

    async def charge(
        self,
        budgets: Sequence[ScopedBudget],
        *,
        tokens: int | None,
        served: tuple[Pair, Mapping[str, str]] | None,
        now_ms: int,
        providers: frozenset[str] = frozenset(),
        usd_micros: int = 0,
        release: Sequence[tuple[str, int]] = (),
    ) -> bool:
        """Count a finished request against its budgets (`tokens` None: usage unknown;
        `usd_micros` its cost, 0 when free, unpriced or unknown). `release`: the request's
        reservations in the store (`usage.reservations`), let go in the same call when there
        is a charge; True when they were."""
        released = False
        if tokens or usd_micros:
            charged: list[tuple[ScopedBudget, CounterBudget, int, int]] = []
            items: list[tuple[str, int, int]] = []
            for sb in budgets:
                b = sb.budget
                if isinstance(b, WindowBudget):
                    continue
                amount = tokens if isinstance(b, TokenBudget) else usd_micros
                if amount and amount > 0:  # a counter never goes down
                    name, end = self._counter(sb, b, now_ms)
                    charged.append((sb, b, end, amount))
                    items.append((name, amount, end + COUNTER_GRACE_MS))
            if items:
                charged_n = len(items)
                if release:
                    # Negative amounts: the reservations go in the charge's own script call.
                    expiry = now_ms + COUNTER_GRACE_MS
                    items += [(name, -amount, expiry) for name, amount in release]
                    released = True
                totals = (await self.store.add_many(items, now_ms))[:charged_n]
                for (sb, b, end, amount), new in zip(charged, totals, strict=True):
                    scale = _scale(b)
                    self._crossed(
                        sb, (new - amount) / scale, new / scale, limit_units(b) / scale, end, None
                    )
        if served is None:
            return released
        pair, headers = served
        scoped = [
            sb
            for sb in budgets
            if isinstance(sb.budget, WindowBudget) and sb.budget.provider == pair[0]
        ]
        if not scoped and pair[0] not in providers:
            return released
        for window in _budget_windows(windows_from_headers(headers, now=now_ms)):
            assert window.used_percent is not None and window.resets_at_ms is not None
            name = window.name if window.name != "custom" else f"custom{window.window_minutes}"
            rise, points = await self.store.attribute(
                f"{self.prefix}:budget-seen:{pair[0]}:{pair[1]}:{name}",
                [self._hash(sb, sb.budget) for sb in scoped if isinstance(sb.budget, WindowBudget)],
                f"{pair[1]}|{name}",
                window.used_percent,
                window.resets_at_ms,
                now_ms,
            )
            if rise <= 0:
                continue
            for sb, points_after in zip(scoped, points, strict=True):
                assert isinstance(sb.budget, WindowBudget)
                before = points_after - rise
                self._crossed(
                    sb, before, points_after, sb.budget.percent, window.resets_at_ms, name
                )
        return released

    def _crossed(
        self,
        sb: ScopedBudget,
        before: float,
        after: float,
        limit: float,
        reset_ms: int,
        window: str | None,
    ) -> None:
        if self.on_event is None:
            return
        for percent in THRESHOLDS:
            threshold = limit * percent / 100
            if before < threshold <= after:
                self.on_event(_event(sb, percent, after, limit, reset_ms, window, self.tz_name))


def _budget_windows(windows: Iterable[Window]) -> list[Window]:
    """The credential-wide windows with a used-percent and a reset (5-hour, weekly, …)."""
    return [
        w
        for w in windows
        if w.whole_credential
        and not w.informational
        and w.used_percent is not None
        and w.resets_at_ms is not None
    ]


def _event(
    sb: ScopedBudget,
    percent: int,
    used: float,
    limit: float,
    reset_ms: int,
    window: str | None,
    tz: str,
) -> dict[str, Any]:
    reset = dt.datetime.fromtimestamp(reset_ms / 1000, ZoneInfo(tz)).isoformat()
    where = f" ({window} window)" if window else ""
    fmt = usd_text if isinstance(sb.budget, UsdBudget) else _fmt
    return {
        "kind": "budget",
        "percent": percent,
        "owner": sb.owner,
        "scope": sb.kind,
        "label": sb.scope,  # the counter's owner (k12, u3, t5): alerts look up its teams
        "budget": sb.budget.to_json(),
        "window": window,
        "used": used,
        "limit": limit,
        "resetsAt": reset_ms,
        "message": (
            f"{sb.owner} has used {percent}% of its budget of {sb.budget.describe()}{where}"
            f" ({fmt(used)} of {fmt(limit)}); it resets at {reset}"
        ),
    }
