"""Refusals shaped for the client that reads them (PRODUCT §9.10, docs/codex.md).

Pure: facts in (what was refused, until when, the message), status, headers and error fields
out; `gateway.proxy` raises them. The rules:

* A wait longer than `USAGE_LIMIT_AFTER_S` is never handed to a client as a sleep: it is a
  usage limit, HTTP 429 with `error.type` `usage_limit_reached`, `resets_at` (Unix seconds) and
  ocx's message in the body and in an ASCII `x-codex-promo-message`. Codex stops the turn at
  once and shows that message; `x-should-retry: false` stops the OpenAI SDKs' own retries;
  `Retry-After` (the true wait) stays for every other client.
* A shorter wait keeps its status with a `Retry-After` of at most `RETRY_AFTER_CAP_S`; an
  upstream's `Retry-After` is never passed on above that cap.
* Every header value ocx writes is ASCII: Codex drops a whole response with one that is not.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from quota.windows import is_exhausted, windows_from_error
from routing.classify import Failure
from routing.eligibility import (
    SKIP_COOLING,
    SKIP_PROBING,
    SKIP_QUOTA_EXHAUSTED,
    SKIP_QUOTA_PROBING,
    TargetState,
)

# Longer waits are usage limits (429 `usage_limit_reached`); shorter ones a capped Retry-After.
USAGE_LIMIT_AFTER_S = 30
# The largest `Retry-After` ocx sends outside the usage-limit shape (seconds).
RETRY_AFTER_CAP_S = 30
USAGE_LIMIT_TYPE = "usage_limit_reached"
# Codex shows "You've hit your usage limit. <promo>, or try again at 9:02 AM."
PROMO_HEADER = b"x-codex-promo-message"
PROMO_MAX = 400
# The target states a target comes back from by itself, at `TargetState.until`.
_WAITABLE = frozenset({SKIP_COOLING, SKIP_PROBING, SKIP_QUOTA_EXHAUSTED, SKIP_QUOTA_PROBING})
# What NFKD leaves non-ASCII but has an obvious ASCII spelling.
_SPELLED = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u2013": "-",
        "\u2014": "-",
        "\u2212": "-",
        "\u2022": "*",
        "\u00b7": "*",
        "\u2192": "->",
        "\u00df": "ss",
        "\u00e6": "ae",
        "\u00c6": "AE",
        "\u0153": "oe",
        "\u0152": "OE",
        "\u00f8": "o",
        "\u00d8": "O",
        "\u0142": "l",
        "\u0141": "L",
        "\u20ac": "EUR",
    }
)
# Printable ASCII but `%`: what an identifier header keeps as it is.
_TOKEN_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


@dataclass(frozen=True)
class Shaped:
    """One refusal as the client gets it: `fields` go into the `error` object beside `type`,
    `code` and `message`."""

    status: int
    type: str
    code: str | None
    message: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    fields: Mapping[str, Any] = field(default_factory=dict)


# --- ASCII headers ------------------------------------------------------------------------------


def ascii_text(text: str, limit: int = PROMO_MAX) -> str:
    """Human text as a header value: printable ASCII only (accents dropped, typographic
    punctuation spelled out, anything else `?`, control characters a space), at most `limit`
    characters."""
    if not (text.isascii() and text.isprintable()):
        out = []
        for ch in unicodedata.normalize("NFKD", text.translate(_SPELLED)).translate(_SPELLED):
            if ch.isascii():
                out.append(ch if ch.isprintable() else " ")
            elif not unicodedata.combining(ch):
                out.append("?")
        text = "".join(out)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def ascii_token(text: str) -> bytes:
    """An identifier (`provider/model`) as a header value: percent-encoded where it is not
    printable ASCII, so that it stays exact."""
    if text.isascii() and text.isprintable() and "%" not in text and " " not in text:
        return text.encode()
    return quote(text, safe=_TOKEN_SAFE).encode()


# --- Retry-After ------------------------------------------------------------------------------


def wait_seconds(until_ms: int, now_ms: int) -> int:
    """Whole seconds until `until_ms`, at least 1."""
    return max(1, math.ceil((until_ms - now_ms) / 1000))


def retry_after(seconds: int | float) -> list[tuple[bytes, bytes]]:
    """A `Retry-After` header of at most `RETRY_AFTER_CAP_S` (at least 1 s)."""
    capped = min(RETRY_AFTER_CAP_S, max(1, math.ceil(seconds)))
    return [(b"retry-after", str(capped).encode())]


def is_long(until_ms: int, now_ms: int) -> bool:
    return until_ms - now_ms > USAGE_LIMIT_AFTER_S * 1000


# --- refusals ---------------------------------------------------------------------------------


def usage_limit(
    *,
    code: str | None,
    message: str,
    resets_ms: int,
    now_ms: int,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> Shaped:
    """The usage-limit shape (codex-wire §4.4): Codex stops at once and shows `message` with
    the reset time. A `Retry-After` in `headers` stays; else it is the whole wait."""
    resets_s = math.ceil(resets_ms / 1000)
    extra = list(headers)
    if not any(name == b"retry-after" for name, _ in extra):
        extra.append((b"retry-after", str(wait_seconds(resets_ms, now_ms)).encode()))
    extra += [
        (PROMO_HEADER, ascii_text(message.rstrip(". ")).encode()),
        (b"x-should-retry", b"false"),
    ]
    return Shaped(
        429,
        USAGE_LIMIT_TYPE,
        code,
        message,
        extra,
        {"resets_at": resets_s, "resets_in_seconds": max(0, resets_s - now_ms // 1000)},
    )


def budget_exceeded(
    *, message: str, reset_ms: int, headers: Iterable[tuple[bytes, bytes]], now_ms: int
) -> Shaped:
    """A spent budget (PRODUCT §9.5): the budget gate's message and `x-ocx-budget-*` headers
    (its `Retry-After`, the whole wait, stays for clients that schedule on it)."""
    return usage_limit(
        code="budget_exceeded", message=message, resets_ms=reset_ms, now_ms=now_ms, headers=headers
    )


def unavailable(
    *,
    status: int,
    type_: str,
    code: str,
    message: str,
    until_ms: int | None,
    now_ms: int,
) -> Shaped:
    """Nothing can serve now: back at `until_ms` (None: not by itself). Long: a usage limit;
    short: `status` with a capped `Retry-After`; unknown: `status` with none."""
    if until_ms is None or until_ms <= now_ms:
        return Shaped(status, type_, code, message)
    if is_long(until_ms, now_ms):
        return usage_limit(code=code, message=message, resets_ms=until_ms, now_ms=now_ms)
    return Shaped(status, type_, code, message, retry_after(wait_seconds(until_ms, now_ms)))


def earliest_return(states: Iterable[TargetState]) -> int | None:
    """When the first of these targets comes back by itself (cooling, quota, probe lease):
    None when one is eligible already or none has a known time."""
    times = []
    for ts in states:
        if ts.eligible:
            return None
        if ts.skip in _WAITABLE and ts.until is not None:
            times.append(ts.until)
    return min(times) if times else None


def upstream_until(failure: Failure, now_ms: int) -> int | None:
    """When an upstream said it is back: its usage-limit reset (the last exhausted window of
    the error) or its `Retry-After` in seconds; None when it said neither."""
    if failure.status is not None:
        resets = [
            w.resets_at_ms
            for w in windows_from_error(failure.status, failure.body, failure.headers, now=now_ms)
            if is_exhausted(w, now=now_ms) and w.resets_at_ms is not None
        ]
        if resets:
            return max(resets)
    raw = failure.headers.get("retry-after", "").strip()
    if raw.isdigit():
        return now_ms + int(raw) * 1000
    return None


def upstream(
    *,
    status: int,
    type_: str,
    code: str | None,
    message: str,
    until_ms: int | None,
    now_ms: int,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> Shaped:
    """An upstream's failure passed on: back at `until_ms` (`upstream_until`, or sooner when
    another target of the combo is). Long, or the upstream's own usage limit: a usage limit;
    otherwise the upstream's status with its wait as a capped `Retry-After`."""
    extra = list(headers)
    if until_ms is not None and (
        is_long(until_ms, now_ms) or (type_ == USAGE_LIMIT_TYPE and until_ms > now_ms)
    ):
        return usage_limit(
            code=code or USAGE_LIMIT_TYPE,
            message=message,
            resets_ms=until_ms,
            now_ms=now_ms,
            headers=extra,
        )
    if until_ms is not None:
        extra += retry_after((until_ms - now_ms) / 1000)
    return Shaped(status, type_, code, message, extra)


# --- x-codex-* pass-through -------------------------------------------------------------------

# Codex's rate-limit headers (codex-wire §4.1): windows and credits of any limit family, the
# family's name, the active limit, plan and reached type. Not turn state or request metadata,
# nor a promo message: ocx's own refusals carry ocx's.
_CODEX_RATE = re.compile(
    r"x-codex-(?:[a-z0-9]+-)*?"
    r"(?:(?:primary|secondary)-[a-z-]+|credits-[a-z-]+|limit-name"
    r"|active-limit|plan-type|rate-limit-reached-type)"
)
_CODEX_MAX_HEADERS = 40
_CODEX_MAX_VALUE = 200


def codex_rate_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The `x-codex-*` rate-limit headers an upstream sent (lower-case names), ASCII, for the
    client; never made up (empty when the upstream sent none)."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers.items():
        if name.startswith("x-codex-") and _CODEX_RATE.fullmatch(name):
            out.append((name.encode(), ascii_text(value, _CODEX_MAX_VALUE).encode()))
            if len(out) == _CODEX_MAX_HEADERS:
                break
    return out
