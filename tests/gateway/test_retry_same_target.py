"""`retrySameTarget` end to end (issue #29): a real `ocx serve` and a real `ocx mock-upstream`.

A transient failure before commit is retried on the same target (after its `Retry-After`, or a
short backoff) before the combo hops; the request log shows each retry; a success on retry
leaves no cooldown; spent retries cool and hop as before; other failures never retry.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events
from tests.gateway.test_proxy_failover import ask, setup_combo

RETRY = {"retrySameTarget": {"attempts": 2, "maxWaitMs": 2000}}
TERMINAL = {"responses": "response.completed", "chat": "[DONE]"}


def logged(server: Server, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    """The request log entry of `request_id` (written in batches: poll briefly)."""
    deadline = time.monotonic() + timeout
    while True:
        r = server.api.get("/api/requests", params={"request_id": request_id})
        assert r.status_code == 200, r.text
        found = r.json()["requests"]
        if found:
            return found[0]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"no request log entry for {request_id}"
        time.sleep(0.05)


def states(server: Server, combo_id: str) -> dict[str, str]:
    r = server.api.get("/api/status", params={"combo": combo_id})
    assert r.status_code == 200, r.text
    return {t["target"]: t["state"] for t in r.json()["combos"][0]["targets"]}


def counted(server: Server, metric: str, combo_id: str, reason: str) -> float:
    text = server.http.get("/metrics").text
    found = re.search(rf'^{metric}\{{combo="{combo_id}",reason="{reason}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def route(entry: dict[str, Any]) -> list[tuple[str, int | None, str, int | None]]:
    return [(a["target"], a["status"], a["outcome"], a.get("waitMs")) for a in entry["attempts"]]


def chat(server: Server, combo_id: str, headers: dict[str, str], stream: bool) -> httpx.Response:
    body = {
        "model": f"combo/{combo_id}",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }
    return server.http.post("/v1/chat/completions", json=body, headers=headers)


def assert_whole(r: httpx.Response, client: str, stream: bool, model: str) -> None:
    assert r.status_code == 200, r.text
    if stream:
        names = [e if client == "responses" else d for e, d in sse_events(r.text)]
        assert TERMINAL[client] in names
    elif client == "responses":
        assert r.json()["output"][0]["content"][0]["text"] == f"mock reply from {model}"
    else:
        assert r.json()["choices"][0]["message"]["content"] == f"mock reply from {model}"


# ---------------------------------------------------------------------------------------------
# Retried on the same target


@pytest.mark.parametrize("adapter", ["openai-responses", "openai-chat", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_429_once_is_retried_on_the_same_target(
    server: Server, mock: Mock, adapter: str, stream: bool
) -> None:
    mock.script("ra", [{"status": 429, "headers": {"Retry-After": "0.3"}}])
    combo_id, headers = setup_combo(
        server, mock, [("p1", "ra"), ("p2", "rb")], adapters={"p1": adapter}, **RETRY
    )

    r = ask(server, combo_id, headers, stream=stream)

    assert_whole(r, "responses", stream, "ra")
    assert r.headers["x-ocx-target"] == "p1/ra"
    assert r.headers["x-ocx-attempts"] == "2"
    first, second = mock.log("ra")
    assert (first["behaviour"]["status"], second["behaviour"]) == (429, {})
    assert second["t_ms"] - first["t_ms"] >= 300  # the Retry-After was waited
    assert mock.hits("rb") == 0
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert route(entry) == [("p1/ra", 429, "retry", 300), ("p1/ra", 200, "served", None)]
    assert entry["attempts"][0]["reason"] == "rate_limited"
    assert entry["attempts"][0]["cooledUntil"] is None
    # A success on retry leaves no cooldown: the target is available for the next request.
    assert states(server, combo_id)["p1/ra"] == "available"
    r = ask(server, combo_id, headers, stream=stream)
    assert r.headers["x-ocx-target"] == "p1/ra" and r.headers["x-ocx-attempts"] == "1"


@pytest.mark.parametrize("adapter", ["openai-responses", "openai-chat", "anthropic"])
def test_a_500_once_is_retried_on_the_same_target(server: Server, mock: Mock, adapter: str) -> None:
    mock.script("fa", [{"status": 500}])
    combo_id, headers = setup_combo(
        server, mock, [("p1", "fa"), ("p2", "fb")], adapters={"p1": adapter}, **RETRY
    )

    r = chat(server, combo_id, headers, stream=adapter == "anthropic")

    assert_whole(r, "chat", adapter == "anthropic", "fa")
    assert r.headers["x-ocx-target"] == "p1/fa"
    assert (mock.hits("fa"), mock.hits("fb")) == (2, 0)
    entry = logged(server, r.headers["x-ocx-request-id"])
    (retry_target, status, outcome, wait), served = route(entry)
    assert (retry_target, status, outcome) == ("p1/fa", 500, "retry")
    assert wait is not None and 100 <= wait <= 500  # the jittered backoff
    assert served == ("p1/fa", 200, "served", None)
    assert states(server, combo_id)["p1/fa"] == "available"
    assert counted(server, "ocx_same_target_retries_total", combo_id, "server_error") == 1
    assert counted(server, "ocx_hops_total", combo_id, "server_error") == 0


def test_a_reset_connection_is_retried(server: Server, mock: Mock) -> None:
    mock.script("xa", [{"reset": True}])
    combo_id, headers = setup_combo(server, mock, [("p1", "xa"), ("p2", "xb")], **RETRY)

    r = ask(server, combo_id, headers, stream=True)

    assert_whole(r, "responses", True, "xa")
    assert r.headers["x-ocx-target"] == "p1/xa"
    assert (mock.hits("xa"), mock.hits("xb")) == (2, 0)
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert [(a["outcome"], a["reason"]) for a in entry["attempts"]] == [
        ("retry", "connection"),
        ("served", ""),
    ]


# ---------------------------------------------------------------------------------------------
# Hop as today


def test_retry_off_hops_to_the_second_target(server: Server, mock: Mock) -> None:
    mock.script("oa", [{"status": 429, "headers": {"Retry-After": "1"}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "oa"), ("p2", "ob")])

    r = ask(server, combo_id, headers)

    assert_whole(r, "responses", False, "ob")
    assert r.headers["x-ocx-target"] == "p2/ob"
    assert (mock.hits("oa"), mock.hits("ob")) == (1, 1)
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert [a["outcome"] for a in entry["attempts"]] == ["hop", "served"]
    assert states(server, combo_id)["p1/oa"] == "cooling"


def test_a_retry_after_longer_than_max_wait_hops_at_once(server: Server, mock: Mock) -> None:
    mock.script("la", [{"status": 429, "headers": {"Retry-After": "3"}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "la"), ("p2", "lb")], **RETRY)

    started = time.monotonic()
    r = ask(server, combo_id, headers)

    assert r.headers["x-ocx-target"] == "p2/lb"
    assert time.monotonic() - started < 2  # no wait at all
    assert (mock.hits("la"), mock.hits("lb")) == (1, 1)
    assert states(server, combo_id)["p1/la"] == "cooling"


QUOTA = {"error": {"code": "insufficient_quota", "message": "quota", "type": "insufficient_quota"}}
BAD = {"error": {"code": "bad", "message": "bad", "type": "invalid_request_error"}}


# Each case on a provider of its own: a usage limit leaves its credential out of quota.
@pytest.mark.parametrize(
    ("first", "step", "outcome"),
    [
        ("pauth", {"status": 401}, "hop"),
        ("pquota", {"status": 429, "headers": {"Retry-After": "1"}, "body": QUOTA}, "hop"),
        ("pusage", {"usage_limit": {"resets_in_seconds": 1}}, "hop"),
        ("pbad", {"status": 400, "body": BAD}, "stop"),
    ],
    ids=["auth", "quota", "usage-limit", "client-error"],
)
def test_no_retry_for_auth_quota_or_client_errors(
    server: Server, mock: Mock, first: str, step: dict[str, Any], outcome: str
) -> None:
    mock.script("na", [step])
    combo_id, headers = setup_combo(server, mock, [(first, "na"), ("p2", "nb")], **RETRY)

    r = chat(server, combo_id, headers, stream=False)

    assert mock.hits("na") == 1
    assert mock.hits("nb") == (1 if outcome == "hop" else 0)
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert entry["attempts"][0]["outcome"] == outcome
    assert all(a["outcome"] != "retry" for a in entry["attempts"])


def test_spent_retries_cool_the_target_and_hop(server: Server, mock: Mock) -> None:
    mock.script("sa", [{"status": 503}, {"status": 503}, {"status": 503}])
    combo_id, headers = setup_combo(server, mock, [("p1", "sa"), ("p2", "sb")], **RETRY)

    r = ask(server, combo_id, headers, stream=True)

    assert_whole(r, "responses", True, "sb")
    assert r.headers["x-ocx-target"] == "p2/sb"
    assert r.headers["x-ocx-attempts"] == "4"
    assert (mock.hits("sa"), mock.hits("sb")) == (3, 1)
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert [(a["target"], a["outcome"]) for a in entry["attempts"]] == [
        ("p1/sa", "retry"),
        ("p1/sa", "retry"),
        ("p1/sa", "hop"),
        ("p2/sb", "served"),
    ]
    assert entry["attempts"][2]["cooledUntil"] is not None
    assert states(server, combo_id)["p1/sa"] == "cooling"
