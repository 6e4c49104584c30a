from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from routing.classify import (
    Decision,
    Failure,
    UsageLimit,
    classifier_code,
    classify,
    failure_from_response,
    is_definite_context_overflow,
    is_spent_window,
    overflow_allows,
    parse_error_body,
    redact,
    stream_failure_status,
    usage_limit_evidence,
)


def envelope(
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    etype: str = "invalid_request_error",
) -> Mapping[str, object]:
    err: dict[str, object] = {"message": message, "type": etype}
    if code is not None:
        err["code"] = code
    if param is not None:
        err["param"] = param
    return {"error": err}


def env_failure(message: str, **kw: str) -> Failure:
    """A status-400 failure whose parsed body is an intact envelope."""
    body = envelope(message, **kw)
    return Failure(status=400, message=message, error_code=kw.get("code"), body=body)


USER_MSG = "Unsupported parameter: user"
EFFORT_MSG = "Unsupported value: 'xhigh' is not supported with the 'gpt-5' model."
IMAGE_MSG = "Model 'gpt-5.3-codex-spark' does not support image inputs."
RF_MSG = "response_format json_schema is not supported by this model"
CHATGPT_MSG = "The 'gpt-5.5' model is not supported when using Codex with a ChatGPT account."

# (id, failure, action, reason, scope, row)
TABLE: list[tuple[str, Failure, str, str, str, int]] = [
    # row 1: 499 stops, even with context evidence
    ("r1-499", Failure(status=499), "stop", "client_cancelled", "none", 1),
    (
        "r1-499-wins-over-overflow",
        Failure(status=499, message="exceeds the context window"),
        "stop",
        "client_cancelled",
        "none",
        1,
    ),
    # row 2: origin_rejected in message or code
    (
        "r2-message",
        Failure(status=502, message="Upstream said ORIGIN_REJECTED for this turn"),
        "stop",
        "origin_rejected",
        "none",
        2,
    ),
    (
        "r2-code",
        Failure(status=500, error_code="Origin-Rejected", message="nope"),
        "stop",
        "origin_rejected",
        "none",
        2,
    ),
    # row 3: non-replayable upstream code
    (
        "r3-non-replayable",
        Failure(status=502, error_code="non_replayable_upstream", message="ws create no reply"),
        "stop",
        "non_replayable",
        "none",
        3,
    ),
    # row 4: cyber_policy code wins over context evidence
    (
        "r4-cyber-code",
        Failure(status=400, error_code="cyber_policy", message="exceeds the context window"),
        "stop",
        "cyber_policy",
        "none",
        4,
    ),
    # row 5: 410 with a lifecycle signal hops
    (
        "r5-code",
        Failure(status=410, error_code="model_retired", message="gone"),
        "hop",
        "model_retired",
        "target",
        5,
    ),
    (
        "r5-code-not-found",
        Failure(status=410, error_code="model_not_found", message="gone"),
        "hop",
        "model_retired",
        "target",
        5,
    ),
    (
        "r5-deprecated-word",
        Failure(status=410, message="The model gpt-4-32k has been deprecated."),
        "hop",
        "model_retired",
        "target",
        5,
    ),
    (
        "r5-end-of-life",
        Failure(status=410, message="This model reached end-of-life on 2026-01-01"),
        "hop",
        "model_retired",
        "target",
        5,
    ),
    (
        "r5-no-longer",
        Failure(status=410, message="Model foo is no longer available"),
        "hop",
        "model_retired",
        "target",
        5,
    ),
    # row 6: classifier says cyber policy (wording)
    (
        "r6-cyber-wording",
        Failure(status=500, message="Request blocked by Cyber Policy"),
        "stop",
        "cyber_policy",
        "none",
        6,
    ),
    # row 7: provider hard-cap overflow
    (
        "r7-prompt-too-long",
        Failure(status=400, message="error: invalid_request_prompt_too_long"),
        "hop",
        "context_overflow",
        "none",
        7,
    ),
    (
        "r7-5059",
        Failure(
            status=500, error_code="5059", message="prompt 210000 > 200000 maximum context length"
        ),
        "hop",
        "context_overflow",
        "none",
        7,
    ),
    # row 8: definite context overflow
    (
        "r8-phrase-400",
        Failure(status=400, message="Your input exceeds the context window of this model."),
        "hop",
        "context_overflow",
        "none",
        8,
    ),
    (
        "r8-exact-code-text-413",
        Failure(status=413, message="context_length_exceeded"),
        "hop",
        "context_overflow",
        "none",
        8,
    ),
    (
        "r8-peeled-5xx",
        Failure(
            status=500,
            message='Provider error 500: {"error":{"message":"This model\'s maximum context '
            'length is 128000 tokens"}}',
        ),
        "hop",
        "context_overflow",
        "none",
        8,
    ),
    (
        "r8-422-too-many-tokens",
        Failure(status=422, message="Too many tokens in request"),
        "hop",
        "context_overflow",
        "none",
        8,
    ),
    # row 9: local input admission refusal
    (
        "r9-admission",
        Failure(
            status=400,
            error_code="input_admission_refused",
            message="Request does not fit the context window",
        ),
        "hop",
        "input_admission_refused",
        "none",
        9,
    ),
    # row 10: provider-scoped quota cap
    (
        "r10-gousagelimit",
        Failure(status=429, error_code="GoUsageLimitError", message="limit"),
        "hop",
        "quota_cap",
        "provider",
        10,
    ),
    (
        "r10-monthly",
        Failure(status=429, message="Monthly usage limit reached"),
        "hop",
        "quota_cap",
        "provider",
        10,
    ),
    (
        "r10-free-prompt-400",
        Failure(status=400, message="ERR_FREE_PROMPT_CAP: prompt too large"),
        "hop",
        "quota_cap",
        "none",
        10,
    ),
    (
        "r10-free-tier-429",
        Failure(status=429, message="Free tier: single request exceeds limit"),
        "hop",
        "quota_cap",
        "provider",
        10,
    ),
    # row 11: structured model codes hop
    (
        "r11-404-model-not-found",
        Failure(status=404, error_code="model_not_found", message="The model does not exist"),
        "hop",
        "model_unsupported",
        "target",
        11,
    ),
    (
        "r11-502-unsupported-model",
        Failure(status=502, error_code="unsupported-model", message="model not found"),
        "hop",
        "model_unsupported",
        "target",
        11,
    ),
    # row 12: free_rate_limited
    (
        "r12-429",
        Failure(status=429, error_code="free_rate_limited", message="slow"),
        "hop",
        "free_rate_limited",
        "target",
        12,
    ),
    (
        "r12-400-request-local",
        Failure(status=400, error_code="free_rate_limited", message="slow"),
        "hop",
        "free_rate_limited",
        "none",
        12,
    ),
    # row 13: request-local incompatibility (§5.1)
    (
        "r13-user",
        env_failure(USER_MSG, code="unsupported_parameter", param="user"),
        "hop",
        "unsupported_user_param",
        "none",
        13,
    ),
    (
        "r13-effort",
        env_failure(EFFORT_MSG, code="unsupported_value", param="reasoning.effort"),
        "hop",
        "unsupported_effort",
        "none",
        13,
    ),
    (
        "r13-image",
        env_failure(IMAGE_MSG, param="input"),
        "hop",
        "image_unsupported",
        "none",
        13,
    ),
    (
        "r13-user-in-provider-wrapper-text",
        Failure(
            status=400,
            message="Provider error 400: "
            + json.dumps(envelope(USER_MSG, code="unsupported_parameter")),
        ),
        "hop",
        "unsupported_user_param",
        "none",
        13,
    ),
    (
        "r13-chatgpt-account-detail",
        Failure(status=400, message=CHATGPT_MSG, body={"detail": CHATGPT_MSG}),
        "hop",
        "chatgpt_account_model",
        "none",
        13,
    ),
    (
        "r13-chatgpt-account-bare-text",
        Failure(status=400, message=CHATGPT_MSG),
        "hop",
        "chatgpt_account_model",
        "none",
        13,
    ),
    # row 14: response_format capability refusal
    (
        "r14-data-frame",
        Failure(
            status=400,
            message="data: "
            + json.dumps(envelope(RF_MSG, code="invalid_parameter_error", param="response_format")),
        ),
        "hop",
        "response_format_unsupported",
        "none",
        14,
    ),
    (
        "r14-parsed-body",
        env_failure(RF_MSG),
        "hop",
        "response_format_unsupported",
        "none",
        14,
    ),
    # row 15: classifier stops
    (
        "r15-plain-400",
        Failure(status=400, message="Bad request: missing field"),
        "stop",
        "invalid_request",
        "none",
        15,
    ),
    (
        "r15-502-model-not-found-wording",
        Failure(status=502, message="model not found"),
        "stop",
        "invalid_request",
        "none",
        15,
    ),
    (
        "r15-context-code-unrelated-message",
        Failure(status=400, error_code="context_length_exceeded", message="something odd"),
        "stop",
        "context_length_exceeded",
        "none",
        15,
    ),
    (
        "r15-overflow-bad-json-fails-closed",
        Failure(status=400, message='Provider error 400: {"error": "maximum context length'),
        "stop",
        "context_length_exceeded",
        "none",
        15,
    ),
    # row 16: status hop list
    ("r16-401", Failure(status=401, message="denied"), "hop", "auth", "provider", 16),
    ("r16-402", Failure(status=402, message="pay"), "hop", "payment_required", "provider", 16),
    ("r16-403", Failure(status=403, message="no"), "hop", "forbidden", "provider", 16),
    ("r16-404", Failure(status=404, message="no route"), "hop", "not_found", "target", 16),
    ("r16-408", Failure(status=408, message="slow"), "hop", "timeout", "target", 16),
    ("r16-425", Failure(status=425, message="early"), "hop", "too_early", "target", 16),
    ("r16-429", Failure(status=429, message="slow down"), "hop", "rate_limited", "target", 16),
    (
        "r16-429-1302",
        Failure(status=429, error_code="1302", message="Rate limit reached for requests"),
        "hop",
        "rate_limited",
        "target",
        16,
    ),
    (
        "r16-429-insufficient-quota",
        Failure(status=429, error_code="insufficient_quota", message="You exceeded your quota"),
        "hop",
        "quota",
        "provider",
        16,
    ),
    ("r16-500", Failure(status=500, message="boom"), "hop", "server_error", "target", 16),
    (
        "r16-503-invalid-request-wording",
        Failure(status=503, message="invalid request"),
        "hop",
        "overloaded",
        "target",
        16,
    ),
    (
        "r16-codex-502-usage-limit",
        Failure(
            status=502,
            error_code="upstream_server_error",
            message="The usage limit has been reached",
        ),
        "hop",
        "usage_limit",
        "target",
        16,
    ),
    (
        "r16-429-usage-limit-type",
        Failure(
            status=429, error_type="usage_limit_reached", message="The usage limit has been reached"
        ),
        "hop",
        "usage_limit",
        "target",
        16,
    ),
    (
        "r16-429-tool-catalog-none-scope",
        Failure(status=429, error_code="tool_catalog_too_large", message="x"),
        "hop",
        "rate_limited",
        "none",
        16,
    ),
    # row 17: classifier hop codes at other statuses
    (
        "r17-422-invalid-api-key",
        Failure(status=422, error_code="invalid_api_key", message="key rejected"),
        "hop",
        "auth",
        "provider",
        17,
    ),
    (
        "r17-409-overloaded",
        Failure(status=409, message="Server is overloaded, retry later"),
        "hop",
        "overloaded",
        "target",
        17,
    ),
    (
        "r17-418-billing-type",
        Failure(status=418, error_type="billing_error", message="card declined"),
        "hop",
        "payment_required",
        "provider",
        17,
    ),
    (
        "r17-409-rate-wording",
        Failure(status=409, message="Throttling: too many requests"),
        "hop",
        "rate_limited",
        "target",
        17,
    ),
    # row 18: everything else stops
    ("r18-409", Failure(status=409, message="conflict"), "stop", "unclassified", "none", 18),
    (
        "r18-413-no-context",
        Failure(status=413, message="payload too large"),
        "stop",
        "unclassified",
        "none",
        18,
    ),
    ("r18-410-plain", Failure(status=410, message="Gone"), "stop", "unclassified", "none", 18),
    (
        "r18-410-deprecated-without-model",
        Failure(status=410, message="This endpoint is deprecated"),
        "stop",
        "unclassified",
        "none",
        18,
    ),
]


