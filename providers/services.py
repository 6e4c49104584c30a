"""Writes for providers and the config version. Every write bumps the version.

After the transaction that bumped a version commits, `versions_committed` is sent: the server
(`gateway.confignotify`) reloads the writing process's runtime at once and tells every other
worker through Redis, so that a write is served by the very next request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from django.apps import apps
from django.db import transaction
from django.db.models import F
from django.dispatch import Signal

from providers import presets
from providers.errors import ConfigError
from providers.models import ConfigState, Provider, ProviderModel
from providers.sealing import mask, seal
from routing import validate

# Sent once the transaction that bumped a config or key-table version commits, with
# `delta`: the `Delta` of that bump (one signal per bump).
versions_committed = Signal()
# Sent inside the write's transaction with `name`: the operator changed a provider (perhaps
# fixed it), so `combos` clears the cooldowns of its targets (connected in combos/apps.py).
provider_written = Signal()

# What a bump changed, as (kind, id) pairs: ("combo", combo id), ("provider", name) for the
# config; ("key", client key pk), ("user", user pk) for the key table. Past this many a worker
# reloads the whole domain instead (a bulk write).
ChangeKind = Literal["combo", "provider", "key", "user"]
Change = tuple[ChangeKind, str]
MAX_CHANGES = 200


@dataclass(frozen=True)
class Delta:
    """One bump: `domain`'s version went from `base` to `version` by `changes` (None: unknown,
    reload the whole domain). A worker serving exactly `base` applies just the changes; one
    serving anything else (a notice missed: a gap) reloads the domain."""

    domain: Literal["config", "keys"]
    base: int
    version: int
    changes: tuple[Change, ...] | None


def _changes(changes: Iterable[Change] | None) -> tuple[Change, ...] | None:
    if changes is None:
        return None
    unique = tuple(sorted(set(changes)))
    return unique if len(unique) <= MAX_CHANGES else None


def _announcer(delta: Delta) -> Callable[[], None]:
    # A function, not a functools.partial: Django names a failing on_commit callback by its
    # `__qualname__`.
    def announce() -> None:
        versions_committed.send(sender=ConfigState, delta=delta)

    return announce


def config_bump(changes: Iterable[Change] | None = None) -> int:
    """Increment the config version (inside the caller's transaction). `changes`: the combos
    and providers written (None: anything else, e.g. disabled models, or unknown)."""
    state, _ = ConfigState.objects.select_for_update().get_or_create(pk=1)
    state.version += 1
    state.save(update_fields=["version", "updated"])
    delta = Delta("config", state.version - 1, state.version, _changes(changes))
    transaction.on_commit(_announcer(delta), robust=True)
    return state.version


def keys_bump(changes: Iterable[Change] | None = None) -> None:
    """Increment the key-table version workers poll (inside the caller's transaction, if any).
    `changes`: the keys and users written (None: unknown, every worker reloads its key map)."""
    with transaction.atomic():
        # Locked and read back: the version this bump made is the notice's `to`.
        state, _ = ConfigState.objects.select_for_update().get_or_create(pk=1)
        ConfigState.objects.filter(pk=1).update(keys_version=F("keys_version") + 1)
        version = state.keys_version + 1
    delta = Delta("keys", version - 1, version, _changes(changes))
    transaction.on_commit(_announcer(delta), robust=True)


def _combo_ids() -> list[str]:
    # Looked up lazily: providers sits below combos in the dependency graph.
    combo_model = apps.get_model("combos", "Combo")
    return list(combo_model.objects.values_list("combo_id", flat=True))


def _issues_to_error(issues: list[validate.Issue], status: int = 400) -> ConfigError:
    texts = [issue.message for issue in issues]
    return ConfigError(texts[0], status=status, issues=[str(i) for i in issues])


def key_follow_problem(
    stored: Provider | None, *, adapter: str, base_url: str, key_given: bool
) -> str | None:
    """The one rule for every interface (API, CLI, config load, admin form): a write that
    changes a provider's `baseUrl` or adapter must give its key (`apiKey` or `apiKeyEnv`) again,
    so that a stored key is never sent to an address it was not given for. The message names
    the field (None: the write may go on)."""
    if stored is None or key_given or not (stored.api_key_sealed or stored.api_key_env):
        return None
    for field, new, old in (
        ("baseUrl", base_url, stored.base_url),
        ("adapter", adapter, stored.adapter),
    ):
        if new != old:
            return (
                f"apiKey: {field} of provider {stored.name} changes ({old} -> {new}): give "
                "apiKey or apiKeyEnv again (ocx provider set: --api-key-stdin or --api-key-env); "
                "a stored key never follows a new address"
            )
    return None


def _write_provider(
    name: str, raw: Mapping[str, object], existing: Provider | None, key_given: bool | None = None
) -> Provider:
    """`key_given`: the writer gave the key (None: `apiKey` or `apiKeyEnv` is in `raw`)."""
    api_key = raw.get("apiKey")
    spec = validate.normalize_provider(name, raw)
    if key_given is None:
        key_given = "apiKey" in raw or "apiKeyEnv" in raw
    problem = key_follow_problem(
        existing, adapter=spec.adapter, base_url=spec.base_url, key_given=key_given
    )
    if problem is not None:
        raise ConfigError(problem, extra={"field": "apiKey"})
    moved = existing is not None and (
        existing.base_url != spec.base_url or existing.adapter != spec.adapter
    )
    provider = existing or Provider(name=name)
    if moved and not (isinstance(api_key, str) and api_key):
        # An address given its key variable again: the sealed key stays behind.
        provider.api_key_sealed = ""
        provider.api_key_hint = ""
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
            prefill=model.prefill,
        )
        row.full_clean(exclude=["provider"], validate_constraints=False)
        row.save()
    return provider


def provider_set(*, name: str, raw: object, key_given: bool | None = None) -> Provider:
    """Create or replace a provider. `apiKey` omitted keeps the stored key (write-only), unless
    the address changes (`key_follow_problem`). `preset` fills the other fields from
    `providers.presets`; explicit fields win. `key_given`: the caller's own account of whether
    the writer gave the key (the CLI, whose `raw` starts from the stored provider)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("provider must be an object")
    if key_given is None:
        # Before the preset fills `apiKeyEnv` in: the writer's own fields count.
        key_given = "apiKey" in raw or "apiKeyEnv" in raw
    raw = presets.expand(raw)
    name = name.strip() if isinstance(name, str) else name
    with transaction.atomic():
        issues = validate.validate_provider(name, raw, combo_ids=_combo_ids())
        if issues:
            raise _issues_to_error(issues)
        existing = Provider.objects.filter(name=name).first()
        provider = _write_provider(name, raw, existing, key_given)
        provider_written.send(sender=Provider, name=name)
        config_bump([("provider", name)])
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
        config_bump([("provider", name)])


def disabled_models_set(*, models: list[str]) -> None:
    with transaction.atomic():
        state, _ = ConfigState.objects.select_for_update().get_or_create(pk=1)
        state.disabled_models = sorted(set(models))
        state.save(update_fields=["disabled_models", "updated"])
        config_bump()
