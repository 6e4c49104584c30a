"""`key_expiring` alerts: 7 days and 1 day before a client key expires (a periodic check the
alert sender runs, `alerts.sender.Sender(periodic=…)`); once per key, expiry and warning."""

from __future__ import annotations

import datetime as dt

from accounts.models import ClientKey
from alerts import events, outbox

WARNINGS = (7, 1)  # days before the expiry


def warning_due(expires: dt.datetime, now: dt.datetime) -> int | None:
    """The warning (7 or 1 days) a key expiring at `expires` is in at `now`, if any."""
    left = expires - now
    if left <= dt.timedelta(0):
        return None
    for days in sorted(WARNINGS):
        if left <= dt.timedelta(days=days):
            return days
    return None


def check_expiring(now: dt.datetime) -> int:
    """Outbox messages for active keys expiring within 7 days; returns the alerts written."""
    keys = (
        ClientKey.objects.filter(
            revoked__isnull=True,
            user__is_active=True,
            expires__gt=now,
            expires__lte=now + dt.timedelta(days=max(WARNINGS)),
        )
        .select_related("user")
        .prefetch_related("user__groups")
    )
    alerts = []
    now_ms = int(now.timestamp() * 1000)
    for key in keys:
        assert key.expires is not None
        days = warning_due(key.expires, now)
        if days is None:
            continue
        alerts.append(
            events.key_expiring(
                key_id=key.pk,
                prefix=key.prefix,
                name=key.name,
                user=key.user.get_username(),
                teams=sorted(g.name for g in key.user.groups.all()),
                expires_ms=int(key.expires.timestamp() * 1000),
                days=days,
                now_ms=now_ms,
            )
        )
    if alerts:
        outbox.write(alerts, now=now)
    return len(alerts)
