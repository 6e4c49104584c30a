from __future__ import annotations

import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: entries leave by the retention (OCX_AUDIT_RETENTION_DAYS), never by hand."""

    list_display = ("at", "actor", "via", "action", "object_type", "object_label", "change_list")
    list_filter = ("via", "action", "object_type", ("at", admin.DateFieldListFilter))
    search_fields = ("actor", "object_label", "object_id")
    date_hierarchy = "at"
    list_per_page = 100
    fields = ("at", "actor", "via", "action", "object_type", "object_id", "object_label")
    readonly_fields = (*fields, "change_list")

    def get_fields(self, request: HttpRequest, obj: AuditEntry | None = None) -> tuple[str, ...]:
        return (*self.fields, "change_list")

    @admin.display(description="changes")
    def change_list(self, obj: AuditEntry) -> str:
        rows = sorted((obj.changes or {}).items())
        if not rows:
            return "-"
        return format_html_join(
            mark_safe("<br>"),
            "{}: {} → {}",
            ((name, _text(v[0]), _text(v[1])) for name, v in rows),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def _text(value: object) -> str:
    return "—" if value is None else json.dumps(value, ensure_ascii=False)
