from __future__ import annotations

from django.apps import AppConfig


class UsageConfig(AppConfig):
    """The request log, usage rollups, budgets and their events."""

    name = "usage"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from server import doctor
        from usage import verify

        doctor.add_check(verify.doctor_check)
