from __future__ import annotations

from django.apps import AppConfig


class ProvidersConfig(AppConfig):
    name = "providers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from providers import audit_kinds

        audit_kinds.register()
