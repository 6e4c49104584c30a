"""The fault list of PRODUCT §10, end to end through a real `ocx serve` and `ocx mock-upstream`.

Each test scripts one fault on the mock and checks the proxy's *conduct* from the mock's attempt
log (`t_ms` spacing, hit counts) as well as what the client saw: never hammer a cooled target,
never retry a terminal 400, never present a truncated answer as complete, never hang past the
bounds (PRODUCT §5.2–§5.8; combos-behaviour.md §2.8, §3.2–§3.4, §4).

Single faults already covered in `test_proxy_failover.py` / `test_proxy_streaming.py` are only
repeated here where this file checks a different property (timing bounds, spacing, billing).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events

KEYS = {
    "p1": "sk-test-faults-p1-aaaaaaaaaaaaaaaaaa",
    "p2": "sk-test-faults-p2-bbbbbbbbbbbbbbbbbb",
}
TIMEOUTS = {"connectMs": 500, "firstByteMs": 800, "idleMs": 800, "totalMs": 3000}
FIRST_BYTE_S = TIMEOUTS["firstByteMs"] / 1000
IDLE_S = TIMEOUTS["idleMs"] / 1000
CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def setup_combo(
    server: Server,
    mock: Mock,
    targets: list[tuple[str, str]],
    *,
    adapters: dict[str, str] | None = None,
    **combo: Any,
) -> tuple[str, dict[str, str]]:
    """Providers p1, p2 on the mock with the short timeouts above; a fresh combo over `targets`.
    Returns (combo id, client headers)."""
    key = server.create_key(user="faults")
    by_provider: dict[str, list[str]] = {}
    for name, model in targets:
        by_provider.setdefault(name, []).append(model)
    for name, models in by_provider.items():
        server.put_provider(
            name,
            {
                "adapter": (adapters or {}).get(name, "openai-responses"),
                "baseUrl": mock.url + "/v1",
                "apiKey": KEYS[name],
                "timeouts": TIMEOUTS,
                "models": {m: {"contextWindow": 100000} for m in models},
            },
        )
    combo_id = "f" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id, {"targets": [{"provider": p, "model": m} for p, m in targets], **combo}
    )
    server.http.get("/v1/models")  # starts the worker's runtime; 401 is fine
    server.wait_synced()
    return combo_id, {"Authorization": f"Bearer {key}"}


def ask(
    server: Server, combo_id: str, headers: dict[str, str], *, stream: bool = False
) -> httpx.Response:
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": stream}
    return server.http.post("/v1/responses", json=body, headers=headers)


def ask_chat(
    server: Server, combo_id: str, headers: dict[str, str], *, stream: bool = False
) -> httpx.Response:
    body = {"model": f"combo/{combo_id}", "stream": stream, **CHAT}
    return server.http.post("/v1/chat/completions", json=body, headers=headers)


def kinds(events: list[tuple[str | None, Any]]) -> list[Any]:
    return [
        e if e is not None else (d.get("type") if isinstance(d, dict) else d) for e, d in events
    ]


def gaps(log: list[dict[str, Any]]) -> list[int]:
    return [b["t_ms"] - a["t_ms"] for a, b in zip(log, log[1:], strict=False)]


def logged(server: Server, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    """The request-log entry of `request_id` (written in batches every ≤ 0.5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        r = server.api.get("/api/requests", params={"request_id": request_id})
        assert r.status_code == 200, r.text
        found = r.json()["requests"]
        if found:
            assert len(found) == 1, found
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no request log entry for {request_id}")
        time.sleep(0.05)


def sequential(
    server: Server,
    combo_id: str,
    headers: dict[str, str],
    *,
    seconds: float | None = None,
    count: int | None = None,
    every: float = 0.2,
) -> list[httpx.Response]:
    """Requests one after another, one started every `every` seconds (never two at once),
    for `seconds` or `count` requests."""
    out: list[httpx.Response] = []
    started = time.monotonic()
    while True:
        if count is not None and len(out) >= count:
            return out
        if seconds is not None and time.monotonic() - started >= seconds:
            return out
        tick = time.monotonic()
        out.append(ask(server, combo_id, headers))
        time.sleep(max(0.0, every - (time.monotonic() - tick)))


# ---------------------------------------------------------------------------------------------
# 1–3. Cooled targets are never hammered


def test_retry_after_honoured_under_steady_traffic(server: Server, mock: Mock) -> None:
    """429 + `Retry-After: 2` once: nothing reaches the target for 2 s (the explicit server
    delay wins over the combo's shorter cooldownMs), and it is used again once that passes."""
    mock.script("ra", [{"status": 429, "headers": {"Retry-After": "2"}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ra"), ("p2", "rb")], cooldownMs=500)

    responses = sequential(server, combo_id, headers, seconds=3.0, every=0.2)

    assert [r.status_code for r in responses] == [200] * len(responses)
    assert responses[0].headers["x-ocx-target"] == "p2/rb"
    log = mock.log("ra")
    assert log[0]["behaviour"]["status"] == 429
    assert len(log) >= 2, "the target was never contacted again after its Retry-After"
    # Not contacted before 2 s after the 429 ...
    assert log[1]["t_ms"] - log[0]["t_ms"] >= 2000, gaps(log)
    # ... and contacted soon after (requests arrive every ~200 ms).
    assert log[1]["t_ms"] - log[0]["t_ms"] < 2000 + 700, gaps(log)
    assert log[1]["behaviour"] == {}
    assert responses[-1].headers["x-ocx-target"] == "p1/ra"
    assert responses[-1].headers["x-ocx-attempts"] == "1"
    # Every request while it cooled went straight to the fallback, in one attempt.
    on_fallback = [r for r in responses[1:] if r.headers["x-ocx-target"] == "p2/rb"]
    assert on_fallback and all(r.headers["x-ocx-attempts"] == "1" for r in on_fallback)
    assert mock.hits("rb") == 1 + len(on_fallback)


def _persistent_failure_is_not_hammered(server: Server, mock: Mock, status: int) -> None:
    model_a, model_b = f"pa{status}", f"pb{status}"
    mock.script(model_a, [], then={"status": status})
    combo_id, headers = setup_combo(
        server, mock, [("p1", model_a), ("p2", model_b)], cooldownMs=1000
    )

    responses = sequential(server, combo_id, headers, seconds=3.0, every=0.1)

    # Every request fails over and is served.
    assert len(responses) >= 15
    for r in responses:
        assert r.status_code == 200, r.text
        assert r.headers["x-ocx-target"] == f"p2/{model_b}"
        assert r.headers["x-ocx-attempts"] in ("1", "2")
    log = mock.log(model_a)
    # The primary is probed again after each cooldown (half-open) ...
    assert 2 <= len(log) <= 4, gaps(log)
    # ... but never twice within one cooldown period.
    assert all(g >= 1000 for g in gaps(log)), gaps(log)
    probes = [r for r in responses if r.headers["x-ocx-attempts"] == "2"]
    assert len(probes) == len(log)
    assert mock.hits(model_b) == len(responses)


def test_429_without_retry_after_never_hammers(server: Server, mock: Mock) -> None:
    _persistent_failure_is_not_hammered(server, mock, 429)


def test_503_persistent_fallback_serves_and_primary_probed_once_per_cooldown(
    server: Server, mock: Mock
) -> None:
    _persistent_failure_is_not_hammered(server, mock, 503)


# ---------------------------------------------------------------------------------------------
# 4–5. First-byte bound


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_response_fails_over_after_its_bound(server: Server, mock: Mock, stream: bool) -> None:
    # Streams must start within firstByteMs; a non-streaming answer gets totalMs in all
    # (it arrives whole when done), so that is its bound for "no response at all".
    mock.script("nra", [{"no_response": True}])
    combo_id, headers = setup_combo(server, mock, [("p1", "nra"), ("p2", "nrb")])
    bound_ms = TIMEOUTS["firstByteMs"] if stream else TIMEOUTS["totalMs"]

    started = time.monotonic()
    r = ask(server, combo_id, headers, stream=stream)
    elapsed = time.monotonic() - started

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/nrb"
    assert r.headers["x-ocx-attempts"] == "2"
    assert bound_ms / 1000 - 0.05 <= elapsed < bound_ms / 1000 + 1.0, elapsed
    (primary,) = mock.log("nra")
    (fallback,) = mock.log("nrb")
    waited = fallback["t_ms"] - primary["t_ms"]
    assert bound_ms - 50 <= waited < bound_ms + 1000, waited


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
@pytest.mark.parametrize("stream", [True], ids=["sse"])
def test_late_first_byte_hits_the_first_byte_limit(
    server: Server, mock: Mock, stream: bool
) -> None:
    mock.script("lfa", [{"delay_first_byte_ms": 2500}])
    combo_id, headers = setup_combo(server, mock, [("p1", "lfa"), ("p2", "lfb")])

    started = time.monotonic()
    r = ask(server, combo_id, headers, stream=stream)
    elapsed = time.monotonic() - started

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/lfb"
    assert elapsed < FIRST_BYTE_S + 1.0, elapsed  # did not wait for the 2.5 s answer
    if stream:
        events = sse_events(r.text)
        assert kinds(events).count("response.completed") == 1
        text = "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
    else:
        text = r.json()["output"][0]["content"][0]["text"]
    assert text == "mock reply from lfb"
    (primary,) = mock.log("lfa")
    (fallback,) = mock.log("lfb")
    waited = fallback["t_ms"] - primary["t_ms"]
    assert TIMEOUTS["firstByteMs"] - 50 <= waited < TIMEOUTS["firstByteMs"] + 1000, waited


# ---------------------------------------------------------------------------------------------
# 6. A flapping primary


def test_flapping_primary(server: Server, mock: Mock) -> None:
    failures = 3
    cooldown_ms = 400
    mock.script("fla", [{"status": 503}] * failures)  # then the default: success
    combo_id, headers = setup_combo(
        server, mock, [("p1", "fla"), ("p2", "flb")], cooldownMs=cooldown_ms
    )

    responses = sequential(server, combo_id, headers, count=20, every=0.12)

    assert [r.status_code for r in responses] == [200] * 20
    targets = [r.headers["x-ocx-target"] for r in responses]
    # Down: every request is served by the fallback; recovered: back on the primary for good.
    down = targets.index("p1/fla")
    assert targets == ["p2/flb"] * down + ["p1/fla"] * (20 - down), targets
    assert down >= failures
    assert 20 - down >= 4, "traffic did not come back to the primary"
    # Exactly `failures` requests paid for a failed probe; all others took one attempt.
    attempts = [r.headers["x-ocx-attempts"] for r in responses]
    assert attempts.count("2") == failures, attempts
    assert {a for i, a in enumerate(attempts) if i >= down} == {"1"}

    log = mock.log("fla")
    assert [e["behaviour"].get("status") for e in log[:failures]] == [503] * failures
    assert all(e["behaviour"] == {} for e in log[failures:])
    assert len(log) == failures + (20 - down)
    # One probe per cooldown: no two attempts on the primary closer than the cooldown until
    # it has answered successfully (the probes, then the recovering one).
    probing = gaps(log[: failures + 1])
    assert all(g >= cooldown_ms for g in probing), probing
    assert mock.hits("flb") == down


# ---------------------------------------------------------------------------------------------
# 7. The answer and the bill come from the target that served


FALLBACK_USAGE = {"input_tokens": 13, "output_tokens": 9, "cached_tokens": 4}


@pytest.mark.parametrize("client", ["responses", "responses-sse", "chat"])
def test_fallback_answer_names_its_model_and_carries_its_usage(
    server: Server, mock: Mock, client: str
) -> None:
    mock.script("ma", [{"status": 503}])
    mock.script("mb", [], then={"usage": FALLBACK_USAGE})
    combo_id, headers = setup_combo(server, mock, [("p1", "ma"), ("p2", "mb")])

    if client == "chat":
        r = ask_chat(server, combo_id, headers)
    else:
        r = ask(server, combo_id, headers, stream=client == "responses-sse")

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/mb"
    assert r.headers["x-ocx-attempts"] == "2"
    if client == "chat":
        body = r.json()
        assert body["model"] == "mb"
        assert body["usage"]["prompt_tokens"] == 13
        assert body["usage"]["completion_tokens"] == 9
    else:
        if client == "responses-sse":
            events = sse_events(r.text)
            (body,) = [d["response"] for e, d in events if e == "response.completed"]
            assert {d["response"]["model"] for e, d in events if e == "response.created"} == {"mb"}
        else:
            body = r.json()
        assert body["model"] == "mb"
        assert body["usage"]["input_tokens"] == 13
        assert body["usage"]["output_tokens"] == 9
        assert body["usage"]["input_tokens_details"]["cached_tokens"] == 4

    entry = logged(server, r.headers["x-ocx-request-id"])
    assert entry["target"] == "p2/mb"
    assert entry["usage"] == {"inputTokens": 13, "outputTokens": 9, "cachedTokens": 4}
    failed, served = entry["attempts"]
    assert (failed["target"], failed["status"], failed["outcome"]) == ("p1/ma", 503, "hop")
    assert failed.get("usage") is None  # the failed attempt is not billed
    assert (served["target"], served["outcome"]) == ("p2/mb", "served")


# ---------------------------------------------------------------------------------------------
# 8. Never hang past the bounds


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
@pytest.mark.parametrize("client", ["responses", "chat"])
def test_stall_after_output_ends_within_idle_bound(server: Server, mock: Mock, client: str) -> None:
    # Responses: created, in_progress, item added, part added, 1st delta — then silence until
    # the proxy hangs up. Chat: role chunk, 1st content chunk — then silence.
    events_before_stall = 5 if client == "responses" else 2
    mock.script("sta", [{"stall_after_events": events_before_stall, "deltas": 4}])
    adapter = "openai-chat" if client == "chat" else "openai-responses"
    combo_id, headers = setup_combo(
        server, mock, [("p1", "sta"), ("p2", "stb")], adapters={"p1": adapter}
    )

    started = time.monotonic()
    if client == "chat":
        r = ask_chat(server, combo_id, headers, stream=True)
    else:
        r = ask(server, combo_id, headers, stream=True)
    elapsed = time.monotonic() - started

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/sta"
    assert elapsed < IDLE_S + 1.0, elapsed
    events = sse_events(r.text)
    if client == "chat":
        payloads = [d for _, d in events]
        assert "[DONE]" not in payloads
        text = "".join(
            (c.get("delta") or {}).get("content") or ""
            for p in payloads
            if isinstance(p, dict)
            for c in p.get("choices", [])
        )
        assert text == "mock"
        assert isinstance(payloads[-1], dict) and payloads[-1]["error"]["message"]
    else:
        names = kinds(events)
        assert "response.completed" not in names
        assert names[-1] == "response.failed", names
        assert events[-1][1]["response"]["status"] == "failed"
        assert events[-1][1]["response"]["error"]["message"]
        assert [d["delta"] for e, d in events if e == "response.output_text.delta"] == ["mock"]
    assert mock.hits("stb") == 0  # committed: never replayed elsewhere
    assert mock.hits("sta") == 1


# ---------------------------------------------------------------------------------------------
# 9–10. Terminal 400s are never retried


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
def test_context_overflow_on_only_model_is_returned_once(server: Server, mock: Mock) -> None:
    message = (
        "This model's maximum context length is 100000 tokens. However, your messages "
        "resulted in 131072 tokens. Please reduce the length of the messages."
    )
    error = {"type": "invalid_request_error", "code": "context_length_exceeded", "message": message}
    mock.script("cxa", [{"status": 400, "body": {"error": error}}])
    # A wait budget would allow the single-target retry after a cooldown: it must not happen.
    combo_id, headers = setup_combo(server, mock, [("p1", "cxa")], waitForCooldownMs=2000)

    started = time.monotonic()
    r = ask(server, combo_id, headers)
    elapsed = time.monotonic() - started

    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "maximum context length" in err["message"]
    assert elapsed < 1.0, elapsed  # no wait for a retry
    assert mock.hits("cxa") == 1
    # The overflow did not cool the target: the next (fitting) request is served by it.
    r = ask(server, combo_id, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p1/cxa"
    assert mock.hits("cxa") == 2


@pytest.mark.parametrize("client", ["responses", "chat-sse"])
def test_content_filter_400_is_not_retried_anywhere(
    server: Server, mock: Mock, client: str
) -> None:
    message = (
        "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy. Please modify your prompt and retry."
    )
    error = {"type": "invalid_request_error", "code": "content_filter", "message": message}
    mock.script("cfa", [{"status": 400, "body": {"error": error}}])
    combo_id, headers = setup_combo(
        server,
        mock,
        [("p1", "cfa"), ("p2", "cfb")],
        adapters={"p1": "openai-chat" if client.startswith("chat") else "openai-responses"},
        waitForCooldownMs=2000,
    )

    if client == "chat-sse":
        r = ask_chat(server, combo_id, headers, stream=True)
    else:
        r = ask(server, combo_id, headers)

    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "content_filter"
    assert "content management policy" in err["message"]
    assert mock.hits("cfa") == 1
    assert mock.hits("cfb") == 0
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert entry["status"] == 400
    assert [a["target"] for a in entry["attempts"]] == ["p1/cfa"]


# ---------------------------------------------------------------------------------------------
# Review findings: answers that only look like answers, and config edits under load


@pytest.mark.parametrize("adapter", ["openai-responses", "openai-chat"])
def test_a_200_carrying_an_error_is_a_failed_attempt(
    server: Server, mock: Mock, adapter: str
) -> None:
    # Some gateways answer HTTP 200 with {"error": …}: never passed on as a (empty) answer.
    error = {"error": {"type": "server_error", "code": "upstream_error", "message": "overloaded"}}
    mock.script("e2a", [{"status": 200, "body": error}])
    combo_id, headers = setup_combo(
        server, mock, [("p1", "e2a"), ("p2", "e2b")], adapters={"p1": adapter}
    )
    r = ask(server, combo_id, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/e2b"
    assert r.headers["x-ocx-attempts"] == "2"
    assert r.json()["output"][0]["content"][0]["text"] == "mock reply from e2b"


def test_editing_a_provider_does_not_cut_its_streams(server: Server, mock: Mock) -> None:
    mock.script("ed1", [{"deltas": 12, "delta_ms": 100}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ed1"), ("p2", "ed2")])
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": True}
    with server.http.stream("POST", "/v1/responses", json=body, headers=headers) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        text = next(chunks)
        # A metadata-only edit of the provider while its stream is running.
        server.put_provider(
            "p1",
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": KEYS["p1"],
                "timeouts": TIMEOUTS,
                "models": {"ed1": {"contextWindow": 100000, "displayName": "Renamed"}},
            },
        )
        text += b"".join(chunks)
    events = kinds(sse_events(text.decode()))
    assert events.count("response.completed") == 1
    assert "response.failed" not in events
