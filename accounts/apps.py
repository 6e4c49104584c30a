from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Who may call: client keys, management tokens, users and their budgets."""

    name = "accounts"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import audit_kinds

        audit_kinds.register()
