"""The one validation + normalization function per config entity (combos, providers, whole config).

Every writer calls these: the admin forms, the ninja API, the CLI and `ocx config load`. They take
JSON-shaped camelCase dicts (the reference configuration file shape) and return `Issue`s in the
reference's order (combos-behaviour.md §1.3-§1.5, §6.1; PRODUCT.md §3). The API shows the first
issue's message only; config load lists all. Normalizers are tolerant (they never raise on corrupt
input, §1.6); the sparse serializers give the stored/dumped shape of §8.1-§8.2, never a secret.
`resolve_model` implements the model resolution of §6.2 because it shares the id/alias grammar.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit

from routing import envpolicy
from routing.types import (
    ADAPTERS,
    AFTER_COMMIT_MODES,
    COMBO_NAMESPACE,
    DEFAULT_BUFFER_MAX_BYTES,
    EFFORTS,
    STRATEGIES,
    ComboSpec,
    ConfigSnapshot,
    ModelPrice,
    ModelSpec,
    ProviderSpec,
    RetryPolicy,
    TargetSpec,
    Timeouts,
)

PathPart = str | int
Path = tuple[PathPart, ...]

# Bare OpenAI-native slugs a combo may take over with `nativeAlias: true` (a fixed list per
# release, §6.1). Extend it when a new native model ships.
NATIVE_ALIAS_SLUGS: frozenset[str] = frozenset(
    {"gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna", "gpt-5.5"}
)
NATIVE_FAMILY_PREFIXES: tuple[str, ...] = ("gpt-", "o1-", "o3-", "o4-", "codex-")
LAST_RESORT_POLICY = "before-last-resort"
DISPLAY_NAME_MAX = 128
MODALITIES: tuple[str, ...] = ("text", "image")

# --- messages (tests assert these verbatim) -------------------------------------------------------
MSG_COMBO_ID = (
    "combo id must start with a letter/number and use letters, numbers, dot, underscore, "
    "or hyphen (max 64)"
)
MSG_PROVIDER_NAME = (
    "provider name must start with a letter/number and use letters, numbers, dot, underscore, "
    "or hyphen (max 64)"
)
MSG_PROVIDER_COMBO_RESERVED = (
    'provider name "combo" collides with the reserved "combo/" namespace while combos are '
    "configured"
)
MSG_COMBO_MUST_BE_OBJECT = "combo must be an object"
MSG_COMBOS_MUST_BE_OBJECT = "combos must be an object"
MSG_PROVIDERS_MUST_BE_OBJECT = "providers must be an object"
MSG_PROVIDER_MUST_BE_OBJECT = "provider must be an object"
MSG_CONFIG_MUST_BE_OBJECT = "config must be an object"
MSG_DISABLED_MODELS = "disabledModels must be an array of strings"
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
MSG_ADAPTER = "adapter must be " + ", ".join(f'"{a}"' for a in ADAPTERS[:-1])
MSG_ADAPTER += f', or "{ADAPTERS[-1]}"'
MSG_BASE_URL = "baseUrl must be an http(s) URL"
MSG_API_KEY_ENV = "apiKeyEnv must be a valid environment variable name"
MSG_API_KEY = "apiKey must be a non-empty string without control characters"
MSG_HEADERS = "headers must be an object of string values"
MSG_DISABLED = "disabled must be a boolean"
MSG_TIMEOUTS = "timeouts must be an object"
MSG_MODELS = "models must be an object"
MSG_MODEL_ID = "model id must be a non-empty string without whitespace or control characters"


def msg_unknown_field(name: str) -> str:
    return f'unknown field "{name}"'


def msg_id_collides(combo_id: str) -> str:
    return f'combo id "{combo_id}" collides with configured provider name "{combo_id}"'


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
class Issue:
    """One validation problem: `path` locates it in the JSON document, `message` is user-facing."""

    path: Path
    message: str

    def __str__(self) -> str:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path)
        return f"{where.lstrip('.')}: {self.message}" if where else self.message


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


# --- small helpers --------------------------------------------------------------------------------

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# JavaScript's String.prototype.trim set; Python's str.strip() also eats \x1c-\x1f.
_JS_WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
_JS_WHITESPACE += "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_FORBIDDEN_HEADERS: frozenset[str] = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-ocx-key",
        "chatgpt-account-id",
        "cookie",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
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
_PROVIDER_FIELDS: frozenset[str] = frozenset(
    {
        "adapter",
        "baseUrl",
        "apiKeyEnv",
        "apiKey",
        "headers",
        "disabled",
        "timeouts",
        "maxConnections",
        "pricingProvider",
        "models",
    }
)
_MODEL_FIELDS: frozenset[str] = frozenset(
    {
        "contextWindow",
        "maxInputTokens",
        "inputModalities",
        "reasoningEfforts",
        "displayName",
        "parallelToolCalls",
        "price",
        "prefill",
    }
)
# A model's `price`, USD per million tokens: (JSON key, required).
_PRICE_FIELDS: tuple[tuple[str, bool], ...] = (
    ("inputPerMTok", True),
    ("cachedInputPerMTok", False),
    ("outputPerMTok", True),
)
_TIMEOUT_FIELDS: tuple[tuple[str, str], ...] = (
    ("connectMs", "connect_ms"),
    ("firstByteMs", "first_byte_ms"),
    ("idleMs", "idle_ms"),
    ("totalMs", "total_ms"),
)
_CONFIG_FIELDS: frozenset[str] = frozenset({"providers", "combos", "disabledModels"})
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


def js_trim(value: str) -> str:
    """Trim like JavaScript's `String.prototype.trim` (the reference's trimming)."""
    return value.strip(_JS_WHITESPACE)


def _as_int(value: object) -> int | None:
    """A JSON integer (an integral finite float counts, as in JavaScript); never a bool/string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _int_in(value: object, low: int, high: int | None) -> int | None:
    n = _as_int(value)
    if n is None or n < low or (high is not None and n > high):
        return None
    return n


