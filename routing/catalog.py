"""The Codex model catalog (`model_catalog_json`) and the `GET /v1/models` list, derived purely
from a `ConfigSnapshot`.

Rows follow codex-wire.md §1.3–§1.4 (the cross-version "superset" entry, no nulls in required or
non-Option fields); combo rows follow combos-behaviour.md §6.3 (member intersection, exact
ladder, alias/`combo/<id>` slug, native-alias rows, `disabledModels` visibility, fail-closed
omission of combos whose member metadata is incomplete — they stay routable).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from routing.efforts import combo_ladder, default_effort_for, picker_default
from routing.types import COMBO_NAMESPACE, ComboSpec, ConfigSnapshot, ModelSpec

# Bare OpenAI-native slugs a combo may take over with `nativeAlias` (fixed per release, §6.1).
# Values are fallback metadata for members that lack it; no capability numbers are invented here.
NATIVE_MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {slug: ModelSpec(id=slug) for slug in ("gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.5")}
)

MODALITIES: tuple[str, ...] = ("text", "image", "audio")

EFFORT_DESCRIPTIONS: Mapping[str, str] = MappingProxyType(
    {
        "none": "No extra reasoning",
        "minimal": "Minimal reasoning for the quickest answers",
        "low": "Fast responses with lighter reasoning",
        "medium": "Balances speed and reasoning depth for everyday tasks",
        "high": "Greater reasoning depth for complex or ambiguous problems",
        "xhigh": "Extra high reasoning depth for the hardest problems",
        "max": "Maximum reasoning depth; slowest and most expensive",
        "ultra": "Beyond maximum reasoning depth where the upstream offers it",
    }
)

OMISSION_DETAILS: Mapping[str, str] = MappingProxyType(
    {
        "no_targets": "it has no targets",
        "duplicate_target": "a target is listed twice",
        "missing_member": "a member is not a configured provider model",
        "incomplete_metadata": "member capabilities are incomplete",
        "incompatible_modalities": "members have no common input modalities",
        "duplicate_slug": "its public id is already used by another combo",
    }
)

BASE_INSTRUCTIONS = """\
You are Codex, a coding agent running in the user's terminal or editor. You help the user \
with software engineering work in their workspace: reading and changing code, running \
commands and tests, and explaining what you find.

How you work:
- Understand the request before acting. Inspect the relevant files and project conventions \
first; do not guess at code you have not read.
- Prefer small, focused changes that fix the root cause. Keep the existing style, naming and \
structure; do not reformat or rewrite unrelated code.
- Use the shell tool to explore (list files, search, read) and to build and run tests. Use \
the patch tool to edit files. Never print or exfiltrate secrets.
- Verify your work: run the narrowest relevant tests or checks after a change, and report \
honestly when something could not be verified.
- Ask before destructive or irreversible actions (deleting data, force-pushing, rewriting \
history) unless the user clearly asked for them.
- Keep the user informed with brief progress notes during longer tasks.

