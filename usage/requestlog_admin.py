"""The request log in the admin: one line per request (local time to the second, status,
duration, user, combo, served target, hops), filters by status class, combo, user and time
range, and a detail page that shows the route (attempts and skipped targets) as tables."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from combos.models import Combo
from combos.times import from_ms, in_words, time_html
from usage.models import RequestLog

STATUS_CLASSES: dict[str, tuple[str, Q]] = {
    "2xx": ("2xx success", Q(status__gte=200, status__lt=300)),
    "4xx": ("4xx refused (not 499)", Q(status__gte=400, status__lt=500) & ~Q(status=499)),
    "499": ("499 client went away", Q(status=499)),
    "5xx": ("5xx failed", Q(status__gte=500, status__lt=600)),
}
RANGES: dict[str, tuple[str, dt.timedelta]] = {
    "1h": ("Last hour", dt.timedelta(hours=1)),
    "24h": ("Last 24 hours", dt.timedelta(hours=24)),
    "7d": ("Last 7 days", dt.timedelta(days=7)),
}


class StatusClassFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status_class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in STATUS_CLASSES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = STATUS_CLASSES.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen[1])


class TimeRangeFilter(admin.SimpleListFilter):
    title = "time"
    parameter_name = "since"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in RANGES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = RANGES.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(at__gte=timezone.now() - chosen[1])


class ComboFilter(admin.SimpleListFilter):
    """The configured combos (no DISTINCT scan over the log); "direct" = no combo."""

    title = "combo"
    parameter_name = "combo"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        ids = Combo.objects.order_by("combo_id").values_list("combo_id", flat=True)
        return [*((c, c) for c in ids), ("-", "(direct model, no combo)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(combo="" if value == "-" else value)


class UserFilter(admin.SimpleListFilter):
    """The ocx users (no DISTINCT scan over the log)."""

    title = "user"
    parameter_name = "user"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = get_user_model().objects.order_by("username").values_list("username", flat=True)
        return [(n, n) for n in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value is None else queryset.filter(user=value)


def hops(row: RequestLog) -> int:
    """Attempts that failed over to the next target."""
    return sum(1 for a in row.attempts or [] if isinstance(a, dict) and a.get("outcome") == "hop")


def _status_class(status: int) -> str:
    if status == 499:
        return "499"
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def _ms(value: object) -> str:
    if not isinstance(value, int):
        return "—"
    return f"{value} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def attempts_table(row: RequestLog) -> SafeString:
    attempts = [a for a in row.attempts or [] if isinstance(a, dict)]
    if not attempts:
        return format_html('<p class="ocx-none">{}</p>', "No upstream attempt.")
    body = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        '<td class="ocx-num">{}</td></tr>',
        (
            (
                n,
                a.get("target") or "—",
                a.get("status") if a.get("status") is not None else "—",
                _outcome(a),
                a.get("reason") or "—",
                _cooled(a.get("cooledUntil"), row),
                _ms(a.get("ms")),
            )
            for n, a in enumerate(attempts, 1)
        ),
    )
    return format_html(
        '<table class="ocx-route" id="ocx-attempts"><thead><tr><th>#</th><th>Target</th>'
        "<th>Status</th><th>Outcome</th><th>Reason</th><th>Cooled until</th><th>Time</th>"
        "</tr></thead><tbody>{}</tbody></table>",
        body,
    )


def _outcome(attempt: dict[str, object]) -> str:
    """The attempt's outcome: a same-target retry says how long it waited first; the
    after-commit rescue's role follows (docs/routing.md, "When a stream breaks after it
    started"): `hop (restart)`, `failed_after_commit (not_continued: tool call started)`."""
    outcome = str(attempt.get("outcome") or "—")
    wait = attempt.get("waitMs")
    if isinstance(wait, int):
        outcome = f"{outcome}, again after {_ms(wait)}"
    role = attempt.get("role")
    if not role or str(role) in outcome:
        return outcome
    detail = attempt.get("roleDetail")
    return f"{outcome} ({role}{': ' + str(detail) if detail else ''})"


def _cooled(until: object, row: RequestLog) -> SafeString | str:
    """The cooldown's end in local time, and how long after the request began it was."""
    if not isinstance(until, int):
        return "—"
    after = (until - row.at.timestamp() * 1000) / 1000
    return format_html(
        '{} <span class="ocx-quiet">(+{})</span>', time_html(from_ms(until)), in_words(after)
    )


