"""`ocx provider list|show|add|set|remove`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from django.core.management.base import CommandError, CommandParser

from providers import presets, selectors, services
from providers.errors import ConfigError
from providers.management.base import ExamplesCommand
from providers.models import Provider
from providers.pricing_note import unpriced_models


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


def _set_parser() -> _Parser:
    p = _Parser(prog="ocx provider set", add_help=False)
    p.add_argument("name", nargs="?")
    p.add_argument("--adapter")
    p.add_argument("--base-url")
    p.add_argument("--api-key-env")
    p.add_argument("--api-key-stdin", action="store_true", help="read the API key from stdin")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--model", action="append", default=[], metavar="ID[:CONTEXT_WINDOW]")
    p.add_argument("--disabled", action="store_true")
    p.add_argument("--enabled", action="store_true")
    p.add_argument(
        "--max-connections",
        metavar="N|-",
        help="upstream connections per worker (- = the OCX_UPSTREAM_MAX_CONNECTIONS default)",
    )
    p.add_argument(
        "--pricing-provider",
        metavar="ID|-",
        help="genai-prices provider id for costs (- = inferred from adapter and base URL)",
    )
    p.add_argument("--from-json", metavar="JSON", help="the whole provider object as JSON")
    return p


def _headers(items: list[str], current: Mapping[str, object]) -> dict[str, object]:
    headers = dict(current)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CommandError(f"invalid header {item!r}; use NAME=VALUE")
        headers[name.strip()] = value
    return headers


def _models(items: list[str], current: Mapping[str, Any]) -> dict[str, Any]:
    models = dict(current)
    for item in items:
        model_id, sep, ctx = item.rpartition(":")
        if sep and ctx.isdigit():
            models[model_id] = {**models.get(model_id, {}), "contextWindow": int(ctx)}
        else:
            models.setdefault(item, {})
    return models


USAGE = """\
ocx provider list
       ocx provider show NAME
       ocx provider add NAME --preset openai|anthropic|chatgpt|openrouter|ollama|vllm
                        [--base-url URL] [--api-key-env VAR | --api-key-stdin]
                        [--header NAME=VALUE ...] [--model ID[:CONTEXT_WINDOW] ...]
       ocx provider set NAME [--adapter A] [--base-url URL] [--api-key-env VAR | --api-key-stdin]
                        [--header NAME=VALUE ...] [--model ID[:CONTEXT_WINDOW] ...]
                        [--disabled | --enabled] [--max-connections N|-]
                        [--pricing-provider ID|-] [--from-json JSON]
       ocx provider remove NAME --yes
"""
EPILOG = """\
adapters: openai-responses, openai-chat, anthropic, chatgpt.
A new provider needs --adapter and --base-url; on an existing one every option is optional and
changes only that field (the rest is kept).

examples:
  ocx provider add openai --preset openai          # key from $OPENAI_API_KEY
  ocx provider set openai --adapter openai-responses --base-url https://api.openai.com/v1 \\
      --api-key-env OPENAI_API_KEY --model gpt-5.2:400000
  printf '%s' "$KEY" | ocx provider set local --adapter openai-chat \\
      --base-url http://127.0.0.1:8000/v1 --api-key-stdin --model qwen3-coder:128000
  ocx provider show openai
  ocx provider set openai --disabled
  ocx provider set openai --max-connections 2000   # per worker; default 1024
  ocx provider set gateway --pricing-provider openai  # cost its requests at OpenAI's prices
  ocx provider set local --from-json '{"adapter": "openai-chat", "baseUrl":
      "http://127.0.0.1:8000/v1", "models": {"qwen3-coder": {"contextWindow": 128000,
      "price": {"inputPerMTok": 0, "outputPerMTok": 0}}}}'   # a model's own price
  ocx provider remove local --yes
