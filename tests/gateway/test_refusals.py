"""`gateway.refusals`: the shape of each refusal, the long/short boundary, the Retry-After
cap and ASCII headers (PRODUCT §9.10), on the pure functions."""

from __future__ import annotations

import pytest

from gateway import refusals
from gateway.refusals import (
    RETRY_AFTER_CAP_S,
    USAGE_LIMIT_AFTER_S,
    Shaped,
    ascii_text,
    ascii_token,
    codex_rate_headers,
    earliest_return,
    unavailable,
    upstream,
    upstream_until,
)
from routing.classify import Failure
from routing.eligibility import TargetState

NOW = 1_790_000_000_000  # epoch ms


def headers(s: Shaped) -> dict[bytes, bytes]:
    return dict(s.headers)


def test_budget_exceeded_is_a_usage_limit_that_keeps_the_budget_headers() -> None:
    reset = NOW + 16 * 3600 * 1000 + 500
    gate_headers = [
        (b"x-ocx-budget-limit", b"1000"),
        (b"x-ocx-budget-remaining", b"0"),
        (b"x-ocx-budget-reset", b"1790057601"),
        (b"retry-after", b"57601"),
    ]
    s = refusals.budget_exceeded(
        message="Budget exceeded: alice may use 1000 tokens per day and has used 1200 tokens; "
        "it resets at 2026-09-22T00:00:00+00:00",
        reset_ms=reset,
        headers=gate_headers,
        now_ms=NOW,
    )
    assert (s.status, s.type, s.code) == (429, "usage_limit_reached", "budget_exceeded")
    assert s.fields == {"resets_at": 1_790_057_601, "resets_in_seconds": 57_601}
    assert s.headers[:4] == gate_headers  # Retry-After stays as the gate computed it
    assert headers(s)[b"x-codex-promo-message"] == (
        b"Budget exceeded: alice may use 1000 tokens per day and has used 1200 tokens; "
        b"it resets at 2026-09-22T00:00:00+00:00"
    )
    assert headers(s)[b"x-should-retry"] == b"false"
    assert [n for n, _ in s.headers].count(b"retry-after") == 1


def test_promo_message_of_a_non_ascii_owner_is_ascii() -> None:
    s = refusals.budget_exceeded(
        message="Budget exceeded: Zoë Müller’s team “Ünïcode” may use $1,000.00 per month — "
        "用户 reached it.",
        reset_ms=NOW + 3_600_000,
        headers=[],
        now_ms=NOW,
    )
    promo = headers(s)[b"x-codex-promo-message"]
    assert promo == (
        b'Budget exceeded: Zoe Muller\'s team "Unicode" may use $1,000.00 per month - ?? reached it'
    )
    # The body keeps the message as it is (JSON carries any text).
    assert s.message.endswith("用户 reached it.")
    assert headers(s)[b"retry-after"] == b"3600"


