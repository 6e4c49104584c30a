from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from quota.windows import (
    FRESHNESS_MS,
    REASON_AVAILABLE,
    REASON_LIMIT_REACHED,
    REASON_PROBE_FAILED,
    REASON_PROBE_STARTED,
    REASON_PROBE_STILL_LIMITED,
    SOURCE_ANTHROPIC,
    SOURCE_ANTHROPIC_UNIFIED,
    SOURCE_CODEX_EVENT,
    SOURCE_CODEX_HEADERS,
    SOURCE_OPENAI,
    SOURCE_USAGE_LIMIT,
    CredentialQuota,
    Transition,
    Window,
    acquire_probe,
    credential_fingerprint,
    eligibility,
    is_exhausted,
    is_usage_limit_error,
    next_change_at,
    observe,
    observe_failure,
    observe_success,
    soonest_reset,
    transition_message,
    window_name,
    windows_from_error,
    windows_from_event,
    windows_from_headers,
)

NOW = 1_790_000_000_000  # epoch ms (Unix s 1790000000)
MIN = 60_000
HOUR = 60 * MIN


def win(
    name: str = "five_hour",
    used: float | None = 100.0,
    resets: int | None = NOW + HOUR,
    *,
    minutes: int | None = 300,
    observed: int = NOW,
    source: str = SOURCE_CODEX_HEADERS,
    limit_id: str = "codex",
    scope: str = "inference",
    informational: bool = False,
    whole: bool = True,
) -> Window:
    return Window(
        name=name,  # type: ignore[arg-type]
        used_percent=used,
        window_minutes=minutes,
        resets_at_ms=resets,
        observed_at_ms=observed,
        scope=scope,  # type: ignore[arg-type]
        source=source,
        limit_id=limit_id,
        informational=informational,
        whole_credential=whole,
    )


def fresh() -> CredentialQuota:
    return CredentialQuota(provider="openai", credential=credential_fingerprint("sk-user-a"))


# ------------------------------------------------------------------------------------------------
# Purity


