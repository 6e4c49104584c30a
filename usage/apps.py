from __future__ import annotations

from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "usage"
    default_auto_field = "django.db.models.BigAutoField"
