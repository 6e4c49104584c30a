"""Budgets per client key and per user (PRODUCT §9.5): what they are, how they are written.

Two kinds, any mix in one list (at most one token budget, one window budget per provider):

* `{"tokens": N, "period": "day"|"week"|"month"}`: at most N tokens (input + output, as the
  upstream reported them) per calendar period in `OCX_TIME_ZONE`;
* `{"windowPercent": P, "provider": "name"}`: at most P percentage points of each quota window
  (5-hour, weekly, …) of that provider's credential, counting each rise of the upstream's
  reported used-percent against the request whose answer reported it.

`parse_budgets` is the one validator (admin, API, CLI); `parse_cli_budget` reads the CLI's
`tokens=100k/day` / `window=30%/chatgpt`. No I/O here.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo

from django.core.exceptions import ObjectDoesNotExist, ValidationError

Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = ("day", "week", "month")
TOKENS_MAX = 10**15
MAX_BUDGETS = 16
PROVIDER_MAX = 64  # providers.models.Provider.name


class BudgetError(ValueError):
    """A budget that cannot be stored; the message names the offending part."""


@dataclass(frozen=True)
class TokenBudget:
    tokens: int
    period: Period

    def to_json(self) -> dict[str, object]:
        return {"tokens": self.tokens, "period": self.period}

    def describe(self) -> str:
        return f"{self.tokens} tokens per {self.period}"


@dataclass(frozen=True)
class WindowBudget:
    percent: float
    provider: str

    def to_json(self) -> dict[str, object]:
        return {"windowPercent": _num(self.percent), "provider": self.provider}

    def describe(self) -> str:
        return f"{_num(self.percent)}% of each {self.provider} quota window"


Budget = TokenBudget | WindowBudget


@dataclass(frozen=True)
class ScopedBudget:
    """A budget as the proxy holds it: whose it is and the counter it is kept in."""

    kind: Literal["key", "user", "team"]
    scope: str  # counter namespace: "k<key id>", "u<user id>" or "t<group id>"
    owner: str  # for messages: "key ocx_AbCdEf…", "user alice" or "team infra"
    budget: Budget


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _one(item: object, where: str) -> Budget:
    if not isinstance(item, dict):
        raise BudgetError(f"{where} must be an object")
    keys = set(item)
    if "tokens" in keys or "period" in keys:
        extra = keys - {"tokens", "period"}
        if extra:
            raise BudgetError(f"{where}: unexpected field {sorted(extra)[0]} in a token budget")
        tokens, period = item.get("tokens"), item.get("period")
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise BudgetError(f"{where}.tokens must be an integer")
        if not 1 <= tokens <= TOKENS_MAX:
            raise BudgetError(f"{where}.tokens must be from 1 to {TOKENS_MAX}")
        if period not in PERIODS:
            raise BudgetError(f"{where}.period must be one of day, week, month")
        return TokenBudget(tokens, cast(Period, period))
    if "windowPercent" in keys or "provider" in keys:
        extra = keys - {"windowPercent", "provider"}
        if extra:
            raise BudgetError(f"{where}: unexpected field {sorted(extra)[0]} in a window budget")
        percent, provider = item.get("windowPercent"), item.get("provider")
        if isinstance(percent, bool) or not isinstance(percent, int | float):
            raise BudgetError(f"{where}.windowPercent must be a number")
        if not math.isfinite(percent) or not 0 < percent <= 100:
            raise BudgetError(f"{where}.windowPercent must be more than 0 and at most 100")
        if not isinstance(provider, str) or not provider.strip():
            raise BudgetError(f"{where}.provider must be a provider name")
        if len(provider) > PROVIDER_MAX or "\x00" in provider:
            raise BudgetError(f"{where}.provider is not a valid provider name")
        return WindowBudget(float(percent), provider)
    raise BudgetError(
        f'{where} must be {{"tokens": N, "period": "day|week|month"}} '
        'or {"windowPercent": P, "provider": "name"}'
    )


def parse_budgets(value: object, *, providers: Collection[str] | None = None) -> tuple[Budget, ...]:
    """Validate one budget object or a list of them (None = no budget).

    `providers`, when given, is the set of configured provider names a window budget may
    name. Raises BudgetError with a message fit for a 400 or a form error."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_BUDGETS:
        raise BudgetError(f"at most {MAX_BUDGETS} budgets")
    out: list[Budget] = []
    for i, item in enumerate(items):
        where = "budget" if not isinstance(value, list) else f"budgets[{i}]"
        budget = _one(item, where)
        if isinstance(budget, TokenBudget) and any(isinstance(b, TokenBudget) for b in out):
            raise BudgetError("at most one token budget (tokens per day, week or month)")
        if isinstance(budget, WindowBudget):
            if any(isinstance(b, WindowBudget) and b.provider == budget.provider for b in out):
                raise BudgetError(f"at most one window budget for provider {budget.provider}")
            if providers is not None and budget.provider not in providers:
                raise BudgetError(f"{where}.provider: unknown provider {budget.provider}")
        out.append(budget)
    return tuple(out)


