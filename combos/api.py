from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Schema
from ninja.errors import HttpError

from combos import selectors, services
from combos.status import status_report
from providers.json_body import object_body
from routing import validate

router = Router(tags=["combos"])

PUT_BODY = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["id", "combo"],
                    "properties": {
                        "id": {"type": "string"},
                        "combo": {"type": "object"},
                        "renameFrom": {"type": "string"},
                    },
                }
            }
        }
    }
}


def _listed(spec) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"id": spec.id, "model": spec.public_id, **validate.combo_to_api(spec)}


@router.get("", operation_id="list_combos")
def list_combos(request: HttpRequest) -> dict[str, object]:
    return {"combos": [_listed(spec) for spec in selectors.combo_list()]}


# Before `/{combo_id}`, which would match `reset` (GET only: 405).
class ResetIn(Schema):
    id: str
    target: str | None = None


@router.post("/reset", operation_id="reset_combo")
def reset_combo(request: HttpRequest, payload: ResetIn) -> dict[str, object]:
    """Clear the routing state (cooldowns, probe leases, rotation) of a combo or of one of its
    targets on every worker; answers with the combo's status after the reset."""
    spec = services.combo_reset(combo_id=payload.id, target=payload.target)
    report = status_report(spec.id)
    return {"success": True, "id": spec.id, "target": payload.target, "status": report["combos"][0]}


@router.get("/{combo_id}", operation_id="get_combo")
def get_combo(request: HttpRequest, combo_id: str) -> dict[str, object]:
    spec = selectors.combo_get(combo_id)
    if spec is None:
        raise HttpError(404, "unknown combo")
    return {"combo": _listed(spec)}


@router.put("", operation_id="put_combo", openapi_extra=PUT_BODY)
def put_combo(request: HttpRequest) -> dict[str, object]:
    body = object_body(request)
    unknown = sorted(set(body) - {"id", "combo", "renameFrom"})
    if unknown:
        raise HttpError(400, f'unknown field "{unknown[0]}"')
    spec = services.combo_set(
        combo_id=body.get("id"), raw=body.get("combo"), rename_from=body.get("renameFrom")
    )
    return {
        "success": True,
        "id": spec.id,
        "model": spec.public_id,
        "combo": validate.combo_to_sparse(spec),
        "warnings": selectors.combo_warnings(spec.id),
    }


@router.delete("", operation_id="delete_combo")
def delete_combo(request: HttpRequest, id: str = "") -> dict[str, object]:  # noqa: A002
    services.combo_delete(combo_id=id.strip() and id)
    return {"success": True, "id": id}
