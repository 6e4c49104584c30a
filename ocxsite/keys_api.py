from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Schema
from ninja.errors import HttpError

from ocxsite import access
from ocxsite.models import ClientKey

router = Router(tags=["keys"])
USER_MAX = 150  # django.contrib.auth's username length
RPM_MAX = 2_147_483_647  # PositiveIntegerField on every supported database


class KeyIn(Schema):
    user: str
    name: str = ""
    allowed_models: list[str] = []
    rpm_limit: int | None = None


def _listed(key: ClientKey) -> dict[str, object]:
    return {
        "id": key.pk,
        "prefix": key.prefix,
        "user": key.user.get_username(),
        "name": key.name,
        "allowedModels": list(key.allowed_models),
        "rpmLimit": key.rpm_limit,
        "created": key.created.isoformat(),
        "revoked": key.revoked.isoformat() if key.revoked else None,
    }


@router.get("", operation_id="list_keys")
def list_keys(request: HttpRequest) -> dict[str, object]:
    return {"keys": [_listed(k) for k in ClientKey.objects.select_related("user")]}


@router.post("", operation_id="create_key", response={201: dict})
def create_key(request: HttpRequest, payload: KeyIn) -> tuple[int, dict[str, object]]:
    if not payload.user.strip():
        raise HttpError(400, "user is required")
    if len(payload.user.strip()) > USER_MAX:
        raise HttpError(400, f"user must be at most {USER_MAX} characters")
    if payload.rpm_limit is not None and not 1 <= payload.rpm_limit <= RPM_MAX:
        raise HttpError(400, f"rpm_limit must be an integer from 1 to {RPM_MAX}")
    # PostgreSQL text cannot hold NUL (SQLite can): reject it the same way on both.
    if any("\x00" in s for s in (payload.user, payload.name, *payload.allowed_models)):
        raise HttpError(400, "user, name and allowed_models must not contain NUL characters")
    # A model-level refusal (e.g. name longer than 64) is a 400 (ocxsite.api's handler).
    key, secret = access.client_key_create(
        username=payload.user.strip(),
        name=payload.name,
        allowed_models=payload.allowed_models,
        rpm_limit=payload.rpm_limit,
    )
    # The secret is shown here once and never again.
    return 201, {**_listed(key), "key": secret}


@router.delete("/{key_id}", operation_id="revoke_key")
def revoke_key(request: HttpRequest, key_id: int) -> dict[str, object]:
    if not access.client_key_revoke(key_id=key_id):
        raise HttpError(404, "unknown or already revoked key")
    return {"success": True, "id": key_id}
