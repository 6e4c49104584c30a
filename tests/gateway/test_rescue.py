"""End to end: a combo's `afterCommit` policy when a stream breaks after it started (issue #29),
through a real `ocx serve` and `ocx mock-upstream`, for Chat, Responses and Anthropic upstreams
and Chat and Responses clients."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events, start_server

TEXT = "The quick brown fox jumps over the lazy dog and runs far away"
OTHER = "Another answer entirely that the first target would have given"
DELTAS = 6
ADAPTERS = {"chat": "openai-chat", "responses": "openai-responses", "anthropic": "anthropic"}
# Events before the third text delta, per upstream protocol: a cut there leaves two deltas.
BEFORE_THIRD = {"responses": 6, "chat": 3, "anthropic": 4}
KEYS = {
    "p1": "sk-rescue-first-aaaaaaaaaaaaaaaaa",
    "p2": "sk-rescue-second-bbbbbbbbbbbbbbb",
    "p3": "sk-rescue-third-ccccccccccccccccc",
}
TOOLS_RESPONSES = [
    {
        "type": "function",
        "name": "shell",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
TOOLS_CHAT = [{"type": "function", "function": {k: v for k, v in TOOLS_RESPONSES[0].items()}}]
TOOLS_CHAT[0]["function"].pop("type")


def setup(
    server: Server,
    mock: Mock,
    upstream: str,
    *,
    models: tuple[str, ...] = ("a", "b"),
    prefill: tuple[bool, ...] = (True, True),
    idle_ms: int = 2000,
    **combo: Any,
) -> tuple[str, str, list[str]]:
    """One provider per model (p1, p2) on the mock speaking `upstream`; a fresh combo over
    them with `combo`'s fields. Returns (combo model name, client key, mock model names)."""
    key = server.create_key()
    tag = uuid.uuid4().hex[:6]
    names = [f"{m}{tag}" for m in models]
    for i, (name, can) in enumerate(zip(names, prefill, strict=True)):
        server.put_provider(
            f"p{i + 1}",
            {
                "adapter": ADAPTERS[upstream],
                "baseUrl": mock.url + "/v1",
                "apiKey": KEYS[f"p{i + 1}"],
                "timeouts": {"firstByteMs": 2000, "idleMs": idle_ms},
                "models": {name: {"contextWindow": 100000, "prefill": can}},
            },
        )
    combo_id = "r" + tag
    targets = [{"provider": f"p{i + 1}", "model": n} for i, n in enumerate(names)]
    server.put_combo(combo_id, {"targets": targets, **combo})
    server.http.get("/v1/models")
    server.wait_synced()
    return f"combo/{combo_id}", key, names


