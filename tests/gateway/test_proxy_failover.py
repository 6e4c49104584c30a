"""End-to-end failover through a real `ocx serve` and a real `ocx mock-upstream`.

PRODUCT §4.1 (route headers, errors), §5.2–§5.3 (hop/stop, cooldowns, half-open probes,
combo_unavailable), §6 (Chat ⇄ Responses translation); combos-behaviour.md §2.8, §3.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import time
import uuid
from email.utils import formatdate
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events

PRIMARY_KEY = "sk-test-primary-aaaaaaaaaaaaaaaaaaaa"
BACKUP_KEY = "sk-test-backup-bbbbbbbbbbbbbbbbbbbbb"
SECRET = "sk-live-SECRETSECRETSECRET123456"


def provider(
    base_url: str,
    *models: str,
    adapter: str = "openai-responses",
    api_key: str = PRIMARY_KEY,
    first_byte_ms: int = 1000,
    idle_ms: int = 1000,
) -> dict[str, Any]:
    return {
        "adapter": adapter,
        "baseUrl": base_url,
        "apiKey": api_key,
        "timeouts": {"firstByteMs": first_byte_ms, "idleMs": idle_ms},
        "models": {m: {"contextWindow": 100000} for m in models},
    }


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
    **combo: Any,
) -> tuple[str, dict[str, str]]:
    """Providers p1, p2, … on the mock (each with its own key), one fresh combo over
    `targets`; returns (combo id, client headers)."""
    key = server.create_key()
    by_provider: dict[str, list[str]] = {}
    for name, model in targets:
        by_provider.setdefault(name, []).append(model)
    for name, models in by_provider.items():
        adapter = (adapters or {}).get(name, "openai-responses")
        api_key = PRIMARY_KEY if name == "p1" else BACKUP_KEY
        server.put_provider(
            name, provider(mock.url + "/v1", *models, adapter=adapter, api_key=api_key)
        )
    combo_id = "c" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id, {"targets": [{"provider": p, "model": m} for p, m in targets], **combo}
    )
    sync(server)
    return combo_id, {"Authorization": f"Bearer {key}"}


def ask(
    server: Server, combo_id: str, headers: dict[str, str], *, stream: bool = False
) -> httpx.Response:
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": stream}
    return server.http.post("/v1/responses", json=body, headers=headers)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_error_shape(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    assert {"type", "code", "message"} <= set(body["error"]), body
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-ocx-request-id"])
    return body["error"]


def completed_text(events: list[tuple[str | None, Any]]) -> str:
    return "".join(d["delta"] for e, d in events if e == "response.output_text.delta")


# ---------------------------------------------------------------------------------------------
# Hop on retryable statuses


# The mock's default 404/408 bodies carry `type: invalid_request_error`, which the shared
# classifier (reference §3.2.1 rule 16, §3.2 row 15) turns into a stop; give them the bodies a
# plain "not found" / "timeout" upstream sends so that the status rule (§3.2 row 16) applies.
BODIES = {
    404: {"error": {"type": "not_found_error", "code": None, "message": "no route"}},
    408: {"error": {"type": "timeout", "code": None, "message": "request timed out"}},
}


@pytest.mark.parametrize("status", [401, 403, 404, 408, 429, 500, 502, 503])
@pytest.mark.parametrize("stream", [False, True])
def test_hops_on_retryable_status(server: Server, mock: Mock, status: int, stream: bool) -> None:
    step: dict[str, Any] = {"status": status}
    if status in BODIES:
        step["body"] = BODIES[status]
    mock.script("fa", [step])
    combo_id, headers = setup_combo(server, mock, [("p1", "fa"), ("p2", "fb")])

    r = ask(server, combo_id, headers, stream=stream)

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/fb"
    assert r.headers["x-ocx-attempts"] == "2"
    assert r.headers["x-ocx-combo"] == combo_id
    request_id = r.headers["x-ocx-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    assert mock.hits("fa") == 1
    backup = mock.log("fb")
    assert len(backup) == 1
    assert backup[0]["headers"]["x-request-id"] == request_id
    if stream:
        events = sse_events(r.text)
        assert [e for e, _ in events].count("response.completed") == 1
        assert completed_text(events) == "mock reply from fb"
    else:
        assert r.json()["output"][0]["content"][0]["text"] == "mock reply from fb"


def test_hops_on_connection_refused(server: Server, mock: Mock) -> None:
    key = server.create_key()
    server.put_provider("dead", provider(f"http://127.0.0.1:{closed_port()}/v1", "ra"))
    server.put_provider("p2", provider(mock.url + "/v1", "rb", api_key=BACKUP_KEY))
    combo_id = "c" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id,
        {"targets": [{"provider": "dead", "model": "ra"}, {"provider": "p2", "model": "rb"}]},
    )
    sync(server)
    headers = {"Authorization": f"Bearer {key}"}

    r = ask(server, combo_id, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/rb"
    assert r.headers["x-ocx-attempts"] == "2"
    assert mock.hits("rb") == 1

    # The refused target is cooling now: the next request goes straight to the backup.
    r = ask(server, combo_id, headers)
    assert r.status_code == 200
    assert r.headers["x-ocx-attempts"] == "1"
    assert r.headers["x-ocx-target"] == "p2/rb"


def test_errors_say_which_target_and_why(server: Server, mock: Mock) -> None:
    # Issue 28 item 5: "Provider connect" named no provider, and combo_unavailable no target.
    key = server.create_key()
    headers = {"Authorization": f"Bearer {key}"}
    server.put_provider("gone", provider(f"http://127.0.0.1:{closed_port()}/v1", "ga"))
    server.put_provider("p2", provider(mock.url + "/v1", "gb", api_key=BACKUP_KEY))
    server.put_provider(
        "keyless",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKeyEnv": f"PROVIDER_TEST_UNSET_{uuid.uuid4().hex[:8].upper()}",
            "models": {"gc": {"contextWindow": 1000}},
        },
    )
    alone = "c" + uuid.uuid4().hex[:8]
    server.put_combo(alone, {"targets": [{"provider": "gone", "model": "ga"}]})
    sync(server)
    r = ask(server, alone, headers)
    assert r.status_code == 502
    err = assert_error_shape(r)
    assert (err["code"], err["message"]) == ("upstream_connect", "Provider connect (gone/ga)")

    mock.script("gb", [{"status": 503}])
    combo_id = "c" + uuid.uuid4().hex[:8]
    targets = [("gone", "ga"), ("p2", "gb"), ("keyless", "gc")]
    server.put_combo(combo_id, {"targets": [{"provider": p, "model": m} for p, m in targets]})
    sync(server)
    r = ask(server, combo_id, headers)
    assert r.status_code == 503
    assert assert_error_shape(r)["message"].startswith(
        "Provider error 503 from p2/gb"
    )  # the last target tried
    r = ask(server, combo_id, headers)
    # Both cool for a minute: a usage limit, not a sleep (PRODUCT §9.10).
    assert r.status_code == 429
    err = assert_error_shape(r)
    assert (err["type"], err["code"]) == ("usage_limit_reached", "combo_unavailable")
    message = err["message"]
    assert r.headers["x-codex-promo-message"] == message
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert re.fullmatch(
        rf"No available targets for combo: {combo_id}: "
        rf"gone/ga: Cooling until {when}( \([a-z_]+\))?; "
        rf"p2/gb: Cooling until {when}( \([a-z_]+\))?; "
        r"keyless/gc: credential_missing: the credential of provider keyless is not configured",
        message,
    ), message
    assert "PROVIDER_TEST_UNSET" not in r.text


# ---------------------------------------------------------------------------------------------
# Stop on request errors


@pytest.mark.parametrize(
    "error",
    [
        {"type": "invalid_request_error", "code": "invalid_request_error", "message": "bad"},
        {"type": "invalid_request_error", "code": "content_filter", "message": "blocked"},
    ],
)
def test_stops_on_invalid_request(server: Server, mock: Mock, error: dict[str, str]) -> None:
    mock.script("sa", [{"status": 400, "body": {"error": error}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "sa"), ("p2", "sb")])

    r = ask(server, combo_id, headers)

    assert r.status_code == 400, r.text
    err = assert_error_shape(r)
    assert err["code"] == error["code"]
    assert error["message"] in err["message"]
    assert r.headers["x-ocx-combo"] == combo_id
    assert mock.hits("sa") == 1
    assert mock.hits("sb") == 0

    # A stop does not cool: the same target serves the next request.
    r = ask(server, combo_id, headers)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/sa"


# ---------------------------------------------------------------------------------------------
# Cooldown durations (reference §3.4) and combo_unavailable (§3.5)


def test_retry_after_seconds_is_honoured(server: Server, mock: Mock) -> None:
    mock.script("ta", [{"status": 429, "headers": {"Retry-After": "1"}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ta"), ("p2", "tb")])

    r = ask(server, combo_id, headers)
    assert r.headers["x-ocx-target"] == "p2/tb"
    for _ in range(3):
        r = ask(server, combo_id, headers)
        assert r.status_code == 200
        assert r.headers["x-ocx-target"] == "p2/tb"
        assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits("ta") == 1  # never contacted while cooling

    time.sleep(1.1)
    r = ask(server, combo_id, headers)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/ta"
    log = mock.log("ta")
    assert len(log) == 2
    assert log[1]["t_ms"] - log[0]["t_ms"] >= 1000
    assert mock.hits("tb") == 4


def _cooldown_seen_by_503(
    server: Server, mock: Mock, model: str, step: dict[str, Any], **combo: Any
) -> int:
    """One-target combo: the failure cools the target; the next request gets
    combo_unavailable whose Retry-After is the remaining cooldown (in seconds): a 503 up to
    30 s, past that a 429 usage limit whose `resets_at` is the cooldown's end (PRODUCT §9.10)."""
    mock.script(model, [step])
    combo_id, headers = setup_combo(server, mock, [("p1", model)], **combo)
    first = ask(server, combo_id, headers)
    expected = step.get("status", 429)
    wait = step.get("headers", {}).get("Retry-After", "")
    assert first.status_code == (429 if wait.isdigit() and int(wait) > 30 else expected)
    r = ask(server, combo_id, headers)
    error = assert_error_shape(r)
    assert error["code"] == "combo_unavailable"
    assert mock.hits(model) == 1
    seconds = int(r.headers["retry-after"])
    if seconds <= 30:
        assert (r.status_code, error["type"]) == (503, "server_error"), r.text
    else:
        assert (r.status_code, error["type"]) == (429, "usage_limit_reached"), r.text
        assert abs(error["resets_at"] - (time.time() + seconds)) <= 2
    return seconds


