"""Sets who changes things through a request (audit.context): its user (read when a change is
recorded, after the API's token auth) and the interface its path belongs to."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

from audit import context


def audit_origin(
    get_response: Callable[[HttpRequest], HttpResponseBase],
) -> Callable[[HttpRequest], HttpResponseBase]:
    def middleware(request: HttpRequest) -> HttpResponseBase:
        via = context.via_for_path(request.path_info)
        if via is None:
            return get_response(request)
        with context.acting(via=via, request=request):
            return get_response(request)

    return middleware
