"""Reads: ORM rows → camelCase dicts and the frozen ConfigSnapshot of the hot path."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Collection
from dataclasses import replace
from types import MappingProxyType

from django.apps import apps
from django.db import connection
from django.utils import timezone

from combos.models import Combo, ComboTarget
from providers import selectors as provider_selectors
from providers.models import ConfigState, Provider, ProviderModel
from providers.sealing import unseal
from routing import envpolicy, pricing, validate
from routing.types import ComboSpec, ConfigSnapshot, ModelSpec, ProviderSpec, Timeouts


def combo_raw(combo: Combo, targets: list[dict[str, object]] | None = None) -> dict[str, object]:
    """The combo as a full camelCase dict (the input shape of the validator). `targets`
    replaces the stored ones (the admin validates the rows of a form before saving)."""
    if targets is None:
        targets = [
            {
                "provider": t.provider.name,
                "model": t.model,
                "weight": t.weight,
                "lastResort": t.last_resort,
            }
            for t in combo.targets.all()
        ]
    raw: dict[str, object] = {
        "targets": targets,
        "strategy": combo.strategy,
        "stickyLimit": combo.sticky_limit,
        "waitForCooldownMs": combo.wait_for_cooldown_ms,
        "defaultEffort": combo.default_effort or None,
        "defaultEffortMode": combo.default_effort_mode,
        "reasoningEffortMode": combo.reasoning_effort_mode,
        "imageInput": combo.image_input,
        "afterCommit": combo.after_commit,
        "maxContinuations": combo.max_continuations,
        "bufferMaxBytes": combo.buffer_max_bytes,
        "nativeAlias": combo.native_alias,
    }
    if combo.cooldown_ms is not None:
        raw["cooldownMs"] = combo.cooldown_ms
    if combo.cooldown_wait_policy:
        raw["cooldownWaitPolicy"] = combo.cooldown_wait_policy
    if combo.alias:
        raw["alias"] = combo.alias
    if combo.display_name:
        raw["displayName"] = combo.display_name
    if combo.override_target:
        raw["override"] = {"target": combo.override_target}
    if combo.retry_attempts is not None or combo.retry_max_wait_ms is not None:
        raw["retrySameTarget"] = {
            "attempts": combo.retry_attempts,
            "maxWaitMs": combo.retry_max_wait_ms,
        }
    return raw


def combo_spec(combo: Combo, targets: list[dict[str, object]] | None = None) -> ComboSpec:
    """`targets`: the combo's stored targets already read (`combos_with_targets`)."""
    spec = validate.normalize_combo(combo.combo_id, combo_raw(combo, targets))
    resets = combo.state_resets or {}
    return replace(spec, resets=MappingProxyType(dict(resets))) if resets else spec


def combo_queryset():  # type: ignore[no-untyped-def]
    return Combo.objects.prefetch_related("targets__provider").order_by("combo_id")


def combo_list() -> list[ComboSpec]:
    # Locale-aware order like the reference's localeCompare (§1.6), not the DB's byte order.
    combos = sorted(combo_queryset(), key=lambda c: (c.combo_id.casefold(), c.combo_id))
    return [combo_spec(c) for c in combos]


def combo_get(combo_id: str) -> ComboSpec | None:
    combo = combo_queryset().filter(combo_id=combo_id).first()
    return None if combo is None else combo_spec(combo)


def combos_with_targets(
    combo_ids: Collection[str],
) -> list[tuple[Combo, list[dict[str, object]]]]:
    """The named combos, each with its stored targets as `combo_raw` takes them, in two flat
    queries: a write reads back the combos it touched this way (~4× less CPU than the
    prefetch of `combo_queryset` for one combo, issue #24)."""
    rows = list(Combo.objects.filter(combo_id__in=list(combo_ids)).order_by("combo_id"))
    targets: dict[int, list[dict[str, object]]] = {c.pk: [] for c in rows}
    if rows:
        flat = (
            ComboTarget.objects.filter(combo_id__in=list(targets))
            .order_by("combo_id", "position", "id")
            .values_list("combo_id", "provider__name", "model", "weight", "last_resort")
        )
        for combo_pk, provider, model, weight, last_resort in flat:
            targets[combo_pk].append(
                {"provider": provider, "model": model, "weight": weight, "lastResort": last_resort}
            )
    return [(c, targets[c.pk]) for c in rows]


def combo_aliases() -> dict[str, object]:
    """combo id → `{"alias": alias}` for every combo with an alias: all a combo write is
    validated against among the other combos (`validate.validate_combo`'s alias uniqueness).
    One flat query; reading every combo whole cost a write at 500 combos ~30 ms of CPU
    (issue #24)."""
    rows = Combo.objects.exclude(alias__isnull=True).exclude(alias="").order_by("combo_id")
    return {combo_id: {"alias": alias} for combo_id, alias in rows.values_list("combo_id", "alias")}


