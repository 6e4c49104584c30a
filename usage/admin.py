from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from combos.times import time_html
from usage import report as usage_report
from usage import requestlog_admin  # noqa: F401 - registers the request log admin
from usage.models import HOUR, MINUTE, BudgetEvent, UsageRollup

# The exports the usage page links (the management API accepts a staff session).
EXPORTS = (
    ("users 7d", "by=user&since=7d"),
    ("users × models 30d", "by=user,model&since=30d"),
    ("keys 7d", "by=key&since=7d"),
    ("targets 24h", "by=target&since=24h"),
)


class BucketSizeFilter(admin.SimpleListFilter):
    """Minute rows (the last day) or hour rows (older, downsampled)."""

    title = "bucket"
    parameter_name = "resolution"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(MINUTE), "1 min"), (str(HOUR), "1 h")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return (
            queryset
            if value not in (str(MINUTE), str(HOUR))
            else queryset.filter(resolution=int(value))
        )


def _links(
    params: dict[str, str], name: str, choices: dict[str, str], drop: tuple[str, ...] = ()
) -> list[tuple[str, str, str]]:
    """(value, label, "?query") per choice, keeping the page's other parameters."""
    out = []
    for value, label in choices.items():
        if value == "custom":
            continue
        query = {k: v for k, v in params.items() if v and k not in drop and k != name}
        out.append((value, label, "?" + urlencode({**query, name: value})))
    return out


@admin.register(UsageRollup)
class UsageRollupAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    # The drill-down of the report: local times, a readable bucket size, tokens in one column.
    list_display = (
        "when",
        "span",
        "user",
        "key_prefix",
        "combo",
        "target",
        "model",
        "status_class",
        "requests",
        "tokens",
        "cost",
        "api_value",
        "unpriced_requests",
    )
    list_filter = (BucketSizeFilter, "status_class", "combo")
    search_fields = ("user", "key_prefix", "target", "model")
    date_hierarchy = "bucket"

    class Media:
        css = {"all": ("ocx/usage-rollups.css",)}
        js = ("ocx/localtime.js",)

    @admin.display(description="bucket start", ordering="bucket")
    def when(self, obj: UsageRollup) -> SafeString:
        return time_html(obj.bucket)

    @admin.display(description="bucket", ordering="resolution")
    def span(self, obj: UsageRollup) -> str:
        return (
            "1 h"
            if obj.resolution == HOUR
            else "1 min"
            if obj.resolution == MINUTE
            else (f"{obj.resolution} s")
        )

    @admin.display(description="tokens in / cached / out")
    def tokens(self, obj: UsageRollup) -> str:
        return f"{obj.input_tokens:,} / {obj.cached_input_tokens:,} / {obj.output_tokens:,}"

    @admin.display(description="cost", ordering="cost_usd")
    def cost(self, obj: UsageRollup) -> str:
        return f"${obj.cost_usd:,.6f}"

    @admin.display(description="API value", ordering="api_value_usd")
    def api_value(self, obj: UsageRollup) -> str:
        return f"${obj.api_value_usd:,.6f}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Counts are removed by retention only: a deleted row would silently lower totals.
        return False

    def get_urls(self) -> list[URLPattern]:
        # The per-minute rows: the report's drill-down (Django's own change list).
        rollups = path(
            "rollups/",
            self.admin_site.admin_view(self.rollups_view),
            name="usage_usagerollup_rollups",
        )
        return [rollups, *super().get_urls()]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The usage report: the page "Usage rollups" opens (staff with view permission)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        params = {k: request.GET.get(k, "") for k in ("period", "from", "to", "by", "tz")}
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Usage report",
            "opts": self.model._meta,
            "periods": usage_report.PERIODS,
            "groupings": usage_report.groupings(),
            "params": params,
            "period_links": _links(params, "period", usage_report.PERIODS, drop=("from", "to")),
            "group_links": _links(params, "by", usage_report.groupings()),
            "default_zone": settings.OCX_TIME_ZONE,
        }
        status = 200
        try:
            report = usage_report.build(
                params=params,
                now=timezone.now(),
                default_zone=settings.OCX_TIME_ZONE,
                rollups_base=reverse("admin:usage_usagerollup_rollups"),
            )
        except usage_report.ReportError as exc:
            context["error"] = str(exc)
            status = 400
        else:
            context["report"] = report
            context["chart"] = usage_report.spend_chart(
                report.series, with_api_value=report.shows_api_value
            )
        return TemplateResponse(
            request, "admin/usage/usagerollup/report.html", context, status=status
        )

    def rollups_view(self, request: HttpRequest) -> HttpResponse:
        links = [(label, f"/api/usage?format=csv&{query}") for label, query in EXPORTS]
        return super().changelist_view(request, {"usage_exports": links, "title": "Usage rollups"})


@admin.register(BudgetEvent)
class BudgetEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Budgets crossing 80 % and 100 % (also on /ws/events and in the log)."""

    list_display = ("at", "percent", "owner", "message")
    list_filter = ("percent", "scope")
    search_fields = ("owner", "message")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