def test_module_imports_no_framework() -> None:
    src = Path(__file__).resolve().parents[2] / "quota" / "windows.py"
    tree = ast.parse(src.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert not roots & {"django", "ninja", "channels", "time"}


# ------------------------------------------------------------------------------------------------
# Naming


@pytest.mark.parametrize(
    ("minutes", "name"),
    [
        (300, "five_hour"),
        (10080, "weekly"),
        (43200, "monthly"),
        (43800, "monthly"),
        (40320, "monthly"),
        (44640, "monthly"),
        (40319, "custom"),
        (44641, "custom"),
        (60, "custom"),
        (None, "custom"),
    ],
)
def test_window_name(minutes: int | None, name: str) -> None:
    assert window_name(minutes) == name


# ------------------------------------------------------------------------------------------------
# x-codex-* headers

OBSERVED_PRO = {
    "x-codex-active-limit": "codex",
    "x-codex-plan-type": "pro",
    "x-codex-primary-used-percent": "22",
    "x-codex-primary-window-minutes": "10080",
    "x-codex-primary-reset-at": "1790426679",
    "x-codex-primary-reset-after-seconds": "155800",
    "x-codex-primary-over-secondary-limit-percent": "0",
    "x-codex-secondary-used-percent": "0",
    "x-codex-secondary-window-minutes": "0",
    "x-codex-secondary-reset-at": "",
    "x-codex-secondary-reset-after-seconds": "0",
    "x-codex-credits-has-credits": "False",
    "x-codex-credits-unlimited": "False",
    "x-codex-credits-balance": "0",
    "x-codex-bengalfox-primary-used-percent": "0",
    "x-codex-bengalfox-primary-window-minutes": "10080",
    "x-codex-bengalfox-limit-name": "GPT-5.3-Codex-Spark",
    "x-codex-turn-state": "opaque",
}


def test_codex_headers_observed_pro_account() -> None:
    ws = windows_from_headers(OBSERVED_PRO, now=NOW)
    main = [w for w in ws if w.limit_id == "codex"]
    # Weekly primary (not 5h!), placeholder secondary dropped.
    assert main == [
        Window(
            name="weekly",
            used_percent=22.0,
            window_minutes=10080,
            resets_at_ms=1_790_426_679_000,
            observed_at_ms=NOW,
            scope="inference",
            source=SOURCE_CODEX_HEADERS,
            limit_id="codex",
        )
    ]
    spark = [w for w in ws if w.limit_id == "codex_bengalfox"]
    assert len(spark) == 1
    assert spark[0].name == "weekly" and spark[0].used_percent == 0.0
    assert spark[0].whole_credential is False and spark[0].informational is True
    assert len(ws) == 2


def test_codex_headers_five_hour_and_weekly_case_insensitive() -> None:
    headers = {
        "X-Codex-Primary-Used-Percent": "100.0",
        "X-Codex-Primary-Window-Minutes": "300",
        "X-Codex-Primary-Reset-At": "1790003600",
        "X-Codex-Secondary-Used-Percent": "57.5",
        "X-Codex-Secondary-Window-Minutes": "10080",
        "X-Codex-Secondary-Reset-At": "1790400000",
    }
    ws = windows_from_headers(headers, now=NOW)
    assert [(w.name, w.used_percent, w.window_minutes, w.resets_at_ms) for w in ws] == [
        ("five_hour", 100.0, 300, 1_790_003_600_000),
        ("weekly", 57.5, 10080, 1_790_400_000_000),
    ]
    assert is_exhausted(ws[0], now=NOW) and not is_exhausted(ws[1], now=NOW)


def test_codex_reset_after_seconds_used_when_reset_at_absent() -> None:
    headers = {
        "x-codex-primary-used-percent": "40",
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-after-seconds": "4210",
    }
    (w,) = windows_from_headers(headers, now=NOW)
    assert w.resets_at_ms == NOW + 4_210_000


def test_codex_reset_at_preferred_over_reset_after() -> None:
    headers = {
        "x-codex-primary-used-percent": "40",
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": "1790001000",
        "x-codex-primary-reset-after-seconds": "9999",
    }
    (w,) = windows_from_headers(headers, now=NOW)
    assert w.resets_at_ms == 1_790_001_000_000


def test_codex_tertiary_monthly_and_missing_used_percent() -> None:
    headers = {
        "x-codex-primary-window-minutes": "300",  # no used-percent: window omitted
        "x-codex-primary-reset-at": "1790003600",
        "x-codex-tertiary-used-percent": "12",
        "x-codex-tertiary-window-minutes": "43800",
        "x-codex-tertiary-reset-at": "1792000000",
    }
    ws = windows_from_headers(headers, now=NOW)
    assert [(w.name, w.used_percent) for w in ws] == [("monthly", 12.0)]


@pytest.mark.parametrize("bad", ["", "abc", "nan", "inf", "  "])
def test_codex_non_numeric_used_percent_is_absent(bad: str) -> None:
    headers = {"x-codex-primary-used-percent": bad, "x-codex-primary-window-minutes": "300"}
    assert windows_from_headers(headers, now=NOW) == []


def test_no_quota_headers_no_windows() -> None:
    assert windows_from_headers({"content-type": "text/event-stream"}, now=NOW) == []


# ------------------------------------------------------------------------------------------------
# anthropic-ratelimit-* headers


def test_anthropic_unified_fraction_to_percent() -> None:
    headers = {
        "anthropic-ratelimit-unified-status": "allowed_warning",
        "anthropic-ratelimit-unified-reset": "1790003600",
        "anthropic-ratelimit-unified-representative-claim": "five_hour",
        "anthropic-ratelimit-unified-5h-utilization": "0.85",
        "anthropic-ratelimit-unified-5h-reset": "1790003600",
        "anthropic-ratelimit-unified-5h-status": "allowed_warning",
        "anthropic-ratelimit-unified-7d-utilization": "1.02",
        "anthropic-ratelimit-unified-7d-reset": "1790400000",
        "anthropic-ratelimit-unified-7d-status": "allowed",
    }
    ws = windows_from_headers(headers, now=NOW)
    assert [(w.name, w.window_minutes, w.resets_at_ms, w.source) for w in ws] == [
        ("five_hour", 300, 1_790_003_600_000, SOURCE_ANTHROPIC_UNIFIED),
        ("weekly", 10080, 1_790_400_000_000, SOURCE_ANTHROPIC_UNIFIED),
    ]
    assert ws[0].used_percent == pytest.approx(85.0)
    assert ws[1].used_percent == pytest.approx(102.0)  # can exceed 100
    assert not is_exhausted(ws[0], now=NOW) and is_exhausted(ws[1], now=NOW)
    assert all(not w.informational and w.whole_credential for w in ws)


def test_anthropic_unified_rejected_is_structured_exhaustion() -> None:
    headers = {
        "anthropic-ratelimit-unified-status": "rejected",
        "anthropic-ratelimit-unified-reset": "1790003600",
        "anthropic-ratelimit-unified-representative-claim": "five_hour",
        "anthropic-ratelimit-unified-5h-utilization": "0.995",
    }
    (w,) = windows_from_headers(headers, now=NOW)
    assert w.used_percent == 100.0
    assert w.resets_at_ms == 1_790_003_600_000
    assert is_exhausted(w, now=NOW)


def test_anthropic_console_limits_informational() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-09-21T20:14:00Z",
        "anthropic-ratelimit-tokens-limit": "80000",
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": "2026-09-21T20:14:01.123456789+00:00",
        "anthropic-ratelimit-output-tokens-limit": "0",  # zero limit: skipped
        "anthropic-ratelimit-output-tokens-remaining": "0",
    }
    ws = windows_from_headers(headers, now=NOW)
    assert [(w.limit_id, w.name, w.source, w.informational) for w in ws] == [
        ("requests", "custom", SOURCE_ANTHROPIC, True),
        ("tokens", "custom", SOURCE_ANTHROPIC, True),
    ]
    assert ws[0].used_percent == pytest.approx(2.0)
    assert ws[1].used_percent == 100.0
    # 2026-09-21T20:14:00Z == 1790021640 s
    assert ws[0].resets_at_ms == 1_790_021_640_000
    assert ws[1].resets_at_ms == 1_790_021_641_123