def _has_control(value: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)


def _trimmed_str(value: object) -> str:
    return js_trim(value) if isinstance(value, str) else ""


def _unknown(raw: Mapping[Any, object], known: Collection[str], prefix: Path) -> list[Issue]:
    return [
        Issue((*prefix, str(key)), msg_unknown_field(str(key))) for key in raw if key not in known
    ]


def _prefixed(prefix: Path, issues: Iterable[Issue]) -> list[Issue]:
    return [Issue((*prefix, *i.path), i.message) for i in issues]


# --- ids and aliases ------------------------------------------------------------------------------


def is_valid_id(value: object) -> bool:
    """The id grammar shared by combo ids, provider names and alias segments (§1.2)."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


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


def _alias_of(combo: object) -> str | None:
    if isinstance(combo, ComboSpec):
        return combo.alias
    if isinstance(combo, Mapping):
        alias = _trimmed_str(combo.get("alias"))
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
        alias = _alias_of(other)
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
    check("stickyLimit", _int_in(raw.get("stickyLimit"), 1, 100) is not None, MSG_STICKY)
    check("cooldownMs", _int_in(raw.get("cooldownMs"), 1, 600_000) is not None, MSG_COOLDOWN)
    check(
        "waitForCooldownMs", _int_in(raw.get("waitForCooldownMs"), 0, 600_000) is not None, MSG_WAIT
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
        _int_in(raw.get("maxContinuations"), 1, 3) is not None,
        MSG_MAX_CONTINUATIONS,
    )
    check(
        "bufferMaxBytes",
        _int_in(raw.get("bufferMaxBytes"), BUFFER_MAX_BYTES_LOW, BUFFER_MAX_BYTES_HIGH) is not None,
        MSG_BUFFER_MAX_BYTES,
    )

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

    check("nativeAlias", isinstance(raw.get("nativeAlias"), bool), MSG_NATIVE_BOOL)
    if native and alias not in NATIVE_ALIAS_SLUGS:
        issues.append(Issue(("nativeAlias",), MSG_NATIVE_UNSUPPORTED))

    raw_display = raw.get("displayName")
    display: str | None = None
    if raw_display is not None and not isinstance(raw_display, str):
        issues.append(Issue(("displayName",), MSG_DISPLAY_STRING))
    elif isinstance(raw_display, str):
        display = js_trim(raw_display) or None
        if display is not None and (len(display) > DISPLAY_NAME_MAX or _has_control(display)):
            issues.append(Issue(("displayName",), MSG_DISPLAY_BOUNDS))
    if native and display is None and (raw_display is None or isinstance(raw_display, str)):
        issues.append(Issue(("displayName",), MSG_DISPLAY_REQUIRED))

    issues.extend(_validate_override(raw, target_keys))
    issues.extend(_validate_retry(raw.get("retrySameTarget")))
    issues.extend(_unknown(raw, _COMBO_FIELDS, ()))
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
        provider = _trimmed_str(entry.get("provider"))
        model = _trimmed_str(entry.get("model"))
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
        if "weight" in entry and _int_in(entry.get("weight"), 1, 10_000) is None:
            issues.append(Issue(("targets", i, "weight"), msg_target_weight(i)))
        if "lastResort" in entry and not isinstance(entry.get("lastResort"), bool):
            issues.append(Issue(("targets", i, "lastResort"), msg_target_last_resort(i)))
        issues.extend(_unknown(entry, _TARGET_FIELDS, ("targets", i)))
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
    return issues + _unknown(value, ("target",), ("override",))


_RETRY_FIELDS = ("attempts", "maxWaitMs")


def _validate_retry(value: object) -> list[Issue]:
    """`retrySameTarget`: null (off) or `{"attempts": 1-3, "maxWaitMs": 0-10000}`, both keys."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [Issue(("retrySameTarget",), MSG_RETRY)]
    issues: list[Issue] = []
    if _int_in(value.get("attempts"), 1, 3) is None:
        issues.append(Issue(("retrySameTarget", "attempts"), MSG_RETRY_ATTEMPTS))
    if _int_in(value.get("maxWaitMs"), 0, 10_000) is None:
        issues.append(Issue(("retrySameTarget", "maxWaitMs"), MSG_RETRY_WAIT))
    return issues + _unknown(value, _RETRY_FIELDS, ("retrySameTarget",))


