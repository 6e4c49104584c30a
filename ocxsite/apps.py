from __future__ import annotations

from django.apps import AppConfig


class OcxsiteConfig(AppConfig):
    """The composition root also owns access: client keys, management tokens, request log."""

    name = "ocxsite"
    verbose_name = "Access and request log"
    default_auto_field = "django.db.models.BigAutoField"
