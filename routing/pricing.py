"""Prices and the cost of a served request (issue 27). Pure: no Django, no I/O.

A target's price, first found wins:
1. the model's own metadata `price` (USD per million tokens);
2. the data bundled with the installed `genai-prices` package, for the provider's pricing
   provider id: its `pricingProvider`, else `pricing_provider()` infers one from the adapter
   and base URL (a local server has none).
Nothing here starts genai-prices' `UpdatePrices` (its only network use), so computing a price
never leaves the machine; the package is imported on the first lookup, off the hot path.

Usage as ocx records it (`providers.wire.usage`): `input` includes the cached input (Anthropic's
cache reads and writes folded in), `output` includes the reasoning tokens. So a request costs
(input - cached) x input rate + cached x cached-input rate + output x output rate; reasoning is
billed as the output it is part of, never twice. Cache writes are billed at the input rate.

A `chatgpt` target is a subscription: it costs nothing per token, and what the same usage
would have cost at API prices is its `api_value_usd`. For every other target the API value is
its cost.
"""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from routing.types import ConfigSnapshot, ModelPrice, ProviderSpec

PER_TOKENS = 1_000_000
# Adapters billed by subscription, not per token; their API value is at OpenAI's API prices.
SUBSCRIPTION_ADAPTERS: Mapping[str, str] = {"chatgpt": "openai"}
# The provider a native adapter stands for when its base URL names none the data knows (a
# gateway or proxy in front of it). A Chat Completions server could be anything: no default.
_ADAPTER_DEFAULTS: Mapping[str, str] = {"anthropic": "anthropic", "openai-responses": "openai"}
_LOCAL_SUFFIXES = (".local", ".localhost", ".internal", ".lan", ".home.arpa")


@dataclass(frozen=True)
class Rate:
    """USD per million tokens: `base`, or the price of the last tier whose start the request's
    input tokens exceed (the whole request at that price, as the providers bill long prompts)."""

    base: float
    tiers: tuple[tuple[int, float], ...] = ()

    def at(self, input_tokens: int) -> float:
        for start, price in reversed(self.tiers):
            if input_tokens > start:
                return price
        return self.base


@dataclass(frozen=True)
class Rates:
    input: Rate
    cached_input: Rate
    output: Rate
    # Where the rates came from, for messages: "metadata" or "genai-prices openai/gpt-5".
    source: str

    def cost(self, *, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        cached = min(max(cached_tokens, 0), input_tokens)
        n = input_tokens
        usd = (
            (input_tokens - cached) * self.input.at(n)
            + cached * self.cached_input.at(n)
            + output_tokens * self.output.at(n)
        )
        return usd / PER_TOKENS


@dataclass(frozen=True)
class Priced:
    """A request's cost (None = unknown), its value at API prices, and whether its target has
    no price at all (counted as `unpricedRequests`)."""

    cost_usd: float | None
    api_value_usd: float | None
    unpriced: bool


NOT_SERVED = Priced(None, None, False)


def metadata_rates(price: ModelPrice) -> Rates:
    cached = price.input if price.cached_input is None else price.cached_input
    return Rates(Rate(price.input), Rate(cached), Rate(price.output), "metadata")


# --- the genai-prices data ---------------------------------------------------------------------


def _snapshot() -> Any:
    from genai_prices import data_snapshot

    return data_snapshot.get_snapshot()


@functools.cache
def provider_ids() -> frozenset[str]:
    """Every provider id of the bundled genai-prices data (`pricingProvider`'s values)."""
    return frozenset(p.id for p in _snapshot().providers)


def _rate(value: object) -> Rate | None:
    if isinstance(value, Decimal):
        return Rate(float(value))
    tiers = getattr(value, "tiers", None)
    base = getattr(value, "base", None)
    if isinstance(base, Decimal) and isinstance(tiers, list):
        return Rate(float(base), tuple((int(t.start), float(t.price)) for t in tiers))
    return None


@functools.lru_cache(maxsize=4096)
def library_rates(provider_id: str, model: str, day: dt.date) -> Rates | None:
    """The bundled genai-prices rates of `model` at `provider_id` on `day` (prices that start on
    a date apply from then), or None when the data has no token price for it."""
    try:
        provider, info = _snapshot().find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None
    prices = info.get_prices(dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC))
    inp, out = _rate(prices.input_mtok), _rate(prices.output_mtok)
    if inp is None or out is None:
        return None
    cached = _rate(prices.cache_read_mtok) or inp
    return Rates(inp, cached, out, f"genai-prices {provider.id}/{info.id}")


@functools.lru_cache(maxsize=256)
def _provider_by_url(base_url: str) -> str | None:
    for provider in _snapshot().providers:
        if re.match(provider.api_pattern, base_url):
            return str(provider.id)
    return None


