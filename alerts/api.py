"""`/api/alerts`: alert destinations (PRODUCT §9.9); `POST /api/alerts/test` sends a test."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router
from ninja.errors import HttpError

from alerts import selectors, services
from alerts.schemas import AlertDeleteOut, AlertListOut, AlertPut, AlertPutOut, AlertTestOut

router = Router(tags=["alerts"])

_FIELDS = {
    "kind": "kind",
    "url": "url",
    "to": "to",
    "events": "events_wanted",
    "secret": "secret",
    "teams": "teams",
    "combos": "combos",
}


@router.get("", response=AlertListOut, operation_id="list_alerts")
def list_alerts(request: HttpRequest) -> dict[str, object]:
    return {"alerts": selectors.destination_list()}


@router.put("", response=AlertPutOut, operation_id="put_alert")
def put_alert(request: HttpRequest, payload: AlertPut) -> dict[str, object]:
    """Create or change a destination; fields left out of `alert` keep their stored values."""
    given = payload.alert.model_fields_set
    changes: dict[str, Any] = {
        arg: getattr(payload.alert, field) for field, arg in _FIELDS.items() if field in given
    }
    # A Django ValidationError is a 400 naming the field (ocxsite.api's handler).
    row = services.destination_set(name=payload.name, **changes)
    return {"success": True, "alert": selectors.destination_json(row)}


@router.delete("", response=AlertDeleteOut, operation_id="delete_alert")
def delete_alert(request: HttpRequest, name: str = "") -> dict[str, object]:
    if not name.strip():
        raise HttpError(400, "name query param is required")
    if not services.destination_delete(name=name):
        raise HttpError(404, f"unknown alert destination {name}")
    return {"success": True, "name": name}


@router.post("/test", response=AlertTestOut, operation_id="test_alert")
def test_alert(request: HttpRequest, name: str = "") -> dict[str, object]:
    """Send a test message now (not through the outbox); `error` says why it failed."""
    if not name.strip():
        raise HttpError(400, "name query param is required")
    if not selectors.exists(name):
        raise HttpError(404, f"unknown alert destination {name}")
    error = services.send_test(name=name)
    return {"success": error is None, "name": name, "error": error}
