"""A failure inside ocx (a bug, Redis down) still answers in the OpenAI error shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.proxy import ProxyApp
from tests.gateway.direct import post


class Entries:
    def __init__(self) -> None:
        self.submitted: list[Any] = []

    def submit(self, entry: Any) -> None:
        self.submitted.append(entry)


class BrokenRuntime:
    def __init__(self) -> None:
        self.requestlog = Entries()

    async def ready(self) -> Any:
        raise ConnectionError("state backend unreachable")


def test_internal_failure_before_commit_is_an_openai_shaped_502() -> None:
    runtime = BrokenRuntime()
    app = ProxyApp(runtime=runtime)  # type: ignore[arg-type]
    sent = asyncio.run(post(app))

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
    # The request log has it, with the status the client got.
    [entry] = runtime.requestlog.submitted
    assert (entry.request_id, entry.status, entry.outcome) == (request_id, 502, "internal_error")
