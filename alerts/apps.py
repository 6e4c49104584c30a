from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """Alert destinations, the outbox of messages to them and its one sender (PRODUCT §9.9)."""

    name = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from alerts import audit_kinds

        audit_kinds.register()
