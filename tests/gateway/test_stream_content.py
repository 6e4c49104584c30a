"""A stream is judged by its content, not by a missing trailer (PRODUCT §5.4, issue 12 part 3):
terminal signals without `[DONE]`, malformed frames (pass-through vs translated) and calls to
tools the request did not declare — end to end through `ocx serve` and `ocx mock-upstream`,
streaming and not, on both inbound APIs."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Mock, Server, sse_events, start_server
from tests.server.test_workers import REDIS_URL, needs_redis, spread_clients

KEYS = {"p1": "sk-test-primary-aaaaaaaaaaaaaaaaaaaa", "p2": "sk-test-backup-bbbbbbbbbbbbbbbbbbbbb"}
CALLER_TOKEN = "caller-chatgpt-token-zzzzzzzzzzzzzz"
PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}}
RESPONSES_TOOLS = [{"type": "function", "name": "current_tool", "parameters": PARAMS}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "current_tool", "parameters": PARAMS}}]
ADAPTERS = ["openai-responses", "chatgpt", "openai-chat", "anthropic"]


def setup(
    server: Server, mock: Mock, targets: list[tuple[str, str, str]]
) -> tuple[str, dict[str, str]]:
    """Providers (name, adapter, model) on the mock and a combo over them, in order. Returns
    (model to ask for, client headers)."""
    key = server.create_key()
    for name, adapter, model in targets:
        spec: dict[str, Any] = {
            "adapter": adapter,
            "baseUrl": mock.url + "/v1",
            "timeouts": {"firstByteMs": 2000, "idleMs": 2000},
            "models": {model: {"contextWindow": 100000}},
        }
        if adapter != "chatgpt":
            spec["apiKey"] = KEYS[name]
        server.put_provider(name, spec)
    combo_id = "t" + uuid.uuid4().hex[:8]
    server.put_combo(combo_id, {"targets": [{"provider": p, "model": m} for p, _, m in targets]})
    server.http.get("/v1/models")
    server.wait_synced()
    headers = {"x-ocx-key": key, "Authorization": f"Bearer {CALLER_TOKEN}"}
    return f"combo/{combo_id}", headers


def ask(
    server: Server,
    api: str,
    model: str,
    headers: dict[str, str],
    *,
    stream: bool,
    tools: bool = False,
    usage: bool = False,
) -> httpx.Response:
    if api == "responses":
        body: dict[str, Any] = {"model": model, "input": "hello", "stream": stream}
        if tools:
            body["tools"] = RESPONSES_TOOLS
        return server.http.post("/v1/responses", json=body, headers=headers)
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hello"}]}
    if tools:
        body["tools"] = CHAT_TOOLS
    if usage:
        body["stream_options"] = {"include_usage": True}
    return server.http.post("/v1/chat/completions", json=body, headers=headers)


def logged(server: Server, r: httpx.Response, timeout: float = 5.0) -> dict[str, Any]:
    """The request-log entry of a response (written in batches)."""
    request_id = r.headers["x-ocx-request-id"]
    deadline = time.monotonic() + timeout
    while True:
        found = server.api.get("/api/requests", params={"request_id": request_id}).json()
        if found["requests"]:
            return found["requests"][0]
        assert time.monotonic() < deadline, f"no request log entry for {request_id}"
        time.sleep(0.05)


def metric(server: Server, name: str, **labels: str) -> float:
    text = server.http.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def chat_text(payloads: list[Any]) -> str:
    return "".join(
        (c.get("delta") or {}).get("content") or ""
        for p in payloads
        if isinstance(p, dict)
        for c in p.get("choices", [])
    )


def assert_complete(api: str, r: httpx.Response, text: str) -> list[tuple[str | None, Any]]:
    """A normal end: `response.completed` (Responses) or a single final `[DONE]` (Chat), with the
    whole text and no error frame."""
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    if api == "responses":
        kinds = [e for e, _ in events]
        assert kinds[-1] == "response.completed", kinds
        assert "response.failed" not in kinds
        got = "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
    else:
        payloads = [d for _, d in events]
        assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1, payloads[-3:]
        assert not any(isinstance(p, dict) and "error" in p for p in payloads)
        got = chat_text(payloads)
    assert got == text
    return events


def assert_explicit_error(api: str, r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    if api == "responses":
        kinds = [e for e, _ in events]
        assert kinds[-1] == "response.failed", kinds
        assert "response.completed" not in kinds
        return dict(events[-1][1]["response"]["error"])
    payloads = [d for _, d in events]
    assert "[DONE]" not in payloads
    assert isinstance(payloads[-1], dict) and "error" in payloads[-1], payloads[-1]
    return dict(payloads[-1]["error"])


# ---------------------------------------------------------------------------------------------
# 1. A terminal signal without the trailer is a complete answer


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_chat_upstream_without_done_is_complete_with_usage(
    server: Server, mock: Mock, api: str
) -> None:
    model_name = f"nd{api}"
    mock.script(
        model_name, [{"omit_done": True, "usage": {"input_tokens": 11, "output_tokens": 3}}]
    )
    model, headers = setup(server, mock, [("p1", "openai-chat", model_name)])

    r = ask(server, api, model, headers, stream=True, usage=True)

    events = assert_complete(api, r, f"mock reply from {model_name}")
    if api == "responses":
        assert events[-1][1]["response"]["usage"]["input_tokens"] == 11
        assert events[-1][1]["response"]["usage"]["output_tokens"] == 3
    else:
        usage = [d["usage"] for _, d in events if isinstance(d, dict) and d.get("usage")]
        assert usage[-1]["prompt_tokens"] == 11 and usage[-1]["completion_tokens"] == 3
    entry = logged(server, r)
    assert entry["status"] == 200
    assert [a["outcome"] for a in entry["attempts"]] == ["served"]
    assert (entry["usage"]["inputTokens"], entry["usage"]["outputTokens"]) == (11, 3)


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("sentinel", [False, True], ids=["no-done", "done"])
def test_responses_upstream_completed_with_or_without_done(
    server: Server, mock: Mock, api: str, sentinel: bool
) -> None:
    model_name = f"rc{api}{int(sentinel)}"
    mock.script(model_name, [{"done_sentinel": sentinel}])
    model, headers = setup(server, mock, [("p1", "openai-responses", model_name)])
    r = ask(server, api, model, headers, stream=True)
    if api == "responses" and sentinel:
        # Pass-through: the client sees exactly what the upstream sent, `[DONE]` included.
        assert sse_events(r.text)[-1][1] == "[DONE]"
        assert sse_events(r.text)[-2][0] == "response.completed"
    else:
        assert_complete(api, r, f"mock reply from {model_name}")


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_anthropic_upstream_message_stop_without_done_is_complete(
    server: Server, mock: Mock, api: str
) -> None:
    model_name = f"an{api}"
    model, headers = setup(server, mock, [("p1", "anthropic", model_name)])
    r = ask(server, api, model, headers, stream=True)
    assert_complete(api, r, f"mock reply from {model_name}")


@pytest.mark.parametrize("adapter", ["openai-chat", "openai-responses", "anthropic"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_no_terminal_signal_at_all_is_a_cut(
    server: Server, mock: Mock, adapter: str, api: str
) -> None:
    model_name = f"cut{adapter[:6]}{api}"
    mock.script(model_name, [{"omit_terminal": True}])
    model, headers = setup(server, mock, [("p1", adapter, model_name)])
    r = ask(server, api, model, headers, stream=True)
    error = assert_explicit_error(api, r)
    assert error["message"]
    entry = logged(server, r)
    assert [a["outcome"] for a in entry["attempts"]] == ["failed_after_commit"]


@pytest.mark.parametrize(
    ("adapter", "api", "after"),
    [
        # Responses: 4 lifecycle + 3 deltas + 3 done events + response.completed = 11.
        ("openai-responses", "responses", 11),
        ("openai-responses", "chat", 11),
        # Chat: role, 3 content chunks, the finish_reason chunk = 5 (no usage, no [DONE]).
        ("openai-chat", "chat", 5),
        ("openai-chat", "responses", 5),
    ],
)
def test_cut_after_the_terminal_signal_is_complete(
    server: Server, mock: Mock, adapter: str, api: str, after: int
) -> None:
    model_name = f"ca{adapter[7:11]}{api}"
    mock.script(model_name, [{"cut_after_events": after}])
    model, headers = setup(server, mock, [("p1", adapter, model_name)])
    r = ask(server, api, model, headers, stream=True)
    assert_complete(api, r, f"mock reply from {model_name}")
    (attempt,) = logged(server, r)["attempts"]
    assert attempt["outcome"] == "served"


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_quiet_after_finish_reason_ends_as_complete_at_idle(
    server: Server, mock: Mock, api: str
) -> None:
    # Finish and usage chunks, then the upstream holds the connection without `[DONE]`.
    model_name = f"qf{api}"
    mock.script(model_name, [{"stall_after_events": 6}])
    model, headers = setup(server, mock, [("p1", "openai-chat", model_name)])
    started = time.monotonic()
    r = ask(server, api, model, headers, stream=True)
    assert time.monotonic() - started < 2.0 + 1.5  # idleMs 2000, then a normal end
    assert_complete(api, r, f"mock reply from {model_name}")


# ---------------------------------------------------------------------------------------------
# 2. Malformed frames: forwarded in pass-through, an explicit error when translated


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_pass_through_forwards_malformed_frame_and_counts_it(
    server: Server, mock: Mock, api: str
) -> None:
    adapter = "openai-responses" if api == "responses" else "openai-chat"
    model_name = f"mf{api}"
    after = 5 if api == "responses" else 2  # after the first text delta
    mock.script(model_name, [{"malformed_after_events": after, "deltas": 4}])
    model, headers = setup(server, mock, [("p1", adapter, model_name), ("p2", adapter, "other")])
    before = metric(server, "ocx_malformed_frames_total", provider="p1")

    r = ask(server, api, model, headers, stream=True)

    assert r.headers["x-ocx-target"] == f"p1/{model_name}"
    assert r.text.count("data: {not json\n\n") == 1  # exactly as received, once
    events = sse_events(r.text)
    assert events[after][1] == "{not json"  # in its place in the stream
    if api == "responses":
        assert events[-1][0] == "response.completed"
    else:
        assert events[-1][1] == "[DONE]"
    entry = logged(server, r)
    (attempt,) = entry["attempts"]
    assert (attempt["outcome"], attempt["malformedFrames"]) == ("served", 1)
    assert metric(server, "ocx_malformed_frames_total", provider="p1") == before + 1
    assert mock.hits("other") == 0


@pytest.mark.parametrize(
    ("api", "adapter", "after"),
    [("responses", "openai-chat", 2), ("chat", "openai-responses", 5), ("chat", "anthropic", 3)],
)
def test_translated_stream_ends_with_explicit_error_on_malformed_frame(
    server: Server, mock: Mock, api: str, adapter: str, after: int
) -> None:
    model_name = f"mt{api}{adapter[:6]}"
    mock.script(model_name, [{"malformed_after_events": after, "deltas": 4}])
    model, headers = setup(server, mock, [("p1", adapter, model_name), ("p2", adapter, "other")])

    r = ask(server, api, model, headers, stream=True)

    assert "{not json" not in r.text
    assert assert_explicit_error(api, r)["message"]
    entry = logged(server, r)
    (attempt,) = entry["attempts"]
    assert attempt["outcome"] == "failed_after_commit"
    assert attempt["malformedFrames"] == 1
    assert mock.hits("other") == 0  # committed: never replayed


# ---------------------------------------------------------------------------------------------
# 3. Undeclared tool calls


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_undeclared_first_call_hops_without_cooling(
    server: Server, mock: Mock, adapter: str, api: str, stream: bool
) -> None:
    stale = f"st{adapter[:6]}{api}{int(stream)}"
    mock.script(stale, [{"tool_call": {"name": "stale_tool"}}])
    fine = stale + "b"
    model, headers = setup(server, mock, [("p1", adapter, stale), ("p2", adapter, fine)])

    r = ask(server, api, model, headers, stream=stream, tools=True)

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == f"p2/{fine}"
    assert "stale_tool" not in r.text  # the undeclared call never reaches the client
    if stream:
        assert_complete(api, r, f"mock reply from {fine}")
    # The backup got the same tools.
    sent = [e["body"] for e in mock.log(fine)]
    assert len(sent) == 1
    assert "current_tool" in str(sent[0].get("tools"))
    entry = logged(server, r)
    first, second = entry["attempts"]
    assert (first["target"], first["outcome"], first["reason"]) == (
        f"p1/{stale}",
        "hop",
        "undeclared_tool",
    )
    assert first["cooledUntil"] is None
    assert second["outcome"] == "served"

    # Not cooled: the next request tries p1 first again (its script is used up: a normal reply).
    r = ask(server, api, model, headers, stream=stream, tools=True)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == f"p1/{stale}"
    assert mock.hits(stale) == 2


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_declared_call_is_the_answer(server: Server, mock: Mock, api: str) -> None:
    name = f"dc{api}"
    mock.script(name, [{"tool_call": {"name": "current_tool"}}])
    model, headers = setup(server, mock, [("p1", "openai-chat", name), ("p2", "openai-chat", "x")])
    r = ask(server, api, model, headers, stream=True, tools=True)
    assert r.headers["x-ocx-target"] == f"p1/{name}"
    assert "current_tool" in r.text
    assert mock.hits("x") == 0


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("adapter", ["openai-responses", "openai-chat", "anthropic"])
def test_undeclared_call_after_text_ends_with_explicit_error(
    server: Server, mock: Mock, adapter: str, api: str
) -> None:
    name = f"at{adapter[:6]}{api}"
    mock.script(name, [{"tool_call": {"name": "stale_tool"}, "lead_text": "Let me check."}])
    model, headers = setup(server, mock, [("p1", adapter, name), ("p2", adapter, name + "b")])

    r = ask(server, api, model, headers, stream=True, tools=True)

    assert r.headers["x-ocx-target"] == f"p1/{name}"
    events = sse_events(r.text)
    if api == "responses":
        text = "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
    else:
        text = chat_text([d for _, d in events])
    assert text == "Let me check."  # what preceded the call, once
    error = assert_explicit_error(api, r)
    assert error["code"] == "undeclared_tool"
    assert "stale_tool" in error["message"]
    assert "function_call_arguments" not in r.text and '"tool_calls"' not in r.text
    entry = logged(server, r)
    (attempt,) = entry["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("failed_after_commit", "undeclared_tool")
    assert attempt["cooledUntil"] is None
    assert mock.hits(name + "b") == 0  # committed: never replayed


def test_undeclared_call_on_the_only_target_is_a_clean_error(server: Server, mock: Mock) -> None:
    mock.script("only", [{"tool_call": {"name": "stale_tool"}}])
    model, headers = setup(server, mock, [("p1", "openai-chat", "only")])
    r = ask(server, "chat", model, headers, stream=False, tools=True)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "upstream_undeclared_tool"
    assert "stale_tool" not in r.text


# ---------------------------------------------------------------------------------------------
# Several workers (PostgreSQL + Redis when the run has them)


@needs_redis
def test_counts_and_hops_on_every_worker(
    tmp_path_factory: pytest.TempPathFactory, mock: Mock
) -> None:
    """3 workers: a malformed pass-through frame is forwarded and counted by whichever worker
    serves it (`/metrics` sums them), and an undeclared call hops on every worker."""
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-content-workers"),
        workers=3,
        extra_env={"REDIS_URL": REDIS_URL or ""},
    )
    clients: list[Any] = []
    try:
        mock.script("wm", [], then={"malformed_after_events": 2})
        mock.script("ws", [], then={"tool_call": {"name": "stale_tool"}})
        model, headers = setup(
            server,
            mock,
            [("p1", "openai-chat", "wm"), ("p2", "openai-chat", "ws")],
        )
        undeclared, _ = setup(
            server, mock, [("p2", "openai-chat", "ws"), ("p1", "openai-chat", "wm")]
        )
        clients = spread_clients(server, headers)
        stored = server.http.get("/readyz").json()["configVersion"]
        for client in clients:
            # A worker loads its runtime on its first /v1 request; then it serves `stored`.
            deadline = time.monotonic() + 10
            while (
                client.http.get("/v1/models").status_code != 200
                or client.http.get("/healthz").json().get("configVersion") != stored
            ):
                assert time.monotonic() < deadline, "a worker did not load the config"
                time.sleep(0.02)
        before = metric(server, "ocx_malformed_frames_total", provider="p1")
        chat = {"stream": True, "messages": [{"role": "user", "content": "hello"}]}
        for client in clients:
            r = client.http.post("/v1/chat/completions", json={"model": model, **chat})
            assert r.status_code == 200, r.text
            assert r.text.count("data: {not json\n\n") == 1
            assert sse_events(r.text)[-1][1] == "[DONE]"
            (attempt,) = logged(server, r)["attempts"]
            assert attempt["malformedFrames"] == 1

            body = {"model": undeclared, "tools": CHAT_TOOLS, **chat}
            r = client.http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.headers["x-ocx-target"] == "p1/wm"
            assert "stale_tool" not in r.text
            reasons = [(a["outcome"], a["reason"]) for a in logged(server, r)["attempts"]]
            assert reasons == [("hop", "undeclared_tool"), ("served", "")]
        after = metric(server, "ocx_malformed_frames_total", provider="p1")
        # One per malformed request, plus one per undeclared request's fallback to p1/wm.
        assert after - before == 2 * len(clients)
    finally:
        for client in clients:
            client.close()
        stop()
