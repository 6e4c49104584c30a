"""Combos: the validation, normalization and stored forms of one combo body (routing.validate).

`validate_combo` is every writer's check of a combo (admin, API, CLI, config load); the issues
come in the reference's order (combos-behaviour.md §1.3-§1.5, §6.1)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from routing.types import (
    AFTER_COMMIT_MODES,
    COMBO_NAMESPACE,
    DEFAULT_BUFFER_MAX_BYTES,
    EFFORTS,
    STRATEGIES,
    ComboSpec,
    ProviderSpec,
    RetryPolicy,
    TargetSpec,
)
from routing.validate_fields import (
    DISPLAY_NAME_MAX,
    MSG_COMBO_ID,
    MSG_PROVIDER_COMBO_RESERVED,
    Issue,
    has_control,
    int_in,
    is_valid_id,
    js_trim,
    msg_id_collides,
    trimmed_str,
    unknown_fields,
)

# Bare OpenAI-native slugs a combo may take over with `nativeAlias: true` (a fixed list per
# release, §6.1). Extend it when a new native model ships.
NATIVE_ALIAS_SLUGS: frozenset[str] = frozenset(
    {"gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna", "gpt-5.5"}
)
NATIVE_FAMILY_PREFIXES: tuple[str, ...] = ("gpt-", "o1-", "o3-", "o4-", "codex-")
LAST_RESORT_POLICY = "before-last-resort"

# --- messages (tests assert these verbatim) -------------------------------------------------------
MSG_COMBO_MUST_BE_OBJECT = "combo must be an object"
MSG_TARGETS = "targets must be a non-empty array"
MSG_TARGETS_ENABLED = "targets must include at least one enabled provider"
MSG_STRATEGY = "strategy must be " + ", ".join(f'"{s}"' for s in STRATEGIES[:-1])
MSG_STRATEGY += f', or "{STRATEGIES[-1]}"'
MSG_STICKY = "stickyLimit must be an integer from 1 to 100"
MSG_COOLDOWN = "cooldownMs must be an integer from 1 to 600000"
MSG_WAIT = "waitForCooldownMs must be an integer from 0 to 600000"
MSG_WAIT_POLICY = 'cooldownWaitPolicy must be "before-last-resort" when set'
MSG_EFFORT = "defaultEffort must be one of: " + ", ".join(EFFORTS)
MSG_EFFORT_MODE = 'defaultEffortMode must be "fallback" or "force"'
MSG_EFFORT_REQUIRED = "defaultEffort is required when defaultEffortMode is force"
MSG_REASONING_MODE = 'reasoningEffortMode must be "strict" or "adaptive"'
MSG_IMAGE_INPUT = 'imageInput must be "auto" or "disabled"'
MSG_AFTER_COMMIT = 'afterCommit must be "error", "continue", or "buffer"'
MSG_MAX_CONTINUATIONS = "maxContinuations must be an integer from 1 to 3"
BUFFER_MAX_BYTES_LOW = 1024
BUFFER_MAX_BYTES_HIGH = 64 * 1024 * 1024
MSG_BUFFER_MAX_BYTES = (
    f"bufferMaxBytes must be an integer from {BUFFER_MAX_BYTES_LOW} to {BUFFER_MAX_BYTES_HIGH}"
)
MSG_ALIAS_STRING = "alias must be a string"
MSG_ALIAS_GRAMMAR = (
    'alias must use letters, numbers, dot, underscore, or hyphen, with at most one "/" segment'
)
MSG_ALIAS_RESERVED = 'alias must not use the reserved "combo/" namespace'
MSG_ALIAS_NATIVE_FAMILY = "bare aliases in the OpenAI native family require nativeAlias=true"
MSG_NATIVE_BOOL = "nativeAlias must be a boolean"
MSG_NATIVE_UNSUPPORTED = "nativeAlias requires a currently supported bare OpenAI-native model alias"
MSG_DISPLAY_STRING = "displayName must be a string"
MSG_DISPLAY_BOUNDS = "displayName must be at most 128 characters and contain no control characters"
MSG_DISPLAY_REQUIRED = "displayName is required for native aliases"
MSG_OVERRIDE = 'override must be null or {"target": "provider/model"}'
MSG_RETRY = 'retrySameTarget must be null or {"attempts": 1-3, "maxWaitMs": 0-10000}'
MSG_RETRY_ATTEMPTS = "retrySameTarget.attempts must be an integer from 1 to 3"
MSG_RETRY_WAIT = "retrySameTarget.maxWaitMs must be an integer from 0 to 10000"


def msg_target_object(i: int) -> str:
    return f"targets[{i}] must be an object"


def msg_target_provider_required(i: int) -> str:
    return f"targets[{i}].provider is required"


def msg_target_provider_unknown(i: int, provider: str) -> str:
    return f'targets[{i}].provider "{provider}" is not configured'


def msg_target_model_required(i: int) -> str:
    return f"targets[{i}].model is required"


def msg_target_weight(i: int) -> str:
    return f"targets[{i}].weight must be an integer from 1 to 10000"


def msg_target_last_resort(i: int) -> str:
    return f"targets[{i}].lastResort must be a boolean"


def msg_duplicate_target(key: str) -> str:
    return f'duplicate combo target "{key}"'


def msg_alias_used_by_combo(alias: str, other: str) -> str:
    return f'alias "{alias}" is already used by combo "{other}"'


def msg_alias_used_by_provider(alias: str, provider: str) -> str:
    return f'alias "{alias}" is already used by provider "{provider}"'


def msg_alias_used_by_model(alias: str, provider: str, model: str) -> str:
    return f'alias "{alias}" is already used by model "{provider}/{model}"'


def msg_override_not_target(target: str) -> str:
    return f'override target "{target}" is not one of this combo\'s targets'


@dataclass(frozen=True)
class ProviderInfo:
    """What combo validation needs to know about a configured provider (§1.4, §1.5).

    `model_aliases` holds `(model, alias)` pairs; ocx providers have none today, but the alias
    collision rule of the reference is kept so that adding them later changes nothing here.
    """

    name: str
    disabled: bool = False
    alias: str | None = None
    model_aliases: tuple[tuple[str, str], ...] = ()


def undeclared_target_notes(
    targets: Iterable[tuple[str, str]], declared: Mapping[str, Collection[str]]
) -> list[str]:
    """A warning per `(provider, model)` target whose model its provider does not declare: it
    is saved and sent upstream as typed (a gateway may serve more than it declares), but a
    typo only shows as upstream errors, and the combo leaves the Codex catalog (no metadata)."""
    notes = []
    for provider, model in targets:
        models = sorted(declared.get(provider, ()))
        if model in models:
            continue
        known = ", ".join(models) if models else "none"
        notes.append(
            f'Target {provider}/{model}: provider "{provider}" does not declare model '
            f'"{model}" (declared: {known}); it is sent upstream as typed, and the combo is '
            "left out of the Codex catalog until the model is declared."
        )
    return notes


def provider_infos(providers: Mapping[str, ProviderSpec]) -> dict[str, ProviderInfo]:
    """The `providers=` argument of `validate_combo` built from normalized provider specs."""
    return {name: ProviderInfo(name=name, disabled=p.disabled) for name, p in providers.items()}


_COMBO_FIELDS: frozenset[str] = frozenset(
    {
        "targets",
        "strategy",
        "stickyLimit",
        "cooldownMs",
        "waitForCooldownMs",
        "cooldownWaitPolicy",
        "defaultEffort",
        "defaultEffortMode",
        "reasoningEffortMode",
        "imageInput",
        "afterCommit",
        "maxContinuations",
        "bufferMaxBytes",
        "alias",
        "nativeAlias",
        "displayName",
        "override",
        "retrySameTarget",
        # Read-only echoes of the GET shape (§8.1), accepted so GET output can be PUT back.
        "id",
        "model",
    }
)
_TARGET_FIELDS: frozenset[str] = frozenset({"provider", "model", "weight", "lastResort"})
# Fields that PUT keeps from the stored combo when the body omits them (§8.2 step 6).
PRESERVED_COMBO_FIELDS: tuple[str, ...] = (
    "cooldownMs",
    "waitForCooldownMs",
    "defaultEffortMode",
    "reasoningEffortMode",
    "imageInput",
    "cooldownWaitPolicy",
    "override",
    "retrySameTarget",
    "afterCommit",
    "maxContinuations",
    "bufferMaxBytes",
)


def validate_combo_id(combo_id: object) -> str | None:
    """The error message for an invalid combo id (§1.2), or None when it is valid."""
    return None if is_valid_id(combo_id) else MSG_COMBO_ID


def alias_grammar_error(alias: str, *, native_alias: bool) -> str | None:
    """The first alias-grammar message for a trimmed, non-empty alias (§6.1), or None."""
    segments = alias.split("/")
    if len(segments) > 2 or not all(is_valid_id(s) for s in segments):
        return MSG_ALIAS_GRAMMAR
    if segments[0] == COMBO_NAMESPACE:
        return MSG_ALIAS_RESERVED
    bare = len(segments) == 1
    if bare and alias.lower().startswith(NATIVE_FAMILY_PREFIXES) and not native_alias:
        return MSG_ALIAS_NATIVE_FAMILY
    return None


def alias_of(combo: object) -> str | None:
    if isinstance(combo, ComboSpec):
        return combo.alias
    if isinstance(combo, Mapping):
        alias = trimmed_str(combo.get("alias"))
        return alias or None
    return None


# --- combos ---------------------------------------------------------------------------------------


def validate_combo(
    combo_id: str,
    raw: object,
    *,
    providers: Mapping[str, ProviderInfo],
    combos: Mapping[str, object],
    exclude_combo_id: str | None = None,
    require_enabled_target: bool = False,
) -> list[Issue]:
    """Validate one combo body (camelCase JSON) and return every issue in the reference order.

    Paths are relative to the combo (`("targets", 0, "provider")`); id problems have the path `()`.
    `providers` are the configured providers (`provider_infos()` builds them from specs);
    `combos` maps the other existing combo ids to stored dicts or `ComboSpec`s for the alias
    uniqueness check, skipping `combo_id` itself and `exclude_combo_id` (the rename source).
    `require_enabled_target` is the save-time rule of the API/admin/CLI, not of config load.
    Stops early when the body is not an object or `targets` is not a non-empty array.
    """
    issues = _check_combo_namespace(combo_id, providers, check_reserved=True)
    return issues + _validate_combo_body(
        raw,
        providers=providers,
        other_aliases=_other_aliases(combos, skip={combo_id, exclude_combo_id}),
        require_enabled_target=require_enabled_target,
    )


def _check_combo_namespace(
    combo_id: str, providers: Mapping[str, object], *, check_reserved: bool
) -> list[Issue]:
    issues: list[Issue] = []
    error = validate_combo_id(combo_id)
    if error:
        issues.append(Issue((), error))
    if check_reserved and COMBO_NAMESPACE in providers:
        issues.append(Issue((), MSG_PROVIDER_COMBO_RESERVED))
    if combo_id in providers:
        issues.append(Issue((), msg_id_collides(combo_id)))
    return issues


def _other_aliases(
    combos: Mapping[str, object], *, skip: Collection[str | None]
) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for other_id, other in combos.items():
        alias = alias_of(other)
        if other_id not in skip and alias:
            pairs.append((other_id, alias))
    return pairs


def _validate_combo_body(
    raw: object,
    *,
    providers: Mapping[str, ProviderInfo],
    other_aliases: list[tuple[str, str]],
    require_enabled_target: bool,
) -> list[Issue]:
    if not isinstance(raw, Mapping):
        return [Issue((), MSG_COMBO_MUST_BE_OBJECT)]
    targets = raw.get("targets")
    if not isinstance(targets, list) or not targets:
        return [Issue(("targets",), MSG_TARGETS)]
    issues, target_keys = _validate_targets(targets, providers, require_enabled_target)

    def check(key: str, ok: bool, message: str) -> None:
        if key in raw and not ok:
            issues.append(Issue((key,), message))

    check("strategy", raw.get("strategy") in STRATEGIES, MSG_STRATEGY)
    check("stickyLimit", int_in(raw.get("stickyLimit"), 1, 100) is not None, MSG_STICKY)
    check("cooldownMs", int_in(raw.get("cooldownMs"), 1, 600_000) is not None, MSG_COOLDOWN)
    check(
        "waitForCooldownMs", int_in(raw.get("waitForCooldownMs"), 0, 600_000) is not None, MSG_WAIT
    )
    check(
        "cooldownWaitPolicy",
        raw.get("cooldownWaitPolicy") in (None, LAST_RESORT_POLICY),
        MSG_WAIT_POLICY,
    )
    effort = raw.get("defaultEffort")
    check("defaultEffort", effort is None or effort in EFFORTS, MSG_EFFORT)
    mode = raw.get("defaultEffortMode")
    check("defaultEffortMode", mode in ("fallback", "force"), MSG_EFFORT_MODE)
    if mode == "force" and effort not in EFFORTS:
        issues.append(Issue(("defaultEffort",), MSG_EFFORT_REQUIRED))
    check(
        "reasoningEffortMode",
        raw.get("reasoningEffortMode") in ("strict", "adaptive"),
        MSG_REASONING_MODE,
    )
    check("imageInput", raw.get("imageInput") in ("auto", "disabled"), MSG_IMAGE_INPUT)
    check("afterCommit", raw.get("afterCommit") in AFTER_COMMIT_MODES, MSG_AFTER_COMMIT)
    check(
        "maxContinuations",
        int_in(raw.get("maxContinuations"), 1, 3) is not None,
        MSG_MAX_CONTINUATIONS,
    )
    check(
        "bufferMaxBytes",
        int_in(raw.get("bufferMaxBytes"), BUFFER_MAX_BYTES_LOW, BUFFER_MAX_BYTES_HIGH) is not None,
        MSG_BUFFER_MAX_BYTES,
    )

    issues.extend(_validate_names(raw, providers, other_aliases))
    issues.extend(_validate_override(raw, target_keys))
    issues.extend(_validate_retry(raw.get("retrySameTarget")))
    issues.extend(unknown_fields(raw, _COMBO_FIELDS, ()))
    return issues


def _validate_names(
    raw: Mapping[str, object],
    providers: Mapping[str, ProviderInfo],
    other_aliases: list[tuple[str, str]],
) -> list[Issue]:
    """The names a combo is known by: its alias (grammar, collisions), the native alias and
    its display name."""
    issues: list[Issue] = []
    native = raw.get("nativeAlias") is True
    alias: str | None = None
    raw_alias = raw.get("alias")
    if raw_alias is not None and not isinstance(raw_alias, str):
        issues.append(Issue(("alias",), MSG_ALIAS_STRING))
    elif isinstance(raw_alias, str) and js_trim(raw_alias):
        alias = js_trim(raw_alias)
        error = alias_grammar_error(alias, native_alias=native)
        if error is None:
            error = _alias_collision(alias, other_aliases, providers)
        if error is not None:
            issues.append(Issue(("alias",), error))

    if "nativeAlias" in raw and not isinstance(raw.get("nativeAlias"), bool):
        issues.append(Issue(("nativeAlias",), MSG_NATIVE_BOOL))
    if native and alias not in NATIVE_ALIAS_SLUGS:
        issues.append(Issue(("nativeAlias",), MSG_NATIVE_UNSUPPORTED))

    raw_display = raw.get("displayName")
    display: str | None = None
    if raw_display is not None and not isinstance(raw_display, str):
        issues.append(Issue(("displayName",), MSG_DISPLAY_STRING))
    elif isinstance(raw_display, str):
        display = js_trim(raw_display) or None
        if display is not None and (len(display) > DISPLAY_NAME_MAX or has_control(display)):
            issues.append(Issue(("displayName",), MSG_DISPLAY_BOUNDS))
    if native and display is None and (raw_display is None or isinstance(raw_display, str)):
        issues.append(Issue(("displayName",), MSG_DISPLAY_REQUIRED))
    return issues


def _validate_targets(
    targets: list[object], providers: Mapping[str, ProviderInfo], require_enabled: bool
) -> tuple[list[Issue], set[str]]:
    issues: list[Issue] = []
    keys: set[str] = set()
    configured: list[ProviderInfo] = []
    all_configured = True
    for i, entry in enumerate(targets):
        if not isinstance(entry, Mapping):
            issues.append(Issue(("targets", i), msg_target_object(i)))
            all_configured = False
            continue
        provider = trimmed_str(entry.get("provider"))
        model = trimmed_str(entry.get("model"))
        if not provider:
            issues.append(Issue(("targets", i, "provider"), msg_target_provider_required(i)))
            all_configured = False
        elif provider not in providers:
            issues.append(
                Issue(("targets", i, "provider"), msg_target_provider_unknown(i, provider))
            )
            all_configured = False
        else:
            configured.append(providers[provider])
        if not model:
            issues.append(Issue(("targets", i, "model"), msg_target_model_required(i)))
        if "weight" in entry and int_in(entry.get("weight"), 1, 10_000) is None:
            issues.append(Issue(("targets", i, "weight"), msg_target_weight(i)))
        if "lastResort" in entry and not isinstance(entry.get("lastResort"), bool):
            issues.append(Issue(("targets", i, "lastResort"), msg_target_last_resort(i)))
        issues.extend(unknown_fields(entry, _TARGET_FIELDS, ("targets", i)))
        if provider and model:
            key = f"{provider}/{model}"
            if key in keys:
                issues.append(Issue(("targets", i), msg_duplicate_target(key)))
            keys.add(key)
    if require_enabled and all_configured and configured and all(p.disabled for p in configured):
        issues.append(Issue(("targets",), MSG_TARGETS_ENABLED))
    return issues, keys


def _alias_collision(
    alias: str, other_aliases: list[tuple[str, str]], providers: Mapping[str, ProviderInfo]
) -> str | None:
    for other_id, other_alias in other_aliases:
        if other_alias == alias:
            return msg_alias_used_by_combo(alias, other_id)
    folded = alias.casefold()
    for info in providers.values():
        if info.alias and js_trim(info.alias).casefold() == folded:
            return msg_alias_used_by_provider(alias, info.name)
        for model, model_alias in info.model_aliases:
            if js_trim(model_alias).casefold() == folded:
                return msg_alias_used_by_model(alias, info.name, model)
    return None


def _validate_override(raw: Mapping[str, object], target_keys: Collection[str]) -> list[Issue]:
    value = raw.get("override")
    if value is None:
        return []
    if not isinstance(value, Mapping) or not isinstance(value.get("target"), str):
        return [Issue(("override",), MSG_OVERRIDE)]
    issues: list[Issue] = []
    target = js_trim(value["target"])
    if target not in target_keys:
        issues.append(Issue(("override", "target"), msg_override_not_target(target)))
    return issues + unknown_fields(value, ("target",), ("override",))


_RETRY_FIELDS = ("attempts", "maxWaitMs")


def _validate_retry(value: object) -> list[Issue]:
    """`retrySameTarget`: null (off) or `{"attempts": 1-3, "maxWaitMs": 0-10000}`, both keys."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [Issue(("retrySameTarget",), MSG_RETRY)]
    issues: list[Issue] = []
    if int_in(value.get("attempts"), 1, 3) is None:
        issues.append(Issue(("retrySameTarget", "attempts"), MSG_RETRY_ATTEMPTS))
    if int_in(value.get("maxWaitMs"), 0, 10_000) is None:
        issues.append(Issue(("retrySameTarget", "maxWaitMs"), MSG_RETRY_WAIT))
    return issues + unknown_fields(value, _RETRY_FIELDS, ("retrySameTarget",))


