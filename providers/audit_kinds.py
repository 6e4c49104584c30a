"""What the audit trail records of a provider: its fields, its models, whether a key is stored
(a secret: `***`)."""

from __future__ import annotations

import hashlib

from audit import trail
from providers.models import Provider, ProviderModel


def read_provider(name: str) -> trail.Snapshot:
    provider = Provider.objects.filter(name=name).first()
    if provider is None:
        return None
    fields = trail.row_fields(
        provider, exclude=("name", "updated", "api_key_sealed", "api_key_hint")
    )
    sealed = provider.api_key_sealed
    # A digest of the sealed token: "changed" is all the trail says of a key.
    fields["api_key"] = hashlib.sha256(sealed.encode()).hexdigest() if sealed else None
    fields["models"] = {
        m.model_id: trail.row_fields(m, exclude=("provider", "model_id"))
        for m in ProviderModel.objects.filter(provider=provider).order_by("model_id")
    }
    return f"provider {name}", fields


def register() -> None:
    trail.register("provider", read_provider, secrets=("api_key",))
    trail.watch(Provider, "provider", lambda p: p.name, owner=True)
    trail.watch(ProviderModel, "provider", _owner_name)


def _owner_name(row: ProviderModel) -> str | None:
    return Provider.objects.filter(pk=row.provider_id).values_list("name", flat=True).first()
