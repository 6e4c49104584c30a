"""Providers: the validation, normalization and stored forms of one provider body, with its
headers, timeouts, models and prices (routing.validate, PRODUCT.md §3.1)."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from types import MappingProxyType
from urllib.parse import urlsplit

from routing import envpolicy
from routing.types import (
    ADAPTERS,
    COMBO_NAMESPACE,
    EFFORTS,
    ModelPrice,
    ModelSpec,
    ProviderSpec,
    Timeouts,
)
from routing.validate_fields import (
    DISPLAY_NAME_MAX,
    MSG_PROVIDER_COMBO_RESERVED,
    MSG_PROVIDER_NAME,
    Issue,
    Path,
    has_control,
    int_in,
    is_valid_id,
    js_trim,
    msg_id_collides,
    trimmed_str,
    unknown_fields,
)

MODALITIES: tuple[str, ...] = ("text", "image")

# --- messages (tests assert these verbatim) -------------------------------------------------------
MSG_PROVIDER_MUST_BE_OBJECT = "provider must be an object"
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

_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
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
    return issues + unknown_fields(raw, [k for k, _ in _PRICE_FIELDS], path)


def _validate_pricing_provider(value: object) -> list[Issue]:
    from routing.pricing import provider_ids

    if value is None or (isinstance(value, str) and value in provider_ids()):
        return []
    return [Issue(("pricingProvider",), MSG_PRICING_PROVIDER)]


def _is_http_url(value: object) -> bool:
    if not isinstance(value, str) or not value or value != js_trim(value):
        return False
    if has_control(value) or any(c.isspace() for c in value):
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
        and not has_control(value)
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
        if key in value and int_in(value[key], 1, None) is None:
            issues.append(Issue(("timeouts", key), msg_timeout(key)))
    return issues + unknown_fields(value, [k for k, _ in _TIMEOUT_FIELDS], ("timeouts",))


def _validate_model(model_id: str, raw: object) -> list[Issue]:
    prefix: Path = ("models", model_id)
    if not isinstance(raw, Mapping):
        return [Issue(prefix, msg_model_object(model_id))]
    issues: list[Issue] = []
    sizes: dict[str, int] = {}
    for key in ("contextWindow", "maxInputTokens"):
        if raw.get(key) is None:
            continue
        n = int_in(raw[key], 1, None)
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
        and not has_control(js_trim(display))
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
    return issues + unknown_fields(raw, _MODEL_FIELDS, prefix)


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
    if key is not None and not (isinstance(key, str) and key and not has_control(key)):
        issues.append(Issue(("apiKey",), MSG_API_KEY))
    if raw.get("headers") is not None:
        issues.extend(_validate_headers(raw["headers"]))
    if "disabled" in raw and not isinstance(raw["disabled"], bool):
        issues.append(Issue(("disabled",), MSG_DISABLED))
    if raw.get("timeouts") is not None:
        issues.extend(_validate_timeouts(raw["timeouts"]))
    limit = raw.get("maxConnections")
    if limit is not None and int_in(limit, 1, MAX_CONNECTIONS_LIMIT) is None:
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
    return issues + unknown_fields(raw, _PROVIDER_FIELDS, ())


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
        context_window=int_in(m.get("contextWindow"), 1, None),
        max_input_tokens=int_in(m.get("maxInputTokens"), 1, None),
        input_modalities=modalities or None,
        reasoning_efforts=_opt_tuple(m.get("reasoningEfforts"), EFFORTS),
        display_name=trimmed_str(display) or None,
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
        base_url=trimmed_str(raw.get("baseUrl")).rstrip("/"),
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
                attr: int_in(t.get(key), 1, None) or getattr(defaults, attr)
                for key, attr in _TIMEOUT_FIELDS
            }
        ),
        max_connections=int_in(raw.get("maxConnections"), 1, MAX_CONNECTIONS_LIMIT),
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


def validate_config_provider(name: str, raw: object, *, combo_ids: Collection[str]) -> list[Issue]:
    """`validate_provider` inside a whole config document (`validate_config`): a name that is
    also a combo id is reported on the combo."""
    return _validate_provider(name, raw, combo_ids=combo_ids, check_collision=False)
