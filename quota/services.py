"""Writes for quota data: window snapshots and transitions (called off the hot path)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction

from quota import windows as qw
from quota.models import QuotaSnapshot, QuotaTransition


def _ts(ms: int | None) -> dt.datetime | None:
    return None if ms is None else _at(ms)


def _at(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def snapshots_write(items: list[tuple[str, str, list[qw.Window]]]) -> None:
    """Upsert the latest window per (provider, credential, window, scope)."""
    latest: dict[tuple[str, str, str, str], qw.Window] = {}
    for provider, credential, windows in items:
        for w in windows:
            name = w.name if w.name != "custom" or not w.limit_id else f"{w.limit_id}"[:16]
            latest[(provider, credential, name, w.scope)] = w
    with transaction.atomic():
        for (provider, credential, name, scope), w in latest.items():
            QuotaSnapshot.objects.update_or_create(
                provider=provider,
                credential=credential,
                window=name,
                scope=scope,
                defaults={
                    "used_percent": w.used_percent,
                    "window_minutes": w.window_minutes,
                    "resets_at": _ts(w.resets_at_ms),
                    "observed_at": _at(w.observed_at_ms),
                    "source": w.source[:32],
                },
            )


@dataclass(frozen=True)
class TransitionEvent:
    provider: str
    credential: str
    transition: qw.Transition
    message: str


def transitions_write(items: list[TransitionEvent]) -> None:
    QuotaTransition.objects.bulk_create(
        QuotaTransition(
            provider=e.provider,
            credential=e.credential,
            from_state=e.transition.from_status,
            to_state=e.transition.to_status,
            reason=e.transition.reason[:256],
            message=e.message[:512],
            at=_at(e.transition.at_ms),
        )
        for e in items
    )
