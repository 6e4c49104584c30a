"""Provider presets: `ocx provider add NAME --preset P`, `"preset"` in `PUT /api/providers`, and
the preset choice of the admin's add form all read this one data table.

Checked on 2026-12-01. Model numbers change: operators should check them against the
provider's own model pages before relying on them, and override any field explicitly.
Numbers are deliberately conservative (the smallest figure we found for the model family),
because Codex compacts history at ~90% of `contextWindow` and a window that is too large makes
requests fail upstream instead.

Sources (as of 2026-12-01):
- OpenAI API reference (api.openai.com, `POST /v1/responses`, `Authorization: Bearer`,
  OPENAI_API_KEY by convention) and the Codex model catalog: the bare native slugs ocx
  supports for `nativeAlias` (`routing.catalog.NATIVE_MODELS`: gpt-5.6-sol,
  gpt-5.6-terra, gpt-5.5); 272000 tokens is the input window Codex's bundled catalog uses
  for the GPT-5 family, efforts low/medium/high are offered by every GPT-5 model.
- Anthropic Messages API (`POST https://api.anthropic.com/v1/messages`, `x-api-key`,
  `anthropic-version: 2023-06-01`); 200000-token context for Claude Sonnet 4.5 / Opus 4.x;
  ocx maps efforts to thinking budgets (`providers/wire/anthropic.py`); "Prefill Claude's
  response" (a final assistant message is continued; no trailing whitespace), hence
  `prefill: true`.
- ChatGPT Codex backend (`https://chatgpt.com/backend-api/codex`, Responses API): Codex's own
  default base URL under ChatGPT login; it takes the caller's ChatGPT access token and
  `chatgpt-account-id`, so ocx stores no credential for it (caller-forward).
- OpenRouter (`https://openrouter.ai/api/v1`, OpenAI-compatible Chat Completions,
  OPENROUTER_API_KEY, optional `X-Title` attribution header); qwen/qwen3-coder-plus: 128000
  tokens, text only, no effort control.
- Ollama (`http://127.0.0.1:11434/v1`, OpenAI-compatible, no key) and vLLM
  (`http://127.0.0.1:8000/v1`, OpenAI-compatible, a key only if the server was started with
  `--api-key`): the models are whatever you serve, so these presets list none; add yours with
  `--model ID:CONTEXT_WINDOW`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from providers.errors import ConfigError

CHECKED = "2026-12-01"

_GPT5: dict[str, Any] = {
    "contextWindow": 272000,
    "inputModalities": ["text", "image"],
    "reasoningEfforts": ["low", "medium", "high"],
}
_CLAUDE: dict[str, Any] = {
    "contextWindow": 200000,
    "inputModalities": ["text", "image"],
    "reasoningEfforts": ["low", "medium", "high"],
    # Anthropic documents prefilling the assistant turn (a final assistant message is
    # continued): a broken stream may be continued there (`afterCommit: "continue"`).
    "prefill": True,
}
_OPENAI_MODELS: dict[str, dict[str, Any]] = {
    "gpt-5.6-sol": {**_GPT5, "displayName": "GPT-5.6 Sol"},
    "gpt-5.6-terra": {**_GPT5, "displayName": "GPT-5.6 Terra"},
    "gpt-5.5": {**_GPT5, "displayName": "GPT-5.5"},
}

PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "openai": {
            "description": "OpenAI API (Responses), key in $OPENAI_API_KEY",
            "provider": {
                "adapter": "openai-responses",
                "baseUrl": "https://api.openai.com/v1",
                "apiKeyEnv": "OPENAI_API_KEY",
                "models": _OPENAI_MODELS,
            },
        },
        "anthropic": {
            "description": "Anthropic Messages API, key in $ANTHROPIC_API_KEY",
            "provider": {
                "adapter": "anthropic",
                "baseUrl": "https://api.anthropic.com/v1",
                "apiKeyEnv": "ANTHROPIC_API_KEY",
                "headers": {"anthropic-version": "2023-06-01"},
                "models": {
                    "claude-sonnet-4-5": {**_CLAUDE, "displayName": "Claude Sonnet 4.5"},
                    "claude-opus-4-8": {**_CLAUDE, "displayName": "Claude Opus 4.8"},
                },
            },
        },
        "chatgpt": {
            "description": (
                "ChatGPT Codex backend: each caller's own ChatGPT login is forwarded "
                "(Authorization: Bearer <ChatGPT token>, ocx key in x-ocx-key)"
            ),
            "provider": {
                "adapter": "chatgpt",
                "baseUrl": "https://chatgpt.com/backend-api/codex",
                "models": _OPENAI_MODELS,
            },
        },
        "openrouter": {
            "description": "OpenRouter (OpenAI-compatible chat), key in $OPENROUTER_API_KEY",
            "provider": {
                "adapter": "openai-chat",
                "baseUrl": "https://openrouter.ai/api/v1",
                "apiKeyEnv": "OPENROUTER_API_KEY",
                "headers": {"X-Title": "ocx"},
                "models": {
                    "qwen/qwen3-coder-plus": {
                        "contextWindow": 128000,
                        "inputModalities": ["text"],
                        "reasoningEfforts": [],
                        "displayName": "Qwen3 Coder Plus",
                    },
                },
            },
        },
        "ollama": {
            "description": "Ollama on this machine (no key); add your models with --model",
            "provider": {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:11434/v1"},
        },
        "vllm": {
            "description": "vLLM on this machine (key only with vllm --api-key); add models",
            "provider": {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:8000/v1"},
        },
    }
)
NAMES: tuple[str, ...] = tuple(PRESETS)
# Whose prices a preset's models cost (the genai-prices id). Set on a provider made from the
# preset when its base URL is not the preset's (a company gateway, `10.x`, a mock): ocx infers
# no prices for a private address, and a dollar budget must still count (issue 42).
PRESET_PRICING: Mapping[str, str] = MappingProxyType(
    {"openai": "openai", "anthropic": "anthropic", "openrouter": "openrouter"}
)


def preset_provider(name: str) -> dict[str, Any]:
    """A deep copy of preset `name`'s provider object (camelCase, as `PUT /api/providers`)."""
    preset = PRESETS.get(name)
    if preset is None:
        raise ConfigError(f'unknown preset "{name}"; one of: {", ".join(NAMES)}')
    return copy.deepcopy(dict(preset["provider"]))


