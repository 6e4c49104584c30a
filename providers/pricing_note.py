"""Which models of a stored provider have no price (issue 42): `ocx provider add` says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routing.pricing import SUBSCRIPTION_ADAPTERS, pricing_provider
from routing.types import ProviderSpec


def unpriced_models(raw: Mapping[str, Any]) -> list[str] | None:
    """None when the provider's requests are priced (a price list applies, a subscription);
    else its models without their own `price` (empty: it has no models yet). No price data is
    loaded: a pricing provider is taken to know the models (`ocx doctor` checks each one)."""
    adapter = str(raw.get("adapter") or "")
    if adapter in SUBSCRIPTION_ADAPTERS:
        return None
    spec = ProviderSpec(
        name="",
        adapter=adapter,
        base_url=str(raw.get("baseUrl") or ""),
        pricing_provider=raw.get("pricingProvider") or None,
    )
    if pricing_provider(spec) is not None:
        return None
    models = raw.get("models")
    if not isinstance(models, Mapping) or not models:
        return []
    missing = sorted(
        str(m)
        for m, meta in models.items()
        if not (isinstance(meta, Mapping) and meta.get("price"))
    )
    return missing or None