When you finish, reply concisely: what you changed and where, how you verified it, and \
anything left open or uncertain. Use Markdown sparingly, with file paths and commands in \
backticks.
"""


@dataclass
class CatalogResult:
    """Outcome of `build_catalog`.

    `models`: the rows of ``{"models": [...]}`` in priority order. `omitted`: (combo id, reason
    code — a key of `OMISSION_DETAILS`) for combos left out of the catalog but still routable
    (the admin's "Needs attention"). `warnings`: one human line per omission or shadowed row.
    """

    models: list[dict[str, Any]] = field(default_factory=list)
    omitted: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ComboCapabilities:
    """The intersection of a combo's members (behaviour §6.3 "Derived capabilities")."""

    context_window: int
    max_input_tokens: int
    input_modalities: tuple[str, ...]
    reasoning_efforts: tuple[str, ...]
    default_effort: str | None
    parallel_tool_calls: bool


def is_native_alias(combo: ComboSpec, native_models: Collection[str] = NATIVE_MODELS) -> bool:
    """True when `combo` owns a bare native slug (`nativeAlias` and a supported alias)."""
    return combo.native_alias and combo.alias is not None and combo.alias in native_models


def disable_selectors(
    combo: ComboSpec, native_models: Collection[str] = NATIVE_MODELS
) -> frozenset[str]:
    """Entries of `disabledModels` that hide `combo`: `combo/<id>` always, plus its alias unless
    it is a native alias (a bare native slug there means the dormant native row)."""
    selectors = {f"{COMBO_NAMESPACE}/{combo.id}"}
    if combo.alias and not is_native_alias(combo, native_models):
        selectors.add(combo.alias)
    return frozenset(selectors)


def combo_capabilities(
    combo: ComboSpec,
    snapshot: ConfigSnapshot,
    native_models: Mapping[str, ModelSpec] = NATIVE_MODELS,
) -> ComboCapabilities | str:
    """Intersect the members of `combo`, or return the omission reason code.

    Members are looked up as `providers[target.provider].models[target.model]` (disabled
    providers count: their configured metadata is still what the target can do). A native-alias
    combo fills a member's missing context/modality/ladder from the native model it replaces.
    Missing modalities count as ``["text"]``; `image` is dropped when `imageInput` is disabled.
    """
    if not combo.targets:
        return "no_targets"
    keys = [target.key for target in combo.targets]
    if len(set(keys)) != len(keys):
        return "duplicate_target"
    native = native_models.get(combo.alias or "") if is_native_alias(combo, native_models) else None
    members: list[ModelSpec] = []
    for target in combo.targets:
        provider = snapshot.providers.get(target.provider)
        spec = provider.models.get(target.model) if provider is not None else None
        if spec is None:
            return "missing_member"
        members.append(_fill_from_native(spec, native) if native is not None else spec)
    if any(m.context_window is None or m.context_window <= 0 for m in members):
        return "incomplete_metadata"
    modalities = [m for m in _modalities(members[0]) if all(m in _modalities(o) for o in members)]
    if combo.image_input == "disabled":
        modalities = [m for m in modalities if m != "image"]
    if not modalities:
        return "incompatible_modalities"
    contexts = [m.context_window for m in members if m.context_window is not None]
    max_inputs = [m.max_input_tokens or m.context_window or 0 for m in members]
    ladder = combo_ladder([m.reasoning_efforts for m in members], mode=combo.reasoning_effort_mode)
    return ComboCapabilities(
        context_window=min(contexts),
        max_input_tokens=min(max_inputs),
        input_modalities=tuple(modalities),
        reasoning_efforts=ladder,
        default_effort=default_effort_for(combo.default_effort, ladder),
        parallel_tool_calls=all(m.parallel_tool_calls is True for m in members),
    )


def build_catalog(
    snapshot: ConfigSnapshot, *, native_models: Mapping[str, ModelSpec] = NATIVE_MODELS
) -> CatalogResult:
    """Build the Codex catalog rows for `snapshot` (PRODUCT.md §7).

    Order/priority: combos first (sorted by id), then every model of every enabled provider
    (providers sorted by name, models in configured order), priorities 1, 2, 3, …. Combo slug =
    alias or `combo/<id>`; a combo slug equal to a provider row's slug shadows that row. Rows
    selected by `disabledModels` get ``visibility: "hide"`` (usable with `-m`, not listed).
    """
    result = CatalogResult()
    combo_rows: list[tuple[str, dict[str, Any]]] = []
    slugs: set[str] = set()
    for combo_id in sorted(snapshot.combos):
        combo = snapshot.combos[combo_id]
        slug = combo.public_id
        keys = ", ".join(sorted(target.key for target in combo.targets))
        caps = combo_capabilities(combo, snapshot, native_models)
        if isinstance(caps, str) or slug in slugs:
            reason = caps if isinstance(caps, str) else "duplicate_slug"
            result.omitted.append((combo.id, reason))
            gaps = _member_gaps(combo, snapshot) if reason == "incomplete_metadata" else ""
            result.warnings.append(
                f'Combo "{combo.id}" is omitted from the catalog because '
                f"{OMISSION_DETAILS[reason]}: {keys}.{gaps}"
            )
            slugs.add(slug)  # still routable under this id, so it shadows provider rows too
            continue
        slugs.add(slug)
        hidden = bool(disable_selectors(combo, native_models) & snapshot.disabled_models)
        route = " → ".join(target.key for target in combo.targets)
        row = _row(
            slug=slug,
            display_name=combo.display_name or slug,
            description=f"Routed via ocx {COMBO_NAMESPACE}/{combo.id} ({combo.strategy}): {route}",
            ladder=caps.reasoning_efforts,
            default_level=picker_default(caps.reasoning_efforts, caps.default_effort),
            modalities=caps.input_modalities,
            context_window=caps.context_window,
            max_input_tokens=caps.max_input_tokens,
            parallel=caps.parallel_tool_calls,
            visibility="hide" if hidden else "list",
        )
        combo_rows.append((slug, row))

    provider_rows: list[tuple[str, dict[str, Any]]] = []
    for name in sorted(snapshot.providers):
        provider = snapshot.providers[name]
        if provider.disabled:
            continue
        for model_id, spec in provider.models.items():
            slug = f"{name}/{model_id}"
            if slug in slugs:
                result.warnings.append(
                    f'Provider model row "{slug}" is shadowed by the combo with that public id.'
                )
                continue
            ladder = spec.reasoning_efforts or ()
            row = _row(
                slug=slug,
                display_name=spec.display_name or slug,
                description=f"{model_id} via provider {name} (ocx)",
                ladder=ladder,
                default_level=picker_default(ladder),
                modalities=_modalities(spec),
                context_window=spec.context_window,
                max_input_tokens=spec.max_input_tokens,
                parallel=spec.parallel_tool_calls is True,
                visibility="hide" if slug in snapshot.disabled_models else "list",
            )
            provider_rows.append((slug, row))

    for priority, (_, row) in enumerate(combo_rows + provider_rows, start=1):
        row["priority"] = priority
        result.models.append(row)
    return result


# Model metadata a catalog row is built from, by its provider-config name.
METADATA_FIELDS: tuple[str, ...] = ("contextWindow", "inputModalities", "reasoningEfforts")


def model_gaps(spec: ModelSpec) -> tuple[str, ...]:
    """The metadata fields `spec` lacks (contextWindow is required for combo rows; without
    inputModalities a model is text-only, without reasoningEfforts it has no effort picker)."""
    present = {
        "contextWindow": spec.context_window is not None and spec.context_window > 0,
        "inputModalities": spec.input_modalities is not None,
        "reasoningEfforts": spec.reasoning_efforts is not None,
    }
    return tuple(name for name in METADATA_FIELDS if not present[name])


def _member_gaps(combo: ComboSpec, snapshot: ConfigSnapshot) -> str:
    notes = []
    for target in combo.targets:
        provider = snapshot.providers.get(target.provider)
        spec = provider.models.get(target.model) if provider is not None else None
        if spec is not None and "contextWindow" in model_gaps(spec):
            notes.append(f"{target.key} lacks {', '.join(model_gaps(spec))}")
    return (" " + "; ".join(notes) + ".") if notes else ""


def catalog_problems(snapshot: ConfigSnapshot, result: CatalogResult) -> list[str]:
    """Why the catalog is empty or thin, in terms an operator can act on: providers without
    models, and every model (by `provider/model`) with the metadata fields it lacks."""
    lines: list[str] = []
    enabled = [snapshot.providers[n] for n in sorted(snapshot.providers)]
    enabled = [p for p in enabled if not p.disabled]
    if not result.models:
        if not enabled:
            lines.append("the catalog is empty: no enabled provider is configured")
        for provider in enabled:
            if not provider.models:
                lines.append(
                    f"the catalog is empty: provider {provider.name} has no models "
                    f"(add them with `ocx provider add {provider.name} --preset P` "
                    "or `--model ID:CONTEXT_WINDOW`)"
                )
    for provider in enabled:
        for model_id, spec in provider.models.items():
            gaps = model_gaps(spec)
            if gaps:
                lines.append(f"model {provider.name}/{model_id} lacks {', '.join(gaps)}")
    for combo_id, reason in result.omitted:
        lines.append(f"combo/{combo_id} is left out of the catalog: {OMISSION_DETAILS[reason]}")
    return lines


def catalog_json(result: CatalogResult) -> bytes:
    """Serialize `result` as the `model_catalog_json` file: ``{"models": [...]}``, UTF-8 without
    BOM, deterministic key order (the row order of codex-wire.md §1.4), trailing newline."""
    text = json.dumps({"models": result.models}, ensure_ascii=False, indent=2)
    return (text + "\n").encode("utf-8")


def models_list(
    snapshot: ConfigSnapshot,
    *,
    created: int = 0,
    native_models: Mapping[str, ModelSpec] = NATIVE_MODELS,
) -> dict[str, Any]:
    """`GET /v1/models` body in OpenAI list shape for every routable public id.

    Combos (including ones omitted from the Codex catalog — they still route) come first with
    ``owned_by: "combo"``, then enabled provider models (`provider/model`, owned by the provider
    name); ids selected by `disabledModels` are left out and a combo slug shadows an equal
    provider id. `created` is injected (Unix seconds) to keep this pure.
    """
    data: list[dict[str, Any]] = []
    seen: set[str] = set()
    for combo_id in sorted(snapshot.combos):
        combo = snapshot.combos[combo_id]
        slug = combo.public_id
        if slug in seen:
            continue
        seen.add(slug)
        if disable_selectors(combo, native_models) & snapshot.disabled_models:
            continue
        data.append({"id": slug, "object": "model", "created": created, "owned_by": "combo"})
    for name in sorted(snapshot.providers):
        provider = snapshot.providers[name]
        if provider.disabled:
            continue
        for model_id in provider.models:
            slug = f"{name}/{model_id}"
            if slug in seen or slug in snapshot.disabled_models:
                continue
            seen.add(slug)
            data.append({"id": slug, "object": "model", "created": created, "owned_by": name})
    return {"object": "list", "data": data}


# --- schema check ------------------------------------------------------------------------

_REQUIRED: Mapping[str, type | tuple[type, ...]] = MappingProxyType(
    {
        "slug": str,
        "display_name": str,
        "supported_reasoning_levels": list,
        "shell_type": str,
        "visibility": str,
        "supported_in_api": bool,
        "priority": int,
        "base_instructions": str,
        "supports_reasoning_summaries": bool,
        "support_verbosity": bool,
        "truncation_policy": dict,
        "supports_parallel_tool_calls": bool,
        "experimental_supported_tools": list,
    }
)
# Optional, but serde has no null for them: absent is fine, null aborts Codex startup.
_NON_NULL: Mapping[str, type | tuple[type, ...]] = MappingProxyType(
    {
        "supports_reasoning_summary_parameter": bool,
        "default_reasoning_summary": str,
        "web_search_tool_type": str,
        "supports_image_detail_original": bool,
        "effective_context_window_percent": int,
        "input_modalities": list,
        "supports_search_tool": bool,
        "use_responses_lite": bool,
        "tool_mode": str,
    }
)
_NULLABLE: Mapping[str, type | tuple[type, ...]] = MappingProxyType(
    {
        "description": str,
        "default_reasoning_level": str,
        "upgrade": dict,
        "model_messages": dict,
        "default_verbosity": str,
        "apply_patch_tool_type": str,
        "context_window": int,
        "max_context_window": int,
        "auto_compact_token_limit": int,
        "availability_nux": dict,
    }
)
_ENUMS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "shell_type": frozenset({"default", "local", "unified_exec", "disabled", "shell_command"}),
        "visibility": frozenset({"list", "hide", "none"}),
        "default_reasoning_summary": frozenset({"auto", "concise", "detailed", "none"}),
        "default_verbosity": frozenset({"low", "medium", "high"}),
        "apply_patch_tool_type": frozenset({"freeform"}),
        "web_search_tool_type": frozenset({"text", "text_and_image"}),
        "tool_mode": frozenset({"direct", "code_mode", "code_mode_only"}),
    }
)


