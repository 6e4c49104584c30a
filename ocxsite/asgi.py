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
from django.urls import path  # noqa: E402

from gateway.events import EventsConsumer  # noqa: E402
from gateway.proxy import ProxyApp  # noqa: E402

proxy_app = ProxyApp()

if os.environ.get("OCX_WORKER"):
    # `ocx serve` raised it already (inherited); a worker started some other way raises its own.
    from server import fdlimit  # noqa: E402

    _nofile = fdlimit.raise_soft_limit()
    if _nofile is not None:
        fdlimit.log.info("worker %d open-files limit: %d", os.getpid(), _nofile[1])


async def http_router(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["path"].startswith("/v1/"):
        await proxy_app(scope, receive, send)
    else:
        await django_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_router,
        "websocket": AuthMiddlewareStack(URLRouter([path("ws/events", EventsConsumer.as_asgi())])),
    }
)
