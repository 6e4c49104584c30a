"""The management API: one NinjaAPI, routers from each app, errors in one place."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as ModelValidationError
from django.db import DataError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from accounts import api_auth
from providers.errors import ConfigError
from server.db_unavailable import unavailable_response

# Who may call which route: accounts.api_auth (docs/people.md); reads for viewers, writes for
# admins unless a route names a wider rule.
ManagementAuth = api_auth.StaffAuth


api = NinjaAPI(
    title="ocx management API",
    version="1",
    urls_namespace="api",
    auth=ManagementAuth(),
)


def error_body(message: str, **extra: object) -> dict[str, object]:
    return {"error": message, **extra}


@api.exception_handler(ConfigError)
def on_config_error(request: HttpRequest, exc: ConfigError) -> HttpResponse:
    return api.create_response(request, error_body(exc.message, **exc.extra), status=exc.status)


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return api.create_response(request, error_body("unauthorized"), status=401)


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return api.create_response(request, error_body(str(exc)), status=exc.status_code)


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    first = exc.errors[0] if exc.errors else {}
    loc = list(first.get("loc", ()))
    if loc[:2] == ["body", "payload"]:
        loc = loc[2:]  # the view's parameter name, not a field of the body
    where = ".".join(str(p) for p in loc if p not in ("body", "query", "path"))
    message = f"{where}: {first.get('msg', 'invalid input')}" if where else "invalid input"
    return api.create_response(request, error_body(message), status=400)


@api.exception_handler(RequestDataTooBig)
def on_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return api.create_response(request, error_body("request body too large"), status=413)


@api.exception_handler(ModelValidationError)
def on_model_validation_error(request: HttpRequest, exc: ModelValidationError) -> HttpResponse:
    # A value the validators let through but the model refuses (e.g. beyond a column's range).
    if hasattr(exc, "error_dict"):
        field, errors = next(iter(exc.message_dict.items()))
        message = f"{field}: {errors[0]}"
    else:
        message = exc.messages[0] if exc.messages else "invalid input"
    return api.create_response(request, error_body(message), status=400)


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def on_database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    # The database is down or restarting: a clear 503 (the proxy keeps serving meanwhile).
    return unavailable_response(exc)


@api.exception_handler(DataError)
def on_data_error(request: HttpRequest, exc: DataError) -> HttpResponse:
    # The database refused a value (too long, out of range, NUL in PostgreSQL text): bad input.
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid value"
    return api.create_response(request, error_body(f"invalid value: {detail}"), status=400)


def _mount() -> None:
    from accounts.keys_api import router as keys_router
    from accounts.teams_api import router as teams_router
    from alerts.api import router as alerts_router
    from combos.api import router as combos_router
    from combos.catalog_api import router as catalog_router
    from providers.api import router as providers_router
    from usage.api import router as usage_router
    from usage.ops_api import router as ops_router

    api.add_router("/combos", combos_router)
    api.add_router("/providers", providers_router)
    api.add_router("/keys", keys_router)
    api.add_router("/teams", teams_router)
    api.add_router("/catalog", catalog_router)
    # Team managers read their teams' usage (accounts.api_auth sets the request's scope).
    api.add_router("/usage", usage_router, auth=api_auth.manager_auth)
    api.add_router("/alerts", alerts_router)
    api.add_router("", ops_router)
    from accounts.portal_api import router as portal_router
    from audit.api import router as audit_router

    api.add_router("/audit", audit_router)
    api.add_router("/me", portal_router)


_mount()
