from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from ninja import Router

from combos import selectors
from routing.catalog import catalog_json

router = Router(tags=["catalog"])


@router.get("", operation_id="get_catalog", response={200: dict})
def get_catalog(request: HttpRequest) -> HttpResponse:
    """The Codex `model_catalog_json` document for the current configuration."""
    return HttpResponse(catalog_json(selectors.catalog_result()), content_type="application/json")


@router.get("/attention", operation_id="needs_attention")
def attention(request: HttpRequest) -> dict[str, object]:
    result = selectors.catalog_result()
    return {
        "omitted": [{"combo": c, "reason": r} for c, r in result.omitted],
        "notes": selectors.needs_attention(),
    }