def validate_catalog(obj: object) -> list[str]:
    """Check a catalog against the strict-parse rules of codex-wire.md §1.1/§1.3; [] means valid.

    Accepts the parsed object or the raw file bytes/str (then also: UTF-8, no BOM, valid JSON).
    Checks: top-level ``{"models": [...]}`` with at least one model; every required field
    present with the right type and never null; non-Option fields never null; enum values;
    reasoning levels `{effort, description}` with non-empty effort; a default level that is on
    the ladder; non-empty `base_instructions`; `supported_in_api` true; unique slugs.
    """
    if isinstance(obj, bytes | str):
        raw = obj.encode("utf-8") if isinstance(obj, str) else obj
        if raw.startswith(b"\xef\xbb\xbf"):
            return ["file starts with a UTF-8 BOM"]
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return [f"not valid UTF-8 JSON: {exc}"]
    if not isinstance(obj, dict) or not isinstance(obj.get("models"), list):
        return ['top level must be an object with a "models" array']
    models: list[Any] = obj["models"]
    if not models:
        return ["catalog must contain at least one model"]
    errors: list[str] = []
    slugs: set[str] = set()
    for index, row in enumerate(models):
        where = f"models[{index}]"
        if not isinstance(row, dict):
            errors.append(f"{where} must be an object")
            continue
        errors.extend(_check_row(row, where))
        slug = row.get("slug")
        if isinstance(slug, str):
            if slug in slugs:
                errors.append(f"{where}.slug {slug!r} is duplicated")
            slugs.add(slug)
    return errors


