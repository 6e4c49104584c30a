"""`GET /api/usage`: token usage per user, team, key, combo, target or model over a time range."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Router
from ninja.errors import HttpError

from usage import selectors
from usage.schemas import UsageReportOut

router = Router(tags=["usage"])


@router.get("", response=UsageReportOut, operation_id="get_usage")
def get_usage(
    request: HttpRequest,
    by: str | None = None,
    since: str | None = None,
    until: str | None = None,
    bucket: str | None = None,
    format: str = "json",
) -> HttpResponse | dict[str, object]:
    if format not in ("json", "csv"):
        raise HttpError(400, "format: use json or csv")
    try:
        query = selectors.build_query(
            by=by, since=since, until=until, bucket=bucket, now=timezone.now()
        )
    except selectors.UsageQueryError as exc:
        raise HttpError(400, str(exc)) from None
    # A team manager's scope (accounts.api_auth): only their teams' members; None: everyone.
    scope = getattr(request, "ocx_scope", None)
    report = selectors.usage_report(query, users=scope.usernames() if scope else None)
    if format == "csv":
        response = HttpResponse(
            selectors.report_csv(report), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = 'attachment; filename="ocx-usage.csv"'
        return response
    return report


@router.get("/verify", operation_id="verify_usage")
def verify_usage(request: HttpRequest, since: str | None = None) -> dict[str, object]:
    """The ledger check (`ocx usage verify`): request log, rollups and the budget counters this
    server counts with (Redis, or its own memory), since `since` (default: today)."""
    from usage import verify

    scope = getattr(request, "ocx_scope", None)
    if scope is not None and not scope.every:
        # The ledger is every team's: a team manager's view stops at their teams.
        raise HttpError(403, "forbidden: the ledger check needs the viewer or admin role")
    now = timezone.now()
    try:
        start = verify.parse_since(since, now=now)
    except selectors.UsageQueryError as exc:
        raise HttpError(400, str(exc)) from None
    result = verify.verify(
        since=start, now=now, counters=verify.live_counters(), counters_note=verify.NO_COUNTERS
    )
    return {
        "since": start.isoformat().replace("+00:00", "Z"),
        "agrees": result.agrees,
        "checked": result.checked,
        "differences": result.differences,
        "notes": result.notes,
    }