@pytest.mark.parametrize(
    ("failure", "action", "reason", "scope", "row"),
    [t[1:] for t in TABLE],
    ids=[t[0] for t in TABLE],
)
def test_table_row_by_row(failure: Failure, action: str, reason: str, scope: str, row: int) -> None:
    decision = classify(failure)
    assert (decision.action, decision.reason, decision.scope, decision.row) == (
        action,
        reason,
        scope,
        row,
    )
    assert decision.cool == (action == "hop" and scope != "none")
    if action == "stop":
        assert not decision.cool


@pytest.mark.parametrize("row", [7, 8])
def test_context_overflow_hops_without_cooling_and_needs_larger_window(row: int) -> None:
    failure = (
        Failure(status=400, message="invalid_request_prompt_too_long")
        if row == 7
        else Failure(status=400, message="maximum context length is 8192 tokens")
    )
    decision = classify(failure)
    assert decision == Decision(
        action="hop",
        reason="context_overflow",
        scope="none",
        request_local=True,
        needs_larger_context=True,
        code="context_length_exceeded",
        row=row,
    )
    assert decision.cool is False


def test_request_local_hops_are_marked() -> None:
    decision = classify(env_failure(USER_MSG, code="unsupported_parameter", param="user"))
    assert decision.request_local is True
    assert decision.needs_larger_context is False
    assert classify(Failure(status=500, message="boom")).request_local is False


