"""Cooldown durations and cooldown arithmetic (combos-behaviour.md §3.4, §3.5; PRODUCT §5.3).

`cooldown_ms` picks the duration for a hop that cools, strongest signal first: the upstream
`Retry-After`, the earliest future `x-codex-*-reset-at`, the combo's `cooldownMs`, the 10-minute
spent-window/credential hold, 5 s for request-rate codes 1302/1305, then 60 s. Every result is
clamped to [1 ms, 10 min]; longer exhaustion is quota state, not a cooldown. All times are epoch
milliseconds passed in as `now`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from routing.classify import (
    PROVIDER_CODES,
    Decision,
    Failure,
    classifier_code,
    classifier_text,
    is_spent_window,
    normalize_code,
)

MAX_COOLDOWN_MS = 600_000
DEFAULT_COOLDOWN_MS = 60_000
REQUEST_RATE_COOLDOWN_MS = 5_000
SPENT_WINDOW_COOLDOWN_MS = 600_000
# §3.4 rule 2: reset headers are clamped to 15 minutes before the 10-minute combo cap.
RESET_CLAMP_MS = 900_000
RETRY_AFTER_MAX_CHARS = 128
RESET_HEADERS: tuple[str, ...] = (
    "x-codex-primary-reset-at",
    "x-codex-secondary-reset-at",
    "x-codex-tertiary-reset-at",
)

Source = Literal["retry_after", "reset_header", "combo", "spent_window", "request_rate", "default"]


@dataclass(frozen=True)
class Cooldown:
    """A cooldown duration in ms and the §3.4 rule (`source`) that produced it."""

    ms: int
    source: Source


# ---------------------------------------------------------------------------------------------
# Retry-After

_NUMERIC_RE = re.compile(r"\d+(?:\.\d+)?")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MON = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)"
_TIME = r"(\d{2}):(\d{2}):(\d{2})"
_IMF_RE = re.compile(rf"(?:mon|tue|wed|thu|fri|sat|sun), (\d{{2}}) {_MON} (\d{{4}}) {_TIME} gmt")
_RFC850_RE = re.compile(
    rf"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday), "
    rf"(\d{{2}})-{_MON}-(\d{{2}}) {_TIME} gmt"
)
_ASCTIME_RE = re.compile(rf"(?:mon|tue|wed|thu|fri|sat|sun) {_MON} ( \d|\d{{2}}) {_TIME} (\d{{4}})")


def _epoch_ms(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> int | None:
    try:
        moment = datetime(year, month, day, hh, mm, ss, tzinfo=UTC)
    except ValueError:
        return None  # a date that does not exist
    return int(moment.timestamp()) * 1000


def _rfc850_year(yy: int, rest: tuple[int, int, int, int, int], now: int) -> int:
    """Resolve a two-digit year to within ±50 years of now, comparing by time of year."""
    now_dt = datetime.fromtimestamp(now / 1000, tz=UTC)
    now_rest = (now_dt.month, now_dt.day, now_dt.hour, now_dt.minute, now_dt.second)
    year = now_dt.year - now_dt.year % 100 + yy
    if (year, *rest) > (now_dt.year + 50, *now_rest):
        year -= 100
    elif (year, *rest) < (now_dt.year - 50, *now_rest):
        year += 100
    return year


def parse_http_date(value: str, now: int) -> int | None:
    """Parse an HTTP date (IMF-fixdate, RFC 850 or asctime, always UTC) to epoch ms, else None."""
    text = value.strip().lower()
    if m := _IMF_RE.fullmatch(text):
        day, mon, year, hh, mm, ss = m.groups()
        return _epoch_ms(int(year), _MONTHS.index(mon) + 1, int(day), int(hh), int(mm), int(ss))
    if m := _RFC850_RE.fullmatch(text):
        day, mon, yy, hh, mm, ss = m.groups()
        rest = (_MONTHS.index(mon) + 1, int(day), int(hh), int(mm), int(ss))
        year = _rfc850_year(int(yy), rest, now)
        return _epoch_ms(year, *rest)
    if m := _ASCTIME_RE.fullmatch(text):
        mon, day, hh, mm, ss, year = m.groups()
        return _epoch_ms(int(year), _MONTHS.index(mon) + 1, int(day), int(hh), int(mm), int(ss))
    return None


def parse_retry_after(value: str, now: int) -> int | None:
    """Parse an upstream `Retry-After` into a delay in ms, or None when it is not valid.

    Numeric seconds give `ceil(seconds × 1000)`; an HTTP date gives `date − now`. `0` and a
    date now or in the past are an *immediate* directive and give 1 ms (never "absent").
    Empty values, negative numbers, other date formats and values over 128 characters give None.
    The result is not capped; `cooldown_ms` applies the 10-minute cap.
    """
    text = value.strip()
    if not text or len(value) > RETRY_AFTER_MAX_CHARS:
        return None
    if _NUMERIC_RE.fullmatch(text):
        return max(1, math.ceil(float(text) * 1000))
    at = parse_http_date(text, now)
    if at is None:
        return None
    return max(1, at - now)


# ---------------------------------------------------------------------------------------------
# Codex reset headers

_RESET_VALUE_RE = re.compile(r"\d+(?:\.\d+)?")


def reset_header_delay(headers: Mapping[str, str], now: int) -> int | None:
    """Delay in ms until the earliest future `x-codex-{primary,secondary,tertiary}-reset-at`.

    Values are epoch seconds, or epoch ms when ≥ 10¹²; non-numeric, non-positive and past or
    present values are ignored. Clamped to 15 minutes; None when no value is usable.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    best: int | None = None
    for name in RESET_HEADERS:
        raw = lowered.get(name, "").strip()
        if not _RESET_VALUE_RE.fullmatch(raw):
            continue
        number = float(raw)
        if number <= 0:
            continue
        at = math.ceil(number if number >= 1e12 else number * 1000)
        if at <= now:
            continue
        if best is None or at < best:
            best = at
    if best is None:
        return None
    return min(best - now, RESET_CLAMP_MS)


