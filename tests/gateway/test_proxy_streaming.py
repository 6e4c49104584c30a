"""End-to-end streaming behaviour: the commit rule, post-commit failures, timeouts, client
aborts and credential isolation (PRODUCT §5.4–§5.6, §6; combos-behaviour.md §4)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events

KEYS = {
    "p1": "sk-test-primary-aaaaaaaaaaaaaaaaaaaa",
    "p2": "sk-test-backup-bbbbbbbbbbbbbbbbbbbbb",
    "p3": "sk-test-third-cccccccccccccccccccccc",
}
CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def sync(server: Server) -> None:
    # Any /v1 request starts the worker's runtime (and its config poller); 401 is fine here.
    server.http.get("/v1/models")
    server.wait_synced()


def setup_combo(
    server: Server,
    mock: Mock,
    targets: list[tuple[str, str]],
    *,
    adapters: dict[str, str] | None = None,
    first_byte_ms: int = 1000,
    idle_ms: int = 1000,
    **combo: Any,
) -> tuple[str, str]:
    """Providers p1, p2, … on the mock, each with its own key; a fresh combo over `targets`.
    Returns (combo id, ocx client key)."""
    key = server.create_key()
    by_provider: dict[str, list[str]] = {}
    for name, model in targets:
        by_provider.setdefault(name, []).append(model)
    for name, models in by_provider.items():
        spec: dict[str, Any] = {
            "adapter": (adapters or {}).get(name, "openai-responses"),
            "baseUrl": mock.url + "/v1",
            "timeouts": {"firstByteMs": first_byte_ms, "idleMs": idle_ms},
            "models": {m: {"contextWindow": 100000} for m in models},
        }
        if spec["adapter"] != "chatgpt":
            spec["apiKey"] = KEYS[name]
        server.put_provider(name, spec)
    combo_id = "s" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id, {"targets": [{"provider": p, "model": m} for p, m in targets], **combo}
    )
    sync(server)
    return combo_id, key


def stream_responses(server: Server, model: str, key: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "input": "hi", "stream": True}
    headers = {"Authorization": f"Bearer {key}", **extra}
    return server.http.post("/v1/responses", json=body, headers=headers)


def stream_chat(server: Server, model: str, key: str) -> httpx.Response:
    body = {"model": model, "stream": True, **CHAT}
    return server.http.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def names(events: list[tuple[str | None, Any]]) -> list[str | None]:
    return [
        e if e is not None else (d.get("type") if isinstance(d, dict) else d) for e, d in events
    ]


def deltas(events: list[tuple[str | None, Any]]) -> list[str]:
    return [d["delta"] for e, d in events if e == "response.output_text.delta"]


def assert_responses_failed(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    kinds = names(events)
    assert "response.completed" not in kinds, kinds
    assert kinds[-1] == "response.failed", kinds
    final = events[-1][1]
    assert final["type"] == "response.failed"
    assert final["response"]["status"] == "failed"
    assert final["response"]["error"]["message"]
    return final


def chat_payloads(text: str) -> list[Any]:
    return [d for _, d in sse_events(text)]


def assert_chat_failed(text: str) -> None:
    payloads = chat_payloads(text)
    assert "[DONE]" not in payloads, payloads
    assert isinstance(payloads[-1], dict) and "error" in payloads[-1], payloads[-1]
    assert payloads[-1]["error"]["message"]


# ---------------------------------------------------------------------------------------------
# The commit rule


def test_failure_before_output_hops(server: Server, mock: Mock) -> None:
    mock.script("bo", [{"fail": "before_output"}])
    combo_id, key = setup_combo(server, mock, [("p1", "bo"), ("p2", "bo2")])

    r = stream_responses(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/bo2"
    assert r.headers["x-ocx-attempts"] == "2"
    events = sse_events(r.text)
    kinds = names(events)
    assert "response.failed" not in kinds
    assert kinds.count("response.completed") == 1
    assert kinds.count("response.created") == 1  # the failed attempt's lifecycle is not replayed
    assert "".join(deltas(events)) == "mock reply from bo2"
    assert mock.hits("bo") == 1
    assert mock.hits("bo2") == 1


def test_failure_after_output_is_final(server: Server, mock: Mock) -> None:
    mock.script("ao", [{"fail": "after_output", "deltas": 4}])
    combo_id, key = setup_combo(server, mock, [("p1", "ao"), ("p2", "ao2")])

    r = stream_responses(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/ao"
    events = sse_events(r.text)
    assert deltas(events) == ["mock"]  # exactly what was already sent, once
    assert_responses_failed(events)
    assert mock.hits("ao") == 1
    assert mock.hits("ao2") == 0  # a committed target is never replayed


def test_cut_after_output_responses(server: Server, mock: Mock) -> None:
    # created, in_progress, item.added, part.added, 2 deltas, then the connection is cut.
    mock.script("cut", [{"cut_after_events": 6, "deltas": 4}])
    combo_id, key = setup_combo(server, mock, [("p1", "cut"), ("p2", "cut2")])

    r = stream_responses(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    events = sse_events(r.text)
    assert len(deltas(events)) == 2
    assert_responses_failed(events)
    assert mock.hits("cut2") == 0


@pytest.mark.parametrize("adapter", ["openai-chat", "openai-responses"])
def test_cut_after_output_chat_client(server: Server, mock: Mock, adapter: str) -> None:
    # Chat upstream: role chunk + 2 content chunks; Responses upstream: 4 lifecycle + 2 deltas.
    events = 3 if adapter == "openai-chat" else 6
    mock.script("cutc", [{"cut_after_events": events, "deltas": 4}])
    combo_id, key = setup_combo(
        server, mock, [("p1", "cutc"), ("p2", "cutc2")], adapters={"p1": adapter}
    )

    r = stream_chat(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/cutc"
    assert_chat_failed(r.text)
    text = "".join(
        (c.get("delta") or {}).get("content") or ""
        for p in chat_payloads(r.text)
        if isinstance(p, dict)
        for c in p.get("choices", [])
    )
    assert text == "mock reply"
    assert mock.hits("cutc2") == 0


def test_malformed_chunk_after_output_responses_is_forwarded(server: Server, mock: Mock) -> None:
    # Same protocol: the client sees exactly what the upstream sent (PRODUCT §5.4).
    mock.script("mal", [{"malformed_after_events": 5, "deltas": 4}])
    combo_id, key = setup_combo(server, mock, [("p1", "mal"), ("p2", "mal2")])

    r = stream_responses(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/mal"
    assert r.text.count("data: {not json\n\n") == 1
    events = sse_events(r.text)
    assert names(events)[-1] == "response.completed"
    assert "".join(deltas(events)) == "mock reply from mal"
    assert mock.hits("mal2") == 0


def test_malformed_chunk_after_output_chat_is_forwarded(server: Server, mock: Mock) -> None:
    mock.script("malc", [{"malformed_after_events": 2, "deltas": 4}])
    combo_id, key = setup_combo(
        server, mock, [("p1", "malc"), ("p2", "malc2")], adapters={"p1": "openai-chat"}
    )

    r = stream_chat(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    assert r.text.count("data: {not json\n\n") == 1
    assert chat_payloads(r.text)[-1] == "[DONE]"
    assert mock.hits("malc2") == 0


def whole_frames(text: str) -> list[Any]:
    """The client's frames, each of which must parse (a malformed one forwarded whole aside): no
    half frame was forwarded and nothing (an appended terminal error included) ran into one."""
    out = []
    for _, data in sse_events(text):
        assert data in ("[DONE]", "{not json") or isinstance(data, dict), data
        out.append(data)
    return out


def split_stream(
    server: Server, mock: Mock, api: str, behaviour: dict[str, Any]
) -> tuple[httpx.Response, list[Any]]:
    """One pass-through stream whose every frame the mock sends in two reads."""
    model = f"split{api}{uuid.uuid4().hex[:6]}"
    mock.script(model, [{"split_events": True, "deltas": 4, **behaviour}])
    combo_id, key = setup_combo(
        server, mock, [("p1", model)], adapters={"p1": "openai-chat"} if api == "chat" else None
    )
    call = stream_chat if api == "chat" else stream_responses
    r = call(server, f"combo/{combo_id}", key)
    assert r.status_code == 200
    return r, whole_frames(r.text)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_frames_split_across_reads_pass_through_whole(server: Server, mock: Mock, api: str) -> None:
    r, frames = split_stream(server, mock, api, {})
    if api == "chat":
        assert frames[-1] == "[DONE]"
    else:
        assert frames[-1]["type"] == "response.completed"
    assert len(frames) >= 6


@pytest.mark.parametrize(("api", "after"), [("responses", 5), ("chat", 2)])
def test_a_malformed_frame_split_across_reads_is_forwarded_whole(
    server: Server, mock: Mock, api: str, after: int
) -> None:
    r, frames = split_stream(server, mock, api, {"malformed_after_events": after})
    assert r.text.count("data: {not json\n\n") == 1
    assert frames[after] == "{not json"
    if api == "chat":
        assert frames[-1] == "[DONE]"
    else:
        assert frames[-1]["type"] == "response.completed"


@pytest.mark.parametrize(
    ("api", "fault", "after"),
    [
        ("responses", "cut_after_events", 6),  # the connection closes mid-frame
        ("chat", "cut_after_events", 3),
    ],
)
def test_a_broken_frame_split_across_reads_never_reaches_the_client(
    server: Server, mock: Mock, api: str, fault: str, after: int
) -> None:
    r, frames = split_stream(server, mock, api, {fault: after})
    if api == "chat":
        assert_chat_failed(r.text)
    else:
        assert_responses_failed(sse_events(r.text))
    assert len(frames) == after + 1  # the whole frames before it, then the terminal error


def test_chat_stream_missing_done_is_complete(server: Server, mock: Mock) -> None:
    # finish_reason (and usage) sent, then the body ends without `[DONE]`: judged by content.
    mock.script("nodone", [{"omit_done": True}])
    combo_id, key = setup_combo(server, mock, [("p1", "nodone")], adapters={"p1": "openai-chat"})

    r = stream_chat(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    payloads = chat_payloads(r.text)
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
    assert not any(isinstance(p, dict) and "error" in p for p in payloads)


def test_responses_stream_missing_completed(server: Server, mock: Mock) -> None:
    mock.script("nocomp", [{"omit_done": True}])
    combo_id, key = setup_combo(server, mock, [("p1", "nocomp")])

    r = stream_responses(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    events = sse_events(r.text)
    assert "".join(deltas(events)) == "mock reply from nocomp"
    assert_responses_failed(events)


def test_chat_upstream_missing_done_to_responses_client(server: Server, mock: Mock) -> None:
    mock.script("nodr", [{"omit_done": True, "usage": {"input_tokens": 7, "output_tokens": 3}}])
    combo_id, key = setup_combo(server, mock, [("p1", "nodr")], adapters={"p1": "openai-chat"})
    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.status_code == 200
    events = sse_events(r.text)
    assert names(events)[-1] == "response.completed"
    assert events[-1][1]["response"]["usage"]["input_tokens"] == 7
    assert events[-1][1]["response"]["usage"]["output_tokens"] == 3


@pytest.mark.parametrize("client", ["chat", "responses"])
def test_chat_upstream_with_no_terminal_at_all_is_a_cut(
    server: Server, mock: Mock, client: str
) -> None:
    # Content, then the body ends: no finish_reason, no usage, no `[DONE]`.
    model = f"noterm{client}"
    mock.script(model, [{"omit_terminal": True}])
    combo_id, key = setup_combo(server, mock, [("p1", model)], adapters={"p1": "openai-chat"})
    if client == "chat":
        r = stream_chat(server, f"combo/{combo_id}", key)
        assert_chat_failed(r.text)
    else:
        r = stream_responses(server, f"combo/{combo_id}", key)
        assert_responses_failed(sse_events(r.text))
    assert r.headers["x-ocx-target"] == f"p1/{model}"


# ---------------------------------------------------------------------------------------------
# Timeouts before commit hop and cool


@pytest.mark.parametrize(
    "step", [{"delay_first_byte_ms": 4000}, {"no_response": True}], ids=["slow", "silent"]
)
@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
def test_first_byte_timeout_hops_and_cools(
    server: Server, mock: Mock, step: dict[str, Any]
) -> None:
    mock.script("fb", [step])
    combo_id, key = setup_combo(server, mock, [("p1", "fb"), ("p2", "fb2")], first_byte_ms=400)

    started = time.monotonic()
    r = stream_responses(server, f"combo/{combo_id}", key)
    elapsed = time.monotonic() - started

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/fb2"
    assert r.headers["x-ocx-attempts"] == "2"
    # The hop came at the 400 ms bound, long before the slow first byte (a loaded CI machine
    # may add a second or two to the rest).
    assert 0.35 <= elapsed < 3.0
    assert "response.completed" in names(sse_events(r.text))

    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.headers["x-ocx-target"] == "p2/fb2"
    assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits("fb") == 1
    assert mock.hits("fb2") == 2


def test_first_byte_limit_does_not_cut_a_slow_non_streaming_answer(
    server: Server, mock: Mock
) -> None:
    # A non-streaming answer arrives whole when it is done: firstByteMs is a streaming
    # bound, the non-streaming one is totalMs (PRODUCT §3.1).
    mock.script("fbn", [{"delay_first_byte_ms": 900}])
    combo_id, key = setup_combo(server, mock, [("p1", "fbn"), ("p2", "fbn2")], first_byte_ms=400)
    r = server.http.post(
        "/v1/responses",
        json={"model": f"combo/{combo_id}", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/fbn"
    assert mock.hits("fbn2") == 0


def test_first_byte_timeout_single_target_is_504(server: Server, mock: Mock) -> None:
    mock.script("fbs", [{"no_response": True}])
    combo_id, key = setup_combo(server, mock, [("p1", "fbs")], first_byte_ms=300)
    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.status_code == 504
    assert set(r.json()["error"]) >= {"type", "code", "message"}


def test_idle_timeout_before_output_hops(server: Server, mock: Mock) -> None:
    # created + in_progress, then silence until the proxy gives up.
    mock.script("idle", [{"stall_after_events": 2}])
    combo_id, key = setup_combo(server, mock, [("p1", "idle"), ("p2", "idle2")], idle_ms=400)

    r = stream_responses(server, f"combo/{combo_id}", key)

    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/idle2"
    events = sse_events(r.text)
    assert names(events).count("response.created") == 1
    assert "".join(deltas(events)) == "mock reply from idle2"
    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.headers["x-ocx-target"] == "p2/idle2"
    assert mock.hits("idle") == 1


def test_idle_timeout_after_output_is_explicit_error(server: Server, mock: Mock) -> None:
    mock.script("idlec", [{"stall_after_events": 5, "deltas": 4}])
    combo_id, key = setup_combo(server, mock, [("p1", "idlec"), ("p2", "idlec2")], idle_ms=400)
    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/idlec"
    events = sse_events(r.text)
    assert deltas(events) == ["mock"]
    assert_responses_failed(events)
    assert mock.hits("idlec2") == 0


def test_stall_shorter_than_idle_timeout_is_fine(server: Server, mock: Mock) -> None:
    mock.script("short", [{"stall_after_events": 5, "stall_ms": 200}])
    combo_id, key = setup_combo(server, mock, [("p1", "short"), ("p2", "short2")], idle_ms=800)
    r = stream_responses(server, f"combo/{combo_id}", key)
    events = sse_events(r.text)
    assert names(events)[-1] == "response.completed"
    assert mock.hits("short2") == 0


# ---------------------------------------------------------------------------------------------
# Client abort (PRODUCT §5.6)


def test_client_abort_leaves_no_cooldown(server: Server, mock: Mock) -> None:
    mock.script("ab", [{"deltas": 20, "delta_ms": 100}])
    combo_id, key = setup_combo(server, mock, [("p1", "ab"), ("p2", "ab2")])
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": True}

    with httpx.Client(base_url=server.url, timeout=10) as client:
        with client.stream(
            "POST", "/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            assert r.status_code == 200
            assert r.headers["x-ocx-target"] == "p1/ab"
            seen = b""
            for chunk in r.iter_raw():
                seen += chunk
                if b"response.output_text.delta" in seen:
                    break
    # The client connection is closed here, mid-stream.
    time.sleep(0.3)

    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/ab"
    assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits("ab") == 2
    assert mock.hits("ab2") == 0


def test_client_abort_before_commit_leaves_no_cooldown(server: Server, mock: Mock) -> None:
    mock.script("abp", [{"delay_first_byte_ms": 600}])
    combo_id, key = setup_combo(server, mock, [("p1", "abp"), ("p2", "abp2")])
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": True}
    with httpx.Client(base_url=server.url, timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"})
    time.sleep(0.6)
    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.headers["x-ocx-target"] == "p1/abp"
    assert mock.hits("abp") == 2
    assert mock.hits("abp2") == 0
    # The aborted request is logged as 499 with its one attempt (reference §4).
    deadline = time.monotonic() + 5
    while True:
        rows = server.api.get("/api/requests", params={"combo": combo_id}).json()["requests"]
        aborted = [row for row in rows if row["status"] == 499]
        if aborted or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(aborted) == 1
    assert aborted[0]["outcome"] == "client_cancelled"
    assert [(a["target"], a["status"], a["outcome"]) for a in aborted[0]["attempts"]] == [
        ("p1/abp", 499, "client_cancelled")
    ]


# ---------------------------------------------------------------------------------------------
# Credentials isolation (PRODUCT §6, §9)


def test_credentials_isolation(server: Server, mock: Mock) -> None:
    mock.script("ka", [{"status": 500}])
    combo_id, key = setup_combo(
        server,
        mock,
        [("p1", "ka"), ("p2", "kb"), ("p3", "kc")],
        adapters={"p3": "chatgpt"},
    )
    caller_token = "caller-chatgpt-token-zzzzzzzzzzzzzz"
    extra = {
        "x-ocx-key": key,
        "chatgpt-account-id": "acct-1",
        "Authorization": f"Bearer {caller_token}",
    }
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": True}

    # Through the combo with the client key in the bearer: p1 fails, p2 serves.
    r = stream_responses(server, f"combo/{combo_id}", key)
    assert r.headers["x-ocx-target"] == "p2/kb"
    # A caller bearer plus x-ocx-key, to a direct API-key provider.
    r = server.http.post("/v1/responses", json={**body, "model": "p2/kb"}, headers=extra)
    assert r.headers["x-ocx-target"] == "p2/kb"
    # The caller's own bearer to the chatgpt provider.
    r = server.http.post("/v1/responses", json={**body, "model": "p3/kc"}, headers=extra)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p3/kc"

    log = mock.log()
    by_model: dict[str, list[dict[str, Any]]] = {}
    for entry in log:
        by_model.setdefault(entry["model"], []).append(entry)
    assert [e["headers"].get("authorization") for e in by_model["ka"]] == [f"Bearer {KEYS['p1']}"]
    assert [e["headers"].get("authorization") for e in by_model["kb"]] == [
        f"Bearer {KEYS['p2']}"
    ] * 2
    (chatgpt,) = by_model["kc"]
    assert chatgpt["headers"].get("authorization") == f"Bearer {caller_token}"
    assert chatgpt["headers"].get("chatgpt-account-id") == "acct-1"
    for entry in log:
        flat = repr(entry["headers"])
        assert "x-ocx-key" not in entry["headers"]
        assert key not in flat
        assert key[:12] not in flat
        if entry["model"] != "kc":
            assert caller_token not in flat
            assert "chatgpt-account-id" not in entry["headers"]
        for name, secret in KEYS.items():
            own = {"ka": "p1", "kb": "p2", "kc": "p3"}[entry["model"]]
            if name != own:
                assert secret not in flat


def test_chatgpt_provider_without_caller_token_is_unavailable(server: Server, mock: Mock) -> None:
    combo_id, key = setup_combo(server, mock, [("p3", "kd")], adapters={"p3": "chatgpt"})
    r = stream_responses(server, f"combo/{combo_id}", key)  # ocx key in the bearer only
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "combo_unavailable"
    assert mock.log() == []