def provider_spec(provider: Provider) -> ProviderSpec:
    models = {
        m.model_id: ModelSpec(
            id=m.model_id,
            context_window=m.context_window,
            max_input_tokens=m.max_input_tokens,
            input_modalities=None if m.input_modalities is None else tuple(m.input_modalities),
            reasoning_efforts=None if m.reasoning_efforts is None else tuple(m.reasoning_efforts),
            display_name=m.display_name or None,
            parallel_tool_calls=m.parallel_tool_calls,
            price=validate.normalize_price(m.price),
            prefill=m.prefill,
        )
        for m in provider.models.all()
    }
    return ProviderSpec(
        name=provider.name,
        adapter=provider.adapter,
        base_url=provider.base_url,
        api_key_env=provider.api_key_env or None,
        api_key=unseal(provider.api_key_sealed) if provider.api_key_sealed else None,
        headers=tuple(sorted((str(k), str(v)) for k, v in (provider.headers or {}).items())),
        disabled=provider.disabled,
        timeouts=Timeouts(
            connect_ms=provider.connect_ms,
            first_byte_ms=provider.first_byte_ms,
            idle_ms=provider.idle_ms,
            total_ms=provider.total_ms,
        ),
        max_connections=provider.max_connections,
        pricing_provider=provider.pricing_provider or None,
        models=MappingProxyType(models),
    )


def config_version() -> int:
    state = ConfigState.objects.filter(pk=1).only("version").first()
    return 0 if state is None else state.version


def config_versions() -> tuple[int, int]:
    """(config version, key-table version): the one row every worker polls."""
    row = ConfigState.objects.filter(pk=1).values_list("version", "keys_version").first()
    return (0, 0) if row is None else (row[0], row[1])


def disabled_models() -> list[str]:
    state = ConfigState.objects.filter(pk=1).first()
    return [] if state is None else list(state.disabled_models)


def config_snapshot() -> ConfigSnapshot:
    """Everything the hot path needs, read in one go (called off the hot path)."""
    state = ConfigState.objects.filter(pk=1).first()
    providers = {p.name: provider_spec(p) for p in Provider.objects.prefetch_related("models")}
    combos = {c.combo_id: combo_spec(c) for c in combo_queryset()}
    return ConfigSnapshot(
        version=0 if state is None else state.version,
        providers=MappingProxyType(providers),
        combos=MappingProxyType(combos),
        disabled_models=frozenset(state.disabled_models if state else ()),
    )


# The last snapshot `config_snapshot_current` built in this process, under the stamp of the
# config row it was built after (issue #24).
_current: tuple[tuple[int, dt.datetime], ConfigSnapshot] | None = None


def config_snapshot_current() -> ConfigSnapshot:
    """The committed config as `config_snapshot`, for checks made by a write (a key's allowed
    models): rebuilt only when the config row moved since the last call (one query otherwise;
    a rebuild costs ~25 ms of CPU at 500 combos). The stamp is the version and the row's
    `updated`: a database emptied and filled again (tests) restarts the version, not the time.
    Inside a transaction it reads afresh: that transaction may have changed the config without
    having bumped yet. A snapshot's rows are read after its stamp, so a cached one is never
    older than the stamp it is kept under."""
    global _current
    if connection.in_atomic_block:
        return config_snapshot()
    row = ConfigState.objects.filter(pk=1).values_list("version", "updated").first()
    cached = _current
    if row is not None and cached is not None and cached[0] == row:
        return cached[1]
    snapshot = config_snapshot()
    _current = None if row is None else (row, snapshot)
    return snapshot


def credential_for(provider: ProviderSpec) -> str | None:
    """The provider's own credential, resolved at dispatch (env var first when named). A
    variable the policy refuses is never read (issue #26): the target has no credential."""
    if provider.api_key_env:
        if envpolicy.refusal(provider.api_key_env) is not None:
            return None
        return os.environ.get(provider.api_key_env) or None
    return provider.api_key


def config_dump() -> dict[str, object]:
    """The sparse config document, without secrets (`ocx config dump`)."""
    providers = {
        p.name: provider_selectors.provider_stored_raw(p)
        for p in Provider.objects.prefetch_related("models")
    }
    combos = {c.id: validate.combo_to_sparse(c) for c in combo_list()}
    return {
        "providers": providers,
        "combos": combos,
        "disabledModels": disabled_models(),
    }


def catalog_result(snapshot: ConfigSnapshot | None = None):  # type: ignore[no-untyped-def]
    """The Codex catalog for the stored configuration (combos omitted are listed too)."""
    from routing.catalog import build_catalog

    return build_catalog(snapshot or config_snapshot())


