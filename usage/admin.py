from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from usage import requestlog_admin  # noqa: F401 - registers the request log admin
from usage.models import BudgetEvent, UsageRollup

# The exports the usage page links (the management API accepts a staff session).
EXPORTS = (
    ("users 7d", "by=user&since=7d"),
    ("users × models 30d", "by=user,model&since=30d"),
    ("keys 7d", "by=key&since=7d"),
    ("targets 24h", "by=target&since=24h"),
)


@admin.register(UsageRollup)
class UsageRollupAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "bucket",
        "resolution",
        "user",
        "key_prefix",
        "combo",
        "target",
        "model",
        "status_class",
        "requests",
        "input_tokens",
        "cached_input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "unknown_usage_requests",
        "cost_usd",
        "api_value_usd",
        "unpriced_requests",
    )
    list_filter = ("resolution", "status_class", "combo")
    search_fields = ("user", "key_prefix", "target", "model")
    date_hierarchy = "bucket"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Counts are removed by retention only: a deleted row would silently lower totals.
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        links = [(label, f"/api/usage?format=csv&{query}") for label, query in EXPORTS]
        return super().changelist_view(request, {**(extra_context or {}), "usage_exports": links})


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
