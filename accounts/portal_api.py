"""`/api/me/...`: the portal's API, for any signed-in user on their own keys (a session with
its CSRF token, or the user's own management token): docs/people.md."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema
from ninja.errors import HttpError
from pydantic import ConfigDict

from accounts import portal
from accounts.api_auth import portal_auth

router = Router(tags=["portal"], auth=portal_auth)


class MyKeyIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: str
    expiresInDays: int | None = Field(None, description="days from now; none: never expires")
    allowedModels: list[str] | None = Field(None, description="within your teams' models")


def _refused(exc: portal.PortalError) -> HttpError:
    return HttpError(exc.status, exc.message)


@router.get("/keys", operation_id="list_my_keys")
def list_my_keys(request: HttpRequest) -> dict[str, object]:
    rules = portal.policy()
    return {
        "keys": [portal.key_json(k) for k in portal.my_keys(request.user)],
        "teamModels": portal.team_models(request.user),
        "policy": {
            "membersCreateKeys": rules.members_create,
            "maxKeys": rules.max_keys or None,
            "maxExpiryDays": rules.max_expiry_days or None,
        },
    }


@router.post("/keys", operation_id="create_my_key", response={201: dict})
def create_my_key(
    request: HttpRequest, payload: MyKeyIn, response: HttpResponse
) -> tuple[int, dict[str, object]]:
    """A new key of yours; its secret (`key`) is in this answer only."""
    try:
        key, secret = portal.key_create(
            user=request.user,
            name=payload.name,
            expires_in_days=payload.expiresInDays,
            allowed_models=payload.allowedModels,
        )
    except portal.PortalError as exc:
        raise _refused(exc) from None
    response["Cache-Control"] = "no-store"
    return 201, {**portal.key_json(key), "key": secret}


@router.post("/keys/{key_id}/rotate", operation_id="rotate_my_key")
def rotate_my_key(request: HttpRequest, key_id: int, response: HttpResponse) -> dict[str, object]:
    """A new secret for a key of yours (the old one stops now), in this answer only."""
    try:
        key, secret = portal.key_rotate(user=request.user, key_id=key_id)
    except portal.PortalError as exc:
        raise _refused(exc) from None
    response["Cache-Control"] = "no-store"
    return {**portal.key_json(key), "key": secret}


@router.delete("/keys/{key_id}", operation_id="revoke_my_key")
def revoke_my_key(request: HttpRequest, key_id: int) -> dict[str, object]:
    try:
        portal.key_revoke(user=request.user, key_id=key_id)
    except portal.PortalError as exc:
        raise _refused(exc) from None
    return {"success": True, "id": key_id}


@router.get("/usage", operation_id="my_usage")
def my_usage(request: HttpRequest) -> dict[str, object]:
    """Your requests, tokens and spend today and this month, by model, and each budget that
    applies to you with what is left of it."""
    return portal.usage_summary(request.user)