@pytest.mark.parametrize(
    "failure",
    [
        # wrong type
        Failure(status=400, body=envelope(USER_MSG, etype="server_error")),
        # param other than user
        Failure(status=400, body=envelope(USER_MSG, param="metadata")),
        # unsupported_value code excludes the user rule
        Failure(status=400, body=envelope(USER_MSG, code="unsupported_value")),
        # effort refusal with the wrong param
        Failure(status=400, body=envelope(EFFORT_MSG, code="unsupported_value", param="model")),
        # image refusal not at the start of the message
        Failure(status=400, body=envelope("Note: " + IMAGE_MSG, param="input")),
        # image refusal with a non-compat code
        Failure(status=400, body=envelope(IMAGE_MSG, code="bad_image", param="input")),
        # not status 400
        Failure(status=422, body=envelope(USER_MSG)),
        # non-string code
        Failure(status=400, body={"error": {**envelope(USER_MSG)["error"], "code": 7}}),  # type: ignore[dict-item]
        # competing detail and error envelopes
        Failure(status=400, body={"detail": CHATGPT_MSG, "error": {"message": CHATGPT_MSG}}),
        # response_format refusal with a different param
        Failure(status=400, body=envelope(RF_MSG, param="tools")),
        # response_format wording without a refusal verb
        Failure(status=400, body=envelope("response_format must be an object")),
    ],
)
def test_envelope_checks_fail_closed(failure: Failure) -> None:
    decision = classify(failure)
    assert decision.action == "stop"
    assert decision.row in (15, 18)


