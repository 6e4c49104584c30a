"""`/api/keys`: client keys, camelCase both ways (`allowedModels`, `rpmLimit`, `budgets`,
`expiresAt` / `expiresIn`), and `POST /api/keys/{id}/rotate`.

The snake_case `allowed_models` / `rpm_limit` of earlier releases are still accepted for one
release; a request using them gets `Deprecation: true` and a `Warning` header.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, Router, Schema
from ninja.errors import HttpError
from pydantic.config import JsonDict

from accounts import access, expiry, key_pages, key_services, roles
from accounts.api_auth import manager_auth, scope
from accounts.models import ClientKey, UserBudget
from usage.budgets import stored_budgets

# Admins, viewers (reads) and team managers (their teams' members only): accounts.api_auth.
router = Router(tags=["keys"], auth=manager_auth)
USER_MAX = 150  # django.contrib.auth's username length
RPM_MAX = 2_147_483_647  # PositiveIntegerField on every supported database
_DEPRECATED: JsonDict = {"deprecated": True}


class KeyIn(Schema):
    user: str
    name: str = ""
    allowedModels: list[str] | None = None
    rpmLimit: int | None = None
    budget: dict[str, Any] | None = Field(None, description="one budget (ocx budgets)")
    budgets: list[dict[str, Any]] | None = Field(None, description="a list of budgets")
    expiresAt: str | None = Field(
        None, description="ISO-8601 date-time with a zone, e.g. 2027-01-31T00:00Z"
    )
    expiresIn: str | None = Field(None, description="a duration from now: 90m, 12h, 30d, 2w")
    allowed_models: list[str] | None = Field(
        None, description="deprecated: use allowedModels", json_schema_extra=_DEPRECATED
    )
    rpm_limit: int | None = Field(
        None, description="deprecated: use rpmLimit", json_schema_extra=_DEPRECATED
    )


class KeyPatch(Schema):
    name: str | None = None
    allowedModels: list[str] | None = None
    rpmLimit: int | None = Field(None, description="null removes the limit")
    budget: dict[str, Any] | None = Field(None, description="null removes every budget")
    budgets: list[dict[str, Any]] | None = Field(None, description="replaces the list")
    expiresAt: str | None = Field(None, description="ISO-8601 with a zone; null: never expires")
    expiresIn: str | None = Field(None, description="a duration from now: 90m, 12h, 30d, 2w")
    allowed_models: list[str] | None = Field(
        None, description="deprecated: use allowedModels", json_schema_extra=_DEPRECATED
    )
    rpm_limit: int | None = Field(
        None, description="deprecated: use rpmLimit", json_schema_extra=_DEPRECATED
    )


class RotateIn(Schema):
    graceSeconds: int = Field(
        0,
        strict=True,
        description="how long the old secret keeps working: 0 (default) to 2592000 (30 days)",
    )


def _iso(value: dt.datetime | None) -> str | None:
    return expiry.iso(value) if value is not None else None


def _expiry(payload: Schema, now: dt.datetime) -> tuple[bool, dt.datetime | None]:
    """(given, value) of `expiresAt` / `expiresIn`; `"expiresAt": null` is given as None."""
    given = payload.model_fields_set & {"expiresAt", "expiresIn"}
    at, within = payload.expiresAt, payload.expiresIn  # type: ignore[attr-defined]
    if "expiresIn" in given and within is None:
        raise HttpError(400, "expiresIn must be a duration such as 30d (expiresAt: null clears)")
    try:
        return bool(given), expiry.expiry_value(expires_at=at, expires_in=within, now=now)
    except expiry.ExpiryError as exc:
        raise HttpError(400, str(exc)) from None


def _listed(key: ClientKey) -> dict[str, object]:
    return {
        "id": key.pk,
        "prefix": key.prefix,
        "user": key.user.get_username(),
        "name": key.name,
        "allowedModels": list(key.allowed_models),
        "rpmLimit": key.rpm_limit,
        "budgets": [b.to_json() for b in stored_budgets(key.budgets)],
        "created": key.created.isoformat(),
        "revoked": key.revoked.isoformat() if key.revoked else None,
        "expiresAt": _iso(key.expires),
        "rotated": _iso(key.rotated),
        # Until then the secret before the last rotation still works.
        "previousSecretValidUntil": _iso(expiry.grace_left(key.previous_until, now=timezone.now())),
    }


def _pick(payload: Schema, camel: str, snake: str, response: HttpResponse) -> tuple[bool, Any]:
    """(given, value) of a field sent as `camel` or, deprecated, as `snake` (not both)."""
    given = payload.model_fields_set
    if camel in given and snake in given:
        raise HttpError(400, f"give {camel} or {snake}, not both ({snake} is deprecated)")
    if snake in given:
        response["Deprecation"] = "true"
        warning = f'299 - "{snake} is deprecated; use {camel}"'
        old = response.get("Warning")
        response["Warning"] = f"{old}, {warning}" if old else warning
        return True, getattr(payload, snake)
    return camel in given, getattr(payload, camel)


def _budgets(payload: Schema) -> tuple[bool, Any]:
    given = payload.model_fields_set
    if "budget" in given and "budgets" in given:
        raise HttpError(400, "give budget or budgets, not both")
    if "budgets" in given:
        return True, payload.budgets  # type: ignore[attr-defined]
    return "budget" in given, payload.budget  # type: ignore[attr-defined]


def _checked(
    payload: Schema, response: HttpResponse
) -> tuple[tuple[bool, Any], tuple[bool, Any], tuple[bool, Any]]:
    models = _pick(payload, "allowedModels", "allowed_models", response)
    rpm = _pick(payload, "rpmLimit", "rpm_limit", response)
    budgets = _budgets(payload)
    if rpm[1] is not None and not 1 <= rpm[1] <= RPM_MAX:
        raise HttpError(400, f"rpmLimit must be an integer from 1 to {RPM_MAX}")
    # PostgreSQL text cannot hold NUL (SQLite can): reject it the same way on both.
    if any("\x00" in s for s in models[1] or ()):
        raise HttpError(400, "allowedModels must not contain NUL characters")
    if models[0] and models[1]:
        problem = key_services.allowed_models_problem(models[1])
        if problem is not None:
            raise HttpError(400, problem)
    return models, rpm, budgets


@router.get("", operation_id="list_keys")
def list_keys(
    request: HttpRequest,
    limit: str | None = None,
    cursor: str | None = None,
    user: str | None = None,
) -> dict[str, object]:
    """One page of keys, newest first: `limit` (1 to 1000, default 500), `cursor` (the
    `nextCursor` of the previous page), `user` (only that user's keys). `nextCursor` is null
    on the last page."""
    size = key_pages.limit_value(limit)
    rows = ClientKey.objects.select_related("user").order_by("-pk")
    if cursor is not None:
        rows = rows.filter(pk__lt=key_pages.cursor_value(cursor))
    if user is not None:
        rows = rows.filter(user__username=user)
    allowed = scope(request)
    if not allowed.every:
        rows = rows.filter(user_id__in=list(allowed.user_ids))
    page = list(rows[: size + 1])
    more = len(page) > size
    page = page[:size]
    return {
        "keys": [_listed(k) for k in page],
        "nextCursor": key_pages.cursor_after(page[-1].pk) if more else None,
    }


@router.post("", operation_id="create_key", response={201: dict, 409: dict})
def create_key(
    request: HttpRequest, payload: KeyIn, response: HttpResponse
) -> tuple[int, dict[str, object]]:
    if not payload.user.strip():
        raise HttpError(400, "user is required")
    if len(payload.user.strip()) > USER_MAX:
        raise HttpError(400, f"user must be at most {USER_MAX} characters")
    if "\x00" in payload.user or "\x00" in payload.name:
        raise HttpError(400, "user and name must not contain NUL characters")
    models, rpm, budgets = _checked(payload, response)
    now = timezone.now()
    _, expires = _expiry(payload, now)
    if expires is not None:
        try:
            field = "expiresIn" if "expiresIn" in payload.model_fields_set else "expiresAt"
            expiry.future_expiry(expires, now=now, field=field)
        except expiry.ExpiryError as exc:
            raise HttpError(400, str(exc)) from None
    # A model-level refusal (e.g. name longer than 64) is a 400 (ocxsite.api's handler).
    username = payload.user.strip()
    # Automation may mint a key for a new user in one call; the answer says it did.
    owner = get_user_model().objects.filter(username=username).first()
    created = owner is None
    _check_scope(request, owner, username)
    if budgets[0]:
        _check_team_cap(request, owner, budgets[1])
    try:
        key, secret = access.client_key_create(
            username=username,
            name=payload.name,
            allowed_models=models[1] or [],
            rpm_limit=rpm[1],
            budgets=key_services.budgets_value(budgets[1]) if budgets[0] else [],
            expires=expires,
        )
    except access.KeyOwnerError as exc:
        return 409, {"error": exc.message, "code": exc.code}
    # The secret is shown here once and never again.
    return 201, {**_listed(key), "key": secret, "userCreated": created}


class UserBudgetsIn(Schema):
    budget: dict[str, Any] | None = Field(None, description="one budget; null removes them")
    budgets: list[dict[str, Any]] | None = Field(None, description="replaces the list")


def _check_scope(request: HttpRequest, owner: Any, username: str) -> None:
    """403 unless the caller may act on `owner`'s keys (a team manager: their teams' members;
    they create no users)."""
    if not scope(request).covers_user(owner.pk if owner is not None else -1):
        raise HttpError(403, f"forbidden: {username} is not a member of a team you manage")


def _check_team_cap(request: HttpRequest, owner: Any, budgets: Any) -> None:
    """A team manager sets budgets up to their teams' (400 naming the team otherwise)."""
    allowed = scope(request)
    if allowed.every or owner is None:
        return
    problem = roles.budget_over_team(budgets, owner_id=owner.pk, team_ids=allowed.team_ids)
    if problem is not None:
        raise HttpError(400, problem)


