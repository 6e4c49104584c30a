"""The one validation + normalization path of every config entity (combos, providers, whole config).

Every writer calls these: the admin forms, the ninja API, the CLI and `ocx config load`. They take
JSON-shaped camelCase dicts (the reference configuration file shape) and return `Issue`s in the
reference's order (combos-behaviour.md §1.3-§1.5, §6.1; PRODUCT.md §3). The API shows the first
issue's message only; config load lists all. Normalizers are tolerant (they never raise on corrupt
input, §1.6); the sparse serializers give the stored/dumped shape of §8.1-§8.2, never a secret.
`resolve_model` implements the model resolution of §6.2 because it shares the id/alias grammar.

The rules live by what they validate, and this module is their one entry (callers import
`routing.validate` only):

- `routing.validate_fields`: the rules every entity shares (ids, trimming, integers, `Issue`);
- `routing.validate_combos`: a combo body (targets, strategy, aliases, overrides, retries);
- `routing.validate_providers`: a provider body (URL, credentials, headers, models, prices);
- here: the whole config document and model resolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from routing.types import COMBO_NAMESPACE, ConfigSnapshot
from routing.validate_combos import (
    BUFFER_MAX_BYTES_HIGH,
    BUFFER_MAX_BYTES_LOW,
    LAST_RESORT_POLICY,
    MSG_AFTER_COMMIT,
    MSG_ALIAS_GRAMMAR,
    MSG_ALIAS_NATIVE_FAMILY,
    MSG_ALIAS_RESERVED,
    MSG_ALIAS_STRING,
    MSG_BUFFER_MAX_BYTES,
    MSG_COMBO_MUST_BE_OBJECT,
    MSG_COOLDOWN,
    MSG_DISPLAY_BOUNDS,
    MSG_DISPLAY_REQUIRED,
    MSG_DISPLAY_STRING,
    MSG_EFFORT,
    MSG_EFFORT_MODE,
    MSG_EFFORT_REQUIRED,
    MSG_IMAGE_INPUT,
    MSG_MAX_CONTINUATIONS,
    MSG_NATIVE_BOOL,
    MSG_NATIVE_UNSUPPORTED,
    MSG_OVERRIDE,
    MSG_REASONING_MODE,
    MSG_RETRY,
    MSG_RETRY_ATTEMPTS,
    MSG_RETRY_WAIT,
    MSG_STICKY,
    MSG_STRATEGY,
    MSG_TARGETS,
    MSG_TARGETS_ENABLED,
    MSG_WAIT,
    MSG_WAIT_POLICY,
    NATIVE_ALIAS_SLUGS,
    NATIVE_FAMILY_PREFIXES,
    PRESERVED_COMBO_FIELDS,
    ProviderInfo,
    alias_grammar_error,
    alias_of,
    combo_to_api,
    combo_to_sparse,
    merge_preserving,
    msg_alias_used_by_combo,
    msg_alias_used_by_model,
    msg_alias_used_by_provider,
    msg_duplicate_target,
    msg_override_not_target,
    msg_target_last_resort,
    msg_target_model_required,
    msg_target_object,
    msg_target_provider_required,
    msg_target_provider_unknown,
    msg_target_weight,
    normalize_combo,
    provider_infos,
    undeclared_target_notes,
    validate_combo,
    validate_combo_id,
    validate_config_combo,
)
from routing.validate_fields import (
    DISPLAY_NAME_MAX,
    MSG_COMBO_ID,
    MSG_PROVIDER_COMBO_RESERVED,
    MSG_PROVIDER_NAME,
    Issue,
    Path,
    PathPart,
    as_int,
    has_control,
    int_in,
    is_valid_id,
    js_trim,
    msg_id_collides,
    msg_unknown_field,
    prefixed,
    trimmed_str,
    unknown_fields,
)
from routing.validate_providers import (
    MAX_CONNECTIONS_LIMIT,
    MODALITIES,
    MSG_ADAPTER,
    MSG_API_KEY,
    MSG_API_KEY_ENV,
    MSG_BASE_URL,
    MSG_DISABLED,
    MSG_HEADERS,
    MSG_MAX_CONNECTIONS,
    MSG_MODEL_ID,
    MSG_MODELS,
    MSG_PRICING_PROVIDER,
    MSG_PROVIDER_MUST_BE_OBJECT,
    MSG_TIMEOUTS,
    msg_header_duplicate,
    msg_header_forbidden,
    msg_header_name,
    msg_header_value,
    msg_model_display,
    msg_model_efforts,
    msg_model_input_exceeds,
    msg_model_modalities,
    msg_model_object,
    msg_model_parallel,
    msg_model_positive,
    msg_model_prefill,
    msg_model_price,
    msg_model_price_required,
    msg_model_price_value,
    msg_timeout,
    normalize_price,
    normalize_provider,
    price_to_sparse,
    provider_to_sparse,
    validate_config_provider,
    validate_provider,
)

MSG_COMBOS_MUST_BE_OBJECT = "combos must be an object"
MSG_PROVIDERS_MUST_BE_OBJECT = "providers must be an object"
MSG_CONFIG_MUST_BE_OBJECT = "config must be an object"
MSG_DISABLED_MODELS = "disabledModels must be an array of strings"
_CONFIG_FIELDS: frozenset[str] = frozenset({"providers", "combos", "disabledModels"})


# --- whole config document ------------------------------------------------------------------------


def _object_or_none(
    raw: Mapping[str, object], key: str, message: str, issues: list[Issue]
) -> Mapping[str, object]:
    if key not in raw:
        return {}
    value = raw[key]
    if not isinstance(value, Mapping):
        issues.append(Issue((key,), message))
        return {}
    return value


def validate_config(raw: object, *, require_enabled_target: bool = False) -> list[Issue]:
    """Validate a whole `{"providers", "combos", "disabledModels"}` document; every issue.

    Providers come first (`("providers", name, ...)`), then combos (`("combos", id, ...)`, a
    duplicate alias reported on the later combo), then `disabledModels`, then unknown top-level
    keys. `combos` that is not an object gives `combos must be an object`. The reserved
    `combo` provider is reported once, on the provider. Config load does not require an enabled
    target (§1.4); pass `require_enabled_target=True` for save-time semantics.
    """
    if not isinstance(raw, Mapping):
        return [Issue((), MSG_CONFIG_MUST_BE_OBJECT)]
    issues: list[Issue] = []
    providers = _object_or_none(raw, "providers", MSG_PROVIDERS_MUST_BE_OBJECT, issues)
    combos = _object_or_none(raw, "combos", MSG_COMBOS_MUST_BE_OBJECT, issues)
    combo_ids = [str(k) for k in combos]
    infos: dict[str, ProviderInfo] = {}
    for raw_name, body in providers.items():
        name = str(raw_name)
        infos[name] = ProviderInfo(
            name=name, disabled=isinstance(body, Mapping) and body.get("disabled") is True
        )
        found = validate_config_provider(name, body, combo_ids=combo_ids)
        issues.extend(prefixed(("providers", name), found))
    earlier: list[tuple[str, str]] = []
    for raw_id, body in combos.items():
        combo_id = str(raw_id)
        found = validate_config_combo(
            combo_id,
            body,
            providers=infos,
            earlier_aliases=earlier,
            require_enabled_target=require_enabled_target,
        )
        issues.extend(prefixed(("combos", combo_id), found))
        alias = alias_of(body)
        if alias:
            earlier.append((combo_id, alias))
    if "disabledModels" in raw:
        disabled = raw["disabledModels"]
        if not isinstance(disabled, list):
            issues.append(Issue(("disabledModels",), MSG_DISABLED_MODELS))
        else:
            for i, item in enumerate(disabled):
                if not isinstance(item, str) or not js_trim(item):
                    msg = f"disabledModels[{i}] must be a non-empty string"
                    issues.append(Issue(("disabledModels", i), msg))
    return issues + unknown_fields(raw, _CONFIG_FIELDS, ())


def normalize_config(
    raw: Mapping[str, object],
    *,
    version: int = 0,
    api_keys: Mapping[str, str] | None = None,
) -> ConfigSnapshot:
    """The `ConfigSnapshot` of a (validated) config document; `api_keys` by provider name."""
    keys = api_keys or {}
    providers = raw.get("providers")
    combos = raw.get("combos")
    disabled = raw.get("disabledModels")
    return ConfigSnapshot(
        version=version,
        providers=MappingProxyType(
            {
                str(name): normalize_provider(str(name), body, api_key=keys.get(str(name)))
                for name, body in (providers.items() if isinstance(providers, Mapping) else ())
                if isinstance(body, Mapping)
            }
        ),
        combos=MappingProxyType(
            {
                str(cid): normalize_combo(str(cid), body)
                for cid, body in (combos.items() if isinstance(combos, Mapping) else ())
                if isinstance(body, Mapping)
            }
        ),
        disabled_models=frozenset(
            js_trim(m)
            for m in (disabled if isinstance(disabled, list) else ())
            if isinstance(m, str) and js_trim(m)
        ),
    )


def _sort_key(value: str) -> tuple[str, str]:
    return (value.casefold(), value)


def config_to_sparse(snapshot: ConfigSnapshot) -> dict[str, object]:
    """The `ocx config dump` document: sparse, sorted by name/id, without secrets.

    `normalize_config(config_to_sparse(s))` equals `s` apart from `version` and api keys, so
    load -> dump -> load is a fixed point.
    """
    return {
        "providers": {
            name: provider_to_sparse(snapshot.providers[name])
            for name in sorted(snapshot.providers, key=_sort_key)
        },
        "combos": {
            cid: combo_to_sparse(snapshot.combos[cid])
            for cid in sorted(snapshot.combos, key=_sort_key)
        },
        "disabledModels": sorted(snapshot.disabled_models, key=_sort_key),
    }


# --- model resolution (§6.2) ----------------------------------------------------------------------

ResolutionKind = Literal["combo", "unknown_combo", "target", "unresolved"]


@dataclass(frozen=True)
class Resolution:
    """Where a requested model id goes: a combo, an unknown canonical combo (404), an explicit
    `provider/model`, or `unresolved` (the caller continues with bare-native/default routing)."""

    kind: ResolutionKind
    combo_id: str | None = None
    provider: str | None = None
    model: str | None = None
    via_alias: bool = field(default=False)


def resolve_model(requested: str, snapshot: ConfigSnapshot) -> Resolution:
    """Resolve a request's `model` (§6.2 steps 3-4).

    With any combo configured: canonical `combo/<id>` (id taken as-is; unknown gives
    `unknown_combo`, which must answer 404 and never fall through), then an exact,
    case-sensitive match on a combo alias (this is how a native alias captures its bare slug).
    Then explicit `<provider>/<model>` split at the first `/` for a configured provider; a
    provider named `combo` is reachable this way only while no combos exist.
    """
    combos = snapshot.combos
    if combos or COMBO_NAMESPACE not in snapshot.providers:
        prefix = COMBO_NAMESPACE + "/"
        if requested.startswith(prefix) and len(requested) > len(prefix):
            combo_id = requested[len(prefix) :]
            kind: ResolutionKind = "combo" if combo_id in combos else "unknown_combo"
            return Resolution(kind, combo_id=combo_id)
        for combo_id, spec in combos.items():
            if spec.alias is not None and spec.alias == requested:
                return Resolution("combo", combo_id=combo_id, via_alias=True)
    provider, sep, model = requested.partition("/")
    if sep and model and provider in snapshot.providers:
        return Resolution("target", provider=provider, model=model)
    return Resolution("unresolved")


# The public names of the three rule modules, re-exported: callers import this module only.
__all__ = [
    "alias_grammar_error",
    "alias_of",
    "as_int",
    "BUFFER_MAX_BYTES_HIGH",
    "BUFFER_MAX_BYTES_LOW",
    "combo_to_api",
    "combo_to_sparse",
    "config_to_sparse",
    "DISPLAY_NAME_MAX",
    "has_control",
    "int_in",
    "is_valid_id",
    "Issue",
    "js_trim",
    "LAST_RESORT_POLICY",
    "MAX_CONNECTIONS_LIMIT",
    "merge_preserving",
    "MODALITIES",
    "MSG_ADAPTER",
    "MSG_AFTER_COMMIT",
    "MSG_ALIAS_GRAMMAR",
    "MSG_ALIAS_NATIVE_FAMILY",
    "MSG_ALIAS_RESERVED",
    "MSG_ALIAS_STRING",
    "msg_alias_used_by_combo",
    "msg_alias_used_by_model",
    "msg_alias_used_by_provider",
    "MSG_API_KEY",
    "MSG_API_KEY_ENV",
    "MSG_BASE_URL",
    "MSG_BUFFER_MAX_BYTES",
    "MSG_COMBO_ID",
    "MSG_COMBO_MUST_BE_OBJECT",
    "MSG_COMBOS_MUST_BE_OBJECT",
    "MSG_CONFIG_MUST_BE_OBJECT",
    "MSG_COOLDOWN",
    "MSG_DISABLED",
    "MSG_DISABLED_MODELS",
    "MSG_DISPLAY_BOUNDS",
    "MSG_DISPLAY_REQUIRED",
    "MSG_DISPLAY_STRING",
    "msg_duplicate_target",
    "MSG_EFFORT",
    "MSG_EFFORT_MODE",
    "MSG_EFFORT_REQUIRED",
    "msg_header_duplicate",
    "msg_header_forbidden",
    "msg_header_name",
    "msg_header_value",
    "MSG_HEADERS",
    "msg_id_collides",
    "MSG_IMAGE_INPUT",
    "MSG_MAX_CONNECTIONS",
    "MSG_MAX_CONTINUATIONS",
    "msg_model_display",
    "msg_model_efforts",
    "MSG_MODEL_ID",
    "msg_model_input_exceeds",
    "msg_model_modalities",
    "msg_model_object",
    "msg_model_parallel",
    "msg_model_positive",
    "msg_model_prefill",
    "msg_model_price",
    "msg_model_price_required",
    "msg_model_price_value",
    "MSG_MODELS",
    "MSG_NATIVE_BOOL",
    "MSG_NATIVE_UNSUPPORTED",
    "MSG_OVERRIDE",
    "msg_override_not_target",
    "MSG_PRICING_PROVIDER",
    "MSG_PROVIDER_COMBO_RESERVED",
    "MSG_PROVIDER_MUST_BE_OBJECT",
    "MSG_PROVIDER_NAME",
    "MSG_PROVIDERS_MUST_BE_OBJECT",
    "MSG_REASONING_MODE",
    "MSG_RETRY",
    "MSG_RETRY_ATTEMPTS",
    "MSG_RETRY_WAIT",
    "MSG_STICKY",
    "MSG_STRATEGY",
    "msg_target_last_resort",
    "msg_target_model_required",
    "msg_target_object",
    "msg_target_provider_required",
    "msg_target_provider_unknown",
    "msg_target_weight",
    "MSG_TARGETS",
    "MSG_TARGETS_ENABLED",
    "msg_timeout",
    "MSG_TIMEOUTS",
    "msg_unknown_field",
    "MSG_WAIT",
    "MSG_WAIT_POLICY",
    "NATIVE_ALIAS_SLUGS",
    "NATIVE_FAMILY_PREFIXES",
    "normalize_combo",
    "normalize_config",
    "normalize_price",
    "normalize_provider",
    "Path",
    "PathPart",
    "prefixed",
    "PRESERVED_COMBO_FIELDS",
    "price_to_sparse",
    "provider_infos",
    "provider_to_sparse",
    "ProviderInfo",
    "Resolution",
    "ResolutionKind",
    "resolve_model",
    "trimmed_str",
    "undeclared_target_notes",
    "unknown_fields",
    "validate_combo",
    "validate_combo_id",
    "validate_config",
    "validate_config_combo",
    "validate_config_provider",
    "validate_provider",
]
