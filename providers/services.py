"""Writes for providers and the config version. Every write bumps the version.

After the transaction that bumped a version commits, `versions_committed` is sent: the server
(`ocxsite.confignotify`) reloads the writing process's runtime at once and tells every other
worker through Redis, so that a write is served by the very next request.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.apps import apps
from django.db import transaction
from django.db.models import F
from django.dispatch import Signal

from combos.engine import validate
from providers import presets
from providers.errors import ConfigError
from providers.models import ConfigState, Provider, ProviderModel
from providers.sealing import mask, seal

# Sent (no arguments) once the transaction that bumped a config or key-table version commits.
versions_committed = Signal()


def _announce() -> None:
    versions_committed.send(sender=ConfigState)


def config_bump() -> int:
    """Increment the config version (inside the caller's transaction)."""
    state, _ = ConfigState.objects.select_for_update().get_or_create(pk=1)
    state.version += 1
    state.save(update_fields=["version", "updated"])
    transaction.on_commit(_announce, robust=True)
    return state.version


def keys_bump() -> None:
    """Increment the key-table version workers poll (inside the caller's transaction, if any)."""
    ConfigState.objects.get_or_create(pk=1)
    ConfigState.objects.filter(pk=1).update(keys_version=F("keys_version") + 1)
    transaction.on_commit(_announce, robust=True)


def _combo_ids() -> list[str]:
    # Looked up lazily: providers sits below combos in the dependency graph.
    combo_model = apps.get_model("combos", "Combo")
    return list(combo_model.objects.values_list("combo_id", flat=True))


def _issues_to_error(issues: list[validate.Issue], status: int = 400) -> ConfigError:
    texts = [issue.message for issue in issues]
    return ConfigError(texts[0], status=status, issues=[str(i) for i in issues])


def _write_provider(name: str, raw: Mapping[str, object], existing: Provider | None) -> Provider:
    api_key = raw.get("apiKey")
    spec = validate.normalize_provider(name, raw)
    provider = existing or Provider(name=name)
    provider.adapter = spec.adapter
    provider.base_url = spec.base_url
    provider.api_key_env = spec.api_key_env or ""
    if isinstance(api_key, str) and api_key:
        provider.api_key_sealed = seal(api_key)
        provider.api_key_hint = mask(api_key)
    elif api_key is None and "apiKey" in raw:
        # An explicit null removes the stored key.
        provider.api_key_sealed = ""
        provider.api_key_hint = ""
    provider.headers = dict(spec.headers)
    provider.disabled = spec.disabled
    provider.connect_ms = spec.timeouts.connect_ms
    provider.first_byte_ms = spec.timeouts.first_byte_ms
    provider.idle_ms = spec.timeouts.idle_ms
    provider.total_ms = spec.timeouts.total_ms
    provider.max_connections = spec.max_connections
    provider.pricing_provider = spec.pricing_provider or ""
    provider.full_clean(validate_unique=False, validate_constraints=False)
    provider.save()
    provider.models.all().delete()
    for model in spec.models.values():
        row = ProviderModel(
            provider=provider,
            model_id=model.id,
            context_window=model.context_window,
            max_input_tokens=model.max_input_tokens,
            input_modalities=None
            if model.input_modalities is None
            else list(model.input_modalities),
            reasoning_efforts=None
            if model.reasoning_efforts is None
            else list(model.reasoning_efforts),
            display_name=model.display_name or "",
            parallel_tool_calls=model.parallel_tool_calls,
            price=None if model.price is None else validate.price_to_sparse(model.price),
        )
        row.full_clean(exclude=["provider"], validate_constraints=False)
        row.save()
    return provider


def provider_set(*, name: str, raw: object) -> Provider:
    """Create or replace a provider. `apiKey` omitted keeps the stored key (write-only).
    `preset` fills the other fields from `providers.presets`; explicit fields win."""
    if not isinstance(raw, Mapping):
        raise ConfigError("provider must be an object")
    raw = presets.expand(raw)
    name = name.strip() if isinstance(name, str) else name
    with transaction.atomic():
        issues = validate.validate_provider(name, raw, combo_ids=_combo_ids())
        if issues:
            raise _issues_to_error(issues)
        existing = Provider.objects.filter(name=name).first()
        provider = _write_provider(name, raw, existing)
        config_bump()
    return provider


def provider_delete(*, name: str) -> None:
    with transaction.atomic():
        provider = Provider.objects.filter(name=name).first()
        if provider is None:
            raise ConfigError("unknown provider", status=404)
        users = sorted(
            set(provider.combo_targets.values_list("combo__combo_id", flat=True))  # type: ignore[attr-defined]
        )
        if users:
            raise ConfigError(
                f'provider "{name}" is used by combos', status=409, extra={"combos": users}
            )
        provider.delete()
        config_bump()


def disabled_models_set(*, models: list[str]) -> None:
    with transaction.atomic():
        state, _ = ConfigState.objects.select_for_update().get_or_create(pk=1)
        state.disabled_models = sorted(set(models))
        state.save(update_fields=["disabled_models", "updated"])
        config_bump()