def _check_row(row: Mapping[str, Any], where: str) -> list[str]:
    errors: list[str] = []
    for key, kind in _REQUIRED.items():
        if key not in row:
            errors.append(f"{where}.{key} is required")
        elif not _is(row[key], kind):
            errors.append(f"{where}.{key} must be {_kind_name(kind)}, not {row[key]!r}")
    for key, kind in _NON_NULL.items():
        if key in row and not _is(row[key], kind):
            errors.append(f"{where}.{key} must be {_kind_name(kind)}, not {row[key]!r}")
    for key, kind in _NULLABLE.items():
        if row.get(key) is not None and not _is(row[key], kind):
            errors.append(f"{where}.{key} must be {_kind_name(kind)} or null")
    for key, allowed in _ENUMS.items():
        value = row.get(key)
        if isinstance(value, str) and value not in allowed:
            errors.append(f"{where}.{key} {value!r} is not one of {sorted(allowed)}")
    if isinstance(row.get("slug"), str) and not row["slug"].strip():
        errors.append(f"{where}.slug must not be empty")
    if row.get("supported_in_api") is False:
        errors.append(f"{where}.supported_in_api must be true (API-key clients drop the model)")
    if isinstance(row.get("base_instructions"), str) and not row["base_instructions"].strip():
        errors.append(f"{where}.base_instructions must be a real system prompt")
    efforts: list[str] = []
    for i, level in enumerate(row.get("supported_reasoning_levels") or []):
        ok = isinstance(level, dict) and isinstance(level.get("description"), str)
        effort = level.get("effort") if isinstance(level, dict) else None
        if not ok or not isinstance(effort, str) or not effort:
            errors.append(f"{where}.supported_reasoning_levels[{i}] needs effort and description")
        else:
            efforts.append(effort)
    default = row.get("default_reasoning_level")
    if isinstance(default, str) and default not in efforts:
        errors.append(f"{where}.default_reasoning_level {default!r} is not a supported level")
    policy = row.get("truncation_policy")
    if isinstance(policy, dict) and (
        policy.get("mode") not in ("bytes", "tokens") or not _is(policy.get("limit"), int)
    ):
        errors.append(f'{where}.truncation_policy needs mode "bytes"|"tokens" and an int limit')
    for name in ("input_modalities", "experimental_supported_tools"):
        items = row.get(name)
        if isinstance(items, list) and not all(isinstance(item, str) for item in items):
            errors.append(f"{where}.{name} must contain strings only")
    modalities = row.get("input_modalities")
    if isinstance(modalities, list) and (
        not modalities or any(item not in MODALITIES for item in modalities)
    ):
        errors.append(f"{where}.input_modalities must be a non-empty subset of {list(MODALITIES)}")
    return errors


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    # bool is an int subclass in Python but not in serde.
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", list: "an array"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, "an object") for k in kind)
    return names.get(kind, "an object")


