"""Times on admin pages: a `<time datetime=…>` element that `ocx/localtime.js` shows in the
browser's own time zone, with a readable server-side text in `OCX_TIME_ZONE` until it runs
(or without JavaScript): "2026-12-01 14:05:03 CET", "until 14:05:03 UTC (in 42 s)".
"""

from __future__ import annotations

import datetime as dt
import time
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils.html import format_html
from django.utils.safestring import SafeString


def _zone() -> ZoneInfo:
    return ZoneInfo(getattr(settings, "OCX_TIME_ZONE", "UTC") or "UTC")


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def from_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def in_words(seconds: float) -> str:
    """A short duration: "42 s", "3 min 5 s", "2 h 4 min", "3 d 11 h" (as localtime.js)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def time_html(moment: dt.datetime) -> SafeString:
    """A moment to the second, date included (request log, events)."""
    local = moment.astimezone(_zone())
    return format_html(
        '<time class="ocx-time" datetime="{}">{}</time>',
        _iso(moment),
        local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or ""),
    )


def until_text(ms: int, *, now_ms: int | None = None) -> str:
    """The server-side fallback of an end time: "14:05:03 UTC (in 42 s)"."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    local = from_ms(ms).astimezone(_zone())
    today = from_ms(now_ms).astimezone(_zone()).date()
    clock = local.strftime("%H:%M:%S " if local.date() == today else "%Y-%m-%d %H:%M:%S ")
    left = (ms - now_ms) / 1000
    when = f"in {in_words(left)}" if left > 0 else "passed"
    return f"{clock}{local.tzname() or ''} ({when})"


def until_html(ms: int, *, now_ms: int | None = None) -> SafeString:
    """An end time with a countdown (cooldowns, quota resets); the script keeps it counting."""
    return format_html(
        '<time class="ocx-until" datetime="{}">{}</time>',
        _iso(from_ms(ms)),
        until_text(ms, now_ms=now_ms),
    )