# ------------------------------------------------------------------------------------------------
# x-ratelimit-* headers (OpenAI style)


@pytest.mark.parametrize(
    ("reset", "expected"),
    [
        ("1s", NOW + 1000),
        ("6m0s", NOW + 360_000),
        ("20ms", NOW + 20),
        ("1h2m3.5s", NOW + 3_723_500),
        ("12", NOW + 12_000),
        ("1790000100", 1_790_000_100_000),
        ("", None),
        ("soon", None),
        ("5x", None),
    ],
)
def test_openai_reset_formats(reset: str, expected: int | None) -> None:
    headers = {
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-remaining-requests": "9999",
        "x-ratelimit-reset-requests": reset,
    }
    (w,) = windows_from_headers(headers, now=NOW)
    assert w.resets_at_ms == expected


def test_openai_requests_and_tokens() -> None:
    headers = {
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-remaining-requests": "7500",
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-limit-tokens": "2000000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "2s",
    }
    ws = windows_from_headers(headers, now=NOW)
    assert [(w.limit_id, w.used_percent, w.source, w.informational) for w in ws] == [
        ("requests", 25.0, SOURCE_OPENAI, True),
        ("tokens", 100.0, SOURCE_OPENAI, True),
    ]
    # Informational, but structurally exhausted (100 % with a future reset) is still evidence.
    assert is_exhausted(ws[1], now=NOW) and not is_exhausted(ws[0], now=NOW)


# ------------------------------------------------------------------------------------------------
# Usage-limit errors

