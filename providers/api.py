from __future__ import annotations

from django.http import HttpRequest
from ninja import Router
from ninja.errors import HttpError

from providers import selectors, services
from providers.json_body import object_body
from providers.models import Provider

router = Router(tags=["providers"])

PUT_BODY = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["name", "provider"],
                    "properties": {"name": {"type": "string"}, "provider": {"type": "object"}},
                }
            }
        }
    }
}


def _listed(provider: Provider) -> dict[str, object]:
    out: dict[str, object] = {"name": provider.name, **selectors.provider_stored_raw(provider)}
    out["apiKeySet"] = bool(provider.api_key_sealed)
    return out


@router.get("", operation_id="list_providers")
def list_providers(request: HttpRequest) -> dict[str, object]:
    return {"providers": [_listed(p) for p in Provider.objects.prefetch_related("models")]}


@router.get("/{name}", operation_id="get_provider")
def get_provider(request: HttpRequest, name: str) -> dict[str, object]:
    provider = Provider.objects.prefetch_related("models").filter(name=name).first()
    if provider is None:
        raise HttpError(404, "unknown provider")
    return {"provider": _listed(provider)}


@router.put("", operation_id="put_provider", openapi_extra=PUT_BODY)
def put_provider(request: HttpRequest) -> dict[str, object]:
    body = object_body(request)
    unknown = sorted(set(body) - {"name", "provider"})
    if unknown:
        raise HttpError(400, f'unknown field "{unknown[0]}"')
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise HttpError(400, "name is required and must be a string")
    provider = services.provider_set(name=name.strip(), raw=body.get("provider"))
    provider = Provider.objects.prefetch_related("models").get(pk=provider.pk)
    return {"success": True, "name": provider.name, "provider": _listed(provider)}


@router.delete("", operation_id="delete_provider")
def delete_provider(request: HttpRequest, name: str = "") -> dict[str, object]:
    if not name.strip():
        raise HttpError(400, "name query param is required")
    services.provider_delete(name=name)
    return {"success": True, "name": name}
