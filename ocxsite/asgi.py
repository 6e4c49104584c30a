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
from django.conf import settings  # noqa: E402
from django.urls import path  # noqa: E402

from gateway import runtime as proxy_runtime  # noqa: E402
from gateway.events import EventsConsumer  # noqa: E402
from gateway.proxy import ProxyApp  # noqa: E402
from gateway.ws_origin import SameOriginValidator  # noqa: E402
from server import body_limits  # noqa: E402
from server.body_limits import BoundedBody  # noqa: E402
from server.forwarded import forwarded  # noqa: E402
from server.request_path import normalized_text  # noqa: E402
from usage.requestlog import new_request_id  # noqa: E402

proxy_app = ProxyApp()


def _proxy_keys() -> object:
    # The proxy's own key map, so that the small unauthenticated body limit and the proxy's
    # 401 agree; None until it is loaded (`preload_keys`, before the first request).
    loaded = proxy_runtime._runtime  # noqa: SLF001 - read only
    return None if loaded is None or loaded.keys_version < 0 else loaded.keys


body_limits.key_map = _proxy_keys  # type: ignore[assignment]
body_limits.request_id = new_request_id

if os.environ.get("OCX_WORKER"):
    # Known keys before the first request: a made-up key never gets the authenticated body
    # limit (issue #43).
    proxy_runtime.preload_keys()

if os.environ.get("OCX_WORKER"):
    # `ocx serve` raised it already (inherited); a worker started some other way raises its own.
    from server import fdlimit  # noqa: E402

    _nofile = fdlimit.raise_soft_limit()
    if _nofile is not None:
        fdlimit.log.info("worker %d open-files limit: %d", os.getpid(), _nofile[1])


async def http_router(scope, receive, send):  # type: ignore[no-untyped-def]
    path = normalized_text(scope["path"])
    if path != scope["path"]:
        # One spelling of a path for routing, as for its body limit (issue #43).
        scope = {**scope, "path": path}
    if path.startswith("/v1/"):
        await proxy_app(scope, receive, send)
    else:
        await django_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        # Bodies above their path's limit are refused before they are read (body_limits).
        # X-Forwarded-* only from OCX_TRUSTED_PROXIES (server.forwarded; nothing by default).
        "http": forwarded(BoundedBody(http_router), settings.OCX_TRUSTED_PROXIES),
        # A browser sends the session cookie with any page's WebSocket: only pages of this site
        # may open one (Origin's scheme, host and port; no Origin, no socket: gateway.ws_origin).
        "websocket": forwarded(
            SameOriginValidator(
                AuthMiddlewareStack(URLRouter([path("ws/events", EventsConsumer.as_asgi())]))
            ),
            settings.OCX_TRUSTED_PROXIES,
        ),
    }
)
