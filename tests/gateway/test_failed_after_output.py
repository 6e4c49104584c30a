"""An upstream `response.failed` after output is logged as a failure, not `ok` (issue #43,
point 4), for a bare `provider/model` target and for a combo alike."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.conftest import Mock, Server


def logged(server: Server, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while True:
        found = server.api.get("/api/requests", params={"request_id": request_id}).json()
        if found["requests"]:
            return found["requests"][0]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, request_id
        time.sleep(0.05)


@pytest.mark.parametrize("via", ["bare", "combo"])
def test_response_failed_after_output_is_a_failure(server: Server, mock: Mock, via: str) -> None:
    tag = uuid.uuid4().hex[:6]
    model = f"rf-{tag}"
    server.put_provider(
        f"rf{tag}",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": "rf-test-key-0123456789",
            "models": {model: {"contextWindow": 100000}},
        },
    )
    name = f"rf{tag}/{model}"
    if via == "combo":
        server.put_combo(f"c{tag}", {"targets": [{"provider": f"rf{tag}", "model": model}]})
        name = f"combo/c{tag}"
    server.wait_synced()
    mock.script(model, [{"fail": "after_output"}])
    r = server.http.post(
        "/v1/responses",
        json={"model": name, "input": "hi", "stream": True},
        headers={"Authorization": f"Bearer {server.create_key()}"},
    )
    assert r.status_code == 200 and "response.failed" in r.text
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert entry["outcome"] == "failed_after_commit", entry
    assert [a["outcome"] for a in entry["attempts"]] == ["failed_after_commit"]