def is_local_host(host: str) -> bool:
    """A server on this machine or the local network (Ollama, vLLM): nobody's price list."""
    host = host.strip("[]").lower().rstrip(".")
    if not host or host == "localhost" or "." not in host and ":" not in host:
        return True  # a bare name: a container or LAN host
    if host.endswith(_LOCAL_SUFFIXES):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified


def pricing_provider(spec: ProviderSpec) -> str | None:
    """The genai-prices provider id of a provider: its explicit `pricingProvider`; for a
    subscription adapter the API it stands for; none for a local server; else the data's own
    URL patterns (api.openai.com, openrouter.ai, an Azure endpoint, …), then the adapter's
    native API (anthropic, openai-responses)."""
    if spec.pricing_provider:
        return spec.pricing_provider
    if spec.adapter in SUBSCRIPTION_ADAPTERS:
        return SUBSCRIPTION_ADAPTERS[spec.adapter]
    try:
        host = urlsplit(spec.base_url).hostname or ""
    except ValueError:
        return None
    if is_local_host(host):
        return None
    return _provider_by_url(spec.base_url) or _ADAPTER_DEFAULTS.get(spec.adapter)


def target_rates(spec: ProviderSpec, model: str, day: dt.date) -> Rates | None:
    """The rates of `model` on `spec`: its metadata price, else the library's, else None."""
    declared = spec.models.get(model)
    if declared is not None and declared.price is not None:
        return metadata_rates(declared.price)
    provider_id = pricing_provider(spec)
    return None if provider_id is None else library_rates(provider_id, model, day)


def price(
    spec: ProviderSpec | None,
    model: str,
    *,
    input_tokens: int | None,
    cached_tokens: int | None,
    output_tokens: int | None,
    rates: Rates | None,
) -> Priced:
    """A served request's cost from the usage the upstream reported and its target's `rates`
    (`target_rates`). No usage report: the cost is unknown (counted as unknown usage), not 0."""
    reported = input_tokens is not None or output_tokens is not None
    value = None
    if rates is not None and reported:
        value = rates.cost(
            input_tokens=input_tokens or 0,
            cached_tokens=cached_tokens or 0,
            output_tokens=output_tokens or 0,
        )
    if spec is not None and spec.adapter in SUBSCRIPTION_ADAPTERS:
        return Priced(0.0, value, False)
    return Priced(value, value, rates is None)


def unpriced_targets(
    snapshot: ConfigSnapshot, day: dt.date, served: Iterable[str] = ()
) -> list[str]:
    """The "provider/model" keys whose requests would get no cost: every combo target, every
    declared model of an enabled provider and every `served` key (targets recently counted as
    unpriced), whose provider is enabled, not a subscription, and has no price for it."""
    keys = set(served)
    for combo in snapshot.combos.values():
        keys.update(t.key for t in combo.targets)
    for declared in snapshot.providers.values():
        keys.update(f"{declared.name}/{model}" for model in declared.models)
    out = []
    for key in sorted(keys):
        name, _, model = key.partition("/")
        spec = snapshot.providers.get(name)
        if spec is None or spec.disabled or spec.adapter in SUBSCRIPTION_ADAPTERS:
            continue
        if target_rates(spec, model, day) is None:
            out.append(key)
    return out


def unpriced_note(key: str) -> str:
    name, _, model = key.partition("/")
    return (
        f"{key} has no price: its requests get no cost (counted as unpricedRequests); set "
        f'models["{model}"].price on provider {name}, or its pricingProvider'
    )


class PriceBook:
    """Rates per (provider, model, day), looked up once and kept while the config snapshot is
    the same, so pricing a batch of requests looks nothing up per request."""

    MAX_ENTRIES = 10_000

    def __init__(self) -> None:
        self._snapshot: ConfigSnapshot | None = None
        self._rates: dict[tuple[str, str, dt.date], Rates | None] = {}

    def rates(
        self, snapshot: ConfigSnapshot, provider: str, model: str, day: dt.date
    ) -> Rates | None:
        if snapshot is not self._snapshot or len(self._rates) > self.MAX_ENTRIES:
            self._snapshot, self._rates = snapshot, {}
        key = (provider, model, day)
        if key not in self._rates:
            spec = snapshot.providers.get(provider)
            self._rates[key] = None if spec is None else target_rates(spec, model, day)
        return self._rates[key]

    def price(
        self,
        snapshot: ConfigSnapshot,
        target: str,
        *,
        at: float,
        input_tokens: int | None,
        cached_tokens: int | None,
        output_tokens: int | None,
    ) -> Priced:
        """The price of a request that `target` ("provider/model") served at epoch `at`."""
        if not target:
            return NOT_SERVED
        provider, _, model = target.partition("/")
        day = dt.datetime.fromtimestamp(at, tz=dt.UTC).date()
        return price(
            snapshot.providers.get(provider),
            model,
            input_tokens=input_tokens,
            cached_tokens=cached_tokens,
            output_tokens=output_tokens,
            rates=self.rates(snapshot, provider, model, day),
        )
