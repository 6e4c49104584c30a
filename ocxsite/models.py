from __future__ import annotations

from django.conf import settings
from django.db import models

from ocxsite.budgets import validate_budgets


class ClientKey(models.Model):
    """An `ocx_…` key a developer puts in Codex; stored as a SHA-256 hash only."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="client_keys")
    name = models.CharField(max_length=64, blank=True, default="")
    prefix = models.CharField(max_length=16, help_text="first characters, to recognise a key")
    digest = models.CharField(max_length=64, unique=True)
    allowed_models = models.JSONField(default=list, blank=True)
    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    # [{"tokens": N, "period": "day"}, {"windowPercent": P, "provider": "…"}] (ocxsite.budgets)
    budgets = models.JSONField(default=list, blank=True, validators=[validate_budgets])
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created",)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class UserBudget(models.Model):
    """A user's budgets, shared by all their keys (ocxsite.budgets)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, models.CASCADE, related_name="ocx_budget")
    budgets = models.JSONField(default=list, blank=True, validators=[validate_budgets])
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("user__username",)

    def __str__(self) -> str:
        return f"budgets of {self.user}"


class BudgetEvent(models.Model):
    """A budget crossing 80 % or 100 % (once per budget period)."""

    at = models.DateTimeField(db_index=True)
    owner = models.CharField(max_length=200)
    scope = models.CharField(max_length=8)
    percent = models.PositiveSmallIntegerField()
    budget = models.JSONField(default=dict)
    window = models.CharField(max_length=32, blank=True, default="")
    used = models.FloatField()
    limit = models.FloatField()
    resets_at = models.DateTimeField()
    message = models.TextField()

    class Meta:
        ordering = ("-at",)

    def __str__(self) -> str:
        return self.message


class ManagementToken(models.Model):
    """An `ocxm_…` token of a staff user for the management API."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="mgmt_tokens")
    name = models.CharField(max_length=64, blank=True, default="")
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created",)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class RequestLog(models.Model):
    request_id = models.CharField(max_length=40, db_index=True)
    at = models.DateTimeField(db_index=True)
    key_prefix = models.CharField(max_length=16, blank=True, default="")
    user = models.CharField(max_length=150, blank=True, default="")
    requested_model = models.CharField(max_length=256, blank=True, default="")
    combo = models.CharField(max_length=64, blank=True, default="")
    target = models.CharField(max_length=512, blank=True, default="")
    status = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=32, blank=True, default="")
    stream = models.BooleanField(default=False)
    duration_ms = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    # USD, computed by the writer from the usage and the target's price (combos.engine.pricing):
    # null = unknown (no usage report, or no price). A chatgpt target costs 0; `api_value_usd`
    # is what the request would have cost at API prices (= cost elsewhere).
    cost_usd = models.FloatField(null=True, blank=True)
    api_value_usd = models.FloatField(null=True, blank=True)
    # Route trace: attempts [{target, status, reason, cooled_until, ms}], skipped [[key, why]].
    attempts = models.JSONField(default=list, blank=True)
    skipped = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ("-at",)

    def __str__(self) -> str:
        return self.request_id
