"""`OCX_CSP`: a Content-Security-Policy header on every Django answer (the admin, /api, …).

Django 5.2 has no CSP support of its own; the value is the operator's, sent as is. The proxy's
`/v1/*` answers are JSON and event streams for API clients, which a CSP does not concern."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

GetResponse = Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]


def content_security_policy(get_response: GetResponse) -> GetResponse:
    policy: str | None = settings.OCX_CSP

    def add(response: HttpResponseBase) -> HttpResponseBase:
        if policy is not None and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponseBase:
            return add(await get_response(request))  # type: ignore[misc]

        return markcoroutinefunction(middleware)

    def sync_middleware(request: HttpRequest) -> HttpResponseBase:
        return add(get_response(request))  # type: ignore[arg-type]

    return sync_middleware


content_security_policy.sync_capable = True  # type: ignore[attr-defined]
content_security_policy.async_capable = True  # type: ignore[attr-defined]
