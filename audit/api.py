"""`GET /api/audit?since=&actor=&object=&limit=` → {"entries": [...]}, newest first (viewers and
admins: the API's default rule)."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils import timezone
from ninja import Router
from ninja.errors import HttpError

from audit import selectors

router = Router(tags=["audit"])


@router.get("", operation_id="list_audit")
def list_audit(
    request: HttpRequest,
    since: str | None = None,
    actor: str | None = None,
    object: str | None = None,  # noqa: A002  # the documented query parameter
    limit: int = 500,
) -> dict[str, object]:
    """The audit trail: every change of providers, combos, keys, tokens, teams, users, roles and
    budgets. `since`: ISO 8601 or a duration (24h, 7d); `actor`: a username or `cli`;
    `object`: a type (`provider`, `combo`, `key`, `token`, `team`, `user`, `alert`), `type:name` or
    text of the object's name; `limit`: 1 to 1000 (default 500)."""
    if not 1 <= limit <= selectors.LIMIT_MAX:
        raise HttpError(400, f"limit: 1 to {selectors.LIMIT_MAX}")
    try:
        start = selectors.parse_since(since, now=timezone.now()) if since else None
    except selectors.AuditQueryError as exc:
        raise HttpError(400, str(exc)) from None
    rows = selectors.entries(since=start, actor=actor, obj=object, limit=limit)
    return {"entries": [selectors.entry_json(e) for e in rows]}
