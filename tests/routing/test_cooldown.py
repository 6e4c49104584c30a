from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import pytest

from routing.classify import Decision, Failure, classify
from routing.cooldown import (
    Cooldown,
    cooldown,
    cooldown_ms,
    is_cooling,
    merge_cooldown,
    parse_http_date,
    parse_retry_after,
    reset_header_delay,
    unavailable_retry_after,
)


def ms(year: int, month: int, day: int, hh: int = 0, mm: int = 0, ss: int = 0) -> int:
    return int(datetime(year, month, day, hh, mm, ss, tzinfo=UTC).timestamp()) * 1000


NOW = ms(2026, 6, 1)  # Mon, 01 Jun 2026 00:00:00 GMT
NOW_S = NOW // 1000
HOP_TARGET = Decision(action="hop", reason="server_error", scope="target")


# ---------------------------------------------------------------------------------------------
# Retry-After parsing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 1),  # immediate directive, not "absent"
        ("1", 1000),
        ("1.5", 1500),
        ("0.0001", 1),
        ("  30 ", 30_000),
        ("14400", 14_400_000),  # not capped here; cooldown_ms caps
        ("Mon, 01 Jun 2026 00:00:30 GMT", 30_000),
        ("mon, 01 JUN 2026 00:00:30 gmt", 30_000),  # case-insensitive
        ("Monday, 01-Jun-26 00:01:00 GMT", 60_000),  # RFC 850
        ("Mon Jun  1 00:00:05 2026", 5_000),  # asctime, space-padded day
        ("Mon Jun 01 00:00:05 2026", 5_000),
        ("Mon, 01 Jun 2026 00:00:00 GMT", 1),  # now: immediate
        ("Sun, 06 Nov 1994 08:49:37 GMT", 1),  # past: immediate
        ("Sunday, 06-Nov-94 08:49:37 GMT", 1),
        ("Sun Nov  6 08:49:37 1994", 1),
        ("", None),
        ("   ", None),
        ("-1", None),
        ("not-a-date", None),
        ("March 1, 2020", None),
        ("1e3", None),
        ("Sun Sep 99 99:99:99 2026", None),  # a date that does not exist
        ("Mon, 30 Feb 2026 00:00:00 GMT", None),
        ("Mon, 01 Jun 2026 24:00:00 GMT", None),
        ("Mon, 01 Jun 2026 00:00:30 UTC", None),
        ("1" * 129, None),  # longer than 128 characters
    ],
)
def test_parse_retry_after(value: str, expected: int | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_parse_retry_after_128_chars_is_accepted() -> None:
    assert parse_retry_after("0" * 127 + "5", NOW) == 5_000


@pytest.mark.parametrize(
    ("value", "year"),
    [
        ("Monday, 01-Jun-76 00:00:00 GMT", 2076),  # exactly now + 50 years: kept in the future
        ("Tuesday, 01-Jun-76 00:00:01 GMT", 1976),  # one second past the boundary
        ("Monday, 31-May-76 23:59:59 GMT", 2076),
        ("Monday, 01-Jun-99 00:00:00 GMT", 1999),
        ("Monday, 01-Jun-26 00:00:00 GMT", 2026),
        ("Monday, 01-Jun-00 00:00:00 GMT", 2000),
        ("Monday, 01-Jan-77 00:00:00 GMT", 1977),
    ],
)
def test_rfc850_two_digit_year_window(value: str, year: int) -> None:
    at = parse_http_date(value, NOW)
    assert at is not None
    assert datetime.fromtimestamp(at / 1000, tz=UTC).year == year


# ---------------------------------------------------------------------------------------------
# Codex reset headers


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-codex-primary-reset-at": str(NOW_S + 20)}, 20_000),
        (
            {
                "x-codex-primary-reset-at": str(NOW_S + 300),
                "x-codex-secondary-reset-at": str(NOW_S + 40),
            },
            40_000,
        ),
        ({"x-codex-tertiary-reset-at": str(NOW_S + 7)}, 7_000),
        ({"x-codex-primary-reset-at": str(NOW + 1234)}, 1_234),  # epoch ms (>= 10^12)
        ({"x-codex-primary-reset-at": str(NOW_S + 7200)}, 900_000),  # 15-minute internal clamp
        (
            {
                "x-codex-primary-reset-at": str(NOW_S - 5),  # past: ignored
                "x-codex-secondary-reset-at": str(NOW_S + 90),
            },
            90_000,
        ),
        ({"x-codex-primary-reset-at": str(NOW_S)}, None),  # not in the future
        ({"x-codex-primary-reset-at": "0"}, None),
        ({"x-codex-primary-reset-at": ""}, None),
        ({"x-codex-primary-reset-at": "soon"}, None),
        ({"x-codex-primary-reset-at": "-5"}, None),
        ({"X-Codex-Primary-Reset-At": str(NOW_S + 3)}, 3_000),
        ({"x-codex-bengalfox-primary-reset-at": str(NOW_S + 3)}, None),
        ({}, None),
    ],
)
def test_reset_header_delay(headers: dict[str, str], expected: int | None) -> None:
    assert reset_header_delay(headers, NOW) == expected