def _scoped_key(request: HttpRequest, key_id: int) -> None:
    """404 for an unknown key, 403 for a key outside the caller's teams."""
    allowed = scope(request)
    if allowed.every:
        return
    owner_id = ClientKey.objects.filter(pk=key_id).values_list("user_id", flat=True).first()
    if owner_id is None:
        raise HttpError(404, "unknown or revoked key")
    if not allowed.covers_user(owner_id):
        raise HttpError(403, "forbidden: the key's user is not a member of a team you manage")


def _user_budgets(row: UserBudget) -> dict[str, object]:
    return {
        "user": row.user.get_username(),
        "budgets": [b.to_json() for b in stored_budgets(row.budgets)],
    }


@router.get("/user-budgets", operation_id="list_user_budgets")
def list_user_budgets(request: HttpRequest) -> dict[str, object]:
    """Every user with budgets (shared by all their keys)."""
    rows = UserBudget.objects.select_related("user")
    allowed = scope(request)
    if not allowed.every:
        rows = rows.filter(user_id__in=list(allowed.user_ids))
    return {"users": [_user_budgets(r) for r in rows]}


@router.put("/user-budgets/{username}", operation_id="set_user_budgets")
def set_user_budgets(
    request: HttpRequest, username: str, payload: UserBudgetsIn
) -> dict[str, object]:
    """Replace a user's budgets; `{"budgets": []}` or `{"budget": null}` removes them."""
    if "\x00" in username:
        raise HttpError(400, "user must not contain NUL characters")
    given, value = _budgets(payload)
    if not given:
        raise HttpError(400, "give budget or budgets")
    owner = get_user_model().objects.filter(username=username).first()
    if owner is None:
        raise HttpError(404, f"no user {username}")
    _check_scope(request, owner, username)
    _check_team_cap(request, owner, value)
    key_services.user_budgets_set(username=username, budgets=value)
    return {"user": username, "budgets": key_services.user_budgets_get(username=username)}


