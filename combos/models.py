from __future__ import annotations

from django.db import models

from providers.models import Provider
from routing.types import AFTER_COMMIT_MODES, DEFAULT_BUFFER_MAX_BYTES, EFFORTS, STRATEGIES


class Combo(models.Model):
    combo_id = models.CharField("id", max_length=64, unique=True)
    strategy = models.CharField(
        max_length=16, default="failover", choices=[(s, s) for s in STRATEGIES]
    )
    sticky_limit = models.PositiveIntegerField(default=1)
    cooldown_ms = models.PositiveIntegerField(null=True, blank=True)
    wait_for_cooldown_ms = models.PositiveIntegerField(default=0)
    cooldown_wait_policy = models.CharField(
        max_length=32, null=True, blank=True, choices=[("before-last-resort", "before-last-resort")]
    )
    default_effort = models.CharField(
        max_length=8, null=True, blank=True, choices=[(e, e) for e in EFFORTS]
    )
    default_effort_mode = models.CharField(
        max_length=8, default="fallback", choices=[("fallback", "fallback"), ("force", "force")]
    )
    reasoning_effort_mode = models.CharField(
        max_length=8, default="strict", choices=[("strict", "strict"), ("adaptive", "adaptive")]
    )
    image_input = models.CharField(
        max_length=8, default="auto", choices=[("auto", "auto"), ("disabled", "disabled")]
    )
    # After-commit rescue of a broken stream (routing.rescue): error (default), continue, buffer.
    after_commit = models.CharField(
        max_length=8,
        default="error",
        choices=[(m, m) for m in AFTER_COMMIT_MODES],
    )
    max_continuations = models.PositiveSmallIntegerField(default=1)
    buffer_max_bytes = models.PositiveIntegerField(default=DEFAULT_BUFFER_MAX_BYTES)
    alias = models.CharField(max_length=129, null=True, blank=True)
    native_alias = models.BooleanField(default=False)
    display_name = models.CharField(max_length=128, null=True, blank=True)
    # Manual override (PRODUCT §8.5): null = automatic, else "provider/model".
    override_target = models.CharField(max_length=512, null=True, blank=True)
    # `retrySameTarget` (issue #29): both null = off; `routing.validate` checks the pair.
    retry_attempts = models.PositiveSmallIntegerField(
        "retry same target: attempts", null=True, blank=True
    )
    retry_max_wait_ms = models.PositiveIntegerField(
        "retry same target: max wait (ms)", null=True, blank=True
    )
    # Operator resets of the routing state: {"*" or "provider/model": epoch ms} (ComboSpec.resets).
    state_resets = models.JSONField(default=dict, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("combo_id",)

    def __str__(self) -> str:
        return f"combo/{self.combo_id}"


class ComboTarget(models.Model):
    combo = models.ForeignKey(Combo, models.CASCADE, related_name="targets")
    position = models.PositiveIntegerField(default=0)
    # PROTECT: a provider used by a combo cannot be deleted (API answers 409).
    provider = models.ForeignKey(Provider, models.PROTECT, related_name="combo_targets")
    model = models.CharField(max_length=256)
    weight = models.PositiveIntegerField(default=1)
    last_resort = models.BooleanField(default=False)

    class Meta:
        ordering = ("combo", "position", "id")

    def __str__(self) -> str:
        return f"{self.provider.name}/{self.model}"