# ---------------------------------------------------------------------------------------------
# Duration precedence

_QUOTA_CAP_CODES = frozenset(
    {"1308", "1310", "1316", "1317", "1318", "1319", "1320", "1321", "insufficient_quota"}
)
_AUTH_CLASSIFIER_CODES = frozenset({"invalid_api_key", "subscription_required"})
_QUOTA_CAP_TEXT = ("usage limit reached", "insufficient_quota", "quota exhausted")


def _clamp(ms: int) -> int:
    return max(1, min(ms, MAX_COOLDOWN_MS))


def _codes(failure: Failure) -> frozenset[str]:
    err = failure.body.get("error") if failure.body is not None else None
    err_map: Mapping[str, object] = err if isinstance(err, Mapping) else {}
    code = normalize_code(failure.error_code if failure.error_code else err_map.get("code"))
    etype = normalize_code(failure.error_type if failure.error_type else err_map.get("type"))
    return frozenset(c for c in (code, etype) if c)


def _is_request_rate(failure: Failure, codes: frozenset[str]) -> bool:
    text = classifier_text(failure)
    if not (codes & {"1302", "1305"} or "rate limit reached for requests" in text):
        return False
    if codes & _QUOTA_CAP_CODES or any(t in text for t in _QUOTA_CAP_TEXT):
        return False
    return not ("gousagelimiterror" in codes or "monthly usage limit reached" in text)


def cooldown(
    failure: Failure,
    decision: Decision,
    *,
    combo_cooldown_ms: int | None,
    now: int,
) -> Cooldown | None:
    """The cooldown for a classified failure, with the rule that chose it; None if it does not cool.

    Precedence (first usable wins): upstream `Retry-After` (`failure.headers`, which must be the
    upstream headers, never a synthetic client hint), the earliest future Codex reset header, the
    combo's `cooldownMs`, the 10-minute spent-window/credential hold, 5 s for request-rate codes
    1302/1305, 60 s. Every value is clamped to [1, 600 000] ms.
    """
    if not decision.cool:
        return None
    headers = {k.lower(): v for k, v in failure.headers.items()}
    retry_after = headers.get("retry-after")
    if retry_after is not None:
        delay = parse_retry_after(retry_after, now)
        if delay is not None:
            return Cooldown(_clamp(delay), "retry_after")
    reset = reset_header_delay(headers, now)
    if reset is not None:
        return Cooldown(_clamp(reset), "reset_header")
    if combo_cooldown_ms is not None:
        return Cooldown(_clamp(combo_cooldown_ms), "combo")
    codes = _codes(failure)
    # Quota *wording* is not enough for the hold ("quota exhausted for this minute" is a burst).
    credential = codes & PROVIDER_CODES or classifier_code(failure) in _AUTH_CLASSIFIER_CODES
    if is_spent_window(failure) or credential:
        return Cooldown(SPENT_WINDOW_COOLDOWN_MS, "spent_window")
    if _is_request_rate(failure, codes):
        return Cooldown(REQUEST_RATE_COOLDOWN_MS, "request_rate")
    return Cooldown(DEFAULT_COOLDOWN_MS, "default")


def cooldown_ms(
    failure: Failure,
    decision: Decision,
    *,
    combo_cooldown_ms: int | None,
    now: int,
) -> int | None:
    """The cooldown duration in ms (see `cooldown`); None when the decision does not cool."""
    found = cooldown(failure, decision, combo_cooldown_ms=combo_cooldown_ms, now=now)
    return None if found is None else found.ms


# ---------------------------------------------------------------------------------------------
# Cooldown arithmetic


def merge_cooldown(existing_until: int | None, new_until: int) -> int:
    """The new expiry after another failure: a second failure never shortens a cooldown."""
    if existing_until is None:
        return new_until
    return max(existing_until, new_until)


def is_cooling(until: int | None, now: int) -> bool:
    """Cooling while `now < until`; free at exactly `now == until` (and with no entry)."""
    return until is not None and now < until


def unavailable_retry_after(untils: Iterable[int | None], now: int) -> str | None:
    """The `Retry-After` of a `combo_unavailable` 503 (§3.5), or None to omit the header.

    The smallest remaining cooldown over the combo's unexpired entries, rounded up to whole
    seconds with a minimum of 1, as a decimal string.
    """
    remaining = [u - now for u in untils if u is not None and u > now]
    if not remaining:
        return None
    return str(max(1, math.ceil(min(remaining) / 1000)))