def expand(raw: Mapping[str, object]) -> dict[str, object]:
    """`raw` with its `preset` applied: the preset's fields, then every field `raw` gives
    explicitly on top (headers merge by name; null removes the preset's field). Explicit
    `models` replace the preset's list; a model the preset knows gets its metadata, with
    explicit fields winning."""
    out: dict[str, object] = dict(raw)
    name = out.pop("preset", None)
    if name is None:
        return out
    if not isinstance(name, str):
        raise ConfigError("preset must be a string")
    base = preset_provider(name)
    known: dict[str, Any] = base.get("models", {})
    merged: dict[str, object] = {**base, **out}
    for key, value in out.items():
        if value is None and key != "apiKey":
            merged.pop(key)  # an explicit null drops the preset's value (e.g. apiKeyEnv)
    headers = out.get("headers")
    if isinstance(headers, Mapping) and "headers" in base:
        merged["headers"] = {**base["headers"], **headers}
    moved = merged.get("baseUrl") != base.get("baseUrl")
    if name in PRESET_PRICING and moved and "pricingProvider" not in out:
        merged["pricingProvider"] = PRESET_PRICING[name]
    models = out.get("models")
    if isinstance(models, Mapping):
        merged["models"] = {
            model_id: {**known.get(model_id, {}), **spec} if isinstance(spec, Mapping) else spec
            for model_id, spec in models.items()
        }
    return merged
