from __future__ import annotations

from django.apps import AppConfig


class QuotaConfig(AppConfig):
    name = "quota"
    default_auto_field = "django.db.models.BigAutoField"
