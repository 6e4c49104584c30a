"""Operations endpoints of the management API: status, quota, request log."""

from __future__ import annotations

import datetime as dt

from django.http import HttpRequest
from ninja import Router
from ninja.errors import HttpError

from combos.status import quota_report, status_report
from usage.models import RequestLog

router = Router(tags=["operations"])


@router.get("/status", operation_id="get_status")
def get_status(request: HttpRequest, combo: str | None = None) -> dict[str, object]:
    report = status_report(combo)
    if combo is not None and not report["combos"]:
        raise HttpError(404, "unknown combo")
    return report


@router.get("/quota", operation_id="get_quota")
def get_quota(request: HttpRequest) -> dict[str, object]:
    return quota_report()


def _entry(row: RequestLog) -> dict[str, object]:
    return {
        "requestId": row.request_id,
        "at": row.at.isoformat().replace("+00:00", "Z"),
        "user": row.user,
        "keyPrefix": row.key_prefix,
        "model": row.requested_model,
        "combo": row.combo or None,
        "target": row.target or None,
        "status": row.status,
        "outcome": row.outcome,
        "stream": row.stream,
        "durationMs": row.duration_ms,
        "usage": {
            "inputTokens": row.input_tokens,
            "outputTokens": row.output_tokens,
            "cachedTokens": row.cached_tokens,
        },
        # The tokens are ocx's estimate (an abandoned stream, a bad usage figure: issue 42).
        "usageEstimated": row.usage_estimated,
        # The budget that refused a `budget_exceeded` request, else null.
        "budget": row.budget or None,
        # USD (docs/usage.md): null = unknown (no price, or no usage reported).
        "costUsd": row.cost_usd,
        "apiValueUsd": row.api_value_usd,
        "attempts": row.attempts,
        "skipped": row.skipped,
    }


@router.get("/requests", operation_id="list_requests")
def list_requests(
    request: HttpRequest,
    limit: int = 50,
    combo: str | None = None,
    status: int | None = None,
    user: str | None = None,
    request_id: str | None = None,
    since: dt.datetime | None = None,
) -> dict[str, object]:
    if not 1 <= limit <= 1000:
        raise HttpError(400, "limit must be from 1 to 1000")
    rows = RequestLog.objects.all()
    if combo:
        rows = rows.filter(combo=combo)
    if status is not None:
        rows = rows.filter(status=status)
    if user:
        rows = rows.filter(user=user)
    if request_id:
        rows = rows.filter(request_id=request_id)
    if since is not None:
        rows = rows.filter(at__gte=since)
    return {"requests": [_entry(r) for r in rows[:limit]]}
