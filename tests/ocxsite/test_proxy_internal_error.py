"""A failure inside ocx (a bug, Redis down) still answers in the OpenAI error shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ocxsite.proxy import ProxyApp


class BrokenRuntime:
    async def ready(self) -> Any:
        raise ConnectionError("state backend unreachable")


def test_internal_failure_before_commit_is_an_openai_shaped_502() -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/v1/responses", "method": "POST", "headers": []}
    app = ProxyApp(runtime=BrokenRuntime())  # type: ignore[arg-type]
    asyncio.run(app(scope, receive, send))

    start, body = sent[0], sent[1]
    assert start["status"] == 502
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    request_id = headers[b"x-ocx-request-id"].decode()
    error = json.loads(body["body"])["error"]
    assert error["code"] == "internal_error"
    assert request_id in error["message"]
    assert "unreachable" not in error["message"]  # no internals leak to the client
    assert len(sent) == 2 and body["more_body"] is False
