"""A clear 503 JSON, not a 500 page, when the database is unreachable (issue 16).

The proxy (`/v1/*`) never needs the database per request: it serves from its loaded snapshot
and key map. The management API, the admin and the other Django pages do; while PostgreSQL is
down or restarting they answer `503 {"error": "database unavailable: …"}` with `Retry-After`.
`ocxsite.api` maps the same errors for the ninja routes (ninja handles view errors itself).
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

log = logging.getLogger("ocx.db")

UNREACHABLE = (OperationalError, InterfaceError)
RETRY_AFTER_S = 5
MESSAGE = (
    "database unavailable: the management API and admin need the database and will answer "
    "again once it is back; the proxy keeps serving from its loaded configuration"
)


def unavailable_body() -> dict[str, object]:
    return {"error": MESSAGE, "retryAfter": RETRY_AFTER_S}


def unavailable_response(exc: BaseException) -> JsonResponse:
    # The exception class only: a driver message may name the host, user or database.
    log.warning("database unavailable (%s): answering 503", type(exc).__name__)
    response = JsonResponse(unavailable_body(), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """Any view that fails because the database is unreachable answers the 503 JSON."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, UNREACHABLE):
            return unavailable_response(exception)
        return None