@pytest.mark.parametrize(
    ("wait_ms", "status", "retry_after"),
    [
        (1, 503, b"1"),
        (1_000, 503, b"1"),
        (1_001, 503, b"2"),
        (29_001, 503, b"30"),
        (USAGE_LIMIT_AFTER_S * 1000, 503, b"30"),  # exactly 30 s: still a short wait
        (USAGE_LIMIT_AFTER_S * 1000 + 1, 429, b"31"),  # past it: a usage limit
        (117_000, 429, b"117"),
    ],
)
def test_unavailable_boundary(wait_ms: int, status: int, retry_after: bytes) -> None:
    s = unavailable(
        status=503,
        type_="server_error",
        code="combo_unavailable",
        message="No available targets for combo: c: p/m: Cooling until …",
        until_ms=NOW + wait_ms,
        now_ms=NOW,
    )
    assert s.status == status
    assert s.code == "combo_unavailable"
    assert headers(s)[b"retry-after"] == retry_after
    if status == 503:
        assert s.type == "server_error"
        assert s.fields == {}
        assert b"x-codex-promo-message" not in headers(s)
    else:
        assert s.type == "usage_limit_reached"
        resets = -(-(NOW + wait_ms) // 1000)
        assert s.fields == {"resets_at": resets, "resets_in_seconds": resets - NOW // 1000}
        assert headers(s)[b"x-codex-promo-message"] == (
            b"No available targets for combo: c: p/m: Cooling until ..."
        )


def test_unavailable_without_a_known_return_has_no_retry_after() -> None:
    for until in (None, NOW, NOW - 5):
        s = unavailable(
            status=503,
            type_="server_error",
            code="combo_unavailable",
            message="m",
            until_ms=until,
            now_ms=NOW,
        )
        assert (s.status, s.headers, s.fields) == (503, [], {})


def test_earliest_return() -> None:
    cooling = TargetState("p/a", "cooling", "cooling", until=NOW + 90_000)
    quota = TargetState("p/b", "out_of_quota", "quota_exhausted", until=NOW + 40_000)
    no_key = TargetState("p/c", "no_credential", "credential_missing: x")
    disabled = TargetState("p/d", "disabled", "provider_disabled", until=NOW + 1)
    available = TargetState("p/e", "available")
    assert earliest_return([cooling, quota, no_key]) == NOW + 40_000
    assert earliest_return([cooling]) == NOW + 90_000
    assert earliest_return([no_key, disabled]) is None  # never by itself
    assert earliest_return([cooling, available]) is None  # one is there now
    assert earliest_return([]) is None


@pytest.mark.parametrize(
    ("raw", "status", "retry_after"),
    [
        ("0", 429, b"1"),
        ("1", 429, b"1"),
        ("30", 429, b"30"),
        ("31", 429, b"31"),  # a usage limit now: the whole wait, no sleep for Codex
        ("3600", 429, b"3600"),
    ],
)
def test_upstream_retry_after(raw: str, status: int, retry_after: bytes) -> None:
    failure = Failure(status=429, error_code="rate_limit_exceeded", headers={"retry-after": raw})
    until = upstream_until(failure, NOW)
    assert until == NOW + int(raw) * 1000
    s = upstream(
        status=429,
        type_="rate_limit_error",
        code="rate_limit_exceeded",
        message="Provider error 429 from p/m",
        until_ms=until,
        now_ms=NOW,
    )
    assert s.status == status
    assert headers(s)[b"retry-after"] == retry_after
    long = int(raw) > USAGE_LIMIT_AFTER_S
    assert s.type == ("usage_limit_reached" if long else "rate_limit_error")
    assert (b"x-codex-promo-message" in headers(s)) is long


def test_upstream_5xx_retry_after_is_capped_not_passed_through() -> None:
    failure = Failure(status=503, headers={"retry-after": "25"})
    s = upstream(
        status=503,
        type_="upstream_error",
        code="service_unavailable",
        message="Provider error 503 from p/m",
        until_ms=upstream_until(failure, NOW),
        now_ms=NOW,
    )
    assert (s.status, headers(s)[b"retry-after"]) == (503, b"25")
    # No Retry-After from the upstream: none from ocx either.
    s = upstream(
        status=500,
        type_="upstream_error",
        code=None,
        message="m",
        until_ms=upstream_until(Failure(status=500), NOW),
        now_ms=NOW,
    )
    assert (s.status, s.headers) == (500, [])


def test_upstream_retry_after_date_or_garbage_is_not_passed_on() -> None:
    for raw in ("Wed, 21 Oct 2015 07:28:00 GMT", "-5", "1.5", ""):
        assert upstream_until(Failure(status=429, headers={"retry-after": raw}), NOW) is None


def test_upstream_usage_limit_keeps_its_reset_and_codex_headers() -> None:
    resets_s = NOW // 1000 + 7200
    failure = Failure(
        status=429,
        error_type="usage_limit_reached",
        headers={
            "x-codex-active-limit": "codex",
            "x-codex-primary-used-percent": "100",
            "x-codex-primary-window-minutes": "300",
            "x-codex-primary-reset-at": str(resets_s),
        },
        body={"error": {"type": "usage_limit_reached", "resets_at": resets_s}},
    )
    until = upstream_until(failure, NOW)
    assert until == resets_s * 1000
    s = upstream(
        status=429,
        type_="usage_limit_reached",
        code="usage_limit_reached",
        message="Provider error 429 from cg/m: The usage limit has been reached",
        until_ms=until,
        now_ms=NOW,
        headers=codex_rate_headers(failure.headers),
    )
    assert (s.status, s.type) == (429, "usage_limit_reached")
    assert s.fields == {"resets_at": resets_s, "resets_in_seconds": 7200}
    h = headers(s)
    assert h[b"x-codex-primary-reset-at"] == str(resets_s).encode()
    assert h[b"retry-after"] == b"7200"


def test_a_short_upstream_usage_limit_is_still_one() -> None:
    s = upstream(
        status=429,
        type_="usage_limit_reached",
        code="usage_limit_reached",
        message="m",
        until_ms=NOW + 10_000,
        now_ms=NOW,
    )
    assert (s.status, s.type, s.fields["resets_in_seconds"]) == (429, "usage_limit_reached", 10)


def test_retry_after_cap() -> None:
    assert refusals.retry_after(59) == [(b"retry-after", str(RETRY_AFTER_CAP_S).encode())]
    assert refusals.retry_after(RETRY_AFTER_CAP_S) == [(b"retry-after", b"30")]
    assert refusals.retry_after(0.2) == [(b"retry-after", b"1")]


def test_codex_rate_headers_pass_only_rate_limit_headers() -> None:
    upstream_headers = {
        "content-type": "text/event-stream",
        "x-codex-active-limit": "codex",
        "x-codex-plan-type": "pro",
        "x-codex-primary-used-percent": "22",
        "x-codex-primary-window-minutes": "10080",
        "x-codex-primary-reset-at": "1790426679",
        "x-codex-primary-reset-after-seconds": "155800",
        "x-codex-secondary-reset-at": "",
        "x-codex-credits-has-credits": "False",
        "x-codex-credits-balance": "0",
        "x-codex-bengalfox-primary-used-percent": "0",
        "x-codex-bengalfox-limit-name": "GPT-5.3-Codex-Spark ✨",
        "x-codex-rate-limit-reached-type": "rate_limit_reached",
        "x-codex-turn-state": "opaque",
        "x-codex-promo-message": "Upgrade",
        "x-codex-beta-features": "a,b",
        "x-ratelimit-remaining-requests": "10",
        "x-other-primary-used-percent": "50",
    }
    got = dict(codex_rate_headers(upstream_headers))
    assert got == {
        b"x-codex-active-limit": b"codex",
        b"x-codex-plan-type": b"pro",
        b"x-codex-primary-used-percent": b"22",
        b"x-codex-primary-window-minutes": b"10080",
        b"x-codex-primary-reset-at": b"1790426679",
        b"x-codex-primary-reset-after-seconds": b"155800",
        b"x-codex-secondary-reset-at": b"",
        b"x-codex-credits-has-credits": b"False",
        b"x-codex-credits-balance": b"0",
        b"x-codex-bengalfox-primary-used-percent": b"0",
        b"x-codex-bengalfox-limit-name": b"GPT-5.3-Codex-Spark ?",
        b"x-codex-rate-limit-reached-type": b"rate_limit_reached",
    }
    assert codex_rate_headers({"content-type": "application/json"}) == []  # never made up


def test_ascii_helpers() -> None:
    assert ascii_text("plain text") == "plain text"
    assert ascii_text("line\r\nbreak\tand\x00nul") == "line break and nul"
    assert ascii_text("x" * 500, limit=20) == "x" * 17 + "..."
    assert ascii_text("Straße → Øre…") == "Strasse -> Ore..."
    assert ascii_token("openai/gpt-5") == b"openai/gpt-5"
    assert ascii_token("p/modèle 1%") == b"p/mod%C3%A8le%201%25"