@router.patch("/{key_id}", operation_id="update_key")
def update_key(
    request: HttpRequest, key_id: int, payload: KeyPatch, response: HttpResponse
) -> dict[str, object]:
    """Change a key's name, allowedModels, rpmLimit, budgets or expiry; absent fields stay as
    they are. `"rpmLimit": null` removes the limit, `"budget": null` / `"budgets": []` every
    budget, `"expiresAt": null` the expiry (a past expiresAt expires the key now)."""
    if payload.name is not None and "\x00" in payload.name:
        raise HttpError(400, "name must not contain NUL characters")
    if "name" in payload.model_fields_set and payload.name is None:
        raise HttpError(400, "name must be a string")
    _scoped_key(request, key_id)
    models, rpm, budgets = _checked(payload, response)
    changes: dict[str, Any] = {}
    if payload.name is not None:
        changes["name"] = payload.name
    if models[0]:
        changes["allowed_models"] = models[1] or []
    if rpm[0]:
        changes["rpm_limit"] = rpm[1]
    if budgets[0]:
        row = ClientKey.objects.select_related("user").filter(pk=key_id).first()
        _check_team_cap(request, row.user if row else None, budgets[1])
        changes["budgets"] = budgets[1]
    expires_given, expires = _expiry(payload, timezone.now())
    if expires_given:
        changes["expires"] = expires
    try:
        key = key_services.client_key_update(key_id=key_id, **changes)
    except ClientKey.DoesNotExist:
        raise HttpError(404, "unknown or revoked key") from None
    return _listed(key)


@router.post("/{key_id}/rotate", operation_id="rotate_key")
def rotate_key(
    request: HttpRequest, key_id: int, payload: RotateIn | None = None
) -> dict[str, object]:
    """A new secret for the key, shown once (`key`); everything else stays, including its id,
    so its budgets keep counting. The old secret works for `graceSeconds` more (default 0)."""
    _scoped_key(request, key_id)
    try:
        grace = expiry.grace_value(payload.graceSeconds if payload is not None else 0)
    except expiry.ExpiryError as exc:
        raise HttpError(400, str(exc)) from None
    try:
        key, secret = access.client_key_rotate(key_id=key_id, grace=grace)
    except ClientKey.DoesNotExist:
        raise HttpError(404, "unknown or revoked key") from None
    return {**_listed(key), "key": secret}


@router.delete("/{key_id}", operation_id="revoke_key")
def revoke_key(request: HttpRequest, key_id: int) -> dict[str, object]:
    _scoped_key(request, key_id)
    if not access.client_key_revoke(key_id=key_id):
        raise HttpError(404, "unknown or already revoked key")
    return {"success": True, "id": key_id}