USAGE_BODY: dict[str, Any] = {
    "error": {
        "type": "usage_limit_reached",
        "message": "The usage limit has been reached",
        "plan_type": "plus",
        "resets_at": 1790426679,
        "resets_in_seconds": 4210,
    }
}


@pytest.mark.parametrize("status", [429, 400, 403, 200, 500])
def test_usage_limit_error_any_status(status: int) -> None:
    assert is_usage_limit_error(status, USAGE_BODY)
    ws = windows_from_error(status, USAGE_BODY, {}, now=NOW)
    assert len(ws) == 1
    (w,) = ws
    assert (w.source, w.used_percent, w.resets_at_ms) == (
        SOURCE_USAGE_LIMIT,
        100.0,
        1_790_426_679_000,  # resets_at wins over resets_in_seconds
    )
    assert is_exhausted(w, now=NOW)


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": "usage_limit_reached"}},
        {"error": {"type": "usage-limit-reached"}},
        {"type": "usage_limit_reached"},
        {"response": {"error": {"code": "usage_limit_reached"}}},
    ],
)
def test_usage_limit_structured_variants(body: dict[str, Any]) -> None:
    assert is_usage_limit_error(429, body)


def test_usage_limit_resets_in_seconds_only() -> None:
    body = {"error": {"type": "usage_limit_reached", "resets_in_seconds": 4210}}
    (w,) = windows_from_error(429, body, None, now=NOW)
    assert w.resets_at_ms == NOW + 4_210_000


def test_usage_limit_without_reset_has_none() -> None:
    (w,) = windows_from_error(429, {"error": {"type": "usage_limit_reached"}}, None, now=NOW)
    assert w.resets_at_ms is None and is_exhausted(w, now=NOW)


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": "rate_limit_exceeded", "message": "usage limit reached"}},
        {"error": {"message": "You've hit your usage limit. usage_limit_reached"}},
        {"error": {"type": "invalid_request_error", "message": "Nutzungslimit erreicht"}},
        {"error": {"type": "usage_not_included"}},
        {"error": "usage_limit_reached"},
        {"detail": "usage_limit_reached"},
        None,
    ],
)
def test_no_evidence_from_prose(body: dict[str, Any] | None) -> None:
    assert not is_usage_limit_error(429, body)
    assert windows_from_error(429, body, {}, now=NOW) == []


def test_usage_limit_dedupes_against_header_window_with_same_reset() -> None:
    headers = {
        "x-codex-active-limit": "codex",
        "x-codex-primary-used-percent": "100",
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": "1790426679",
    }
    ws = windows_from_error(429, USAGE_BODY, headers, now=NOW)
    assert [(w.name, w.source, w.resets_at_ms) for w in ws] == [
        ("five_hour", SOURCE_CODEX_HEADERS, 1_790_426_679_000)
    ]


def test_usage_limit_with_different_reset_keeps_both_windows() -> None:
    headers = {
        "x-codex-primary-used-percent": "100",
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": "1790003600",
        "x-codex-secondary-used-percent": "100",
        "x-codex-secondary-window-minutes": "10080",
        "x-codex-secondary-reset-at": "1790400000",
    }
    ws = windows_from_error(429, USAGE_BODY, headers, now=NOW)
    assert [(w.name, w.source) for w in ws] == [
        ("five_hour", SOURCE_CODEX_HEADERS),
        ("weekly", SOURCE_CODEX_HEADERS),
        ("five_hour", SOURCE_USAGE_LIMIT),
    ]


def test_usage_limit_for_model_scoped_family_does_not_limit_credential() -> None:
    headers = {"x-codex-active-limit": "codex_bengalfox"}
    (w,) = windows_from_error(429, USAGE_BODY, headers, now=NOW)
    assert w.limit_id == "codex_bengalfox" and not w.whole_credential
    assert not is_exhausted(w, now=NOW)
    state, t = observe_failure(fresh(), [w], now=NOW)
    assert state.status == "available" and t is None