def _retry_policy(value: object) -> RetryPolicy | None:
    if not isinstance(value, Mapping):
        return None
    attempts = int_in(value.get("attempts"), 1, 3)
    wait = int_in(value.get("maxWaitMs"), 0, 10_000)
    return None if attempts is None or wait is None else RetryPolicy(attempts, wait)


def _override_target(raw: object) -> str | None:
    if isinstance(raw, Mapping) and isinstance(raw.get("target"), str):
        return js_trim(raw["target"]) or None
    return None


def normalize_combo(combo_id: str, raw: Mapping[str, object]) -> ComboSpec:
    """The runtime/GET value of a combo body (§1.6); tolerant, it never raises on corrupt input.

    Call `validate_combo` first on anything user-supplied: normalization silently downgrades
    corrupt values (e.g. `lastResort: "yes"` -> False, force without a valid effort -> fallback).
    An `override` that does not name one of the targets normalizes to None (automatic).
    """
    raw_targets = raw.get("targets")
    targets: list[TargetSpec] = []
    for entry in raw_targets if isinstance(raw_targets, list) else []:
        if not isinstance(entry, Mapping):
            continue
        targets.append(
            TargetSpec(
                provider=trimmed_str(entry.get("provider")),
                model=trimmed_str(entry.get("model")),
                weight=int_in(entry.get("weight"), 1, 10_000) or 1,
                last_resort=entry.get("lastResort") is True,
            )
        )
    effort = raw.get("defaultEffort")
    default_effort = effort if isinstance(effort, str) and effort in EFFORTS else None
    force = raw.get("defaultEffortMode") == "force" and default_effort is not None
    strategy = raw.get("strategy")
    override = _override_target(raw.get("override"))
    wait = int_in(raw.get("waitForCooldownMs"), 0, 600_000)
    after_commit = raw.get("afterCommit")
    return ComboSpec(
        id=combo_id,
        targets=tuple(targets),
        strategy=strategy if isinstance(strategy, str) and strategy in STRATEGIES else "failover",
        sticky_limit=int_in(raw.get("stickyLimit"), 1, 100) or 1,
        cooldown_ms=int_in(raw.get("cooldownMs"), 1, 600_000),
        wait_for_cooldown_ms=wait or 0,
        cooldown_wait_policy=(
            LAST_RESORT_POLICY if raw.get("cooldownWaitPolicy") == LAST_RESORT_POLICY else None
        ),
        default_effort=default_effort,
        default_effort_mode="force" if force else "fallback",
        reasoning_effort_mode=(
            "adaptive" if raw.get("reasoningEffortMode") == "adaptive" else "strict"
        ),
        image_input="disabled" if raw.get("imageInput") == "disabled" else "auto",
        after_commit=(
            after_commit
            if isinstance(after_commit, str) and after_commit in AFTER_COMMIT_MODES
            else "error"
        ),
        max_continuations=int_in(raw.get("maxContinuations"), 1, 3) or 1,
        buffer_max_bytes=int_in(
            raw.get("bufferMaxBytes"), BUFFER_MAX_BYTES_LOW, BUFFER_MAX_BYTES_HIGH
        )
        or DEFAULT_BUFFER_MAX_BYTES,
        alias=trimmed_str(raw.get("alias")) or None,
        native_alias=raw.get("nativeAlias") is True,
        display_name=trimmed_str(raw.get("displayName")) or None,
        override=override if override in {t.key for t in targets} else None,
        retry_same_target=_retry_policy(raw.get("retrySameTarget")),
    )