def budgets_json(budgets: tuple[Budget, ...]) -> list[dict[str, object]]:
    return [b.to_json() for b in budgets]


def stored_budgets(value: object) -> tuple[Budget, ...]:
    """Budgets as stored (validated on write); a malformed row counts as none, never a crash."""
    try:
        return parse_budgets(value or None)
    except BudgetError:
        return ()


def validate_budgets(value: object) -> None:
    """Model-field validator (ClientKey.budgets, UserBudget.budgets), run by `full_clean`: the
    shape only. Whether a window budget's provider exists is checked when budgets are written
    (`key_services.budgets_value`), so a key whose provider was removed later can still be
    renamed or have its rpm limit changed."""
    try:
        parse_budgets(value)
    except BudgetError as exc:
        raise ValidationError(str(exc)) from None


_TOKENS_RE = re.compile(r"^tokens=([0-9_]+)([kKmMgG]?)/(day|week|month)$")
_WINDOW_RE = re.compile(r"^window=([0-9]+(?:\.[0-9]+)?)%?/(.+)$")
_SUFFIX = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def parse_cli_budget(text: str) -> dict[str, object]:
    """`tokens=100000/day`, `tokens=2M/month`, `window=30%/chatgpt` → the budget's JSON."""
    spec = text.strip()
    m = _TOKENS_RE.match(spec)
    if m:
        return {"tokens": int(m.group(1)) * _SUFFIX[m.group(2).lower()], "period": m.group(3)}
    m = _WINDOW_RE.match(spec)
    if m:
        percent = float(m.group(1))
        return {"windowPercent": _num(percent), "provider": m.group(2)}
    raise BudgetError(
        f"bad budget {text!r}: use tokens=N/day|week|month (N may end in k or M) "
        "or window=P%/PROVIDER"
    )


# --------------------------------------------------------------------------------------------
# Calendar periods


def period_bounds(period: Period, now_ms: int, tz: ZoneInfo) -> tuple[str, int, int]:
    """(label, start ms, end ms) of the calendar period holding `now_ms` in `tz`.

    A week starts on Monday. Bounds are local midnights, so a day across a DST change is 23
    or 25 hours long."""
    local = dt.datetime.fromtimestamp(now_ms / 1000, tz)
    day = local.date()
    if period == "day":
        start, end = day, day + dt.timedelta(days=1)
    elif period == "week":
        start = day - dt.timedelta(days=day.weekday())
        end = start + dt.timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (start + dt.timedelta(days=32)).replace(day=1)
    return start.isoformat(), _midnight_ms(start, tz), _midnight_ms(end, tz)


def _midnight_ms(day: dt.date, tz: ZoneInfo) -> int:
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=tz).timestamp() * 1000)


def scoped_budgets(key: Any) -> tuple[ScopedBudget, ...]:
    """A ClientKey's budgets then its user's (`select_related("user__ocx_budget")`)."""
    user = key.user
    own = tuple(
        ScopedBudget("key", f"k{key.pk}", f"key {key.prefix}… of {user.get_username()}", b)
        for b in stored_budgets(key.budgets)
    )
    try:
        user_budgets = stored_budgets(user.ocx_budget.budgets)
    except ObjectDoesNotExist:
        user_budgets = ()
    return own + tuple(
        ScopedBudget("user", f"u{user.pk}", f"user {user.get_username()}", b) for b in user_budgets
    )