def test_conflicting_nested_codes_fail_closed() -> None:
    inner = json.dumps(envelope(USER_MSG, code="unsupported_value"))
    body = envelope("Provider error 400: " + inner, code="unsupported_parameter")
    assert classify(Failure(status=400, body=body)).action == "stop"
    same = envelope("Provider error 400: " + json.dumps(envelope(USER_MSG)), code="")
    assert classify(Failure(status=400, body=same)).reason == "unsupported_user_param"


def test_envelope_peels_at_most_three_provider_wrappers() -> None:
    inner = json.dumps(envelope(USER_MSG))
    assert classify(Failure(status=400, message="Provider error 400: " * 3 + inner)).hop
    assert not classify(Failure(status=400, message="Provider error 400: " * 4 + inner)).hop


def test_a_local_overload_hops_without_cooling() -> None:
    decision = classify(Failure(transport="local", error_code="fd_limit"))
    assert (decision.action, decision.reason, decision.scope, decision.cool) == (
        "hop",
        "local: fd_limit",
        "none",
        False,
    )
    assert decision.local_overload and decision.code == "ocx_overloaded"


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("connect", "connection"),
        ("reset", "connection"),
        ("no_response", "connection"),
        ("timeout_connect", "timeout"),
        ("timeout_first_byte", "timeout"),
        ("timeout_idle", "timeout"),
        ("timeout_total", "timeout"),
        ("malformed", "malformed_response"),
    ],
)
def test_transport_failures_hop_and_cool(kind: str, reason: str) -> None:
    decision = classify(Failure(transport=kind))
    assert (decision.action, decision.reason, decision.scope, decision.cool) == (
        "hop",
        reason,
        "target",
        True,
    )


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"error": {"code": "server_is_overloaded", "message": "busy"}}, 503),
        ({"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}, 400),
        ({"type": "error", "status": "429", "error": {"message": "x"}}, 429),
        ({"type": "error", "error": {"status_code": 401, "message": "x"}}, 401),
        ({"response": {"error": {"http_status": 504}}}, 504),
        ({"type": "error", "status": "700", "error": {"message": "x"}}, 502),
        ({"error": {"message": "Provider stream failed before producing output"}}, 502),
        ({}, 502),
    ],
)
def test_stream_failure_status(body: Mapping[str, object], status: int) -> None:
    assert stream_failure_status(Failure(stream_event="error", body=body)) == status


