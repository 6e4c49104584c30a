"""What the audit trail records of an alert destination: its fields, with the webhook secret
and the URL (a Slack incoming-webhook URL is itself a credential) as "***"."""

from __future__ import annotations

import hashlib

from alerts.models import AlertDestination
from audit import trail


def read_destination(name: str) -> trail.Snapshot:
    row = AlertDestination.objects.filter(name=name).first()
    if row is None:
        return None
    fields = trail.row_fields(row, exclude=("name", "created", "updated", "secret", "url"))
    # Digests: "changed" is all the trail says of either.
    fields["url"] = hashlib.sha256(row.url.encode()).hexdigest() if row.url else None
    fields["secret"] = hashlib.sha256(row.secret.encode()).hexdigest() if row.secret else None
    return f"alert destination {name}", fields


def register() -> None:
    trail.register("alert", read_destination, secrets=("url", "secret"))
    trail.watch(AlertDestination, "alert", lambda row: row.name, owner=True)
