"""Who may call a `/api` route (docs/people.md): the caller is a management token's user or a
session's; then the route's rule decides.

- `StaffAuth` (every route's default): reads for viewers and admins, writes for admins only.
- `ManagerAuth` (keys, usage, teams): also team managers, whose view then narrows to their teams
  (`request.ocx_scope`).
- `PortalAuth` (`/api/me/...`): any active user, acting on their own keys.

401 without credentials, 403 without the right: the check runs before the body is read.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.errors import HttpError
from ninja.security import APIKeyHeader
from ninja.utils import check_csrf

from accounts import access, roles


class _Caller(APIKeyHeader):
    """`Authorization: Bearer ocxm_…` (a token acts with its user's rights) or a session."""

    param_name = "Authorization"
    openapi_description = "Bearer <management token> (ocxm_…) or a session"
    # Session writes are CSRF-checked (below); this also makes the Swagger UI at /api/docs send
    # the page's CSRF token with its requests.
    csrf = True

    def __call__(self, request: HttpRequest) -> Any:
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token:
                return None
            if _status_token(request, token.strip()):
                return "ocx status"  # read-only: this one GET, nothing else
            user = access.mgmt_user_for(token.strip())
            if user is None:
                return None
            request.user = user  # type: ignore[assignment]
        else:
            user = getattr(request, "user", None)
            if user is None or not user.is_authenticated:
                return None
            # A session is a cookie the browser sends on its own: writes need Django's CSRF
            # check (token, Origin/Referer), as the admin's forms do. Bearer calls need none.
            if check_csrf(request) is not None:
                raise HttpError(
                    403, "CSRF check failed: send the csrftoken cookie's value as X-CSRFToken"
                )
        self.authorize(request, user)
        return user

    def authorize(self, request: HttpRequest, user: Any) -> None:
        raise NotImplementedError

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        return None  # __call__ does the work; kept for the OpenAPI security scheme


def _read(request: HttpRequest) -> bool:
    return (request.method or "GET").upper() in roles.READ_METHODS


VIEWER_WRITE = "forbidden: the viewer role reads only; writes need the admin role"
MEMBER_CALL = "forbidden: the member role has no management API access (the portal is /me/)"
MANAGER_CALL = "forbidden: a team manager manages only their teams' keys, members and usage"


def _refuse(user: Any, request: HttpRequest) -> HttpError:
    if user.is_staff:
        return HttpError(403, VIEWER_WRITE)
    if roles.is_team_manager(user):
        return HttpError(403, MANAGER_CALL)
    return HttpError(403, MEMBER_CALL)


class StaffAuth(_Caller):
    def authorize(self, request: HttpRequest, user: Any) -> None:
        if user.is_superuser or (user.is_staff and _read(request)):
            request.ocx_scope = roles.Scope(every=True)  # type: ignore[attr-defined]
            return
        raise _refuse(user, request)


class ManagerAuth(_Caller):
    def authorize(self, request: HttpRequest, user: Any) -> None:
        scope = roles.scope_for(user, read=_read(request))
        if not scope.every and not scope.team_ids:
            raise _refuse(user, request)
        request.ocx_scope = scope  # type: ignore[attr-defined]


class PortalAuth(_Caller):
    def authorize(self, request: HttpRequest, user: Any) -> None:
        request.ocx_scope = roles.Scope(every=False)  # type: ignore[attr-defined]


def scope(request: HttpRequest) -> roles.Scope:
    """The scope the route's auth granted (`StaffAuth` routes: everything)."""
    return getattr(request, "ocx_scope", None) or roles.Scope(every=False)


def _status_token(request: HttpRequest, token: str) -> bool:
    """`ocx status` on the server's host: the token `ocx serve` wrote to server.json."""
    expected = settings.OCX_STATUS_TOKEN
    return (
        bool(expected)
        and request.method == "GET"
        and request.path_info == "/api/status"
        and secrets.compare_digest(token.encode(), expected.encode())
    )


staff_auth = StaffAuth()
manager_auth = ManagerAuth()
portal_auth = PortalAuth()