# ---------------------------------------------------------------------------------------------
# Precedence, row by row

RESET_20S = {"x-codex-primary-reset-at": str(NOW_S + 20)}

# (id, failure, combo_cooldown_ms, expected ms, source)
PRECEDENCE: list[tuple[str, Failure, int | None, int, str]] = [
    # 1. explicit Retry-After beats everything
    (
        "retry-after-beats-reset-and-combo",
        Failure(status=429, headers={"retry-after": "30", **RESET_20S}),
        5_000,
        30_000,
        "retry_after",
    ),
    (
        "retry-after-zero-is-1ms",
        Failure(status=429, headers={"retry-after": "0"}),
        5_000,
        1,
        "retry_after",
    ),
    (
        "retry-after-past-date-is-1ms",
        Failure(status=503, headers={"retry-after": "Sun, 06 Nov 1994 08:49:37 GMT"}),
        5_000,
        1,
        "retry_after",
    ),
    (
        "retry-after-http-date",
        Failure(status=503, headers={"retry-after": "Mon, 01 Jun 2026 00:02:00 GMT"}),
        None,
        120_000,
        "retry_after",
    ),
    (
        "retry-after-3600-capped",
        Failure(status=429, headers={"retry-after": "3600"}),
        None,
        600_000,
        "retry_after",
    ),
    (
        "retry-after-beats-spent-window",
        Failure(status=429, error_code="1308", headers={"retry-after": "12"}),
        None,
        12_000,
        "retry_after",
    ),
    # 2. invalid Retry-After falls through to the reset headers
    (
        "reset-beats-combo",
        Failure(status=429, headers={"retry-after": "not-a-date", **RESET_20S}),
        5_000,
        20_000,
        "reset_header",
    ),
    (
        "reset-survives-5xx",
        Failure(status=502, message="The usage limit has been reached", headers=RESET_20S),
        None,
        20_000,
        "reset_header",
    ),
    (
        "reset-2h-capped-at-10min",
        Failure(status=429, headers={"x-codex-primary-reset-at": str(NOW_S + 7200)}),
        None,
        600_000,
        "reset_header",
    ),
    # 3. the combo's cooldownMs when no upstream signal exists
    (
        "combo-beats-request-rate",
        Failure(status=429, error_code="1302", message="Rate limit reached for requests"),
        5_000,
        5_000,
        "combo",
    ),
    ("combo-beats-default", Failure(status=500, message="boom"), 90_000, 90_000, "combo"),
    (
        "combo-beats-spent-window",
        Failure(status=429, error_code="1308", message="usage limit reached"),
        30_000,
        30_000,
        "combo",
    ),
    ("combo-capped", Failure(status=500, message="boom"), 999_999_999, 600_000, "combo"),
    ("combo-zero-clamped-to-1", Failure(status=500, message="boom"), 0, 1, "combo"),
    # 4. spent window or credential failure: 10 minutes
    (
        "spent-1308",
        Failure(status=429, error_code="1308", message="x"),
        None,
        600_000,
        "spent_window",
    ),
    (
        "spent-usage-limit-reached-code-any-status",
        Failure(status=500, error_code="usage-limit-reached", message="x"),
        None,
        600_000,
        "spent_window",
    ),
    (
        "spent-codex-502-prose",
        Failure(status=502, message="The usage limit has been reached"),
        None,
        600_000,
        "spent_window",
    ),
    (
        "spent-beats-request-rate-1302",
        Failure(status=429, error_code="1302", message="Usage limit reached for this plan"),
        None,
        600_000,
        "spent_window",
    ),
    (
        "spent-token-plan-window",
        Failure(
            status=429,
            message="Your token-plan 1-week quota has been exhausted. The quota will reset at 9",
        ),
        None,
        600_000,
        "spent_window",
    ),
    (
        "credential-invalid-api-key",
        Failure(status=401, message="Incorrect API key provided"),
        None,
        600_000,
        "spent_window",
    ),
    (
        "credential-insufficient-quota",
        Failure(status=429, error_code="insufficient_quota", message="x"),
        None,
        600_000,
        "spent_window",
    ),
    (
        "credential-billing-code",
        Failure(status=402, error_code="billing_error", message="x"),
        None,
        600_000,
        "spent_window",
    ),
    # 5. request-rate 429 without Retry-After: 5 s
    (
        "request-rate-1302",
        Failure(status=429, error_code="1302", message="x"),
        None,
        5_000,
        "request_rate",
    ),
    (
        "request-rate-1305",
        Failure(status=429, error_code="1305", message="x"),
        None,
        5_000,
        "request_rate",
    ),
    (
        "request-rate-wording",
        Failure(status=429, message="Rate limit reached for requests per min"),
        None,
        5_000,
        "request_rate",
    ),
    (
        "request-rate-with-quota-cap-code-1310",
        Failure(status=429, error_code="1310", message="Rate limit reached for requests"),
        None,
        60_000,
        "default",
    ),
    (
        "per-minute-quota-is-not-spent",
        Failure(status=429, message="rate limit exceeded, quota exhausted for this minute"),
        None,
        60_000,
        "default",
    ),
    # 6. default
    ("default-500", Failure(status=500, message="boom"), None, 60_000, "default"),
    ("default-403-permission", Failure(status=403, message="no"), None, 60_000, "default"),
    ("default-transport", Failure(transport="timeout_first_byte"), None, 60_000, "default"),
]