# ------------------------------------------------------------------------------------------------
# codex.rate_limits events


def test_rate_limits_event() -> None:
    event = {
        "type": "codex.rate_limits",
        "plan_type": "plus",
        "rate_limits": {
            "primary": {"used_percent": 12.5, "window_minutes": 300, "reset_at": 1790000000},
            "secondary": {"used_percent": 40, "window_minutes": 10080, "reset_at": 1790400000},
        },
        "credits": {"has_credits": False, "unlimited": False, "balance": "0"},
        "metered_limit_name": "codex",
    }
    ws = windows_from_event(event, now=NOW)
    assert [(w.name, w.used_percent, w.resets_at_ms, w.source) for w in ws] == [
        ("five_hour", 12.5, 1_790_000_000_000, SOURCE_CODEX_EVENT),
        ("weekly", 40.0, 1_790_400_000_000, SOURCE_CODEX_EVENT),
    ]
    assert all(w.whole_credential for w in ws)


def test_rate_limits_event_resets_in_seconds_and_null_secondary() -> None:
    event = {
        "type": "codex.rate_limits",
        "rate_limits": {
            "primary": {"used_percent": 100, "window_minutes": 300, "resets_in_seconds": 60},
            "secondary": None,
        },
    }
    (w,) = windows_from_event(event, now=NOW)
    assert w.resets_at_ms == NOW + 60_000 and is_exhausted(w, now=NOW)


def test_other_events_ignored() -> None:
    assert windows_from_event({"type": "response.completed", "rate_limits": {}}, now=NOW) == []


# ------------------------------------------------------------------------------------------------
# Exhaustion rule


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (win(used=100.0, resets=NOW + 1), True),
        (win(used=150.0, resets=NOW + 1), True),
        (win(used=99.99, resets=NOW + HOUR), False),
        (win(used=100.0, resets=NOW), False),  # reset not in the future
        (win(used=100.0, resets=None), False),  # missing reset is not evidence
        (win(used=None, resets=NOW + HOUR), False),
        (win(used=100.0, scope="search"), False),
        (win(used=100.0, scope="mcp"), False),
        (win(used=100.0, whole=False), False),
        (win(used=100.0, informational=True, source=SOURCE_OPENAI), True),
        (win(used=None, resets=None, source=SOURCE_USAGE_LIMIT), True),
    ],
)
def test_is_exhausted(window: Window, expected: bool) -> None:
    assert is_exhausted(window, now=NOW) is expected


# ------------------------------------------------------------------------------------------------
# State machine


def test_available_stays_available_without_evidence() -> None:
    s0 = fresh()
    s1, t = observe(s0, [win(used=99.0), win(used=100.0, resets=None)], now=NOW)
    assert s1 == s0 and t is None
    assert eligibility(s1, now=NOW) == "eligible"
    assert next_change_at(s1) is None
    assert acquire_probe(s1, now=NOW, lease_ms=MIN) == (s1, True)


def test_available_to_limited() -> None:
    w5 = win("five_hour", 100.0, NOW + HOUR)
    s1, t = observe(fresh(), [w5, win("weekly", 30.0, NOW + 5 * HOUR, minutes=10080)], now=NOW)
    assert t == Transition("available", "limited", REASON_LIMIT_REACHED, NOW)
    assert s1.status == "limited" and s1.exhausted == (w5,)
    assert s1.last_transition == t
    assert eligibility(s1, now=NOW + HOUR - 1) == "ineligible"
    assert eligibility(s1, now=NOW + HOUR) == "probe"
    assert next_change_at(s1) == NOW + HOUR


def test_usage_limit_error_limits_via_failure() -> None:
    ws = windows_from_error(429, USAGE_BODY, {}, now=NOW)
    s1, t = observe_failure(fresh(), ws, now=NOW)
    assert t is not None and (t.from_status, t.to_status) == ("available", "limited")
    assert next_change_at(s1) == 1_790_426_679_000


