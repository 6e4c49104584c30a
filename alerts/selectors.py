"""Reads of alert destinations and their messages (the API, the CLI, the admin)."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.db.models import Count, Q

from alerts.models import FAILED, PENDING, AlertDestination


def masked_url(url: str) -> str:
    """The scheme and host only: a Slack webhook URL's path is its credential."""
    if not url:
        return ""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}/…" if parts.path not in ("", "/") else url


def destination_json(
    row: AlertDestination, *, pending: int = 0, failed: int = 0
) -> dict[str, object]:
    out: dict[str, object] = {
        "name": row.name,
        "kind": row.kind,
        "events": list(row.events),
        "teams": list(row.teams),
        "combos": list(row.combos),
        "pending": pending,
        "failed": failed,
    }
    if row.kind == "email":
        out["to"] = list(row.to)
    else:
        out["url"] = masked_url(row.url)
    if row.kind == "webhook":
        out["hasSecret"] = bool(row.secret)  # the secret itself is never returned
    return out


def destination_list() -> list[dict[str, object]]:
    rows = AlertDestination.objects.annotate(
        pending_n=Count("messages", filter=Q(messages__status=PENDING)),
        failed_n=Count("messages", filter=Q(messages__status=FAILED)),
    ).order_by("name")
    return [
        destination_json(r, pending=r.pending_n, failed=r.failed_n)  # type: ignore[attr-defined]
        for r in rows
    ]


def exists(name: str) -> bool:
    return AlertDestination.objects.filter(name=name).exists()
