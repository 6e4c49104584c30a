from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from combos.services import combo_state_reset
        from dashboard.services import on_combo_state_reset

        combo_state_reset.connect(on_combo_state_reset, dispatch_uid="dashboard-reset-event")
