from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from quota.models import QuotaSnapshot, QuotaTransition


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(QuotaSnapshot)
class QuotaSnapshotAdmin(ReadOnlyAdmin):
    list_display = (
        "provider",
        "credential",
        "window",
        "scope",
        "used_percent",
        "resets_at",
        "observed_at",
    )
    list_filter = ("provider", "window", "scope")


@admin.register(QuotaTransition)
class QuotaTransitionAdmin(ReadOnlyAdmin):
    list_display = ("at", "provider", "credential", "from_state", "to_state", "message")
    list_filter = ("provider", "to_state")
