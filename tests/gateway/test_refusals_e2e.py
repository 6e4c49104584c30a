"""Refusals shaped for the client, end to end (PRODUCT §9.10, issue #46): a real `ocx serve`
and the real mock upstream.

A spent budget and any wait past 30 s answer as a usage limit (429 `usage_limit_reached` +
`resets_at` + an ASCII `x-codex-promo-message`); shorter waits keep their status with a
Retry-After of at most 30 s; the serving target's `x-codex-*` rate-limit headers reach the
client; and every header of every refusal is ASCII.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import httpx

from tests.conftest import Mock, Server, sse_events
from tests.gateway.test_caller_credentials import chatgpt_only
from tests.gateway.test_quota_failover import account, reset_in, usage_limit

API_KEY = "sk-test-refusals-aaaaaaaaaaaaaaaaaaaaaaa"
USAGE = {"input_tokens": 60, "output_tokens": 40}


def assert_ascii(r: httpx.Response) -> None:
    """Every header of the answer is printable ASCII (Codex drops a response otherwise)."""
    for name, value in r.headers.raw:
        assert name.isascii() and value.isascii(), (name, value)
        assert all(0x20 <= b < 0x7F or b == 0x09 for b in value), (name, value)


def provider(mock: Mock, *models: str, **extra: Any) -> dict[str, Any]:
    return {
        "adapter": "openai-responses",
        "baseUrl": mock.url + "/v1",
        "apiKey": API_KEY,
        "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
        "models": {m: {"contextWindow": 100000} for m in models},
        **extra,
    }


def one_target(server: Server, mock: Mock, **combo: Any) -> tuple[str, str, dict[str, str]]:
    """A combo of one target on a fresh provider: (combo id, mock model, request headers)."""
    tag = uuid.uuid4().hex[:6]
    name, model, combo_id = f"rp{tag}", f"rm{tag}", f"rc{tag}"
    server.put_provider(name, provider(mock, model))
    server.put_combo(combo_id, {"targets": [{"provider": name, "model": model}], **combo})
    key = server.create_key(user=f"refusals-{tag}")
    server.wait_synced()
    return combo_id, model, {"Authorization": f"Bearer {key}"}


def ask(
    server: Server, model: str, headers: dict[str, str], stream: bool = False
) -> httpx.Response:
    body = {"model": model, "input": "hi", "stream": stream}
    return server.http.post("/v1/responses", json=body, headers=headers)


def usage_limit_error(r: httpx.Response, code: str) -> dict[str, Any]:
    """The usage-limit shape: Codex stops at once and shows the promo message."""
    assert r.status_code == 429, r.text
    assert_ascii(r)
    error: dict[str, Any] = r.json()["error"]
    assert (error["type"], error["code"]) == ("usage_limit_reached", code)
    assert abs(error["resets_in_seconds"] - (error["resets_at"] - time.time())) <= 2
    assert r.headers["x-should-retry"] == "false"
    assert int(r.headers["retry-after"]) > 30
    assert r.headers["x-codex-promo-message"]
    return error


# --- spent budget ---------------------------------------------------------------------------


def test_spent_budget_is_a_usage_limit_with_the_budget_headers(server: Server, mock: Mock) -> None:
    tag = uuid.uuid4().hex[:6]
    server.put_provider(f"bp{tag}", provider(mock, "bm"))
    # A user name Codex could not carry in a header as it is.
    r = server.api.post(
        "/api/keys",
        json={"user": f"zoë-{tag}", "budget": {"tokens": 1, "period": "day"}},
    )
    assert r.status_code == 201, r.text
    created = r.json()
    headers = {"Authorization": f"Bearer {created['key']}"}
    deadline = time.monotonic() + 5
    while server.http.get("/v1/models", headers=headers).status_code == 401:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    mock.script("bm", [], then={"usage": USAGE})
    assert ask(server, f"bp{tag}/bm", headers).status_code == 200  # admitted, then 100 tokens

    r = ask(server, f"bp{tag}/bm", headers)
    error = usage_limit_error(r, "budget_exceeded")
    midnight = int(time.time() // 86400 + 1) * 86400
    assert error["resets_at"] == midnight
    assert error["message"].startswith(
        f"Budget exceeded: key {created['prefix']}… of zoë-{tag} may use 1 tokens per day "
        "and has used 100 tokens; it resets at "
    )
    assert r.headers["x-codex-promo-message"] == (
        error["message"].replace("…", "...").replace("ë", "e")
    )
    # What other clients read stays: the x-ocx-budget-* headers, the whole wait.
    assert r.headers["x-ocx-budget-limit"] == "1"
    assert r.headers["x-ocx-budget-remaining"] == "0"
    assert r.headers["x-ocx-budget-reset"] == str(midnight)
    assert 0 < int(r.headers["retry-after"]) <= math.ceil(midnight - time.time()) + 1
    assert mock.hits("bm") == 1  # the refused request reached no upstream


# --- waits: long is a usage limit, short a capped Retry-After --------------------------------


def test_long_upstream_retry_after_then_long_cooling_are_usage_limits(
    server: Server, mock: Mock
) -> None:
    combo_id, model, headers = one_target(server, mock)
    mock.script(model, [{"status": 429, "headers": {"Retry-After": "120"}}])

    first = ask(server, f"combo/{combo_id}", headers)  # the upstream's own answer
    error = usage_limit_error(first, "rate_limit_exceeded")
    assert 118 <= error["resets_at"] - time.time() <= 121
    assert error["message"].startswith(f"Provider error 429 from rp{model[2:]}/{model}")
    assert first.headers["retry-after"] in ("119", "120")

    for stream in (False, True):  # the combo cools: unavailable for two minutes
        r = ask(server, f"combo/{combo_id}", headers, stream=stream)
        error = usage_limit_error(r, "combo_unavailable")
        assert error["message"].startswith(
            f"No available targets for combo: {combo_id}: rp{model[2:]}/{model}: Cooling until "
        )
        assert r.headers["x-codex-promo-message"] == error["message"]
        assert r.headers["x-ocx-combo"] == combo_id
        assert 118 <= error["resets_at"] - time.time() <= 121
    assert mock.hits(model) == 1


def test_short_waits_keep_503_with_a_capped_retry_after(server: Server, mock: Mock) -> None:
    combo_id, model, headers = one_target(server, mock, cooldownMs=20_000)
    mock.script(model, [{"status": 503, "headers": {"Retry-After": "25"}}])

    first = ask(server, f"combo/{combo_id}", headers)
    assert first.status_code == 503, first.text
    assert_ascii(first)
    assert first.headers["retry-after"] in ("24", "25")
    assert first.json()["error"]["type"] == "server_error"  # the upstream's own
    assert "x-codex-promo-message" not in first.headers

    r = ask(server, f"combo/{combo_id}", headers)
    assert r.status_code == 503, r.text
    assert_ascii(r)
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "combo_unavailable")
    assert "resets_at" not in error
    assert 1 <= int(r.headers["retry-after"]) <= 25
    assert mock.hits(model) == 1


def test_upstream_429_past_the_cap_is_never_passed_on_as_a_sleep(
    server: Server, mock: Mock
) -> None:
    combo_id, model, headers = one_target(server, mock)
    mock.script(model, [{"status": 429, "headers": {"Retry-After": "31"}}])
    r = ask(server, f"combo/{combo_id}", headers)
    usage_limit_error(r, "rate_limit_exceeded")
    assert r.headers["retry-after"] in ("30", "31")  # the usage limit's own, not a sleep


# --- x-codex-* pass-through --------------------------------------------------------------------


def test_codex_rate_headers_of_the_serving_target_reach_the_client(
    server: Server, mock: Mock
) -> None:
    c, key = chatgpt_only(server, mock)
    reset = reset_in(3600)
    primary = {"used_percent": 22, "window_minutes": 300, "reset_at": reset}
    mock.script(c.pm, [{"rate_limits": {"primary": primary}}] * 2)
    for stream in (False, True):
        r = ask(server, f"combo/{c.id}", account("a", key), stream=stream)
        assert r.status_code == 200, r.text
        assert_ascii(r)
        if stream:
            assert sse_events(r.text)[-1][0] == "response.completed"
        assert r.headers["x-codex-active-limit"] == "codex"
        assert r.headers["x-codex-primary-used-percent"] == "22"
        assert r.headers["x-codex-primary-window-minutes"] == "300"
        assert r.headers["x-codex-primary-reset-at"] == str(reset)
    # A target that sends none gets none made up.
    combo_id, model, headers = one_target(server, mock)
    r = ask(server, f"combo/{combo_id}", headers)
    assert r.status_code == 200, r.text
    assert not [n for n in r.headers if n.startswith("x-codex-")]


def test_upstream_usage_limit_keeps_its_reset_and_codex_headers(server: Server, mock: Mock) -> None:
    c, key = chatgpt_only(server, mock)
    reset = reset_in(7200)
    mock.script(c.pm, [usage_limit(reset)])
    caller = account("a", key)
    r = ask(server, f"combo/{c.id}", caller)
    # The code stays the classifier's, as before; the type is what Codex reads.
    error = usage_limit_error(r, "rate_limit_exceeded")
    assert error["resets_at"] == reset
    assert error["message"].startswith(f"Provider error 429 from {c.primary}/{c.pm}")
    assert r.headers["x-codex-primary-used-percent"] == "100"
    assert r.headers["x-codex-primary-reset-at"] == str(reset)
    # The caller's account is out until then: the next request says so without an attempt.
    r = ask(server, f"combo/{c.id}", caller)
    error = usage_limit_error(r, "combo_unavailable")
    assert error["resets_at"] == reset
    assert f"{c.primary}/{c.pm}: Out of quota until " in error["message"]
    # The same target asked for by name (no combo): the same usage limit.
    r = ask(server, f"{c.primary}/{c.pm}", caller)
    error = usage_limit_error(r, "provider_unavailable")
    assert error["resets_at"] == reset
    assert error["message"].startswith(f"{c.primary}/{c.pm}: Out of quota until ")
    assert mock.hits(c.pm) == 1


# --- every header ASCII ---------------------------------------------------------------------


def test_every_refusal_and_header_is_ascii(server: Server, mock: Mock) -> None:
    tag = uuid.uuid4().hex[:6]
    name, model = f"ap{tag}", f"am{tag}"
    server.put_provider(name, provider(mock, model))
    server.put_combo(f"ac{tag}", {"targets": [{"provider": name, "model": model}]})
    key = server.create_key(user=f"ascii-{tag}")
    limited = server.create_key(user=f"ascii-l-{tag}", allowedModels=[f"combo/ac{tag}"])
    rpm = server.create_key(user=f"ascii-r-{tag}", rpmLimit=1)
    expired = server.create_key(user=f"ascii-e-{tag}")
    listed = server.api.get("/api/keys", params={"user": f"ascii-e-{tag}"}).json()["keys"][0]
    patched = server.api.patch(f"/api/keys/{listed['id']}", json={"expiresAt": "2020-01-01T00:00Z"})
    assert patched.status_code == 200
    server.wait_synced()
    bearer = {"Authorization": f"Bearer {key}"}
    # A served answer whose upstream sent a non-ASCII x-codex value, on a non-ASCII model name.
    mock.script(
        "modèle-ü",
        [
            {
                "text": "ok",
                "headers": {"x-codex-limit-name": "Spärk", "x-codex-active-limit": "codex"},
            }
        ],
    )
    served = ask(server, f"{name}/modèle-ü", bearer)
    assert served.status_code == 200, served.text
    assert served.headers["x-ocx-target"] == f"{name}/mod%C3%A8le-%C3%BC"
    assert served.headers["x-codex-limit-name"] == "Spark"

    mock.script(model, [{"status": 429, "headers": {"Retry-After": "3600"}}])
    answers = {
        "served": served,
        "no key": ask(server, f"combo/ac{tag}", {}),
        "wrong key": ask(server, f"combo/ac{tag}", {"Authorization": "Bearer ocx_wrong"}),
        "expired": ask(server, f"combo/ac{tag}", {"Authorization": f"Bearer {expired}"}),
        "not allowed": ask(server, f"{name}/{model}", {"Authorization": f"Bearer {limited}"}),
        "unknown model": ask(server, "nope/ü", bearer),
        "bad json": server.http.post("/v1/responses", content=b"{", headers=bearer),
        "unknown endpoint": server.http.post("/v1/nope", json={}, headers=bearer),
        "method": server.http.get("/v1/responses", headers=bearer),
        "upstream long": ask(server, f"combo/ac{tag}", bearer),
        "combo long": ask(server, f"combo/ac{tag}", bearer),
    }
    ask(server, f"combo/ac{tag}", {"Authorization": f"Bearer {rpm}"})
    answers["rpm"] = ask(server, f"combo/ac{tag}", {"Authorization": f"Bearer {rpm}"})
    expected = {
        "served": 200,
        "no key": 401,
        "wrong key": 401,
        "expired": 401,
        "not allowed": 403,
        "unknown model": 404,
        "bad json": 400,
        "unknown endpoint": 404,
        "method": 405,
        "upstream long": 429,
        "combo long": 429,
        "rpm": 429,
    }
    assert {k: r.status_code for k, r in answers.items()} == expected
    for r in answers.values():
        assert_ascii(r)
    assert 1 <= int(answers["rpm"].headers["retry-after"]) <= 30  # capped
    assert answers["rpm"].json()["error"]["code"] == "client_rate_limited"