def ask(
    server: Server, client: str, model: str, key: str, *, tools: bool = False
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if client == "responses":
        body: dict[str, Any] = {"model": model, "input": "hello", "stream": True}
        if tools:
            body["tools"] = TOOLS_RESPONSES
        return server.http.post("/v1/responses", json=body, headers=headers)
    body = {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": "hello"}],
        "stream_options": {"include_usage": True},
    }
    if tools:
        body["tools"] = TOOLS_CHAT
    return server.http.post("/v1/chat/completions", json=body, headers=headers)


def whole_answer(client: str, r: httpx.Response) -> str:
    """The text of a stream that must have ended as one complete answer: exactly one terminal,
    no error, consistent ids; for Responses rising sequence numbers and a final output that
    holds the same text."""
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    if client == "chat":
        payloads = [d for _, d in events]
        assert payloads.count("[DONE]") == 1 and payloads[-1] == "[DONE]", payloads
        chunks = [p for p in payloads if isinstance(p, dict)]
        assert not any("error" in p for p in chunks), chunks
        assert len({p["id"] for p in chunks}) == 1, {p["id"] for p in chunks}
        finishes = [c for p in chunks for c in p["choices"] if c.get("finish_reason")]
        assert len(finishes) == 1, finishes
        return "".join(
            c["delta"].get("content") or "" for p in chunks for c in p["choices"] if "delta" in c
        )
    kinds = [e for e, _ in events if e is not None]
    assert kinds.count("response.completed") == 1 and kinds[-1] == "response.completed", kinds
    assert "response.failed" not in kinds and "error" not in kinds, kinds
    assert kinds.count("response.created") == 1, kinds
    seqs = [
        d["sequence_number"] for _, d in events if isinstance(d, dict) and "sequence_number" in d
    ]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    text = "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert final["id"] == events[0][1]["response"]["id"]
    output = "".join(
        part["text"]
        for item in final["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    assert output == text
    return text


def error_of(client: str, r: httpx.Response) -> dict[str, Any]:
    """The explicit in-band error a stream ended with (and no completion before it)."""
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    if client == "chat":
        payloads = [d for _, d in events]
        assert "[DONE]" not in payloads, payloads
        assert isinstance(payloads[-1], dict) and "error" in payloads[-1], payloads[-1]
        error: dict[str, Any] = payloads[-1]["error"]
        return error
    kinds = [e for e, _ in events if e is not None]
    assert "response.completed" not in kinds and kinds[-1] == "response.failed", kinds
    error = events[-1][1]["response"]["error"]
    return error


def logged(server: Server, r: httpx.Response, timeout: float = 5.0) -> dict[str, Any]:
    request_id = r.headers["x-ocx-request-id"]
    deadline = time.monotonic() + timeout
    while True:
        found = server.api.get("/api/requests", params={"request_id": request_id}).json()
        if found["requests"]:
            entry: dict[str, Any] = found["requests"][0]
            return entry
        assert time.monotonic() < deadline, f"no request log entry for {request_id}"
        time.sleep(0.05)


def script(mock: Mock, name: str, **behaviour: Any) -> None:
    mock.script(name, [{"text": TEXT, "deltas": DELTAS, **behaviour}], {"text": TEXT})


UPSTREAMS = ("chat", "responses", "anthropic")
CLIENTS = ("chat", "responses")


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_cut_is_continued_into_one_whole_answer(
    server: Server, mock: Mock, upstream: str, client: str
) -> None:
    model, key, (a, b) = setup(server, mock, upstream, afterCommit="continue")
    script(mock, a, cut_after_events=BEFORE_THIRD[upstream], usage={"input_tokens": 11})
    mock.script(b, [], {"text": TEXT, "deltas": 4, "usage": {"input_tokens": 20}})

    r = ask(server, client, model, key)

    assert whole_answer(client, r) == TEXT
    assert r.headers["x-ocx-target"] == f"p1/{a}"
    assert mock.hits(a) == 1 and mock.hits(b) == 1
    # The continuation was asked with the text so far as the final assistant message.
    sent = mock.log(b)[0]["body"]
    last = (sent.get("input") or sent.get("messages"))[-1]
    assert last["role"] == "assistant"
    said = last["content"] if isinstance(last["content"], str) else last["content"][0]["text"]
    assert TEXT.startswith(said) and said and said == said.rstrip() and said != TEXT
    entry = logged(server, r)
    assert entry["outcome"] == "ok"
    trace = [(t["target"], t["outcome"], t.get("role")) for t in entry["attempts"]]
    assert trace == [(f"p1/{a}", "continued", None), (f"p2/{b}", "continuation", "continuation")]
    if upstream == "anthropic":
        # Anthropic reports input tokens at the start: the cut attempt's count is summed in.
        assert entry["usage"]["inputTokens"] == 31


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_stall_is_continued(server: Server, mock: Mock, upstream: str) -> None:
    model, key, (a, b) = setup(server, mock, upstream, afterCommit="continue", idle_ms=300)
    script(
        mock,
        a,
        stall_after_events=BEFORE_THIRD[upstream],
        stall_ms=3000,
        stall_close=True,
    )
    mock.script(b, [], {"text": TEXT})

    started = time.monotonic()
    r = ask(server, "responses", model, key)

    assert whole_answer("responses", r) == TEXT
    assert time.monotonic() - started < 2.5  # handed over at the idle timeout, not the close
    assert mock.hits(a) == 1 and mock.hits(b) == 1


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_refused_prefill_ends_with_the_original_error(
    server: Server, mock: Mock, upstream: str, client: str
) -> None:
    model, key, (a, b) = setup(server, mock, upstream, afterCommit="continue")
    script(mock, a, cut_after_events=BEFORE_THIRD[upstream])
    mock.script(b, [], {"text": TEXT, "refuse_prefill": True})

    r = ask(server, client, model, key)

    error = error_of(client, r)
    assert "cut" in error["message"] and "prefill" not in error["message"], error
    assert error["code"] == "upstream_stream_truncated"
    assert mock.hits(b) == 1
    trace = [(t["target"], t["outcome"]) for t in logged(server, r)["attempts"]]
    assert trace == [(f"p1/{a}", "failed_after_commit"), (f"p2/{b}", "continuation_refused")]


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_no_continuation_after_a_tool_call_started(
    server: Server, mock: Mock, upstream: str
) -> None:
    model, key, (a, b) = setup(server, mock, upstream, afterCommit="continue")
    mock.script(
        a,
        [
            {
                "tool_call": {"name": "shell", "arguments": {"command": "ls -la /tmp"}},
                "lead_text": "Let me check.",
                "deltas": 6,
                "cut_after_events": BEFORE_THIRD[upstream] + 3,
            }
        ],
    )

    r = ask(server, "responses", model, key, tools=True)

    error = error_of("responses", r)
    assert error["code"] == "upstream_stream_truncated"
    assert mock.hits(b) == 0
    attempts = logged(server, r)["attempts"]
    assert [(t["outcome"], t.get("role")) for t in attempts] == [
        ("failed_after_commit", "not_continued")
    ]


def test_a_target_without_prefill_is_not_asked(server: Server, mock: Mock) -> None:
    model, key, (a, b) = setup(server, mock, "chat", prefill=(True, False), afterCommit="continue")
    script(mock, a, cut_after_events=BEFORE_THIRD["chat"])

    r = ask(server, "chat", model, key)

    assert error_of("chat", r)["code"] == "upstream_stream_truncated"
    assert mock.hits(b) == 0


def test_the_only_target_continues_itself(server: Server, mock: Mock) -> None:
    model, key, (a,) = setup(
        server, mock, "anthropic", models=("a",), prefill=(True,), afterCommit="continue"
    )
    script(mock, a, cut_after_events=BEFORE_THIRD["anthropic"])

    r = ask(server, "chat", model, key)

    assert whole_answer("chat", r) == TEXT
    assert mock.hits(a) == 2


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_buffer_restarts_a_cut_answer_on_the_next_target(
    server: Server, mock: Mock, upstream: str, client: str
) -> None:
    model, key, (a, b) = setup(server, mock, upstream, afterCommit="buffer")
    mock.script(a, [{"text": OTHER, "deltas": DELTAS, "cut_after_events": BEFORE_THIRD[upstream]}])
    mock.script(b, [], {"text": TEXT})

    r = ask(server, client, model, key)

    # Only the second answer: nothing of the cut one reached the client.
    assert whole_answer(client, r) == TEXT
    assert r.headers["x-ocx-target"] == f"p2/{b}"
    assert mock.hits(a) == 1 and mock.hits(b) == 1
    sent = mock.log(b)[0]["body"]
    said = sent.get("input") or sent.get("messages")
    assert said == "hello" or said[-1]["role"] == "user"  # from scratch, no prefill
    trace = [(t["target"], t["outcome"], t.get("role")) for t in logged(server, r)["attempts"]]
    assert trace == [(f"p1/{a}", "hop", "restart"), (f"p2/{b}", "served", None)]


def test_buffer_restarts_a_stalled_answer(server: Server, mock: Mock) -> None:
    model, key, (a, b) = setup(server, mock, "responses", afterCommit="buffer", idle_ms=300)
    mock.script(
        a,
        [{"text": OTHER, "stall_after_events": 6, "stall_ms": 3000, "stall_close": True}],
    )
    mock.script(b, [], {"text": TEXT})

    r = ask(server, "chat", model, key)

    assert whole_answer("chat", r) == TEXT


def test_buffer_over_its_bound_is_an_explicit_error(server: Server, mock: Mock) -> None:
    model, key, (a, b) = setup(server, mock, "chat", afterCommit="buffer", bufferMaxBytes=1024)
    mock.script(a, [], {"text": "word " * 400, "deltas": 40})

    r = ask(server, "responses", model, key)

    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "buffer_limit_exceeded"
    assert "1024" in r.json()["error"]["message"]
    assert mock.hits(a) == 1 and mock.hits(b) == 0


def test_default_policy_is_todays_explicit_error(server: Server, mock: Mock) -> None:
    model, key, (a, b) = setup(server, mock, "responses")
    script(mock, a, cut_after_events=BEFORE_THIRD["responses"])

    r = ask(server, "responses", model, key)

    events = sse_events(r.text)
    text = "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
    assert TEXT.startswith(text) and text != TEXT
    assert error_of("responses", r)["code"] == "upstream_stream_truncated"
    assert mock.hits(b) == 0
    assert [t["outcome"] for t in logged(server, r)["attempts"]] == ["failed_after_commit"]


def test_buffer_keeps_the_connection_open_and_fails_in_band(
    tmp_path_factory: pytest.TempPathFactory, mock: Mock
) -> None:
    """With the keep-alive already sent (its status line too), a request whose every target
    broke ends with an in-band error naming the last failure, never a clean end."""
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx"), extra_env={"OCX_BUFFER_KEEPALIVE_MS": "50"}
    )
    try:
        model, key, (a, b) = setup(server, mock, "chat", afterCommit="buffer")
        slow_cut = {"text": TEXT, "deltas": DELTAS, "delta_ms": 60, "cut_after_events": 5}
        mock.script(a, [slow_cut])
        mock.script(b, [slow_cut])

        r = ask(server, "responses", model, key)

        assert r.status_code == 200
        assert r.text.startswith(": ocx buffering the answer\n\n")
        assert "output_text.delta" not in r.text  # nothing of either broken answer
        error = error_of("responses", r)
        assert error["code"] == "upstream_stream_truncated"
        assert mock.hits(a) == 1 and mock.hits(b) == 1
        roles = [t.get("role") for t in logged(server, r)["attempts"]]
        assert roles == ["restart", "restart"]
    finally:
        stop()


@pytest.mark.parametrize("bound", [1, 2])
def test_a_continuation_that_breaks_again_within_the_bound(
    server: Server, mock: Mock, bound: int
) -> None:
    model, key, (a, b, c) = setup(
        server,
        mock,
        "anthropic",
        models=("a", "b", "c"),
        prefill=(True, True, True),
        afterCommit="continue",
        maxContinuations=bound,
    )
    script(mock, a, cut_after_events=BEFORE_THIRD["anthropic"])
    # The first continuation sends two more deltas, then its connection is cut too.
    mock.script(b, [{"text": TEXT, "deltas": 6, "cut_after_events": 4}])
    mock.script(c, [], {"text": TEXT})

    r = ask(server, "responses", model, key)

    outcomes = [t["outcome"] for t in logged(server, r)["attempts"]]
    if bound == 1:
        error = error_of("responses", r)
        assert error["code"] == "upstream_stream_truncated"
        assert mock.hits(c) == 0
        assert outcomes == ["failed_after_commit", "continuation_failed"]
    else:
        assert whole_answer("responses", r) == TEXT
        assert mock.hits(c) == 1
        assert outcomes == ["continued", "continuation_failed", "continuation"]
        said = mock.log(c)[0]["body"]["messages"][-1]["content"][0]["text"]
        assert len(said) > len(mock.log(b)[0]["body"]["messages"][-1]["content"][0]["text"])
