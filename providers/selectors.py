"""Reads for providers: ORM rows → sparse camelCase dicts (never a secret)."""

from __future__ import annotations

from providers.models import Provider
from routing import validate


def provider_stored_raw(provider: Provider) -> dict[str, object]:
    """The provider as a sparse camelCase dict, without any secret."""
    spec = validate.normalize_provider(provider.name, provider_raw(provider))
    return validate.provider_to_sparse(spec)


def provider_raw(provider: Provider) -> dict[str, object]:
    raw: dict[str, object] = {"adapter": provider.adapter, "baseUrl": provider.base_url}
    if provider.api_key_env:
        raw["apiKeyEnv"] = provider.api_key_env
    if provider.headers:
        raw["headers"] = dict(provider.headers)
    if provider.disabled:
        raw["disabled"] = True
    raw["timeouts"] = {
        "connectMs": provider.connect_ms,
        "firstByteMs": provider.first_byte_ms,
        "idleMs": provider.idle_ms,
        "totalMs": provider.total_ms,
    }
    if provider.max_connections is not None:
        raw["maxConnections"] = provider.max_connections
    if provider.pricing_provider:
        raw["pricingProvider"] = provider.pricing_provider
    models: dict[str, object] = {}
    for m in provider.models.all():
        entry: dict[str, object] = {}
        if m.context_window is not None:
            entry["contextWindow"] = m.context_window
        if m.max_input_tokens is not None:
            entry["maxInputTokens"] = m.max_input_tokens
        if m.input_modalities is not None:
            entry["inputModalities"] = list(m.input_modalities)
        if m.reasoning_efforts is not None:
            entry["reasoningEfforts"] = list(m.reasoning_efforts)
        if m.display_name:
            entry["displayName"] = m.display_name
        if m.parallel_tool_calls is not None:
            entry["parallelToolCalls"] = m.parallel_tool_calls
        if m.price is not None:
            entry["price"] = dict(m.price)
        if m.prefill is not None:
            entry["prefill"] = m.prefill
        models[m.model_id] = entry
    if models:
        raw["models"] = models
    return raw
