"""Calling the proxy's ASGI app in the test's own event loop, without a server."""

from __future__ import annotations

from typing import Any

from gateway.proxy import ProxyApp


async def post(app: ProxyApp, path: str = "/v1/responses", body: bytes = b"{}") -> list[Any]:
    """The ASGI messages the app sent for one POST of `body` to `path`."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": [(b"host", b"localhost")]}
    await app(scope, receive, send)
    return sent