def test_usage_limit_without_reset_holds_for_unknown_reset() -> None:
    ws = windows_from_error(429, {"error": {"code": "usage_limit_reached"}}, {}, now=NOW)
    s1, _ = observe_failure(fresh(), ws, now=NOW, unknown_reset_ms=10 * MIN)
    assert s1.hold_until_ms == NOW + 10 * MIN
    assert eligibility(s1, now=NOW + 10 * MIN - 1) == "ineligible"
    assert eligibility(s1, now=NOW + 10 * MIN) == "probe"


def test_ordinary_failure_of_available_credential_changes_nothing() -> None:
    s0 = fresh()
    assert observe_failure(s0, [], now=NOW) == (s0, None)


def test_strict_recovery_both_windows_earlier_reset_does_not_restore() -> None:
    r5, rw = NOW + HOUR, NOW + 72 * HOUR
    both = [win("five_hour", 100.0, r5), win("weekly", 100.0, rw, minutes=10080)]
    s, t = observe(fresh(), both, now=NOW)
    assert t is not None and s.status == "limited" and len(s.exhausted) == 2
    assert next_change_at(s) == rw
    # The 5h window has reset but the weekly has not: still ineligible, no probe granted.
    for clock in (r5, r5 + 1, rw - 1):
        assert eligibility(s, now=clock) == "ineligible"
        assert acquire_probe(s, now=clock, lease_ms=MIN) == (s, False)
    # After the later reset: exactly one probe, and only its success restores.
    assert eligibility(s, now=rw) == "probe"
    s, granted = acquire_probe(s, now=rw, lease_ms=MIN)
    assert granted and s.status == "probing"
    assert s.last_transition == Transition("limited", "probing", REASON_PROBE_STARTED, rw)
    s, t = observe_success(s, [win("five_hour", 3.0, rw + 5 * HOUR)], now=rw + 500)
    assert t == Transition("probing", "available", REASON_AVAILABLE, rw + 500)
    assert s.status == "available" and s.exhausted == () and s.probe_lease_until_ms is None
    assert eligibility(s, now=rw + 500) == "eligible"


def test_one_probe_at_a_time_and_lease_expiry() -> None:
    s, _ = observe(fresh(), [win(resets=NOW + HOUR)], now=NOW)
    t0 = NOW + HOUR
    s, granted = acquire_probe(s, now=t0, lease_ms=30_000)
    assert granted and s.probe_lease_until_ms == t0 + 30_000
    assert next_change_at(s) == t0 + 30_000
    # A second caller during the lease is refused.
    assert eligibility(s, now=t0 + 29_999) == "ineligible"
    assert acquire_probe(s, now=t0 + 29_999, lease_ms=30_000) == (s, False)
    # The probe was lost: its lease expires and exactly one new probe is granted.
    assert eligibility(s, now=t0 + 30_000) == "probe"
    s2, granted = acquire_probe(s, now=t0 + 30_000, lease_ms=30_000)
    assert granted and s2.status == "probing" and s2.probe_lease_until_ms == t0 + 60_000
    assert acquire_probe(s2, now=t0 + 30_001, lease_ms=30_000) == (s2, False)


def test_probe_response_still_exhausted_relimits_with_new_resets() -> None:
    s, _ = observe(fresh(), [win("five_hour", 100.0, NOW + HOUR)], now=NOW)
    t0 = NOW + HOUR
    s, _ = acquire_probe(s, now=t0, lease_ms=MIN)
    new_weekly = win("weekly", 100.0, t0 + 48 * HOUR, minutes=10080, observed=t0)
    s, t = observe_success(s, [win("five_hour", 0.0, t0 + 5 * HOUR), new_weekly], now=t0 + 1)
    assert t == Transition("probing", "limited", REASON_PROBE_STILL_LIMITED, t0 + 1)
    assert s.exhausted == (new_weekly,)  # replaced by the probe's truth
    assert s.probe_lease_until_ms is None
    assert next_change_at(s) == t0 + 48 * HOUR
    assert eligibility(s, now=t0 + 2) == "ineligible"