@pytest.mark.parametrize(
    ("failure", "combo_ms", "expected", "source"),
    [p[1:] for p in PRECEDENCE],
    ids=[p[0] for p in PRECEDENCE],
)
def test_precedence_row_by_row(
    failure: Failure, combo_ms: int | None, expected: int, source: str
) -> None:
    decision = classify(failure)
    assert decision.cool
    assert cooldown(failure, decision, combo_cooldown_ms=combo_ms, now=NOW) == Cooldown(
        expected,
        source,  # type: ignore[arg-type]
    )
    assert cooldown_ms(failure, decision, combo_cooldown_ms=combo_ms, now=NOW) == expected


@pytest.mark.parametrize(
    "failure",
    [
        Failure(status=400, message="maximum context length exceeded"),  # no-cool hop
        Failure(status=400, message="bad request"),  # stop
        Failure(status=499),  # client abort
        Failure(status=429, error_code="tool_catalog_too_large", message="x"),  # scope none
    ],
)
def test_no_cooldown_when_the_decision_does_not_cool(failure: Failure) -> None:
    headers_failure = Failure(
        status=failure.status,
        error_code=failure.error_code,
        message=failure.message,
        headers={"retry-after": "30"},
    )
    for f in (failure, headers_failure):
        decision = classify(f)
        assert not decision.cool
        assert cooldown_ms(f, decision, combo_cooldown_ms=5_000, now=NOW) is None


def test_cooldown_uses_only_upstream_headers_case_insensitively() -> None:
    failure = Failure(status=429, headers={"Retry-After": "7"})
    assert cooldown_ms(failure, HOP_TARGET, combo_cooldown_ms=None, now=NOW) == 7_000


# ---------------------------------------------------------------------------------------------
# Arithmetic and boundaries


@pytest.mark.parametrize(
    ("until", "now", "cooling"),
    [
        (NOW + 60_000, NOW + 59_999, True),
        (NOW + 60_000, NOW + 60_000, False),
        (NOW + 60_000, NOW + 60_001, False),
        (NOW + 1, NOW, True),
        (None, NOW, False),
    ],
)
def test_is_cooling_boundary(until: int | None, now: int, cooling: bool) -> None:
    assert is_cooling(until, now) is cooling


def test_default_cooldown_end_to_end_boundary() -> None:
    failure = Failure(status=500, message="boom")
    duration = cooldown_ms(failure, classify(failure), combo_cooldown_ms=None, now=NOW)
    assert duration == 60_000
    until = NOW + duration
    assert is_cooling(until, NOW + 59_999)
    assert not is_cooling(until, NOW + 60_000)


@pytest.mark.parametrize(
    ("existing", "new", "merged"),
    [
        (None, NOW + 5_000, NOW + 5_000),
        (NOW + 600_000, NOW + 60_000, NOW + 600_000),  # never shortened
        (NOW + 60_000, NOW + 600_000, NOW + 600_000),  # extended
        (NOW + 60_000, NOW + 60_000, NOW + 60_000),
        (NOW - 10, NOW + 5_000, NOW + 5_000),  # expired entry replaced
    ],
)
def test_merge_cooldown_never_shortens(existing: int | None, new: int, merged: int) -> None:
    assert merge_cooldown(existing, new) == merged


@pytest.mark.parametrize(
    ("untils", "now", "header"),
    [
        ([5_000], 0, "5"),
        ([6_000], 3_500, "3"),  # 2 500 ms left rounds up
        ([3_501], 3_500, "1"),  # 1 ms left
        ([10_000, 4_000, None], 0, "4"),  # the smallest remaining
        ([3_000, 9_000], 3_000, "6"),  # an expired entry is ignored
        ([3_000], 3_000, None),
        ([None], 0, None),
        ([], 0, None),
    ],
)
def test_unavailable_retry_after(
    untils: Iterable[int | None], now: int, header: str | None
) -> None:
    assert unavailable_retry_after(untils, now) == header


def test_no_framework_imports() -> None:
    import routing.cooldown as mod

    source = open(mod.__file__, encoding="utf-8").read()
    for name in ("django", "ninja", "channels"):
        assert f"import {name}" not in source
        assert f"from {name}" not in source
