"""Writes for combos and whole-config loads. Every write bumps the config version."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from django.db import transaction
from django.dispatch import Signal

from combos import selectors
from combos.models import Combo, ComboTarget
from combos.state_reset import clear_on_commit, target_clear_on_commit
from providers import presets
from providers import services as provider_services
from providers.errors import ConfigError
from providers.models import ConfigState, Provider
from routing import validate
from routing.types import ComboSpec

RENAME_NOT_STRING = "renameFrom must be a non-empty string"
RENAME_SAME = "renameFrom must differ from id"
COMBO_NOT_OBJECT = "combo must be an object"
ID_REQUIRED = "id is required and must be a string"


def _provider_infos() -> dict[str, validate.ProviderInfo]:
    return {
        p.name: validate.ProviderInfo(name=p.name, disabled=p.disabled)
        for p in Provider.objects.all()
    }


def _write_combo(spec: ComboSpec, existing: Combo | None) -> Combo:
    combo = existing or Combo(combo_id=spec.id)
    combo.combo_id = spec.id
    combo.strategy = spec.strategy
    combo.sticky_limit = spec.sticky_limit
    combo.cooldown_ms = spec.cooldown_ms
    combo.wait_for_cooldown_ms = spec.wait_for_cooldown_ms
    combo.cooldown_wait_policy = spec.cooldown_wait_policy
    combo.default_effort = spec.default_effort
    combo.default_effort_mode = spec.default_effort_mode
    combo.reasoning_effort_mode = spec.reasoning_effort_mode
    combo.image_input = spec.image_input
    combo.after_commit = spec.after_commit
    combo.max_continuations = spec.max_continuations
    combo.buffer_max_bytes = spec.buffer_max_bytes
    combo.alias = spec.alias
    combo.native_alias = spec.native_alias
    combo.display_name = spec.display_name
    combo.override_target = spec.override
    retry = spec.retry_same_target
    combo.retry_attempts = None if retry is None else retry.attempts
    combo.retry_max_wait_ms = None if retry is None else retry.max_wait_ms
    combo.full_clean(validate_unique=False)
    combo.save()
    combo.targets.all().delete()
    providers = {
        p.name: p for p in Provider.objects.filter(name__in=[t.provider for t in spec.targets])
    }
    ComboTarget.objects.bulk_create(
        ComboTarget(
            combo=combo,
            position=i,
            provider=providers[t.provider],
            model=t.model,
            weight=t.weight,
            last_resort=t.last_resort,
        )
        for i, t in enumerate(spec.targets)
    )
    return combo


def _raise_issues(issues: list[validate.Issue]) -> None:
    if issues:
        raise ConfigError(issues[0].message, issues=[str(i) for i in issues])


def combo_set(*, combo_id: object, raw: object, rename_from: object = None) -> ComboSpec:
    """PUT /api/combos semantics (combos-behaviour.md §8.2): create, replace or rename."""
    if not isinstance(combo_id, str) or not combo_id.strip():
        raise ConfigError(ID_REQUIRED)
    combo_id = combo_id.strip()
    with transaction.atomic():
        if rename_from is not None:
            if not isinstance(rename_from, str) or not rename_from.strip():
                raise ConfigError(RENAME_NOT_STRING)
            rename_from = rename_from.strip()
            if rename_from == combo_id:
                raise ConfigError(RENAME_SAME)
            if not Combo.objects.filter(combo_id=rename_from).exists():
                raise ConfigError(f'combo "{rename_from}" does not exist')
            if Combo.objects.filter(combo_id=combo_id).exists():
                raise ConfigError(f'combo "{combo_id}" already exists')
        if not isinstance(raw, Mapping):
            raise ConfigError(COMBO_NOT_OBJECT)
        source_id = rename_from if isinstance(rename_from, str) else combo_id
        found = selectors.combos_with_targets([source_id])
        source, stored_targets = found[0] if found else (None, None)
        stored = None if source is None else selectors.combo_raw(source, stored_targets)
        merged = validate.merge_preserving(stored, raw)
        _raise_issues(
            validate.validate_combo(
                combo_id,
                merged,
                providers=_provider_infos(),
                combos=selectors.combo_aliases(),
                exclude_combo_id=source_id,
                require_enabled_target=True,
            )
        )
        spec = validate.normalize_combo(combo_id, merged)
        before = None if source is None else selectors.combo_spec(source, stored_targets)
        _write_combo(spec, source)
        if before != spec:
            # Shared (Redis) routing state is reset once here, not by every worker; registered
            # before the bump so that it runs before the workers are told to reload.
            clear_on_commit({source_id, combo_id})
        provider_services.config_bump(("combo", c) for c in {source_id, combo_id} if c)
    return spec


def combo_delete(*, combo_id: object) -> None:
    if not isinstance(combo_id, str) or not combo_id.strip():
        raise ConfigError("id query param is required")
    with transaction.atomic():
        deleted, _ = Combo.objects.filter(combo_id=combo_id).delete()
        if not deleted:
            raise ConfigError("unknown combo", status=404)
        clear_on_commit([combo_id])
        provider_services.config_bump([("combo", combo_id)])


def combo_set_override(*, combo_id: str, target: str | None) -> ComboSpec:
    """`auto` (target None) or `pin provider/model` (PRODUCT §8.5)."""
    with transaction.atomic():
        combo = selectors.combo_queryset().filter(combo_id=combo_id).first()
        if combo is None:
            raise ConfigError(f"unknown combo {combo_id}", status=404)
        raw = selectors.combo_raw(combo)
        raw["override"] = None if target is None else {"target": target}
        return combo_set(combo_id=combo_id, raw=raw)


def config_load(*, doc: object, replace: bool = False) -> dict[str, int]:
    """Import {"providers", "combos", "disabledModels"} all or nothing (PRODUCT §3.4)."""
    if not isinstance(doc, Mapping):
        raise ConfigError("config must be an object")
    with transaction.atomic():
        if not replace:
            # Merge with what is stored: the document's entries replace same-named ones.
            current = selectors.config_dump()
            merged: dict[str, object] = {
                "providers": {**current["providers"], **dict(doc.get("providers") or {})}  # type: ignore[dict-item]
                if isinstance(doc.get("providers", {}), Mapping)
                else doc.get("providers"),
                "combos": {**current["combos"], **dict(doc.get("combos") or {})}  # type: ignore[dict-item]
                if isinstance(doc.get("combos", {}), Mapping)
                else doc.get("combos"),
                "disabledModels": doc.get("disabledModels", current["disabledModels"]),
            }
            # Keep unknown top-level keys so that validation reports them.
            merged.update({k: v for k, v in doc.items() if k not in merged})
        else:
            merged = dict(doc)
        providers_raw = merged.get("providers")
        # Whether each provider's entry gives its key itself (before a preset fills apiKeyEnv):
        # a changed address needs it (providers.services.key_follow_problem).
        key_given = {
            name: isinstance(raw, Mapping) and ("apiKey" in raw or "apiKeyEnv" in raw)
            for name, raw in (providers_raw.items() if isinstance(providers_raw, Mapping) else ())
        }
        if isinstance(providers_raw, Mapping):
            # `"preset": "openai"` works in a config document as in PUT /api/providers.
            merged["providers"] = {
                name: presets.expand(raw) if isinstance(raw, Mapping) else raw
                for name, raw in providers_raw.items()
            }
        issues = validate.validate_config(merged)
        if issues:
            raise ConfigError(issues[0].message, issues=[str(i) for i in issues])
        providers_doc: Mapping[str, Mapping[str, object]] = merged.get("providers") or {}  # type: ignore[assignment]
        combos_doc: Mapping[str, Mapping[str, object]] = merged.get("combos") or {}  # type: ignore[assignment]
        # Keep stored keys for providers the document names without an apiKey.
        stored = {p.name: p for p in Provider.objects.all()}
        before = {c.id: c for c in selectors.combo_list()}
        ComboTarget.objects.all().delete()
        Combo.objects.all().delete()
        for name in set(stored) - set(providers_doc):
            stored[name].delete()
        for name, raw in providers_doc.items():
            provider_services._write_provider(name, raw, stored.get(name), key_given.get(name))
        for combo_id, raw in combos_doc.items():
            _write_combo(validate.normalize_combo(combo_id, raw), None)
        state, _ = ConfigState.objects.select_for_update().get_or_create(pk=1)
        # Stored as normalized (trimmed, deduplicated, sorted) so dump and runtime agree.
        disabled = validate.normalize_config({"disabledModels": merged.get("disabledModels")})
        state.disabled_models = sorted(disabled.disabled_models, key=lambda m: (m.casefold(), m))
        state.save(update_fields=["disabled_models", "updated"])
        after = {c.id: c for c in selectors.combo_list()}
        clear_on_commit(c for c in before.keys() | after.keys() if before.get(c) != after.get(c))
        provider_services.config_bump()
    return {"providers": len(providers_doc), "combos": len(combos_doc)}


# Sent after a reset committed, with `combo_id`, `target` (None: every target) and `cause`
# ("operator" or "provider written"): the dashboard records it as a routing event.
combo_state_reset = Signal()


def combo_reset(*, combo_id: object, target: object = None, now_ms: int | None = None) -> ComboSpec:
    """Clear the routing state (cooldowns, probe leases, rotation) of a combo, or of one of its
    targets, on every worker: the shared (Redis) state is changed once here after the commit,
    and the stamp in `Combo.state_resets` makes each worker drop its own copy when the change
    reaches it (`gateway.runtime`), whatever path brings it (notice, poll, reload)."""
    if not isinstance(combo_id, str) or not combo_id.strip():
        raise ConfigError(ID_REQUIRED)
    if target is not None and not isinstance(target, str):
        raise ConfigError("target must be a string (provider/model)")
    combo_id = combo_id.strip()
    at = int(time.time() * 1000) if now_ms is None else now_ms
    with transaction.atomic():
        combo = Combo.objects.select_for_update().filter(combo_id=combo_id).first()
        if combo is None:
            raise ConfigError(f"unknown combo {combo_id}", status=404)
        keys = [f"{t.provider.name}/{t.model}" for t in combo.targets.select_related("provider")]
        if target is not None and target not in keys:
            raise ConfigError(
                f'target "{target}" is not one of combo {combo_id}\'s targets '
                f"({', '.join(keys) or 'none'})"
            )
        _stamp_reset(combo, target or "*", at)
        provider_services.config_bump([("combo", combo_id)])
        transaction.on_commit(_announce_reset(combo_id, target, "operator"))
        return selectors.combo_spec(combo)


def _stamp_reset(combo: Combo, key: str, at: int) -> None:
    resets = dict(combo.state_resets or {})
    if key == "*":
        resets = {}  # a whole reset covers every target's earlier one
    resets[key] = at
    combo.state_resets = resets
    combo.save(update_fields=["state_resets", "updated"])
    if key == "*":
        clear_on_commit([combo.combo_id])
    else:
        target_clear_on_commit(combo.combo_id, key)


def on_provider_written(sender: object, name: str, **kwargs: object) -> None:
    """A provider was written (the operator may have fixed it): the cooldowns of its targets in
    every combo are cleared, in the write's transaction (providers.services.provider_written)."""
    at = int(time.time() * 1000)
    rows = ComboTarget.objects.filter(provider__name=name).select_related("combo")
    for row in rows:
        combo = Combo.objects.select_for_update().get(pk=row.combo_id)
        key = f"{name}/{row.model}"
        _stamp_reset(combo, key, at)
        transaction.on_commit(_announce_reset(combo.combo_id, key, f"provider {name} written"))


def _announce_reset(combo_id: str, target: str | None, cause: str) -> Callable[[], None]:
    def send() -> None:
        combo_state_reset.send(sender=Combo, combo_id=combo_id, target=target, cause=cause)

    return send