def test_probe_success_with_window_at_100_without_future_reset_still_limited() -> None:
    s, _ = observe(fresh(), [win(resets=NOW + HOUR)], now=NOW)
    t0 = NOW + HOUR
    s, _ = acquire_probe(s, now=t0, lease_ms=MIN)
    s, t = observe_success(s, [win(used=100.0, resets=None)], now=t0, unknown_reset_ms=5 * MIN)
    assert t is not None and t.to_status == "limited"
    assert next_change_at(s) == t0 + 5 * MIN


def test_probe_usage_limit_error_relimits_with_new_reset() -> None:
    s, _ = observe(fresh(), [win(resets=NOW + HOUR)], now=NOW)
    t0 = NOW + HOUR
    s, _ = acquire_probe(s, now=t0, lease_ms=MIN)
    body = {"error": {"type": "usage_limit_reached", "resets_in_seconds": 7200}}
    s, t = observe_failure(s, windows_from_error(429, body, {}, now=t0), now=t0)
    assert t == Transition("probing", "limited", REASON_PROBE_STILL_LIMITED, t0)
    assert next_change_at(s) == t0 + 2 * HOUR


def test_failed_probe_without_evidence_backs_off() -> None:
    s, _ = observe(fresh(), [win(resets=NOW + HOUR)], now=NOW)
    t0 = NOW + HOUR
    s, _ = acquire_probe(s, now=t0, lease_ms=MIN)
    s, t = observe_failure(s, [], now=t0 + 10, probe_backoff_ms=MIN)
    assert t == Transition("probing", "limited", REASON_PROBE_FAILED, t0 + 10)
    assert s.probe_lease_until_ms is None
    assert eligibility(s, now=t0 + 10 + MIN - 1) == "ineligible"
    assert eligibility(s, now=t0 + 10 + MIN) == "probe"


def test_limited_ignores_non_exhausted_observations_and_success() -> None:
    s, _ = observe(fresh(), [win(resets=NOW + HOUR)], now=NOW)
    s2, t = observe(s, [win(used=10.0)], now=NOW + 1)
    assert (s2, t) == (s, None)
    s3, t = observe_success(s, [win(used=10.0)], now=NOW + 2)
    assert (s3, t) == (s, None)  # only a probe success restores


def test_limited_merges_new_exhausted_window_without_transition() -> None:
    w5 = win("five_hour", 100.0, NOW + HOUR)
    s, _ = observe(fresh(), [w5], now=NOW)
    ww = win("weekly", 100.0, NOW + 50 * HOUR, minutes=10080, observed=NOW + 5)
    s2, t = observe(s, [ww], now=NOW + 5)
    assert t is None
    assert s2.exhausted == (w5, ww)
    assert s2.last_transition == s.last_transition
    assert next_change_at(s2) == NOW + 50 * HOUR


def test_event_during_probe_showing_exhaustion_relimits() -> None:
    s, _ = observe(fresh(), [win(resets=NOW + HOUR)], now=NOW)
    s, _ = acquire_probe(s, now=NOW + HOUR, lease_ms=MIN)
    event = {
        "type": "codex.rate_limits",
        "rate_limits": {
            "primary": {"used_percent": 100, "window_minutes": 300, "reset_at": 1790010000}
        },
    }
    s, t = observe(s, windows_from_event(event, now=NOW + HOUR), now=NOW + HOUR)
    assert t is not None and t.to_status == "limited"
    assert next_change_at(s) == 1_790_010_000_000


def test_probe_non_exhausted_observation_keeps_probing() -> None:
    s, _ = observe(fresh(), [win(resets=NOW + HOUR)], now=NOW)
    s, _ = acquire_probe(s, now=NOW + HOUR, lease_ms=MIN)
    s2, t = observe(s, [win(used=5.0)], now=NOW + HOUR)
    assert (s2, t) == (s, None)


