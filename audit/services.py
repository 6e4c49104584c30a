"""Writes of the audit trail: one entry per change (`audit.trail` computes it), and the
retention (OCX_AUDIT_RETENTION_DAYS, like the request log's)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings

from audit.models import AuditEntry

LABEL_MAX = 255


def record(
    *,
    actor: str,
    via: str,
    action: str,
    object_type: str,
    object_id: str,
    object_label: str,
    changes: dict[str, list[object]],
    now: dt.datetime,
) -> AuditEntry:
    entry = AuditEntry(
        at=now,
        actor=actor[:160],
        via=via,
        action=action,
        object_type=object_type,
        object_id=object_id[:LABEL_MAX],
        object_label=object_label[:LABEL_MAX],
        changes=changes,
    )
    entry.full_clean()
    entry.save()
    return entry


def prune(*, now: dt.datetime) -> int:
    """Delete the entries older than the retention; returns how many."""
    cutoff = now - dt.timedelta(days=settings.OCX_AUDIT_RETENTION_DAYS)
    deleted, _ = AuditEntry.objects.filter(at__lt=cutoff).delete()
    return deleted
