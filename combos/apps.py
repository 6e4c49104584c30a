from __future__ import annotations

from django.apps import AppConfig


class CombosConfig(AppConfig):
    name = "combos"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from combos.services import on_provider_written
        from providers.services import provider_written

        provider_written.connect(on_provider_written, dispatch_uid="combos-provider-reset")
        from combos import audit_kinds

        audit_kinds.register()
