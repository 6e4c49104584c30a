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

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from quota.windows import Window, windows_from_headers
from state.budget_store import COUNTER_GRACE_MS
from usage.budgets import Period, ScopedBudget, TokenBudget, WindowBudget, period_bounds

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
        used = (
            f"{_fmt(self.used)} tokens"
            if isinstance(b.budget, TokenBudget)
            else f"{_fmt(self.used)} points of the {self.window} window"
        )
        return (
            f"Budget exceeded: {b.owner} may use {b.budget.describe()} and has used {used}; "
            f"it resets at {reset.isoformat()}"
        )

    def headers(self, now_ms: int) -> list[tuple[bytes, bytes]]:
        remaining = max(0.0, self.limit - self.used)
        return [
            (b"x-ocx-budget-limit", _fmt(self.limit).encode()),
            (b"x-ocx-budget-remaining", _fmt(remaining).encode()),
            (b"x-ocx-budget-reset", str(math.ceil(self.reset_ms / 1000)).encode()),
            (b"retry-after", str(max(1, math.ceil((self.reset_ms - now_ms) / 1000))).encode()),
        ]


class BudgetGate:
    def __init__(
        self,
        store: BudgetStore,
        *,
        prefix: str,
        tz: str = "UTC",
        on_event: Callable[[dict[str, object]], None] | None = None,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.tz_name = tz
        self.tz = ZoneInfo(tz)
        self.on_event = on_event
        self._periods: dict[Period, tuple[str, int, int]] = {}
        self._providers_of: object = None
        self._providers: frozenset[str] = frozenset()

    def _period(self, period: Period, now_ms: int) -> tuple[str, int, int]:
        cached = self._periods.get(period)
        if cached is None or not cached[1] <= now_ms < cached[2]:
            cached = self._periods[period] = period_bounds(period, now_ms, self.tz)
        return cached

    def _counter(self, sb: ScopedBudget, budget: TokenBudget, now_ms: int) -> tuple[str, int]:
        label, _, end = self._period(budget.period, now_ms)
        return f"{self.prefix}:budget:{sb.scope}:tokens:{budget.period}:{label}", end

    def _token_name(self, sb: ScopedBudget, now_ms: int) -> str:
        assert isinstance(sb.budget, TokenBudget)
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

    def along(self, budgets: Sequence[ScopedBudget], now_ms: int) -> list[str] | None:
        """The Redis names of the budgets' counters when another read of the request can fetch
        them in its own round trip (`admit_read`): token budgets only (window budgets are
        hashes) and a store that keeps them in Redis (`note_read`). None: `admit` reads them."""
        if not budgets or getattr(self.store, "note_read", None) is None:
            return None
        names = []
        for sb in budgets:
            if not isinstance(sb.budget, TokenBudget):
                return None
            names.append(self._token_name(sb, now_ms))
        return names

    def admit_read(
        self,
        budgets: Sequence[ScopedBudget],
        names: Sequence[str],
        raws: Sequence[bytes | None],
        now_ms: int,
    ) -> Refusal | None:
        """`admit` on the counters read along: `names` as `along(budgets, now_ms)` gave them,
        `raws` their values in that order."""
        assert len(names) == len(raws) == len(budgets)
        values = [int(raw) if raw is not None else 0 for raw in raws]
        self.store.note_read(names, values)  # type: ignore[attr-defined]
        refusals = self._token_refusals(budgets, values, now_ms)
        return max(refusals, key=lambda r: r.reset_ms) if refusals else None

    async def admit(self, budgets: Sequence[ScopedBudget], now_ms: int) -> Refusal | None:
        """The used-up budget with the latest reset (the request is refused until then)."""
        tokens = [sb for sb in budgets if isinstance(sb.budget, TokenBudget)]
        windows = [(sb, sb.budget) for sb in budgets if isinstance(sb.budget, WindowBudget)]
        values, maps = await self.store.read(
            [self._token_name(sb, now_ms) for sb in tokens],
            [self._hash(sb, b) for sb, b in windows],
            now_ms,
        )
        refusals = self._token_refusals(tokens, values, now_ms)
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

    def _token_refusals(
        self, tokens: Sequence[ScopedBudget], values: Sequence[int], now_ms: int
    ) -> list[Refusal]:
        refusals = []
        for sb, used in zip(tokens, values, strict=True):
            tb = sb.budget
            assert isinstance(tb, TokenBudget)
            if used >= tb.tokens:
                end = self._period(tb.period, now_ms)[2]
                refusals.append(Refusal(sb, tb.tokens, used, end, tz=self.tz_name))
        return refusals

    async def charge(
        self,
        budgets: Sequence[ScopedBudget],
        *,
        tokens: int | None,
        served: tuple[Pair, Mapping[str, str]] | None,
        now_ms: int,
        providers: frozenset[str] = frozenset(),
    ) -> None:
        """Count a finished request against its budgets (`tokens` None: usage unknown)."""
        if tokens:
            charged: list[tuple[ScopedBudget, TokenBudget, int]] = []
            items: list[tuple[str, int, int]] = []
            for sb in budgets:
                if isinstance(sb.budget, TokenBudget):
                    name, end = self._counter(sb, sb.budget, now_ms)
                    charged.append((sb, sb.budget, end))
                    items.append((name, tokens, end + COUNTER_GRACE_MS))
            if items:
                totals = await self.store.add_many(items, now_ms)
                for (sb, tb, end), new in zip(charged, totals, strict=True):
                    self._crossed(sb, new - tokens, new, tb.tokens, end, None)
        if served is None:
            return
        pair, headers = served
        scoped = [
            sb
            for sb in budgets
            if isinstance(sb.budget, WindowBudget) and sb.budget.provider == pair[0]
        ]
        if not scoped and pair[0] not in providers:
            return
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
    return {
        "kind": "budget",
        "percent": percent,
        "owner": sb.owner,
        "scope": sb.kind,
        "budget": sb.budget.to_json(),
        "window": window,
        "used": used,
        "limit": limit,
        "resetsAt": reset_ms,
        "message": (
            f"{sb.owner} has used {percent}% of its budget of {sb.budget.describe()}{where}"
            f" ({_fmt(used)} of {_fmt(limit)}); it resets at {reset}"
        ),
    }
