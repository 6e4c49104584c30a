"""Bounded overshoot (issue 42, PRODUCT §9.7): admission reserves the expected cost of each
request in flight against every token and dollar budget that applies, and the end of the
request settles it (the real figure is charged by `BudgetGate.charge`, the reservation let go).

A budget admits a request while its counter is under the limit and, when requests are in
flight, while counter + their reservations is under it too: a burst of concurrent requests
worth N requests' budget is admitted about N times, not as often as it arrives. The check and
the reservation are one step — on Redis one script call (`_RESERVE`), shared by every worker;
without Redis (or while it is unreachable) this worker's own memory, with no await between
check and write.

The expected cost of a request is what the key's recent requests on the same model cost on
this worker (`Recent`, a moving average), else ocx's estimate of its input
(`usage.estimate.input_estimate`) priced at the route's first target. Reservations in Redis
expire `HELD_TTL_MS` after the last one was made, so a worker that dies holding some does not
hold them for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from usage.budget_gate import BudgetGate, Refusal, _scale, limit_units
from usage.budgets import ScopedBudget, TokenBudget, UsdBudget

log = logging.getLogger("ocx.budget")
HELD_TTL_MS = 3600 * 1000
RECENT_MAX = 10_000
ALPHA = 0.5  # weight of the latest request in the moving average

# KEYS = counters c1..cn then their reservation counters h1..hn; ARGV = n, then each budget's
# limit and amount, then the reservation ttl. Returns {0} when reserved, else {i, used, held}
# of the first budget that refuses.
_RESERVE = """
local n = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2 + 2 * n])
for i = 1, n do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  local held = tonumber(redis.call('GET', KEYS[n + i]) or '0')
  if held < 0 then held = 0 end
  local limit = tonumber(ARGV[2 * i])
  if used >= limit or (held > 0 and used + held >= limit) then
    return {i, used, held}
  end
end
for i = 1, n do
  local amount = tonumber(ARGV[2 * i + 1])
  if amount > 0 then
    redis.call('INCRBY', KEYS[n + i], amount)
    redis.call('PEXPIRE', KEYS[n + i], ttl)
  end
end
return {0}
"""

# KEYS = reservation counters; ARGV = the amounts to let go. Never below zero.
_RELEASE = """
for i = 1, #KEYS do
  local left = redis.call('DECRBY', KEYS[i], ARGV[i])
  if left <= 0 then redis.call('DEL', KEYS[i]) end
end
return 1
"""


@dataclass
class Hold:
    """What one admitted request reserved: (counter name, amount) per budget."""

    items: list[tuple[str, int]] = field(default_factory=list)
    shared: bool = False  # reserved in Redis (else in this worker's memory)


class Recent:
    """The recent cost of a key's requests per model on this worker: (tokens, micro-dollars)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str], tuple[float, float]] = {}

    def get(self, key_id: int, model: str) -> tuple[int, int] | None:
        found = self._seen.get((key_id, model))
        return None if found is None else (round(found[0]), round(found[1]))

    def learn(self, key_id: int, model: str, tokens: int, micros: int) -> None:
        if len(self._seen) >= RECENT_MAX:
            self._seen.clear()  # only a hint: the estimate takes over
        old = self._seen.get((key_id, model))
        if old is None:
            self._seen[(key_id, model)] = (float(tokens), float(micros))
        else:
            self._seen[(key_id, model)] = (
                ALPHA * tokens + (1 - ALPHA) * old[0],
                ALPHA * micros + (1 - ALPHA) * old[1],
            )


def _counted(budgets: Sequence[ScopedBudget]) -> list[ScopedBudget]:
    return [sb for sb in budgets if isinstance(sb.budget, TokenBudget | UsdBudget)]


