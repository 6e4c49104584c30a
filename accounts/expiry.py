"""Key expiry and rotation grace: reading `expiresAt` / `expiresIn` / `--expires` / `--grace`.

Pure functions (no I/O); `now` is always passed in. Errors are ExpiryError with a message that
names the field, fit for a 400, a form error or a CLI error.
"""

from __future__ import annotations

import datetime as dt
import re

DURATION_MAX = dt.timedelta(days=36_500)  # a hundred years: beyond that, give no expiry
GRACE_MAX = dt.timedelta(days=30)
_DURATION_RE = re.compile(r"^([0-9]{1,9})([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class ExpiryError(ValueError):
    """A bad expiry or grace value; the message names the field."""


def parse_duration(text: str, *, field: str) -> dt.timedelta:
    """`90m`, `12h`, `30d`, `2w` (or `45s`) → a timedelta of at most a hundred years."""
    m = _DURATION_RE.match(text.strip())
    if not m:
        raise ExpiryError(f"{field} must be a duration such as 90m, 12h, 30d or 2w (got {text!r})")
    value = dt.timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    if value > DURATION_MAX:
        raise ExpiryError(f"{field} must be at most 36500d")
    return value


def parse_instant(text: str, *, field: str) -> dt.datetime:
    """An ISO-8601 date-time with a zone (`2027-01-31T00:00Z`, `…+02:00`) → an aware datetime."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ExpiryError(
            f"{field} must be an ISO-8601 date-time with a zone, e.g. 2027-01-31T00:00Z "
            f"(got {text!r})"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ExpiryError(f"{field} must include a time zone (Z or +HH:MM), e.g. 2027-01-31T00:00Z")
    return value.astimezone(dt.UTC)


def expiry_value(
    *, expires_at: str | None, expires_in: str | None, now: dt.datetime
) -> dt.datetime | None:
    """The expiry given as an instant or a duration from `now` (not both); None when neither."""
    if expires_at is not None and expires_in is not None:
        raise ExpiryError("give expiresAt or expiresIn, not both")
    if expires_in is not None:
        return now + parse_duration(expires_in, field="expiresIn")
    if expires_at is not None:
        return parse_instant(expires_at, field="expiresAt")
    return None


def cli_expiry(text: str, *, now: dt.datetime) -> dt.datetime:
    """`--expires 30d` or `--expires 2027-01-31T00:00Z`."""
    if _DURATION_RE.match(text.strip()):
        return now + parse_duration(text, field="--expires")
    return parse_instant(text, field="--expires")


def future_expiry(value: dt.datetime, *, now: dt.datetime, field: str = "expiresAt") -> None:
    """A new key must not be born expired."""
    if value <= now:
        raise ExpiryError(f"{field} {iso(value)} is in the past: a new key must expire later")


def grace_value(seconds: object) -> dt.timedelta:
    """`graceSeconds` of a rotation: an integer from 0 to 30 days."""
    limit = int(GRACE_MAX.total_seconds())
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= limit:
        raise ExpiryError(f"graceSeconds must be an integer from 0 to {limit} (30 days)")
    return dt.timedelta(seconds=seconds)


def cli_grace(text: str) -> dt.timedelta:
    """`--grace 1h` (or `0`): at most 30 days."""
    if text.strip() == "0":
        return dt.timedelta(0)
    value = parse_duration(text, field="--grace")
    if value > GRACE_MAX:
        raise ExpiryError("--grace must be at most 30d")
    return value


def iso(value: dt.datetime) -> str:
    """UTC, to the second, with a Z: how expiry instants are shown in answers and messages."""
    return value.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def grace_left(previous_until: dt.datetime | None, *, now: dt.datetime) -> dt.datetime | None:
    """When the secret before the last rotation stops working, while it still works: a grace
    that has passed is not reported (issue #43)."""
    return previous_until if previous_until is not None and previous_until > now else None
