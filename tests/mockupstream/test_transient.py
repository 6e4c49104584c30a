"""The mock's transient-failure recipes for `retrySameTarget` (issue #29): a 429 with
`Retry-After` once, then 200; a 500 once, then 200 — on every protocol, streamed and not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from mockupstream.server import MockState, serve


@pytest_asyncio.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    state = MockState(require_keys=frozenset())
    server = await serve("127.0.0.1", 0, state)
    port = server.sockets[0].getsockname()[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        yield http
    server.close()
    state.cancel_connections()
    await server.wait_closed()


def request(protocol: str, stream: bool) -> tuple[str, dict[str, Any]]:
    if protocol == "responses":
        return "/v1/responses", {"model": "tm", "input": "hi", "stream": stream}
    message = {"role": "user", "content": "hi"}
    if protocol == "chat":
        return "/v1/chat/completions", {"model": "tm", "messages": [message], "stream": stream}
    body = {"model": "tm", "max_tokens": 16, "messages": [message], "stream": stream}
    return "/v1/messages", body


TERMINAL = {"responses": "response.completed", "chat": "data: [DONE]", "anthropic": "message_stop"}
SCENARIOS = {
    "429 Retry-After 2 once": ({"status": 429, "headers": {"Retry-After": "2"}}, 429, "2"),
    "500 once": ({"status": 500}, 500, None),
}


@pytest.mark.parametrize("protocol", ["responses", "chat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_fails_once_then_answers(
    client: httpx.AsyncClient, protocol: str, stream: bool, scenario: str
) -> None:
    step, status, retry_after = SCENARIOS[scenario]
    r = await client.post("/_mock/script", json={"model": "tm", "steps": [step]})
    assert r.status_code == 200
    path, body = request(protocol, stream)

    first = await client.post(path, json=body)
    second = await client.post(path, json=body)

    assert first.status_code == status
    assert first.headers.get("retry-after") == retry_after
    assert "error" in first.json()
    assert second.status_code == 200
    assert "retry-after" not in second.headers
    if stream:
        assert second.headers["content-type"] == "text/event-stream"
        assert TERMINAL[protocol] in second.text
    else:
        assert "mock reply from tm" in second.text
    log = (await client.get("/_mock/log", params={"model": "tm"})).json()
    assert [e["behaviour"] for e in log] == [step, {}]