def combo_warnings(combo_id: str) -> list[str]:
    """What was saved but deserves a second look (a target's model its provider does not
    declare: `validate.undeclared_target_notes`). Said by the API, the CLI and the admin."""
    rows = list(
        ComboTarget.objects.filter(combo__combo_id=combo_id)
        .order_by("position", "id")
        .values_list("provider__name", "model")
    )
    declared: dict[str, set[str]] = {}
    for provider, model in ProviderModel.objects.filter(
        provider__name__in={p for p, _ in rows}
    ).values_list("provider__name", "model_id"):
        declared.setdefault(provider, set()).add(model)
    return validate.undeclared_target_notes(rows, declared)


def needs_attention(snapshot: ConfigSnapshot | None = None) -> list[str]:
    """What an operator should look at: omitted combos, and the targets whose configured state
    (`eligibility.target_state`, the router's own rule) is disabled or without a credential.
    `snapshot`: the config already read by the caller (else read here, once)."""
    from routing.catalog import OMISSION_DETAILS
    from routing.eligibility import Access, credential_problem, target_state
    from routing.state import ComboState

    snapshot = snapshot or config_snapshot()
    notes: list[str] = []
    for combo_id, reason in catalog_result(snapshot).omitted:
        detail = OMISSION_DETAILS.get(reason, reason)
        notes.append(f"combo/{combo_id} is omitted from the Codex catalog: {detail}")
    for combo in snapshot.combos.values():
        for target in combo.targets:
            provider = snapshot.providers.get(target.provider)
            secret = None if provider is None else credential_for(provider)
            missing = (
                None
                if provider is None
                # A caller's own ChatGPT token is checked per request, not here.
                else credential_problem(provider, secret, caller_token=True)
            )
            ts = target_state(
                target,
                providers=snapshot.providers,
                state=ComboState(),
                now=0,
                access=Access(missing=missing),
            )
            if ts.skip is None:
                continue
            if ts.skip.startswith("provider_"):
                notes.append(f"combo/{combo.id}: {ts.detail}")
            elif missing is not None:
                notes.append(f"combo/{combo.id}: {target.key} has no credential ({missing})")
    notes.extend(_unpriced_notes(snapshot, unpriced_targets(snapshot)))
    return capped(sorted(set(notes)))


UNPRICED_LOOKBACK = dt.timedelta(days=7)
# Bounds of what clients can grow (issue #43): a bare `provider/<any name>` is served, so the
# week's unpriced targets can be as many as the names clients made up.
MAX_NOTES = 100
MAX_SERVED_TARGETS = 1000
EXAMPLES = 3
EXAMPLE_CHARS = 40


def _unpriced_notes(snapshot: ConfigSnapshot, keys: list[str]) -> list[str]:
    """One note per configured target or declared model without a price; the models served
    without being declared (names chosen by clients) aggregated into one note per provider."""
    configured = {t.key for c in snapshot.combos.values() for t in c.targets}
    configured.update(f"{p.name}/{m}" for p in snapshot.providers.values() for m in p.models)
    notes = [pricing.unpriced_note(key) for key in keys if key in configured]
    undeclared: dict[str, list[str]] = {}
    for key in keys:
        if key not in configured:
            name, _, model = key.partition("/")
            undeclared.setdefault(name, []).append(model)
    for name, models in sorted(undeclared.items()):
        shown = [m if len(m) <= EXAMPLE_CHARS else m[: EXAMPLE_CHARS - 1] + "…" for m in models]
        examples = ", ".join(shown[:EXAMPLES]) + (", …" if len(models) > EXAMPLES else "")
        notes.append(
            f"provider {name}: {len(models)} undeclared model name(s) served without a price in "
            f"the last week ({examples}): their requests get no cost; declare the models with "
            "a price, or set the provider's pricingProvider"
        )
    return notes


def capped(notes: list[str]) -> list[str]:
    """At most `MAX_NOTES` notes, the last one saying how many more there were."""
    if len(notes) <= MAX_NOTES:
        return notes
    more = len(notes) - (MAX_NOTES - 1)
    return [*notes[: MAX_NOTES - 1], f"… and {more} more notes"]


def unpriced_targets(snapshot: ConfigSnapshot) -> list[str]:
    """The configured targets and models without a price, and those served without one in the
    last week (an explicit provider/model a combo does not name)."""
    # Looked up by name: usage sits above combos (it counts what combos route).
    rollups = apps.get_model("usage", "UsageRollup")
    now = timezone.now()
    served = (
        rollups.objects.filter(bucket__gte=now - UNPRICED_LOOKBACK, unpriced_requests__gt=0)
        .values_list("target", flat=True)
        .order_by("target")
        .distinct()[:MAX_SERVED_TARGETS]
    )
    return pricing.unpriced_targets(snapshot, now.date(), served)