@pytest.mark.parametrize(
    ("event", "body", "action", "reason"),
    [
        (
            "response.failed",
            {"error": {"code": "server_is_overloaded", "message": "Selected model is at capacity"}},
            "hop",
            "overloaded",
        ),
        (
            "response.incomplete",
            {
                "error": {
                    "type": "upstream_error",
                    "code": "upstream_server_error",
                    "message": "Provider stream failed before producing output",
                }
            },
            "hop",
            "server_error",
        ),
        (
            "error",
            {"type": "error", "error": {"code": "invalid_request_error"}},
            "stop",
            "invalid_request",
        ),
        (
            "response.failed",
            {"error": {"code": "context_length_exceeded", "message": "context_length_exceeded"}},
            "hop",
            "context_overflow",
        ),
    ],
)
def test_stream_events_without_status(
    event: str, body: Mapping[str, object], action: str, reason: str
) -> None:
    decision = classify(Failure(stream_event=event, body=body))
    assert (decision.action, decision.reason) == (action, reason)


def test_stream_event_with_recorded_status_uses_it() -> None:
    failure = Failure(status=429, stream_event="response.failed", body={"error": {}})
    assert classify(failure).reason == "rate_limited"


@pytest.mark.parametrize(
    ("status", "message", "etype", "code"),
    [
        (None, "x", "previous_response_not_found", "previous_response_not_found"),
        (None, "x", "client_cancelled", "client_cancelled"),
        (499, "x", None, "client_closed_request"),
        (400, "blocked by cyber_policy", None, "cyber_policy"),
        (400, "x", "input_admission_refused", "input_admission_refused"),
        (500, "context window full", None, "context_length_exceeded"),
        (429, "You exceeded your current quota", None, "insufficient_quota"),
        (429, "slow", None, "rate_limit_exceeded"),
        (400, "Resource exhausted", None, "rate_limit_exceeded"),
        (418, "x", "origin_rejected", "origin_rejected"),
        (401, "x", None, "invalid_api_key"),
        (422, "Authentication failed", None, "invalid_api_key"),
        (403, "A subscription is required", None, "subscription_required"),
        (403, "no", None, "permission_denied"),
        (503, "invalid request", None, "server_is_overloaded"),
        (409, "server is busy", None, "server_is_overloaded"),
        (502, "model not found", None, "invalid_request_error"),
        (500, "boom", None, "upstream_server_error"),
        (400, "bad", None, "invalid_request_error"),
        (418, "x", "teapot_error", "teapot_error"),
    ],
)
def test_shared_classifier(status: int | None, message: str, etype: str | None, code: str) -> None:
    assert classifier_code(Failure(status=status, message=message, error_type=etype)) == code


@pytest.mark.parametrize(
    ("failed", "candidate", "allowed"),
    [
        (128_000, 200_000, True),
        (128_000, 128_001, True),
        (128_000, 128_000, False),
        (128_000, 64_000, False),
        (None, 200_000, False),
        (128_000, None, False),
        (None, None, False),
    ],
)
def test_overflow_allows(failed: int | None, candidate: int | None, allowed: bool) -> None:
    assert overflow_allows(failed, candidate) is allowed


@pytest.mark.parametrize(
    ("status", "message", "definite"),
    [
        (400, "context_length_exceeded", True),
        (400, "  Context_Length_Exceeded ", True),
        (400, "context_length_exceeded because", False),  # not exact and no phrase
        (400, "Provider error 400: Provider error 400: exceeds the context window", True),
        (400, '{"error":{"message":"context window exceeded"}}', True),
        (400, '{"error":{"message":', False),  # bad JSON fails closed
        (400, '{"error":"maximum context length"}', False),  # no error.message
        (413, "maximum context window reached", True),
        (429, "maximum context length", False),  # status not in the list
        (404, "too many tokens", False),
        (503, "too many tokens", True),
        (400, "x" * 16_385 + " too many tokens", False),  # longer than 16 384
    ],
)
def test_definite_context_overflow(status: int, message: str, definite: bool) -> None:
    assert is_definite_context_overflow(Failure(status=status, message=message)) is definite