def test_retry_after_http_date(server: Server, mock: Mock) -> None:
    at = int(time.time()) + 3
    step = {"status": 429, "headers": {"Retry-After": formatdate(at, usegmt=True)}}
    assert 1 <= _cooldown_seen_by_503(server, mock, "da", step) <= 3


def test_codex_reset_header_used_without_retry_after(server: Server, mock: Mock) -> None:
    at = int(time.time()) + 20
    step = {"status": 429, "headers": {"x-codex-primary-reset-at": str(at)}}
    # The reset header wins over the combo's cooldownMs (reference §3.4 rule 2 before 3).
    assert 18 <= _cooldown_seen_by_503(server, mock, "xa", step, cooldownMs=5000) <= 20


def test_combo_cooldown_ms(server: Server, mock: Mock) -> None:
    assert _cooldown_seen_by_503(server, mock, "ka", {"status": 429}, cooldownMs=2000) == 2


def test_default_cooldown_without_signals(server: Server, mock: Mock) -> None:
    assert 59 <= _cooldown_seen_by_503(server, mock, "na", {"status": 500}) <= 60


def test_cooldown_capped_at_ten_minutes(server: Server, mock: Mock) -> None:
    step = {"status": 429, "headers": {"Retry-After": "3600"}}
    assert 590 <= _cooldown_seen_by_503(server, mock, "capa", step) <= 600


