"""JSON errors where Django or ninja would answer with plain text or HTML.

Shapes (docs/operations.md "Error shapes"):
- `/api/*`, `/admin/*`, `/healthz`, … (Django): `{"error": "<message>"}`, the management API's
  own shape (`ocxsite.api.error_body`);
- `/v1/*` (the proxy): the OpenAI shape `{"error": {"type", "code", "message"}}`.

A Host not in ALLOWED_HOSTS is refused on every path: Django raises DisallowedHost (answered by
`bad_request`, the handler400), and the lean `/v1/*` app, which bypasses Django's request
machinery, asks `HostGate` (precomputed at startup; a set lookup per request).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.http.request import split_domain_port, validate_host
from django.views import defaults

HOST_NOT_ALLOWED = "host not allowed: add it to OCX_ALLOWED_HOSTS on the server"
# Django's plain-text/HTML answers that the management API turns into its JSON shape.
_API_MESSAGES = {404: "not found", 405: "method not allowed"}


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponseBase:
    """handler400: a disallowed Host is a JSON 400 on every Django path (admin included)."""
    if isinstance(exception, DisallowedHost):
        # Django's own message names the host and how to allow it: not for the client.
        return JsonResponse({"error": HOST_NOT_ALLOWED}, status=400)
    return defaults.bad_request(request, exception)


def json_api_errors(
    get_response: Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]],
) -> Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]:
    """Middleware: a disallowed Host is refused on every Django path, static files included;
    `/api/*` 404/405 answers that are not JSON get `{"error": …}` (ninja's 405 is text
    "Method not allowed"; an unknown path is Django's HTML 404). `Allow` is kept."""

    def convert(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        message = _API_MESSAGES.get(response.status_code)
        if (
            message is None
            or not request.path.startswith("/api/")
            or response.get("Content-Type", "").startswith("application/json")
        ):
            return response
        out = JsonResponse({"error": message}, status=response.status_code)
        if response.has_header("Allow"):
            out["Allow"] = response["Allow"]
        return out

    # Each middleware checks the Host first (DisallowedHost → `bad_request`): before WhiteNoise,
    # so static files are refused to a disallowed Host like every other Django path.
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponseBase:
            request.get_host()
            return convert(request, await get_response(request))  # type: ignore[misc]

        return markcoroutinefunction(middleware)

    def sync_middleware(request: HttpRequest) -> HttpResponseBase:
        request.get_host()
        return convert(request, get_response(request))  # type: ignore[arg-type]

    return sync_middleware


json_api_errors.sync_capable = True  # type: ignore[attr-defined]
json_api_errors.async_capable = True  # type: ignore[attr-defined]


class HostGate:
    """ALLOWED_HOSTS for the `/v1/*` ASGI app, with Django's rules (port ignored, case-insensitive,
    `.example.com` = the domain and its subdomains, `*` = anything).

    Built once at startup. Per request: one dict lookup of the Host header; a header seen for
    the first time is checked with Django's `validate_host` and remembered (a bounded cache, so
    random hosts cannot grow it without limit)."""

    CACHE_LIMIT = 1024

    def __init__(self, allowed_hosts: Iterable[str]) -> None:
        self.patterns = [h.lower() for h in allowed_hosts]
        self.allow_all = "*" in self.patterns
        self._seen: dict[str, bool] = {}

    def allows(self, host: str | None) -> bool:
        if self.allow_all:
            return True
        if host is None:
            return False
        verdict = self._seen.get(host)
        if verdict is None:
            verdict = self._check(host)
            if len(self._seen) < self.CACHE_LIMIT:
                self._seen[host] = verdict
        return verdict

    def _check(self, host: str) -> bool:
        domain, _ = split_domain_port(host)
        return bool(domain) and validate_host(domain, self.patterns)