def _retry_policy(value: object) -> RetryPolicy | None:
    if not isinstance(value, Mapping):
        return None
    attempts = _int_in(value.get("attempts"), 1, 3)
    wait = _int_in(value.get("maxWaitMs"), 0, 10_000)
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
                provider=_trimmed_str(entry.get("provider")),
                model=_trimmed_str(entry.get("model")),
                weight=_int_in(entry.get("weight"), 1, 10_000) or 1,
                last_resort=entry.get("lastResort") is True,
            )
        )
    effort = raw.get("defaultEffort")
    default_effort = effort if isinstance(effort, str) and effort in EFFORTS else None
    force = raw.get("defaultEffortMode") == "force" and default_effort is not None
    strategy = raw.get("strategy")
    override = _override_target(raw.get("override"))
    wait = _int_in(raw.get("waitForCooldownMs"), 0, 600_000)
    after_commit = raw.get("afterCommit")
    return ComboSpec(
        id=combo_id,
        targets=tuple(targets),
        strategy=strategy if isinstance(strategy, str) and strategy in STRATEGIES else "failover",
        sticky_limit=_int_in(raw.get("stickyLimit"), 1, 100) or 1,
        cooldown_ms=_int_in(raw.get("cooldownMs"), 1, 600_000),
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
        max_continuations=_int_in(raw.get("maxContinuations"), 1, 3) or 1,
        buffer_max_bytes=_int_in(
            raw.get("bufferMaxBytes"), BUFFER_MAX_BYTES_LOW, BUFFER_MAX_BYTES_HIGH
        )
        or DEFAULT_BUFFER_MAX_BYTES,
        alias=_trimmed_str(raw.get("alias")) or None,
        native_alias=raw.get("nativeAlias") is True,
        display_name=_trimmed_str(raw.get("displayName")) or None,
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
    provider = _trimmed_str(entry.get("provider"))
    model = _trimmed_str(entry.get("model"))
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


# --- providers ------------------------------------------------------------------------------------


def msg_header_name(name: str) -> str:
    return f'header name "{name}" is not a valid HTTP header name'


def msg_header_forbidden(name: str) -> str:
    return f'headers must not set "{name}"; credentials and transport headers are managed by ocx'


def msg_header_duplicate(name: str) -> str:
    return f'duplicate header "{name}"'


def msg_header_value(name: str) -> str:
    return f'headers["{name}"] must be a string without CR, LF or NUL'


MAX_CONNECTIONS_LIMIT = 1_000_000
MSG_MAX_CONNECTIONS = f"maxConnections must be an integer from 1 to {MAX_CONNECTIONS_LIMIT}"


def msg_timeout(key: str) -> str:
    return f"timeouts.{key} must be a positive integer"


def msg_model_object(model_id: str) -> str:
    return f'models["{model_id}"] must be an object'


def msg_model_positive(model_id: str, key: str) -> str:
    return f'models["{model_id}"].{key} must be a positive integer'


def msg_model_input_exceeds(model_id: str) -> str:
    return f'models["{model_id}"].maxInputTokens must not exceed contextWindow'


def msg_model_modalities(model_id: str) -> str:
    return (
        f'models["{model_id}"].inputModalities must be a non-empty list of "text" and/or "image" '
        "without duplicates"
    )


def msg_model_efforts(model_id: str) -> str:
    return (
        f'models["{model_id}"].reasoningEfforts must be a list of distinct efforts from: '
        + ", ".join(EFFORTS)
    )


def msg_model_display(model_id: str) -> str:
    return (
        f'models["{model_id}"].displayName must be a string of at most 128 characters without '
        "control characters"
    )


def msg_model_parallel(model_id: str) -> str:
    return f'models["{model_id}"].parallelToolCalls must be a boolean'


def msg_model_prefill(model_id: str) -> str:
    return f'models["{model_id}"].prefill must be a boolean'


def msg_model_price(model_id: str) -> str:
    return (
        f'models["{model_id}"].price must be an object like {{"inputPerMTok": 1.25, '
        '"cachedInputPerMTok": 0.125, "outputPerMTok": 10}} (USD per million tokens)'
    )


def msg_model_price_value(model_id: str, key: str) -> str:
    return f'models["{model_id}"].price.{key} must be a number >= 0 (USD per million tokens)'


def msg_model_price_required(model_id: str, key: str) -> str:
    return f'models["{model_id}"].price.{key} is required (USD per million tokens)'


MSG_PRICING_PROVIDER = (
    "pricingProvider must be null or a provider id of the genai-prices data, such as "
    '"openai", "anthropic", "openrouter", "google", "azure" or "groq"'
)


def _price_number(value: object) -> float | None:
    """A JSON number >= 0 (not a bool, not NaN or infinite), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def _validate_price(model_id: str, raw: object, prefix: Path) -> list[Issue]:
    path: Path = (*prefix, "price")
    if not isinstance(raw, Mapping):
        return [Issue(path, msg_model_price(model_id))]
    issues: list[Issue] = []
    for key, required in _PRICE_FIELDS:
        value = raw.get(key)
        if value is None:
            if required:
                issues.append(Issue((*path, key), msg_model_price_required(model_id, key)))
        elif _price_number(value) is None:
            issues.append(Issue((*path, key), msg_model_price_value(model_id, key)))
    return issues + _unknown(raw, [k for k, _ in _PRICE_FIELDS], path)


def _validate_pricing_provider(value: object) -> list[Issue]:
    from routing.pricing import provider_ids

    if value is None or (isinstance(value, str) and value in provider_ids()):
        return []
    return [Issue(("pricingProvider",), MSG_PRICING_PROVIDER)]


def _is_http_url(value: object) -> bool:
    if not isinstance(value, str) or not value or value != js_trim(value):
        return False
    if _has_control(value) or any(c.isspace() for c in value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _is_model_id(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= 256
        and not _has_control(value)
        and not any(c.isspace() for c in value)
    )


def _validate_headers(value: object) -> list[Issue]:
    if not isinstance(value, Mapping):
        return [Issue(("headers",), MSG_HEADERS)]
    issues: list[Issue] = []
    seen: set[str] = set()
    for name, header_value in value.items():
        path: Path = ("headers", str(name))
        if not isinstance(name, str) or _HEADER_NAME_RE.fullmatch(name) is None:
            issues.append(Issue(path, msg_header_name(str(name))))
            continue
        lower = name.lower()
        if lower in _FORBIDDEN_HEADERS:
            issues.append(Issue(path, msg_header_forbidden(name)))
        elif lower in seen:
            issues.append(Issue(path, msg_header_duplicate(name)))
        seen.add(lower)
        if not isinstance(header_value, str) or any(c in header_value for c in "\r\n\0"):
            issues.append(Issue(path, msg_header_value(name)))
    return issues


def _validate_timeouts(value: object) -> list[Issue]:
    if not isinstance(value, Mapping):
        return [Issue(("timeouts",), MSG_TIMEOUTS)]
    issues: list[Issue] = []
    for key, _attr in _TIMEOUT_FIELDS:
        if key in value and _int_in(value[key], 1, None) is None:
            issues.append(Issue(("timeouts", key), msg_timeout(key)))
    return issues + _unknown(value, [k for k, _ in _TIMEOUT_FIELDS], ("timeouts",))


def _validate_model(model_id: str, raw: object) -> list[Issue]:
    prefix: Path = ("models", model_id)
    if not isinstance(raw, Mapping):
        return [Issue(prefix, msg_model_object(model_id))]
    issues: list[Issue] = []
    sizes: dict[str, int] = {}
    for key in ("contextWindow", "maxInputTokens"):
        if raw.get(key) is None:
            continue
        n = _int_in(raw[key], 1, None)
        if n is None:
            issues.append(Issue((*prefix, key), msg_model_positive(model_id, key)))
        else:
            sizes[key] = n
    if len(sizes) == 2 and sizes["maxInputTokens"] > sizes["contextWindow"]:
        issues.append(Issue((*prefix, "maxInputTokens"), msg_model_input_exceeds(model_id)))
    modalities = raw.get("inputModalities")
    if modalities is not None and not (
        isinstance(modalities, list)
        and modalities
        and all(isinstance(m, str) and m in MODALITIES for m in modalities)
        and len(set(modalities)) == len(modalities)
    ):
        issues.append(Issue((*prefix, "inputModalities"), msg_model_modalities(model_id)))
    efforts = raw.get("reasoningEfforts")
    if efforts is not None and not (
        isinstance(efforts, list)
        and all(isinstance(e, str) and e in EFFORTS for e in efforts)
        and len(set(efforts)) == len(efforts)
    ):
        issues.append(Issue((*prefix, "reasoningEfforts"), msg_model_efforts(model_id)))
    display = raw.get("displayName")
    if display is not None and not (
        isinstance(display, str)
        and len(js_trim(display)) <= DISPLAY_NAME_MAX
        and not _has_control(js_trim(display))
    ):
        issues.append(Issue((*prefix, "displayName"), msg_model_display(model_id)))
    parallel = raw.get("parallelToolCalls")
    if parallel is not None and not isinstance(parallel, bool):
        issues.append(Issue((*prefix, "parallelToolCalls"), msg_model_parallel(model_id)))
    prefill = raw.get("prefill")
    if prefill is not None and not isinstance(prefill, bool):
        issues.append(Issue((*prefix, "prefill"), msg_model_prefill(model_id)))
    if raw.get("price") is not None:
        issues.extend(_validate_price(model_id, raw["price"], prefix))
    return issues + _unknown(raw, _MODEL_FIELDS, prefix)


def validate_provider(name: str, raw: object, *, combo_ids: Collection[str]) -> list[Issue]:
    """Validate one provider body (`providers.<name>`, PRODUCT.md §3.1); every issue, in order.

    Checks the name grammar (as a combo id), the reserved `combo` name while `combo_ids` is
    non-empty and a clash with a combo id; then `adapter` and `baseUrl` (required), `apiKeyEnv`,
    the write-only `apiKey`, `headers`, `disabled`, `timeouts`, `maxConnections` (null: the
    `OCX_UPSTREAM_MAX_CONNECTIONS` default), `pricingProvider` (null: inferred), `models.<id>`
    (with its optional `price`) and unknown fields.
    Paths are relative to the provider; name problems have the path `()`.
    """
    return _validate_provider(name, raw, combo_ids=combo_ids, check_collision=True)


def _validate_provider(
    name: str, raw: object, *, combo_ids: Collection[str], check_collision: bool
) -> list[Issue]:
    issues: list[Issue] = []
    if not is_valid_id(name):
        issues.append(Issue((), MSG_PROVIDER_NAME))
    if name == COMBO_NAMESPACE and combo_ids:
        issues.append(Issue((), MSG_PROVIDER_COMBO_RESERVED))
    elif check_collision and name in combo_ids:
        issues.append(Issue((), msg_id_collides(name)))
    if not isinstance(raw, Mapping):
        return issues + [Issue((), MSG_PROVIDER_MUST_BE_OBJECT)]
    if raw.get("adapter") not in ADAPTERS:
        issues.append(Issue(("adapter",), MSG_ADAPTER))
    if not _is_http_url(raw.get("baseUrl")):
        issues.append(Issue(("baseUrl",), MSG_BASE_URL))
    env = raw.get("apiKeyEnv")
    if env is not None and not (isinstance(env, str) and _ENV_RE.fullmatch(env)):
        issues.append(Issue(("apiKeyEnv",), MSG_API_KEY_ENV))
    elif isinstance(env, str):
        refused = envpolicy.refusal(env)
        if refused is not None:
            issues.append(Issue(("apiKeyEnv",), refused))
    key = raw.get("apiKey")
    if key is not None and not (isinstance(key, str) and key and not _has_control(key)):
        issues.append(Issue(("apiKey",), MSG_API_KEY))
    if raw.get("headers") is not None:
        issues.extend(_validate_headers(raw["headers"]))
    if "disabled" in raw and not isinstance(raw["disabled"], bool):
        issues.append(Issue(("disabled",), MSG_DISABLED))
    if raw.get("timeouts") is not None:
        issues.extend(_validate_timeouts(raw["timeouts"]))
    limit = raw.get("maxConnections")
    if limit is not None and _int_in(limit, 1, MAX_CONNECTIONS_LIMIT) is None:
        issues.append(Issue(("maxConnections",), MSG_MAX_CONNECTIONS))
    if "pricingProvider" in raw:
        issues.extend(_validate_pricing_provider(raw["pricingProvider"]))
    models = raw.get("models")
    if models is not None:
        if not isinstance(models, Mapping):
            issues.append(Issue(("models",), MSG_MODELS))
        else:
            for model_id, model in models.items():
                if not _is_model_id(model_id):
                    issues.append(Issue(("models", str(model_id)), MSG_MODEL_ID))
                else:
                    issues.extend(_validate_model(model_id, model))
    return issues + _unknown(raw, _PROVIDER_FIELDS, ())


def _opt_tuple(value: object, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(dict.fromkeys(v for v in value if isinstance(v, str) and v in allowed))


def normalize_price(raw: object) -> ModelPrice | None:
    if not isinstance(raw, Mapping):
        return None
    inp, out = _price_number(raw.get("inputPerMTok")), _price_number(raw.get("outputPerMTok"))
    if inp is None or out is None:
        return None
    return ModelPrice(
        input=inp, output=out, cached_input=_price_number(raw.get("cachedInputPerMTok"))
    )


def _normalize_model(model_id: str, raw: object) -> ModelSpec:
    m = raw if isinstance(raw, Mapping) else {}
    display = m.get("displayName")
    parallel = m.get("parallelToolCalls")
    modalities = _opt_tuple(m.get("inputModalities"), MODALITIES)
    return ModelSpec(
        id=model_id,
        context_window=_int_in(m.get("contextWindow"), 1, None),
        max_input_tokens=_int_in(m.get("maxInputTokens"), 1, None),
        input_modalities=modalities or None,
        reasoning_efforts=_opt_tuple(m.get("reasoningEfforts"), EFFORTS),
        display_name=_trimmed_str(display) or None,
        parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
        price=normalize_price(m.get("price")),
        prefill=m["prefill"] if isinstance(m.get("prefill"), bool) else None,
    )


def normalize_provider(
    name: str, raw: Mapping[str, object], *, api_key: str | None = None
) -> ProviderSpec:
    """The runtime value of a provider body; tolerant, call `validate_provider` first.

    `api_key` (the decrypted stored key) wins over a body `apiKey`; `baseUrl` loses trailing
    slashes; absent timeouts take the `Timeouts` defaults; `reasoningEfforts: []` stays `()`.
    """
    body_key = raw.get("apiKey")
    stored_key = body_key if isinstance(body_key, str) and body_key else None
    env = raw.get("apiKeyEnv")
    headers = raw.get("headers")
    timeouts = raw.get("timeouts")
    t = timeouts if isinstance(timeouts, Mapping) else {}
    defaults = Timeouts()
    models = raw.get("models")
    adapter = raw.get("adapter")
    pricing = raw.get("pricingProvider")
    return ProviderSpec(
        name=name,
        adapter=adapter if isinstance(adapter, str) else "",
        base_url=_trimmed_str(raw.get("baseUrl")).rstrip("/"),
        api_key_env=env if isinstance(env, str) and env else None,
        api_key=api_key if api_key is not None else stored_key,
        headers=tuple(
            (k, v)
            for k, v in (headers.items() if isinstance(headers, Mapping) else ())
            if isinstance(k, str) and isinstance(v, str)
        ),
        disabled=raw.get("disabled") is True,
        timeouts=Timeouts(
            **{
                attr: _int_in(t.get(key), 1, None) or getattr(defaults, attr)
                for key, attr in _TIMEOUT_FIELDS
            }
        ),
        max_connections=_int_in(raw.get("maxConnections"), 1, MAX_CONNECTIONS_LIMIT),
        pricing_provider=pricing if isinstance(pricing, str) and pricing else None,
        models=MappingProxyType(
            {
                mid: _normalize_model(mid, m)
                for mid, m in (models.items() if isinstance(models, Mapping) else ())
                if isinstance(mid, str)
            }
        ),
    )


def _model_to_sparse(model: ModelSpec) -> dict[str, object]:
    out: dict[str, object] = {}
    if model.context_window is not None:
        out["contextWindow"] = model.context_window
    if model.max_input_tokens is not None:
        out["maxInputTokens"] = model.max_input_tokens
    if model.input_modalities is not None:
        out["inputModalities"] = list(model.input_modalities)
    if model.reasoning_efforts is not None:
        out["reasoningEfforts"] = list(model.reasoning_efforts)
    if model.display_name is not None:
        out["displayName"] = model.display_name
    if model.parallel_tool_calls is not None:
        out["parallelToolCalls"] = model.parallel_tool_calls
    if model.price is not None:
        out["price"] = price_to_sparse(model.price)
    if model.prefill is not None:
        out["prefill"] = model.prefill
    return out


def price_to_sparse(price: ModelPrice) -> dict[str, float]:
    out = {"inputPerMTok": price.input}
    if price.cached_input is not None:
        out["cachedInputPerMTok"] = price.cached_input
    out["outputPerMTok"] = price.output
    return out


def provider_to_sparse(spec: ProviderSpec) -> dict[str, object]:
    """The stored / dumped / GET form of a provider: defaults omitted, never `apiKey`.

    Always `adapter` and `baseUrl`; `apiKeyEnv`, `headers`, `disabled: true`, the non-default
    `timeouts` keys, `maxConnections` and `models` only when set. Whether a stored key exists is
    the caller's to report (e.g. a masked hint in the admin); this function never sees a reason
    to.
    """
    out: dict[str, object] = {"adapter": spec.adapter, "baseUrl": spec.base_url}
    if spec.api_key_env is not None:
        out["apiKeyEnv"] = spec.api_key_env
    if spec.headers:
        out["headers"] = dict(spec.headers)
    if spec.disabled:
        out["disabled"] = True
    defaults = Timeouts()
    timeouts = {
        key: getattr(spec.timeouts, attr)
        for key, attr in _TIMEOUT_FIELDS
        if getattr(spec.timeouts, attr) != getattr(defaults, attr)
    }
    if timeouts:
        out["timeouts"] = timeouts
    if spec.max_connections is not None:
        out["maxConnections"] = spec.max_connections
    if spec.pricing_provider is not None:
        out["pricingProvider"] = spec.pricing_provider
    if spec.models:
        out["models"] = {mid: _model_to_sparse(m) for mid, m in spec.models.items()}
    return out


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
        found = _validate_provider(name, body, combo_ids=combo_ids, check_collision=False)
        issues.extend(_prefixed(("providers", name), found))
    earlier: list[tuple[str, str]] = []
    for raw_id, body in combos.items():
        combo_id = str(raw_id)
        found = _check_combo_namespace(combo_id, infos, check_reserved=False)
        found += _validate_combo_body(
            body,
            providers=infos,
            other_aliases=list(earlier),
            require_enabled_target=require_enabled_target,
        )
        issues.extend(_prefixed(("combos", combo_id), found))
        alias = _alias_of(body)
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
    return issues + _unknown(raw, _CONFIG_FIELDS, ())


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
