from __future__ import annotations

from django.db import models

from routing.types import ADAPTERS


class Provider(models.Model):
    name = models.CharField(max_length=64, unique=True)
    adapter = models.CharField(max_length=32, choices=[(a, a) for a in ADAPTERS])
    base_url = models.CharField(max_length=2048)
    api_key_env = models.CharField(max_length=128, blank=True, default="")
    # Fernet token (providers.sealing); the plaintext never touches the database.
    api_key_sealed = models.TextField(blank=True, default="")
    api_key_hint = models.CharField(max_length=32, blank=True, default="")
    headers = models.JSONField(default=dict, blank=True)
    disabled = models.BooleanField(default=False)
    connect_ms = models.PositiveIntegerField(default=5000)
    first_byte_ms = models.PositiveIntegerField(default=20000)
    idle_ms = models.PositiveIntegerField(default=60000)
    total_ms = models.PositiveIntegerField(default=600000)
    # Upstream connections per worker; null = OCX_UPSTREAM_MAX_CONNECTIONS.
    max_connections = models.PositiveIntegerField(null=True, blank=True)
    # The genai-prices provider id of its prices; "" = inferred (routing.pricing).
    pricing_provider = models.CharField(max_length=64, blank=True, default="")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class ProviderModel(models.Model):
    provider = models.ForeignKey(Provider, models.CASCADE, related_name="models")
    model_id = models.CharField(max_length=256)
    context_window = models.PositiveIntegerField(null=True, blank=True)
    max_input_tokens = models.PositiveIntegerField(null=True, blank=True)
    # null = not declared; a list otherwise.
    input_modalities = models.JSONField(null=True, blank=True)
    # Three states: null = unknown, [] = no effort control, else the ladder.
    reasoning_efforts = models.JSONField(null=True, blank=True)
    display_name = models.CharField(max_length=128, blank=True, default="")
    parallel_tool_calls = models.BooleanField(null=True, blank=True)
    # USD per million tokens: {"inputPerMTok", "cachedInputPerMTok"?, "outputPerMTok"}; null =
    # the genai-prices data's price. Validated by routing.validate like the rest.
    price = models.JSONField(null=True, blank=True)
    # The model continues a final assistant message (prefill): null = not known to. Only such
    # models are asked to continue a broken stream (a combo's `afterCommit: "continue"`).
    prefill = models.BooleanField(null=True, blank=True)

    class Meta:
        ordering = ("provider__name", "model_id")
        constraints = [
            models.UniqueConstraint(fields=["provider", "model_id"], name="uniq_provider_model")
        ]

    def __str__(self) -> str:
        return f"{self.provider.name}/{self.model_id}"


class ConfigState(models.Model):
    """A single row: the config version every worker polls, and top-level settings."""

    version = models.PositiveBigIntegerField(default=0)
    # Bumped by every change to client keys or their users; never repeats a value, so a worker
    # that read it before loading its key map always notices a write that raced the load.
    keys_version = models.PositiveBigIntegerField(default=0)
    disabled_models = models.JSONField(default=list, blank=True)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"config v{self.version}"
