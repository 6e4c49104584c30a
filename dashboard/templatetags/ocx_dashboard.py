"""`{% ocx_dashboard %}` (the admin index) and `{% routing_events %}` (the events page)."""

from __future__ import annotations

import time
from typing import Any

from django import template
from django.conf import settings
from django.utils import timezone
from django.utils.safestring import SafeString

from combos import live
from combos import selectors as combo_selectors
from combos.status import (
    NO_LIVE_STATE_NOTE,
    REDIS_UNREACHABLE_NOTE,
    WORKER_COPY_NOTE,
    badge_label,
    combo_view,
)
from combos.times import time_html, until_html
from dashboard import selectors
from usage.pricing_warning import unpriced_warning
from usage.report import usd

register = template.Library()
NOTES = {
    "none": NO_LIVE_STATE_NOTE,
    "redis unreachable": REDIS_UNREACHABLE_NOTE,
    "this worker": WORKER_COPY_NOTE,
}


def live_context() -> dict[str, Any]:
    """Combos with each target's state, and the quota windows, as of now."""
    now = int(time.time() * 1000)
    snapshot = combo_selectors.config_snapshot()
    combos = sorted(snapshot.combos.values(), key=lambda c: c.id)
    state = live.load([c.id for c in combos])
    views = [combo_view(c, snapshot, state, now=now) for c in combos]
    source, quota = selectors.quota_bars(now_ms=now)
    rows = []
    for view in views:
        first = view.views[0]
        rows.append(
            {
                "id": view.combo.id,
                "model": view.combo.public_id,
                "mode": f"pinned to {view.combo.override}" if view.combo.override else "auto",
                "strategy": view.combo.strategy,
                "would_serve": first.would_serve,
                "credential": first.credential if len(view.views) > 1 else None,
                "targets": [
                    {"state": ts, "label": badge_label(ts), "position": i + 1}
                    for i, ts in enumerate(first.targets)
                ],
            }
        )
    return {"combos": rows, "quota": quota, "note": NOTES.get(source), "now_ms": now}


@register.inclusion_tag("dashboard/dashboard.html", takes_context=True)
def ocx_dashboard(context: template.Context) -> dict[str, Any]:
    return {
        **live_context(),
        "events": selectors.recent_events(30),
        "charts": selectors.charts(selectors.DEFAULT_RANGE),
        "ranges": list(selectors.RANGES),
        "spend": selectors.spend(now=timezone.now(), zone=settings.OCX_TIME_ZONE),
        # A dollar budget next to unpriced targets (issue 42): they are refused under it.
        "unpriced_warning": unpriced_warning(),
        "request": context.get("request"),
    }


@register.inclusion_tag("dashboard/_events.html")
def routing_events(limit: int = 200) -> dict[str, Any]:
    return {"events": selectors.recent_events(limit)}


@register.filter
def local_time(value: Any) -> SafeString | str:
    return "" if value is None else time_html(value)


@register.filter
def dollars(value: float) -> str:
    """USD with cents ("$1,234.50"; "< $0.01" for a fraction of a cent)."""
    return usd(value)


@register.filter
def countdown(ms: int | None) -> SafeString | str:
    return "" if ms is None else until_html(ms)
