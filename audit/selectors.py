"""Reads of the audit trail: `GET /api/audit` and the admin."""

from __future__ import annotations

import datetime as dt
import re

from django.db.models import Q, QuerySet

from audit.models import AuditEntry

LIMIT_MAX = 1000
_RELATIVE = re.compile(r"^(\d{1,6})([mhdw])$")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class AuditQueryError(ValueError):
    """A bad parameter; the message names it."""


def parse_since(value: str, *, now: dt.datetime) -> dt.datetime:
    """ISO 8601 (no offset = UTC) or a duration back from now: 30m, 24h, 7d, 2w."""
    text = value.strip()
    m = _RELATIVE.match(text)
    if m:
        return now - dt.timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise AuditQueryError(
            f"since: expected an ISO 8601 time (2026-01-31T12:00:00Z) or a duration like 24h, "
            f"7d; got {value!r}"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def entries(
    *,
    since: dt.datetime | None = None,
    actor: str | None = None,
    obj: str | None = None,
    limit: int = 500,
) -> QuerySet[AuditEntry]:
    """Newest first. `actor`: a username, or `cli` for every command (`cli:<OS user>`);
    `obj`: an object type (`provider`, `combo`, `key`, `token`, `team`, `user`, `alert`),
    `type:id` or `type:label`, or any text of the object's label."""
    rows = AuditEntry.objects.all()
    if since is not None:
        rows = rows.filter(at__gte=since)
    if actor:
        rows = rows.filter(Q(actor=actor) | Q(actor__startswith=f"{actor}:"))
    if obj:
        kind, sep, ident = obj.partition(":")
        if sep:
            named = Q(object_label=ident) | Q(object_label=f"{kind} {ident}")
            rows = rows.filter(object_type=kind).filter(Q(object_id=ident) | named)
        else:
            rows = rows.filter(Q(object_type=obj) | Q(object_label__icontains=obj))
    return rows.order_by("-at", "-id")[: max(1, min(limit, LIMIT_MAX))]


def entry_json(entry: AuditEntry) -> dict[str, object]:
    return {
        "id": entry.pk,
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "via": entry.via,
        "action": entry.action,
        "objectType": entry.object_type,
        "objectId": entry.object_id,
        "object": entry.object_label,
        "changes": entry.changes,
    }
