from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from ocxsite import access
from ocxsite.models import ClientKey, ManagementToken, RequestLog


@admin.register(ClientKey)
class ClientKeyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("prefix", "user", "name", "rpm_limit", "created", "revoked")
    list_filter = ("revoked",)
    search_fields = ("prefix", "user__username", "name")
    readonly_fields = ("prefix", "digest", "created", "revoked")
    fields = ("user", "name", "allowed_models", "rpm_limit", "prefix", "created", "revoked")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Keys are created with `ocx key create` or POST /api/keys, which show the secret once.
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ClientKey]) -> None:
        count = access.client_keys_revoke(keys=queryset)
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)


@admin.register(ManagementToken)
class ManagementTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("prefix", "user", "name", "created", "revoked")
    readonly_fields = ("prefix", "digest", "created", "revoked", "user")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ManagementToken]) -> None:
        count = queryset.filter(revoked__isnull=True).update(revoked=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)


@admin.register(RequestLog)
class RequestLogAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "at",
        "request_id",
        "user",
        "requested_model",
        "target",
        "status",
        "duration_ms",
    )
    list_filter = ("status", "combo", "stream")
    search_fields = ("request_id", "user", "requested_model", "target")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