class Reservations:
    def __init__(self, gate: BudgetGate) -> None:
        self.gate = gate
        self.recent = Recent()
        self._held: dict[str, int] = {}  # this worker's reservations (no Redis, or it is out)
        self._scripts: tuple[Callable[..., Any], Callable[..., Any]] | None = None

    def _redis(self) -> tuple[Any, Any] | None:
        """(Redis client, breaker or None) when the counters are in Redis."""
        store = self.gate.store
        shared = getattr(store, "shared", store)
        client = getattr(shared, "redis", None)
        if client is None:
            return None
        if self._scripts is None:
            self._scripts = (client.script(_RESERVE), client.script(_RELEASE))
        return client, getattr(store, "breaker", None)

    @staticmethod
    def _name(sb: ScopedBudget, gate: BudgetGate, now_ms: int) -> str:
        return gate._token_name(sb, now_ms)

    async def reserve(
        self,
        budgets: Sequence[ScopedBudget],
        *,
        tokens: int,
        micros: int,
        now_ms: int,
    ) -> Hold | Refusal:
        """Reserve `tokens` / `micros` against every token / dollar budget, or the Refusal of
        the first budget whose counter and reservations already reach its limit."""
        counted = _counted(budgets)
        if not counted:
            return Hold()
        gate = self.gate
        names = [self._name(sb, gate, now_ms) for sb in counted]
        amounts = [tokens if isinstance(sb.budget, TokenBudget) else micros for sb in counted]
        limits = [limit_units(sb.budget) for sb in counted]  # type: ignore[arg-type]
        redis = self._redis()
        if redis is not None:
            breaker = redis[1]
            if breaker is None or not breaker.open:
                reserve = self._scripts[0]  # type: ignore[index]
                args: list[int] = [len(counted)]
                for limit, amount in zip(limits, amounts, strict=True):
                    args += (limit, amount)
                args.append(HELD_TTL_MS)
                keys = names + [f"{n}:held" for n in names]

                async def call() -> Any:
                    return await reserve(keys=keys, args=args)

                if breaker is not None:
                    ok, out = await breaker.call(call)
                else:
                    ok, out = True, await call()
                if ok:
                    assert out is not None
                    values = [int(v) for v in out]
                    if values[0]:
                        i = values[0] - 1
                        return self._refusal(counted[i], values[1] + values[2], now_ms)
                    return Hold(
                        [(f"{n}:held", a) for n, a in zip(names, amounts, strict=True) if a > 0],
                        shared=True,
                    )
        # This worker's memory: the counters as the store reads them (no await suspends a
        # memory read), then check and reserve with no await in between.
        used, _ = await gate.store.read(names, [], now_ms)
        held = self._held
        for sb, name, value, limit in zip(counted, names, used, limits, strict=True):
            h = held.get(name, 0)
            if value >= limit or (h > 0 and value + h >= limit):
                return self._refusal(sb, value + h, now_ms)
        hold = Hold()
        for name, amount in zip(names, amounts, strict=True):
            if amount > 0:
                held[name] = held.get(name, 0) + amount
                hold.items.append((name, amount))
        return hold

    def _refusal(self, sb: ScopedBudget, used_units: int, now_ms: int) -> Refusal:
        b = sb.budget
        assert isinstance(b, TokenBudget | UsdBudget)
        scale = _scale(b)
        end = self.gate._period(b.period, now_ms)[2]
        return Refusal(sb, limit_units(b) / scale, used_units / scale, end, tz=self.gate.tz_name)

    async def release(self, hold: Hold) -> None:
        """Let a request's reservations go (its real cost was charged). Never raises."""
        if not hold.items:
            return
        if not hold.shared:
            held = self._held
            for name, amount in hold.items:
                left = held.get(name, 0) - amount
                if left > 0:
                    held[name] = left
                else:
                    held.pop(name, None)
            return
        redis = self._redis()
        assert redis is not None and self._scripts is not None
        release = self._scripts[1]
        keys = [name for name, _ in hold.items]
        args = [amount for _, amount in hold.items]

        async def call() -> Any:
            return await release(keys=keys, args=args)

        try:
            if redis[1] is not None:
                await redis[1].call(call)
            else:
                await call()
        except Exception:  # noqa: BLE001 - the reservation expires on its own (HELD_TTL_MS)
            log.exception("budget reservations: could not let one go; it expires on its own")
