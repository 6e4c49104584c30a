from __future__ import annotations

from django.apps import AppConfig


class ProvidersConfig(AppConfig):
    name = "providers"
    default_auto_field = "django.db.models.BigAutoField"