# --- row shape ---------------------------------------------------------------------------


def _modalities(spec: ModelSpec) -> tuple[str, ...]:
    # Missing modalities count as text-only (§6.3); Codex only knows text/image/audio.
    listed = tuple(m for m in (spec.input_modalities or ("text",)) if m in MODALITIES)
    return listed or ("text",)


def _fill_from_native(spec: ModelSpec, native: ModelSpec) -> ModelSpec:
    # Fills only what the target lacks; explicit target limits always win.
    ladder = spec.reasoning_efforts
    return ModelSpec(
        id=spec.id,
        context_window=spec.context_window or native.context_window,
        max_input_tokens=spec.max_input_tokens or native.max_input_tokens,
        input_modalities=spec.input_modalities or native.input_modalities,
        reasoning_efforts=ladder if ladder is not None else native.reasoning_efforts,
        display_name=spec.display_name,
        parallel_tool_calls=spec.parallel_tool_calls,
    )


def _row(
    *,
    slug: str,
    display_name: str,
    description: str,
    ladder: tuple[str, ...],
    default_level: str | None,
    modalities: tuple[str, ...],
    context_window: int | None,
    max_input_tokens: int | None,
    parallel: bool,
    visibility: str,
) -> dict[str, Any]:
    reasoning = bool(ladder)
    row: dict[str, Any] = {
        "slug": slug,
        "display_name": display_name,
        "description": description,
        "default_reasoning_level": default_level,
        "supported_reasoning_levels": [
            {"effort": effort, "description": EFFORT_DESCRIPTIONS.get(effort, f"{effort} effort")}
            for effort in ladder
        ],
        "shell_type": "shell_command",
        "visibility": visibility,
        "supported_in_api": True,
        "priority": 0,  # assigned by build_catalog
        "availability_nux": None,
        "upgrade": None,
        "base_instructions": BASE_INSTRUCTIONS
        + f"\nYou are answering as the model `{slug}` ({display_name}), served through ocx.\n",
        "supports_reasoning_summaries": reasoning,
        "supports_reasoning_summary_parameter": reasoning,
        "default_reasoning_summary": "auto" if reasoning else "none",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": None,
        "web_search_tool_type": "text",
        "truncation_policy": {"mode": "bytes", "limit": 10000},
        "supports_parallel_tool_calls": parallel,
        "supports_image_detail_original": False,
    }
    if context_window is not None and context_window > 0:
        max_input = min(max_input_tokens or context_window, context_window)
        row["context_window"] = context_window
        row["max_context_window"] = context_window
        # §6.3: min(floor(context × 0.9), maxInputTokens).
        row["auto_compact_token_limit"] = min(context_window * 9 // 10, max_input)
    row["effective_context_window_percent"] = 95
    row["experimental_supported_tools"] = []
    row["input_modalities"] = list(modalities)
    row["supports_search_tool"] = False
    row["use_responses_lite"] = False
    row["tool_mode"] = "direct"
    return row
