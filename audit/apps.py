from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit trail: who changed what, when, through which interface (docs/people.md)."""

    name = "audit"
    verbose_name = "Audit trail"
    default_auto_field = "django.db.models.BigAutoField"