def _combo_out(spec: ComboSpec, *, api: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    if api:
        out["id"] = spec.id
        out["model"] = spec.public_id
    out["strategy"] = spec.strategy
    out["stickyLimit"] = spec.sticky_limit
    if spec.cooldown_ms is not None:
        out["cooldownMs"] = spec.cooldown_ms
    if spec.wait_for_cooldown_ms != 0:
        out["waitForCooldownMs"] = spec.wait_for_cooldown_ms
    if spec.cooldown_wait_policy is not None:
        out["cooldownWaitPolicy"] = spec.cooldown_wait_policy
    out["defaultEffort"] = spec.default_effort
    if spec.default_effort_mode == "force":
        out["defaultEffortMode"] = "force"
    if spec.reasoning_effort_mode == "adaptive":
        out["reasoningEffortMode"] = "adaptive"
    if spec.image_input == "disabled":
        out["imageInput"] = "disabled"
    if spec.after_commit != "error":
        out["afterCommit"] = spec.after_commit
    if spec.max_continuations != 1:
        out["maxContinuations"] = spec.max_continuations
    if spec.buffer_max_bytes != DEFAULT_BUFFER_MAX_BYTES:
        out["bufferMaxBytes"] = spec.buffer_max_bytes
    if api or spec.alias is not None:
        out["alias"] = spec.alias
    if api or spec.native_alias:
        out["nativeAlias"] = spec.native_alias
    if api or spec.display_name is not None:
        out["displayName"] = spec.display_name
    if spec.override is not None:
        out["override"] = {"target": spec.override}
    elif api:
        out["override"] = None
    retry = spec.retry_same_target
    if retry is not None:
        out["retrySameTarget"] = {"attempts": retry.attempts, "maxWaitMs": retry.max_wait_ms}
    targets: list[dict[str, object]] = []
    for t in spec.targets:
        item: dict[str, object] = {"provider": t.provider, "model": t.model, "weight": t.weight}
        if api or t.last_resort:
            item["lastResort"] = t.last_resort
        targets.append(item)
    out["targets"] = targets
    return out


def combo_to_sparse(spec: ComboSpec) -> dict[str, object]:
    """The stored / dumped sparse form of a combo (§8.2 "On success").

    Always `strategy`, `stickyLimit`, `defaultEffort` (maybe null) and `targets` (`provider`,
    `model`, `weight`; `lastResort` only when true); every other field only when not default;
    `override` as `{"target": "p/m"}` only when pinned. No `id`: it is the key in `combos`.
    """
    return _combo_out(spec, api=False)


def combo_to_api(spec: ComboSpec) -> dict[str, object]:
    """One item of `GET /api/combos` (§8.1): `id`, `model` (public id) and the normalized fields.

    `alias`, `nativeAlias`, `displayName`, `override` and per-target `lastResort` are always
    present (null/false when unset); the tuning fields stay sparse so that PUTting GET output
    back writes no defaults. `validate_combo` accepts (and ignores) `id` and `model`.
    """
    return _combo_out(spec, api=True)


def _target_key(entry: object) -> str | None:
    if not isinstance(entry, Mapping):
        return None
    provider = trimmed_str(entry.get("provider"))
    model = trimmed_str(entry.get("model"))
    return f"{provider}/{model}" if provider and model else None


def merge_preserving(
    stored: Mapping[str, object] | None, incoming: Mapping[str, object]
) -> dict[str, object]:
    """Preserve-on-omit of `PUT /api/combos` (§8.2 step 6): a new dict, inputs untouched.

    Keys of `PRESERVED_COMBO_FIELDS` the body omits take the stored value, and each incoming
    target without `lastResort` takes the stored flag of the target with the same trimmed
    provider/model. Two ocx rules keep the merge valid: a stored `defaultEffortMode: "force"` is
    not carried over when the merged body has no valid `defaultEffort` (`--effort -` clears
    force), and a stored `override` is dropped when its target is no longer in the targets.
    """
    merged: dict[str, object] = dict(incoming)
    if stored is None:
        return merged
    incoming_targets = incoming.get("targets")
    incoming_keys = {
        key
        for key in map(_target_key, incoming_targets if isinstance(incoming_targets, list) else [])
        if key is not None
    }
    for key in PRESERVED_COMBO_FIELDS:
        if key in incoming or key not in stored:
            continue
        value = stored[key]
        if key == "defaultEffortMode" and merged.get("defaultEffort") not in EFFORTS:
            continue
        if key == "override" and _override_target(value) not in incoming_keys:
            continue
        merged[key] = value
    stored_targets = stored.get("targets")
    flags: dict[str, object] = {}
    for entry in stored_targets if isinstance(stored_targets, list) else []:
        stored_key = _target_key(entry)
        if stored_key is not None and isinstance(entry, Mapping) and "lastResort" in entry:
            flags.setdefault(stored_key, entry["lastResort"])
    if isinstance(incoming_targets, list):
        new_targets: list[object] = []
        for entry in incoming_targets:
            target_key = _target_key(entry)
            if isinstance(entry, Mapping) and "lastResort" not in entry and target_key in flags:
                entry = {**entry, "lastResort": flags[target_key]}
            new_targets.append(entry)
        merged["targets"] = new_targets
    return merged


def validate_config_combo(
    combo_id: str,
    raw: object,
    *,
    providers: Mapping[str, ProviderInfo],
    earlier_aliases: Iterable[tuple[str, str]],
    require_enabled_target: bool,
) -> list[Issue]:
    """`validate_combo` inside a whole config document (`validate_config`): the reserved `combo`
    provider is reported once, on the provider, and an alias only against the combos before."""
    issues = _check_combo_namespace(combo_id, providers, check_reserved=False)
    return issues + _validate_combo_body(
        raw,
        providers=providers,
        other_aliases=list(earlier_aliases),
        require_enabled_target=require_enabled_target,
    )
