"""`retrySameTarget` never follows a timeout (issue #43, point 5), end to end.

A target that sends no first byte, or stalls before output, is not retried on the same target:
the combo moves on to the next target at once, after ONE timeout. Hit counts on the mock, not
wall time, prove it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.conftest import Mock, Server, sse_events

RETRY = {"attempts": 3, "maxWaitMs": 1000}


def setup(server: Server, mock: Mock, **combo: Any) -> tuple[str, str, list[str]]:
    key = server.create_key()
    tag = uuid.uuid4().hex[:6]
    names = [f"silent{tag}", f"next{tag}"]
    for i, name in enumerate(names):
        server.put_provider(
            f"s{i + 1}",
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": f"silent-test-key-{i + 1}-0123456789",
                "timeouts": {"firstByteMs": 300, "idleMs": 300, "totalMs": 1000},
                "models": {name: {"contextWindow": 100000}},
            },
        )
    combo_id = "t" + tag
    targets = [{"provider": f"s{i + 1}", "model": n} for i, n in enumerate(names)]
    server.put_combo(combo_id, {"targets": targets, "retrySameTarget": RETRY, **combo})
    server.wait_synced()
    return f"combo/{combo_id}", key, names


@pytest.mark.parametrize("after_commit", ["error", "buffer"])
@pytest.mark.parametrize(
    "silence",
    [{"no_response": True}, {"stall_after_events": 1}, {"stall_after_events": 4}],
    ids=["no-first-byte", "stall-before-output", "stall-after-output"],
)
@pytest.mark.parametrize("stream", [True, False])
def test_a_silent_target_is_left_after_one_timeout(
    server: Server, mock: Mock, after_commit: str, silence: dict[str, Any], stream: bool
) -> None:
    if not stream and "stall_after_events" in silence:
        pytest.skip("a stall is a stream's")
    if silence.get("stall_after_events") == 4 and after_commit == "error":
        pytest.skip("after output the client has the stream: nothing to move on from")
    model, key, (silent, other) = setup(server, mock, afterCommit=after_commit)
    mock.script(silent, [], silence)
    mock.script(other, [], {})
    r = server.http.post(
        "/v1/responses",
        json={"model": model, "input": "hi", "stream": stream},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    if stream:
        names = [e for e, _ in sse_events(r.text)]
        assert "response.completed" in names
    assert (mock.hits(silent), mock.hits(other)) == (1, 1)
