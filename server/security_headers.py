"""`OCX_CSP`: a Content-Security-Policy header on every Django answer (the admin, /api, …).

Django 5.2 has no CSP support of its own; the value is the operator's, sent as is. The proxy's
`/v1/*` answers are JSON and event streams for API clients, which a CSP does not concern.

Every `/api/` answer also gets `Cache-Control: no-store` unless it set its own (issue #43): the
answers that carry a secret (a key created or rotated, a team's key, any later one) are among
them, and none of the management API's answers is meant for a cache."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

GetResponse = Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]


def content_security_policy(get_response: GetResponse) -> GetResponse:
    policy: str | None = settings.OCX_CSP

    def add(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if policy is not None and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        if request.path.startswith("/api/") and "Cache-Control" not in response:
            response["Cache-Control"] = "no-store"
        return response

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponseBase:
            return add(request, await get_response(request))  # type: ignore[misc]

        return markcoroutinefunction(middleware)

    def sync_middleware(request: HttpRequest) -> HttpResponseBase:
        return add(request, get_response(request))  # type: ignore[arg-type]

    return sync_middleware


content_security_policy.sync_capable = True  # type: ignore[attr-defined]
content_security_policy.async_capable = True  # type: ignore[attr-defined]
