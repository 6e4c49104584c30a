"""Writes for routing events (called from a background writer's thread with a whole batch)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from django.db import transaction

from dashboard.models import KEEP, RoutingEvent

STORED_KINDS = frozenset({"cooldown", "hop", "reset"})


def _moment(ms: object) -> dt.datetime | None:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return None
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _text(value: object, limit: int) -> str:
    return "" if value is None else str(value)[:limit]


def on_combo_state_reset(
    sender: object, combo_id: str, target: str | None, cause: str, **kwargs: object
) -> None:
    """`combos.services.combo_state_reset`: an operator reset is a routing event too."""
    routing_events_write(
        events=[
            {
                "kind": "reset",
                "at": dt.datetime.now(dt.UTC).timestamp() * 1000,
                "combo": combo_id,
                "target": target or "",
                "reason": cause,
            }
        ]
    )


def routing_events_write(*, events: Sequence[Mapping[str, object]]) -> int:
    """Store the cooldown and hop events of a batch (`at` and `until` in epoch ms), then drop
    all but the newest `KEEP` rows. Returns the rows stored."""
    rows = []
    for e in events:
        kind = e.get("kind")
        at = _moment(e.get("at"))
        if kind not in STORED_KINDS or at is None:
            continue
        status = e.get("status")
        rows.append(
            RoutingEvent(
                at=at,
                kind=str(kind),
                combo=_text(e.get("combo"), 64),
                target=_text(e.get("target"), 512),
                status=status if isinstance(status, int) and not isinstance(status, bool) else None,
                reason=_text(e.get("reason"), 256),
                until=_moment(e.get("until")),
            )
        )
    if not rows:
        return 0
    with transaction.atomic():
        RoutingEvent.objects.bulk_create(rows)
        newest = RoutingEvent.objects.order_by("-id").values_list("id", flat=True).first()
        if newest is not None and newest > KEEP:
            RoutingEvent.objects.filter(id__lte=newest - KEEP).delete()
    return len(rows)