def skipped_table(row: RequestLog) -> SafeString:
    skipped = [s for s in row.skipped or [] if isinstance(s, list | tuple) and len(s) == 2]
    if not skipped:
        return format_html('<p class="ocx-none">{}</p>', "No target was skipped.")
    body = format_html_join("", "<tr><td>{}</td><td>{}</td></tr>", ((k, why) for k, why in skipped))
    return format_html(
        '<table class="ocx-route" id="ocx-skipped"><thead><tr><th>Target</th><th>Why skipped</th>'
        "</tr></thead><tbody>{}</tbody></table>",
        body,
    )


@admin.register(RequestLog)
class RequestLogAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "when",
        "status_badge",
        "duration",
        "user",
        "combo_name",
        "served",
        "hop_count",
    )
    list_display_links = ("when",)
    list_filter = (StatusClassFilter, TimeRangeFilter, ComboFilter, UserFilter, "stream")
    search_fields = ("request_id", "user", "requested_model", "target")
    list_per_page = 50
    # A log is read, not edited: no bulk actions (and no checkbox column taking room).
    actions = None
    # COUNT(*) over the whole log on every page view is what makes a big log slow.
    show_full_result_count = False
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "request_id",
                    "when",
                    "status_badge",
                    "outcome",
                    "duration",
                    "user",
                    "key_prefix",
                    "requested_model",
                    "combo_name",
                    "served",
                    "stream",
                    "tokens",
                    "cost",
                    "budget_name",
                )
            },
        ),
        ("Route: attempts in order", {"fields": ("attempts_view",)}),
        ("Route: skipped targets", {"fields": ("skipped_view",)}),
    )
    readonly_fields = (
        "when",
        "status_badge",
        "duration",
        "combo_name",
        "served",
        "tokens",
        "cost",
        "budget_name",
        "attempts_view",
        "skipped_view",
    )

    class Media:
        css = {"all": ("ocx/requestlog.css",)}
        js = ("ocx/localtime.js",)

    @admin.display(description="time", ordering="at")
    def when(self, obj: RequestLog) -> SafeString:
        return time_html(obj.at)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: RequestLog) -> SafeString:
        badge = format_html(
            '<span class="ocx-status ocx-status-{}">{}</span>',
            _status_class(obj.status),
            obj.status,
        )
        if obj.budget:
            # A budget_exceeded refusal names the budget that refused it (issue 42).
            return format_html(
                '{} <span class="ocx-quiet ocx-budget">budget: {}</span>', badge, obj.budget
            )
        return badge

    @admin.display(description="budget")
    def budget_name(self, obj: RequestLog) -> str:
        return obj.budget or "—"

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, obj: RequestLog) -> str:
        return _ms(obj.duration_ms)

    @admin.display(description="combo", ordering="combo")
    def combo_name(self, obj: RequestLog) -> str:
        return obj.combo or "—"

    @admin.display(description="served by", ordering="target")
    def served(self, obj: RequestLog) -> str:
        return obj.target or "—"

    @admin.display(description="hops")
    def hop_count(self, obj: RequestLog) -> int:
        return hops(obj)

    @admin.display(description="tokens in/out")
    def tokens(self, obj: RequestLog) -> str:
        if obj.input_tokens is None and obj.output_tokens is None:
            return "—"
        text = f"{obj.input_tokens or 0} / {obj.output_tokens or 0}"
        # ocx's estimate: an abandoned stream or a usage report that failed the checks.
        return text + " (estimated)" if obj.usage_estimated else text

    @admin.display(description="cost")
    def cost(self, obj: RequestLog) -> str:
        if obj.cost_usd is None:
            return "— (no price or no usage reported)" if obj.target else "—"
        text = f"${obj.cost_usd:.6f}"
        if obj.api_value_usd is not None and obj.api_value_usd != obj.cost_usd:
            text += f" (at API prices ${obj.api_value_usd:.6f})"
        return text

    @admin.display(description="attempts")
    def attempts_view(self, obj: RequestLog) -> SafeString:
        return attempts_table(obj)

    @admin.display(description="skipped")
    def skipped_view(self, obj: RequestLog) -> SafeString:
        return skipped_table(obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Rows leave by the retention (OCX_REQUEST_LOG_RETENTION_DAYS), not by hand.
        return False
