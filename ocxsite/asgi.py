"""ASGI entry point: `/v1/*` goes to the lean proxy app, everything else to Django.

The proxy path skips Django's request machinery on purpose: sync middleware and
signal receivers cost several thread hops per request (PERFORMANCE-NOTES.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from ocxsite.body_limits import BoundedBody  # noqa: E402
from ocxsite.events import EventsConsumer  # noqa: E402
from ocxsite.proxy import ProxyApp  # noqa: E402

proxy_app = ProxyApp()


async def http_router(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["path"].startswith("/v1/"):
        await proxy_app(scope, receive, send)
    else:
        await django_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        # Bodies above their path's limit are refused before they are read (body_limits).
        "http": BoundedBody(http_router),
        # A browser sends the session cookie with any page's WebSocket: only pages of an allowed
        # host may open one (Origin checked against OCX_ALLOWED_HOSTS; no Origin, no socket).
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/events", EventsConsumer.as_asgi())]))
        ),
    }
)
