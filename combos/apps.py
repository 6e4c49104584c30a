from __future__ import annotations

from django.apps import AppConfig


class CombosConfig(AppConfig):
    name = "combos"
    default_auto_field = "django.db.models.BigAutoField"