# ------------------------------------------------------------------------------------------------
# Serialisation


def test_state_json_round_trip() -> None:
    s, _ = observe(
        fresh(),
        [win("five_hour", 100.0, NOW + HOUR), win("weekly", 100.0, NOW + 9 * HOUR, minutes=10080)],
        now=NOW,
    )
    s, _ = acquire_probe(s, now=NOW + 9 * HOUR, lease_ms=MIN)
    data = json.loads(json.dumps(s.to_json()))
    assert CredentialQuota.from_json(data) == s
    assert data["last_transition"] == {
        "from": "limited",
        "to": "probing",
        "reason": REASON_PROBE_STARTED,
        "at_ms": NOW + 9 * HOUR,
    }
    assert CredentialQuota.from_json(json.loads(json.dumps(fresh().to_json()))) == fresh()


@pytest.mark.parametrize(
    "data",
    [
        {"provider": "p", "credential": "c", "status": "broken"},
        {
            "provider": "p",
            "credential": "c",
            "exhausted": [{"name": "hourly", "observed_at_ms": 1}],
        },
    ],
)
def test_state_from_json_rejects_bad_data(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CredentialQuota.from_json(data)


# ------------------------------------------------------------------------------------------------
# Fingerprint


def test_fingerprint_stable_short_and_non_leaking() -> None:
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"
    fp = credential_fingerprint(secret)
    assert fp == credential_fingerprint(secret)
    assert fp != credential_fingerprint(secret + "x")
    assert len(fp) == 16 and all(c in "0123456789abcdef" for c in fp)
    assert secret[:8] not in fp and secret[-8:] not in fp
    s, _ = observe(CredentialQuota("openai", fp), [win()], now=NOW)
    assert secret not in json.dumps(s.to_json())


def test_fingerprint_rejects_empty() -> None:
    with pytest.raises(ValueError):
        credential_fingerprint("")


# ------------------------------------------------------------------------------------------------
# soonest_reset (reset-window strategy)


def test_soonest_reset_freshness_boundary() -> None:
    w = win(used=10.0, resets=NOW + 2 * HOUR, observed=NOW)
    assert soonest_reset([w], now=NOW + FRESHNESS_MS) == NOW + 2 * HOUR  # exactly 30 min: fresh
    assert soonest_reset([w], now=NOW + FRESHNESS_MS + 1) is None  # 30 min + 1 ms: stale


def test_soonest_reset_filters_and_min() -> None:
    ws = [
        win("weekly", 10.0, NOW + 50 * HOUR, minutes=10080),
        win("five_hour", 10.0, NOW + 3 * HOUR),
        win("custom", 10.0, NOW + MIN, scope="search"),
        win("custom", 10.0, NOW + MIN, scope="mcp"),
        win("custom", 10.0, NOW + MIN, informational=True, source=SOURCE_OPENAI),
        win("weekly", 10.0, NOW + MIN, whole=False, limit_id="codex_bengalfox"),
        win("five_hour", 10.0, NOW),  # not strictly in the future
        win("five_hour", 10.0, None),
    ]
    assert soonest_reset(ws, now=NOW) == NOW + 3 * HOUR
    assert soonest_reset([], now=NOW) is None


# ------------------------------------------------------------------------------------------------
# Messages


def test_transition_messages() -> None:
    down = Transition("available", "limited", REASON_LIMIT_REACHED, NOW)
    up = Transition("probing", "available", REASON_AVAILABLE, NOW)
    assert (
        transition_message(down, primary="openai", fallback="fallback-provider")
        == 'Primary provider usage limit reached; switched to "fallback-provider".'
    )
    assert (
        transition_message(up, primary="openai", fallback="fallback-provider")
        == 'Primary provider quota is available again; switched back to "openai".'
    )
    still = Transition("probing", "limited", REASON_PROBE_STILL_LIMITED, NOW)
    msg = transition_message(still, primary="openai", fallback="fb")
    assert "fb" in msg and "sk-" not in msg