@pytest.mark.parametrize(
    ("failure", "spent"),
    [
        (Failure(status=429, error_code="1308", message="x"), True),
        (Failure(status=400, error_code="usage-limit-reached", message="x"), True),
        (Failure(status=429, error_code="usage_limit_exceeded", message="x"), True),
        (Failure(status=502, message="The usage limit has been reached"), True),
        (Failure(status=429, message="Usage limit reached for 5 hour window"), True),
        (
            Failure(
                status=429,
                message="Your token-plan 1-week quota has been exhausted. Resets at 9",
            ),
            True,
        ),
        (
            Failure(status=429, message="rate limit exceeded, quota exhausted for this minute"),
            False,
        ),
        (Failure(status=429, error_code="1302", message="Rate limit reached for requests"), False),
    ],
)
def test_spent_window(failure: Failure, spent: bool) -> None:
    assert is_spent_window(failure) is spent


# ---------------------------------------------------------------------------------------------
# Body reading


@pytest.mark.parametrize(
    ("raw", "limit", "expected"),
    [
        (b'{"error":{"message":"x"}}', 1000, {"error": {"message": "x"}}),
        (b'data: {"error":{"code":"y"}}\n\n', 1000, {"error": {"code": "y"}}),
        (b'{"error":{"message":"x"}}', 10, None),  # oversized: never partly used
        (b"not json", 1000, None),
        (b"[1, 2]", 1000, None),
        (b"\xff\xfe{}", 1000, None),
        (b"", 1000, None),
    ],
)
def test_parse_error_body(raw: bytes, limit: int, expected: Mapping[str, object] | None) -> None:
    assert parse_error_body(raw, limit) == expected


def test_parse_error_body_oversized_70kb() -> None:
    raw = json.dumps({"error": {"message": "x" * 70_000}}).encode()
    assert parse_error_body(raw) is None


def test_failure_from_response_extracts_and_redacts() -> None:
    raw = json.dumps(
        {
            "error": {
                "type": "rate_limit_error",
                "code": 1302,
                "message": "Bad key sk-abcdefghijklmnop used; " + "y" * 600,
            }
        }
    ).encode()
    failure = failure_from_response(429, {"Retry-After": "5"}, raw)
    assert failure.status == 429
    assert failure.error_code == "1302"
    assert failure.error_type == "rate_limit_error"
    assert "sk-abcdefghijklmnop" not in failure.message
    assert failure.message.startswith("Bad key sk-[redacted] used;")
    assert len(failure.message) == 500
    assert failure.headers == {"retry-after": "5"}
    assert classify(failure).reason == "rate_limited"


def test_failure_from_response_bare_text_and_detail() -> None:
    bare = failure_from_response(502, {}, b"Bad gateway Bearer abcdefghijkl")
    assert bare.body is None
    assert bare.message == "Bad gateway Bearer [redacted]"
    detail = failure_from_response(400, {}, json.dumps({"detail": CHATGPT_MSG}).encode())
    assert detail.message == CHATGPT_MSG
    assert classify(detail).reason == "chatgpt_account_model"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("api_key=abcdef123456 rest", "api_key=[redacted] rest"),
        ('"token": "abcdefghij"', '"token": "[redacted]"'),
        ("nothing secret", "nothing secret"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


# ---------------------------------------------------------------------------------------------
# Usage-limit evidence (PRODUCT §8.2)

NOW = 1_790_000_000_000


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (
            Failure(
                status=429,
                body={"error": {"type": "usage_limit_reached", "resets_at": 1_790_000_100}},
            ),
            UsageLimit(resets_at=1_790_000_100_000),
        ),
        (
            Failure(
                status=429,
                body={"error": {"type": "usage_limit_reached", "resets_in_seconds": 30}},
            ),
            UsageLimit(resets_at=NOW + 30_000),
        ),
        (
            Failure(status=429, error_code="1308", message="x"),
            UsageLimit(resets_at=None),
        ),
        # prose alone is not structured evidence
        (Failure(status=502, message="The usage limit has been reached"), None),
        (Failure(status=429, message="slow down"), None),
    ],
)
def test_usage_limit_evidence(failure: Failure, expected: UsageLimit | None) -> None:
    assert usage_limit_evidence(failure, now=NOW) == expected


def test_failure_defaults_are_immutable() -> None:
    failure = Failure(status=500)
    assert isinstance(failure.headers, MappingProxyType)
    with pytest.raises(AttributeError):
        failure.status = 400  # type: ignore[misc]


def test_no_framework_imports() -> None:
    import routing.classify as mod

    source = open(mod.__file__, encoding="utf-8").read()
    for name in ("django", "ninja", "channels"):
        assert f"import {name}" not in source
        assert f"from {name}" not in source