def test_combo_unavailable_when_first_pick_finds_nothing(server: Server, mock: Mock) -> None:
    mock.script("ua", [{"status": 429, "headers": {"Retry-After": "2"}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ua")])

    first = ask(server, combo_id, headers)
    assert first.status_code == 429  # after an attempt: the upstream's own status
    assert assert_error_shape(first)["code"] == "rate_limit_exceeded"
    assert first.headers["retry-after"] == "2"

    for stream in (False, True):
        r = ask(server, combo_id, headers, stream=stream)
        assert r.status_code == 503
        assert r.headers["content-type"].startswith("application/json")
        err = assert_error_shape(r)
        assert (err["type"], err["code"]) == ("server_error", "combo_unavailable")
        # Each target with its state and until when, in `ocx status`'s words (issue 28 item 5).
        assert re.fullmatch(
            rf"No available targets for combo: {combo_id}: p1/ua: "
            r"Cooling until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC",
            err["message"],
        ), err["message"]
        assert r.headers["retry-after"] in ("1", "2")
        assert r.headers["x-ocx-combo"] == combo_id
    assert mock.hits("ua") == 1  # no upstream contacted


def test_last_upstream_failure_is_returned_sanitized(server: Server, mock: Mock) -> None:
    mock.script("la", [{"status": 503}])
    body = {
        "error": {
            "type": "not_found_error",
            "code": "not_found",
            "message": f"no such thing for key {SECRET}",
        }
    }
    mock.script("lb", [{"status": 404, "body": body}])
    combo_id, headers = setup_combo(server, mock, [("p1", "la"), ("p2", "lb")])

    r = ask(server, combo_id, headers)

    assert r.status_code == 404  # the last failure's own status, not 503
    err = assert_error_shape(r)
    assert err["code"] == "not_found"
    assert SECRET not in r.text
    assert "SECRETSECRET" not in r.text
    assert "no such thing" in err["message"]
    assert mock.hits("la") == 1
    assert mock.hits("lb") == 1


def test_last_failure_non_json_body_is_sanitized(server: Server, mock: Mock) -> None:
    mock.script("ga", [{"status": 500, "body": f"<html>boom {SECRET}</html>"}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ga")])
    r = ask(server, combo_id, headers)
    assert r.status_code == 500
    assert_error_shape(r)
    assert SECRET not in r.text


# ---------------------------------------------------------------------------------------------
# Waiting and half-open probes


@pytest.mark.xdist_group("timed")  # asserts a time: not beside another (conftest)
def test_single_target_retry_with_wait_for_cooldown(server: Server, mock: Mock) -> None:
    mock.script("wa", [{"status": 429, "headers": {"Retry-After": "1"}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "wa")], waitForCooldownMs=3000)

    started = time.monotonic()
    r = ask(server, combo_id, headers)
    elapsed = time.monotonic() - started

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p1/wa"
    assert r.headers["x-ocx-attempts"] == "2"
    assert 0.9 <= elapsed < 2.5
    log = mock.log("wa")
    assert len(log) == 2
    assert log[1]["t_ms"] - log[0]["t_ms"] >= 1000


def test_wait_budget_too_small_gives_upstream_failure(server: Server, mock: Mock) -> None:
    mock.script("wsa", [{"status": 429, "headers": {"Retry-After": "2"}}])
    combo_id, headers = setup_combo(server, mock, [("p1", "wsa")], waitForCooldownMs=500)
    started = time.monotonic()
    r = ask(server, combo_id, headers)
    assert r.status_code == 429
    assert time.monotonic() - started < 1  # no pointless sleep
    assert mock.hits("wsa") == 1


def test_half_open_single_probe(server: Server, mock: Mock) -> None:
    mock.script(
        "ha",
        [{"status": 429, "headers": {"Retry-After": "1"}}, {"deltas": 6, "delta_ms": 150}],
    )
    combo_id, headers = setup_combo(server, mock, [("p1", "ha"), ("p2", "hb")])
    assert ask(server, combo_id, headers).headers["x-ocx-target"] == "p2/hb"
    time.sleep(1.1)

    def one(i: int) -> tuple[int, str]:
        if i:
            time.sleep(0.15)  # let the first request take the probe lease
        with httpx.Client(base_url=server.url, timeout=10) as client:
            body = {"model": f"combo/{combo_id}", "input": "hi", "stream": True}
            r = client.post("/v1/responses", json=body, headers=headers)
            return r.status_code, r.headers.get("x-ocx-target", "")

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, range(3)))

    assert [s for s, _ in results] == [200, 200, 200]
    targets = sorted(t for _, t in results)
    assert targets == ["p1/ha", "p2/hb", "p2/hb"]
    assert mock.hits("ha") == 2  # the 429 and exactly one probe
    assert mock.hits("hb") == 3

    # The probe succeeded: the target is healthy again.
    r = ask(server, combo_id, headers)
    assert r.headers["x-ocx-target"] == "p1/ha"


def test_half_open_probe_failure_cools_again(server: Server, mock: Mock) -> None:
    mock.script(
        "hfa",
        [{"status": 429, "headers": {"Retry-After": "1"}}, {"status": 500}],
    )
    combo_id, headers = setup_combo(server, mock, [("p1", "hfa"), ("p2", "hfb")])
    ask(server, combo_id, headers)
    time.sleep(1.1)
    r = ask(server, combo_id, headers)  # the probe fails with 500 and hops
    assert r.headers["x-ocx-target"] == "p2/hfb"
    assert r.headers["x-ocx-attempts"] == "2"
    r = ask(server, combo_id, headers)
    assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits("hfa") == 2


# ---------------------------------------------------------------------------------------------
# Resolution and authentication


def test_unknown_combo_is_404_without_upstream(server: Server, mock: Mock) -> None:
    _, headers = setup_combo(server, mock, [("p1", "za")])
    r = server.http.post(
        "/v1/responses", json={"model": "combo/nope", "input": "hi"}, headers=headers
    )
    assert r.status_code == 404
    err = assert_error_shape(r)
    assert err["type"] == "invalid_request_error"
    assert err["message"] == "Unknown combo: nope"
    assert mock.log() == []


@pytest.mark.parametrize(
    "auth",
    [
        {},
        {"Authorization": "Bearer ocx_not-a-real-key"},
        {"x-ocx-key": "ocx_not-a-real-key"},
        {"Authorization": "Bearer sk-some-upstream-key"},
        {"Authorization": "Basic b2N4Og=="},
    ],
)
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
def test_missing_or_invalid_key_is_401(
    server: Server, mock: Mock, auth: dict[str, str], path: str
) -> None:
    combo_id, _ = setup_combo(server, mock, [("p1", "aa")])
    body = {
        "model": f"combo/{combo_id}",
        "input": "hi",
        "messages": [{"role": "user", "content": "hi"}],
    }
    r = server.http.post(path, json=body, headers=auth)
    assert r.status_code == 401
    assert assert_error_shape(r)["type"] == "invalid_request_error"
    assert mock.log() == []


def test_revoked_key_is_401(server: Server, mock: Mock) -> None:
    combo_id, headers = setup_combo(server, mock, [("p1", "rva")])
    assert ask(server, combo_id, headers).status_code == 200
    secret = headers["Authorization"].split(" ", 1)[1]
    (row,) = [
        k for k in server.api.get("/api/keys").json()["keys"] if secret.startswith(k["prefix"])
    ]
    assert server.api.delete(f"/api/keys/{row['id']}").status_code == 200
    deadline = time.monotonic() + 3
    while ask(server, combo_id, headers).status_code != 401:  # the key cache refreshes by poll
        assert time.monotonic() < deadline, "revoked key still accepted"
        time.sleep(0.05)
    before = mock.hits("rva")
    r = ask(server, combo_id, headers)
    assert r.status_code == 401
    assert mock.hits("rva") == before


def test_key_in_x_ocx_key_header(server: Server, mock: Mock) -> None:
    combo_id, headers = setup_combo(server, mock, [("p1", "xka")])
    key = headers["Authorization"].split(" ", 1)[1]
    r = ask(server, combo_id, {"x-ocx-key": key})
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/xka"


def test_direct_provider_model_routing(server: Server, mock: Mock) -> None:
    _, headers = setup_combo(server, mock, [("p1", "pa"), ("p2", "pb")])
    r = server.http.post("/v1/responses", json={"model": "p2/pb", "input": "hi"}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/pb"
    assert r.headers["x-ocx-attempts"] == "1"
    assert "x-ocx-combo" not in r.headers
    assert mock.hits("pa") == 0
    log = mock.log("pb")
    assert len(log) == 1 and log[0]["body"]["model"] == "pb"
    assert log[0]["headers"]["authorization"] == f"Bearer {BACKUP_KEY}"


def test_direct_routing_failure_has_own_status(server: Server, mock: Mock) -> None:
    mock.script("dfa", [{"status": 502}])
    _, headers = setup_combo(server, mock, [("p1", "dfa")])
    r = server.http.post("/v1/responses", json={"model": "p1/dfa", "input": "hi"}, headers=headers)
    assert r.status_code == 502
    assert_error_shape(r)
    assert mock.hits("dfa") == 1


def test_unknown_direct_model_is_404(server: Server, mock: Mock) -> None:
    _, headers = setup_combo(server, mock, [("p1", "uda")])
    for model in ("p9/x", "nonsense"):
        r = server.http.post("/v1/responses", json={"model": model, "input": "hi"}, headers=headers)
        assert r.status_code == 404, r.text
        assert_error_shape(r)
    assert mock.log() == []


# ---------------------------------------------------------------------------------------------
# Chat Completions clients (PRODUCT §6)

CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def chat_stream_payloads(text: str) -> tuple[list[Any], bool]:
    payloads = [d for _, d in sse_events(text)]
    done = bool(payloads) and payloads[-1] == "[DONE]"
    return [p for p in payloads if p != "[DONE]"], done


@pytest.mark.parametrize("adapter", ["openai-chat", "openai-responses"])
def test_chat_client_non_stream(server: Server, mock: Mock, adapter: str) -> None:
    combo_id, headers = setup_combo(server, mock, [("p1", "cha")], adapters={"p1": adapter})
    r = server.http.post(
        "/v1/chat/completions", json={"model": f"combo/{combo_id}", **CHAT}, headers=headers
    )
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["content"] == "mock reply from cha"
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] == 3
    assert r.headers["x-ocx-target"] == "p1/cha"
    (entry,) = mock.log("cha")
    expected_path = "/v1/chat/completions" if adapter == "openai-chat" else "/v1/responses"
    assert entry["path"] == expected_path
    assert entry["body"]["model"] == "cha"
    if adapter == "openai-responses":
        assert "messages" not in entry["body"]
        assert "hello" in json.dumps(entry["body"]["input"])


@pytest.mark.parametrize("adapter", ["openai-chat", "openai-responses"])
def test_chat_client_stream(server: Server, mock: Mock, adapter: str) -> None:
    combo_id, headers = setup_combo(server, mock, [("p1", "chs")], adapters={"p1": adapter})
    r = server.http.post(
        "/v1/chat/completions",
        json={"model": f"combo/{combo_id}", "stream": True, **CHAT},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    payloads, done = chat_stream_payloads(r.text)
    assert done
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    text = "".join(
        (c.get("delta") or {}).get("content") or "" for p in payloads for c in p["choices"]
    )
    assert text == "mock reply from chs"
    finishes = [c.get("finish_reason") for p in payloads for c in p["choices"]]
    assert "stop" in finishes
    (entry,) = mock.log("chs")
    expected_path = "/v1/chat/completions" if adapter == "openai-chat" else "/v1/responses"
    assert entry["path"] == expected_path
    assert entry["stream"] is True


def test_responses_client_to_chat_target(server: Server, mock: Mock) -> None:
    combo_id, headers = setup_combo(server, mock, [("p1", "rtc")], adapters={"p1": "openai-chat"})
    r = ask(server, combo_id, headers, stream=True)
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert completed_text(events) == "mock reply from rtc"
    assert events[-1][0] == "response.completed"
    r = ask(server, combo_id, headers)
    assert r.json()["output"][0]["content"][0]["text"] == "mock reply from rtc"
    assert [e["path"] for e in mock.log("rtc")] == ["/v1/chat/completions"] * 2


def test_chat_client_failover_across_protocols(server: Server, mock: Mock) -> None:
    mock.script("cfa", [{"status": 500}])
    combo_id, headers = setup_combo(
        server, mock, [("p1", "cfa"), ("p2", "cfb")], adapters={"p2": "openai-chat"}
    )
    r = server.http.post(
        "/v1/chat/completions",
        json={"model": f"combo/{combo_id}", "stream": True, **CHAT},
        headers=headers,
    )
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/cfb"
    assert r.headers["x-ocx-attempts"] == "2"
    _, done = chat_stream_payloads(r.text)
    assert done


# ---------------------------------------------------------------------------------------------
# /v1/models


def test_models_lists_combos(server: Server, mock: Mock) -> None:
    combo_id, headers = setup_combo(server, mock, [("p1", "ma"), ("p2", "mb")])
    r = server.http.get("/v1/models", headers=headers)
    assert r.status_code == 200
    listing = r.json()
    assert listing["object"] == "list"
    rows = {m["id"]: m for m in listing["data"]}
    assert rows[f"combo/{combo_id}"]["owned_by"] == "combo"
    assert rows[f"combo/{combo_id}"]["object"] == "model"
    assert server.http.get("/v1/models").status_code == 401
    assert mock.log() == []