"""


class Command(ExamplesCommand):
    help = "List, show, add (from a preset), create/update and remove providers."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args)
        sub = (
            {"create": "set", "update": "set", "delete": "remove"}.get(argv[0], argv[0])
            if argv
            else "list"
        )
        rest = argv[1:]
        try:
            if sub == "list":
                self._list()
            elif sub == "show":
                self._show(rest)
            elif sub == "set":
                self._set(rest)
            elif sub == "add":
                self._add(rest)
            elif sub == "remove":
                self._remove(rest)
            else:
                raise CommandError(f"unknown provider command {sub}")
        except ConfigError as exc:
            extra = f" (combos: {', '.join(exc.extra['combos'])})" if "combos" in exc.extra else ""  # type: ignore[arg-type]
            raise CommandError(exc.message + extra) from None

    def _list(self) -> None:
        providers = list(Provider.objects.all())
        if not providers:
            self.stdout.write(
                "No providers configured. Add one with: ocx provider set NAME "
                "--adapter openai-responses --base-url URL --api-key-env VAR"
            )
        for p in providers:
            state = " (disabled)" if p.disabled else ""
            self.stdout.write(f"{p.name}  {p.adapter}  {p.base_url}{state}")

    def _show(self, rest: list[str]) -> None:
        if len(rest) != 1:
            raise CommandError("provider name is required")
        provider = Provider.objects.prefetch_related("models").filter(name=rest[0]).first()
        if provider is None:
            raise CommandError(f"unknown provider {rest[0]}")
        out = {"name": provider.name, **selectors.provider_stored_raw(provider)}
        out["apiKeySet"] = bool(provider.api_key_sealed)
        self.stdout.write(json.dumps(out, indent=2))

    def _set(self, rest: list[str]) -> None:
        ns, extra = _set_parser().parse_known_args(rest)
        if extra:
            raise CommandError(f"unexpected argument {extra[0]}")
        if not ns.name:
            raise CommandError("provider name is required")
        existing = Provider.objects.prefetch_related("models").filter(name=ns.name).first()
        raw: dict[str, object] = {}
        if existing is not None:
            raw = dict(selectors.provider_raw(existing))
        if ns.from_json:
            try:
                loaded = json.loads(ns.from_json)
            except ValueError:
                raise CommandError("--from-json is not valid JSON") from None
            if not isinstance(loaded, dict):
                raise CommandError("--from-json must be a JSON object")
            raw = loaded
        if ns.adapter:
            raw["adapter"] = ns.adapter
        if ns.base_url:
            raw["baseUrl"] = ns.base_url
        if ns.api_key_env is not None:
            if ns.api_key_env == "-":
                raw.pop("apiKeyEnv", None)
            else:
                raw["apiKeyEnv"] = ns.api_key_env
        if ns.api_key_stdin:
            key = sys.stdin.readline().strip()
            if not key:
                raise CommandError("no API key on stdin")
            raw["apiKey"] = key
        if ns.header:
            raw["headers"] = _headers(ns.header, raw.get("headers") or {})  # type: ignore[arg-type]
        if ns.model:
            raw["models"] = _models(ns.model, raw.get("models") or {})  # type: ignore[arg-type]
        if ns.disabled and ns.enabled:
            raise CommandError("--disabled and --enabled are exclusive")
        if ns.disabled:
            raw["disabled"] = True
        if ns.enabled:
            raw.pop("disabled", None)
        if ns.max_connections == "-":
            raw.pop("maxConnections", None)
        elif ns.max_connections is not None:
            # Not a number stays a string: the validator's message names the field and range.
            text = ns.max_connections.strip()
            raw["maxConnections"] = int(text) if text.isdigit() else text
        if ns.pricing_provider == "-":
            raw.pop("pricingProvider", None)
        elif ns.pricing_provider is not None:
            raw["pricingProvider"] = ns.pricing_provider.strip()
        # `raw` starts from the stored provider: only what this command gives counts as the key
        # given again (a changed address needs it: services.key_follow_problem).
        given = bool(ns.api_key_stdin or (ns.api_key_env and ns.api_key_env != "-"))
        if ns.from_json:
            given = given or "apiKey" in raw or "apiKeyEnv" in raw
        provider = services.provider_set(name=ns.name, raw=raw, key_given=given)
        self.stdout.write(f"Saved provider {provider.name}.")

    def _add(self, rest: list[str]) -> None:
        p = _Parser(prog="ocx provider add", add_help=False)
        p.add_argument("name")
        p.add_argument("--preset", required=True, choices=presets.NAMES)
        p.add_argument("--base-url")
        p.add_argument("--api-key-env")
        p.add_argument("--api-key-stdin", action="store_true")
        p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
        p.add_argument("--model", action="append", default=[], metavar="ID[:CONTEXT_WINDOW]")
        ns = p.parse_args(rest)
        if Provider.objects.filter(name=ns.name).exists():
            raise CommandError(
                f"provider {ns.name} already exists; change it with: ocx provider set {ns.name} …"
            )
        raw: dict[str, object] = {"preset": ns.preset}
        if ns.base_url:
            raw["baseUrl"] = ns.base_url
        if ns.api_key_env:
            raw["apiKeyEnv"] = ns.api_key_env
        if ns.api_key_stdin:
            key = sys.stdin.readline().strip()
            if not key:
                raise CommandError("no API key on stdin")
            raw["apiKey"] = key
        if ns.header:
            raw["headers"] = _headers(ns.header, {})
        if ns.model:
            raw["models"] = _models(ns.model, {})
        services.provider_set(name=ns.name, raw=raw)
        provider = Provider.objects.prefetch_related("models").get(name=ns.name)
        stored = selectors.provider_stored_raw(provider)
        models = ", ".join(m.model_id for m in provider.models.all()) or "none"
        self.stdout.write(
            f"Added provider {provider.name} from preset {ns.preset}: {provider.adapter} "
            f"{provider.base_url}; models: {models}."
        )
        env = stored.get("apiKeyEnv")
        if isinstance(env, str) and env:
            note = "" if os.environ.get(env) else " (not set in this shell)"
            self.stdout.write(f"Its key is read from ${env}{note} by `ocx serve` at each request.")
        if provider.adapter == "chatgpt":
            self.stdout.write(
                "Callers use their own ChatGPT login: Codex sends its ChatGPT token as the "
                "bearer, and the ocx key goes in the x-ocx-key header (see README)."
            )
        if not provider.models.exists():
            self.stdout.write(
                f"Add the models you serve: ocx provider set {provider.name} "
                "--model ID:CONTEXT_WINDOW"
            )
        unpriced = unpriced_models(stored)
        if unpriced is not None:
            # Loudly: under a dollar budget such a model is refused (400 model_unpriced).
            listed = ", ".join(unpriced) if unpriced else "every model you add"
            self.stderr.write(
                f"WARNING: provider {provider.name} has no prices ({listed}): its requests get "
                "no cost, and a key, user or team with a dollar budget is refused them "
                f"(model_unpriced). Price them: ocx provider set {provider.name} "
                "--pricing-provider openai (whose price list to use), or give each model a "
                '"price" {"inputPerMTok": …, "outputPerMTok": …} (docs/usage.md#cost)'
            )

    def _remove(self, rest: list[str]) -> None:
        names = [a for a in rest if a != "--yes"]
        if len(names) != 1:
            raise CommandError("provider name is required")
        if "--yes" not in rest:
            raise CommandError("remove requires --yes")
        services.provider_delete(name=names[0])
        self.stdout.write(f"Removed provider {names[0]}.")
