from __future__ import annotations

from django.db import models


class QuotaSnapshot(models.Model):
    """One observed quota window per (provider, credential fingerprint, window, scope)."""

    provider = models.CharField(max_length=64)
    credential = models.CharField(max_length=32, help_text="fingerprint, never the secret")
    window = models.CharField(max_length=16)
    scope = models.CharField(max_length=16, default="inference")
    used_percent = models.FloatField(null=True, blank=True)
    window_minutes = models.PositiveIntegerField(null=True, blank=True)
    resets_at = models.DateTimeField(null=True, blank=True)
    observed_at = models.DateTimeField()
    source = models.CharField(max_length=32, default="")

    class Meta:
        ordering = ("provider", "credential", "window")
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "credential", "window", "scope"], name="uniq_quota_window"
            )
        ]

    def __str__(self) -> str:
        return f"{self.provider}[{self.credential}] {self.window}"


class QuotaTransition(models.Model):
    provider = models.CharField(max_length=64)
    credential = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=256)
    message = models.CharField(max_length=512, blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ("-at",)
