"""Hop-or-stop classification of one failed combo attempt (combos-behaviour.md §3.2, §3.3, §5.1).

The proxy shell turns an upstream failure that happened *before commit* (an HTTP error status,
a transport failure, or a zero-output terminal stream event) into a frozen `Failure`, and
`classify` returns a `Decision`: hop to the next target or stop and return this failure, why,
and which cooldown scope the hop carries. Nothing here reads the clock or does I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

Action = Literal["hop", "stop"]
Scope = Literal["none", "target", "provider"]

TRANSPORT_KINDS: frozenset[str] = frozenset(
    {
        "connect",
        "reset",
        "no_response",
        "timeout_connect",
        "timeout_first_byte",
        "timeout_idle",
        "timeout_total",
        "malformed",
        "undeclared_tool",
        "local",  # ocx's own limit (pool, file descriptors); the cause is in `error_code`
    }
)
STREAM_EVENTS: frozenset[str] = frozenset({"response.failed", "response.incomplete", "error"})

# §3.7: bounded failure-body read; classification text is capped at 500 characters.
FAILURE_BODY_LIMIT = 64 * 1024
MESSAGE_LIMIT = 500
# §3.2 row 8 and §5.1: envelope checks only look at messages up to this size.
ENVELOPE_MESSAGE_LIMIT = 16_384


def _empty_headers() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Failure:
    """One failed attempt before commit.

    `status` is the HTTP status (None for a transport failure, or for a stream event whose status
    must be derived); `error_type`/`error_code`/`message` are the upstream `error.type`,
    `error.code` and the already-redacted short text (at most 500 characters); any of them left
    empty is taken from `body["error"]`. `transport` is one of `TRANSPORT_KINDS`; `stream_event`
    is one of `STREAM_EVENTS` when a zero-output terminal event caused the failure. `headers` are
    the *upstream* response headers with lower-case names (never the synthetic client
    Retry-After). `body` is the full parsed JSON error body, if any (see `parse_error_body`).
    `timed_out`: the attempt ended because the upstream went silent (a stall after output,
    reported as a 502 truncation); a timeout transport says the same before output.
    """

    status: int | None = None
    error_type: str | None = None
    error_code: str | None = None
    message: str = ""
    transport: str | None = None
    stream_event: str | None = None
    headers: Mapping[str, str] = field(default_factory=_empty_headers)
    body: Mapping[str, object] | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class Decision:
    """The verdict for one failure.

    `action` is "hop" or "stop"; `reason` a stable machine string for logs and metrics; `scope`
    the cooldown scope of §3.3 ("none", "target", or "provider" = every target of the combo on
    that provider); `request_local` marks a hop that says nothing about the target's health.
    `needs_larger_context` (definite context overflow, PRODUCT §5.2) restricts the next pick to
    targets for which `overflow_allows` is true. `code` is the normalized upstream or classifier
    code and `row` the §3.2 table row that decided (0 for transport failures).
    """

    action: Action
    reason: str
    scope: Scope = "none"
    request_local: bool = False
    needs_larger_context: bool = False
    code: str = ""
    row: int = 0
    # ocx's own limit stopped the attempt (transport "local"): nothing about the target at all.
    local_overload: bool = False

    @property
    def hop(self) -> bool:
        return self.action == "hop"

    @property
    def cool(self) -> bool:
        """True when this hop cools the target (or its provider siblings)."""
        return self.action == "hop" and self.scope != "none"


# ---------------------------------------------------------------------------------------------
# Body reading and normalization


def parse_error_body(raw: bytes, limit: int = FAILURE_BODY_LIMIT) -> Mapping[str, object] | None:
    """Parse a failure body read with a size bound (§3.7).

    Returns the JSON object, or None when the body is larger than `limit` (an oversized body is
    never used, not even partly), is not UTF-8, is not JSON, or is not an object. One leading SSE
    `data:` frame is peeled, because gateways send errors that way (#4903).
    """
    if len(raw) > limit:
        return None
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    return _parse_object(_peel_data_frame(text))


_SECRET_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._\-~+/=]{6,}"),
    re.compile(
        r"(?i)\b(api[_-]?key|access[_-]?token|token|secret)(\"?\s*[=:]\s*\"?)[^\s\"',}]{6,}"
    ),
)


def redact(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """Remove secrets (`sk-…`, bearer tokens, `api_key=…`) and cap the text at `limit` chars."""
    out = _SECRET_RES[0].sub("sk-[redacted]", text)
    out = _SECRET_RES[1].sub("Bearer [redacted]", out)
    out = _SECRET_RES[2].sub(lambda m: f"{m.group(1)}{m.group(2)}[redacted]", out)
    return out[:limit]


def failure_from_response(
    status: int,
    headers: Mapping[str, str],
    raw: bytes,
    *,
    limit: int = FAILURE_BODY_LIMIT,
) -> Failure:
    """Build a `Failure` from an upstream non-2xx response read with a bound (§3.7).

    The JSON `error.type`, `error.code` and `error.message` are extracted (a `detail` string or
    a bare text body serve as message); the message is redacted and capped at 500 characters.
    """
    body = parse_error_body(raw, limit)
    lowered = {k.lower(): v for k, v in headers.items()}
    if body is None:
        text = "" if len(raw) > limit else raw.decode("utf-8", "replace").strip()
        return Failure(status=status, message=redact(text), headers=lowered)
    err = body.get("error")
    etype = ecode = None
    message = ""
    if isinstance(err, Mapping):
        etype = _scalar(err.get("type"))
        ecode = _scalar(err.get("code"))
        msg = err.get("message")
        message = msg if isinstance(msg, str) else ""
    elif isinstance(err, str):
        message = err
    detail = body.get("detail")
    if not message and isinstance(detail, str):
        message = detail
    return Failure(
        status=status,
        error_type=etype,
        error_code=ecode,
        message=redact(message),
        headers=lowered,
        body=body,
    )


def normalize_code(value: object) -> str:
    """Lower-case a structured code and replace `-` by `_` (`usage-limit-reached` → ...)."""
    text = _scalar(value)
    return (text or "").strip().lower().replace("-", "_")


def _scalar(value: object) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int)):
        return str(value)
    return None


def _peel_data_frame(text: str) -> str:
    if text.startswith("data:"):
        return text[len("data:") :].strip()
    return text


def _parse_object(text: str) -> Mapping[str, object] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class _Facts:
    status: int | None
    code: str
    type: str
    message: str
    text: str  # lower-cased message plus the structured code and type, for wording matches

    @property
    def codes(self) -> frozenset[str]:
        return frozenset(c for c in (self.code, self.type) if c)


def _error_obj(failure: Failure) -> Mapping[str, object]:
    if failure.body is None:
        return {}
    err = failure.body.get("error")
    return err if isinstance(err, Mapping) else {}


def _facts(failure: Failure) -> _Facts:
    err = _error_obj(failure)
    code = normalize_code(failure.error_code if failure.error_code else err.get("code"))
    etype = normalize_code(failure.error_type if failure.error_type else err.get("type"))
    message = failure.message
    if not message:
        raw_msg = err.get("message")
        message = redact(raw_msg) if isinstance(raw_msg, str) else ""
    text = message.lower()
    for extra in (code, etype):
        if extra and extra not in text:
            text = f"{text} {extra}"
    status = failure.status
    if status is None and failure.stream_event is not None:
        status = stream_failure_status(failure)
    return _Facts(status=status, code=code, type=etype, message=message, text=text)


# ---------------------------------------------------------------------------------------------
# The shared classifier (§3.2.1)

_CLIENT_CLOSED = ("client closed", "client_closed_request", "client disconnected", "client aborted")
_CYBER = ("cyber_policy", "cyber policy")
_CONTEXT = ("context_length_exceeded", "context window", "context length", "maximum context")
_CONTEXT_TOKENS = ("too many tokens",)
_QUOTA = (
    "insufficient_quota",
    "exceeded your current quota",
    "quota exhausted",
    "account quota exceeded",
    "monthly quota exceeded",
    "daily quota exceeded",
)
_RATE = (
    "rate limit",
    "rate limited",
    "too many requests",
    "resource_exhausted",
    "resource exhausted",
    "throttling",
)
_AUTH = (
    "invalid_api_key",
    "invalid api key",
    "incorrect api key",
    "authentication",
    "unauthorized",
    "unauthenticated",
)
_OVERLOADED = ("overloaded", "server is busy", "temporarily unavailable")
_INVALID = (
    "invalid request",
    "model unavailable",
    "model not found",
    "unsupported model",
    "unsupported region",
    "not available in your region",
    "region is not supported",
    "invalid arn",
    "arn:aws",
)


def _has(text: str, needles: tuple[str, ...]) -> bool:
    return any(n in text for n in needles)


def _shared_classifier(f: _Facts) -> str:
    kinds = f.codes
    text = f.text
    if "previous_response_not_found" in kinds:
        return "previous_response_not_found"
    if "client_cancelled" in kinds:
        return "client_cancelled"
    if f.status == 499 or _has(text, _CLIENT_CLOSED):
        return "client_closed_request"
    if _has(text, _CYBER):
        return "cyber_policy"
    if "input_admission_refused" in kinds:
        return "input_admission_refused"
    if _has(text, _CONTEXT) or _has(text, _CONTEXT_TOKENS):
        return "context_length_exceeded"
    if _has(text, _QUOTA):
        return "insufficient_quota"
    if f.status == 429 or _has(text, _RATE):
        return "rate_limit_exceeded"
    if "origin_rejected" in kinds:
        return "origin_rejected"
    if f.status == 401 or _has(text, _AUTH):
        return "invalid_api_key"
    if f.status == 403:
        return "subscription_required" if "subscription" in text else "permission_denied"
    if f.status == 503 or _has(text, _OVERLOADED):
        return "server_is_overloaded"
    if _has(text, _INVALID):
        return "invalid_request_error"
    if f.status is not None and f.status >= 500:
        return "upstream_server_error"
    if f.status == 400:
        return "invalid_request_error"
    return f.type or f.code


def classifier_text(failure: Failure) -> str:
    """The lower-cased text that wording rules match: the message plus the code and type."""
    return _facts(failure).text


def classifier_code(failure: Failure) -> str:
    """The shared error classifier of §3.2.1: a normalized code for status, type and wording."""
    return _shared_classifier(_facts(failure))


# ---------------------------------------------------------------------------------------------
# Stream-event status (§4)

_CODE_STATUS: Mapping[str, int] = MappingProxyType(
    {
        "invalid_request_error": 400,
        "context_length_exceeded": 400,
        "input_admission_refused": 400,
        "previous_response_not_found": 400,
        "invalid_api_key": 401,
        "permission_denied": 403,
        "subscription_required": 403,
        "rate_limit_exceeded": 429,
        "insufficient_quota": 429,
        "client_cancelled": 499,
        "client_closed_request": 499,
        "server_is_overloaded": 503,
    }
)


def _status_field(obj: object) -> int | None:
    if not isinstance(obj, Mapping):
        return None
    for key in ("status", "status_code", "http_status"):
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
        if isinstance(value, str) and re.fullmatch(r"[45]\d\d", value):
            return int(value)
    return None


def stream_failure_status(failure: Failure) -> int:
    """HTTP status for a zero-output terminal stream event without a recorded status (§4).

    Taken from `status`/`status_code`/`http_status` on the body, its `error`, its `response` or
    `response.error`; otherwise derived from the classified error (a bare
    `invalid_request_error` gives 400, `server_is_overloaded` 503); otherwise 502.
    """
    if failure.status is not None:
        return failure.status
    body = failure.body or {}
    response = body.get("response")
    nested: list[object] = [body, body.get("error"), response]
    if isinstance(response, Mapping):
        nested.append(response.get("error"))
    for obj in nested:
        found = _status_field(obj)
        if found is not None:
            return found
    code = _shared_classifier(_facts(replace(failure, stream_event=None)))
    return _CODE_STATUS.get(code, 502)


# ---------------------------------------------------------------------------------------------
# Individual signals


_LIFECYCLE_CODES = frozenset(
    {"model_deprecated", "model_end_of_life", "model_eol", "model_not_found", "model_retired"}
)
_LIFECYCLE_RE = re.compile(
    r"end of life|end-of-life|no longer available"
    r"|\b(?:deprecated|retired|retirement|sunset|decommissioned)\b"
)
_NON_REPLAYABLE_CODES = frozenset(
    {"non_replayable_upstream", "upstream_not_replayable", "websocket_create_no_reply"}
)
_PROMPT_CAP_RE = re.compile(r"prompt\s+\d+\s*>\s*\d+\s+maximum context length")
# ocx names the target since issue #28 ("Provider error 400 from p/m: …"); older releases and
# the reference did not.
_PROVIDER_ERROR_RE = re.compile(
    r"^provider error \d{3}(?: from \S{1,600}?(?=: ))?:\s*", re.IGNORECASE
)
_PROVIDER_400_RE = re.compile(r"^Provider error 400(?: from \S{1,600}?(?=: ))?: ")
_OVERFLOW_PHRASES = (
    "exceeds the context window",
    "exceed the context window",
    "context window exceeded",
    "context length exceeded",
    "maximum context length",
    "maximum context window",
    "too many tokens",
)
_MODEL_CODES = frozenset({"model_not_found", "model_unavailable", "unsupported_model"})
_RESPONSE_FORMAT_CODES = frozenset(
    {
        "",
        "invalid_request_error",
        "invalid_parameter_error",
        "unsupported_parameter",
        "unsupported_value",
    }
)
_COMPAT_CODES = frozenset(
    {"", "invalid_request_error", "unsupported_parameter", "unsupported_value"}
)
_REFUSAL_RE = re.compile(
    r"response_format.*?(?:unavailable|not available|unsupported|not supported|does not support"
    r"|doesn't support|cannot be used|is not enabled)"
    r"|(?:unavailable|not available|unsupported|not supported|does not support|doesn't support"
    r"|cannot be used|is not enabled).*?response_format",
    re.DOTALL,
)
_IMAGE_RE = re.compile(r"^Model '[^']{1,256}' does not support image inputs\.")
_CHATGPT_MODEL_RE = re.compile(
    r"model is not supported when using codex with a chatgpt account", re.IGNORECASE
)
_NONE_SCOPE_CODES = frozenset(
    {
        "input_admission_refused",
        "context_length_exceeded",
        "tool_catalog_too_large",
        "cursor_root_envelope_limit",
        "target_incompatible",
    }
)
# §3.3 provider-scoped credential and billing codes.
PROVIDER_CODES: frozenset[str] = frozenset(
    {
        "invalid_api_key",
        "insufficient_quota",
        "subscription_required",
        "payment_required",
        "billing_error",
        "insufficient_balance",
    }
)
_ROW17_CODES = PROVIDER_CODES | {
    "permission_denied",
    "rate_limit_exceeded",
    "server_is_overloaded",
    "upstream_server_error",
}
_SPENT_CODES = frozenset({"usage_limit_exceeded", "usage_limit_reached", "1308"})
_SPENT_WINDOW_RE = re.compile(
    r"quota (?:has been|is) (?:exhausted|used up)|quota will reset|token[- ]plan\b.*\bquota"
)
_PER_MINUTE_RE = re.compile(r"\b(?:this|per|a|each) minute\b")


def _is_lifecycle_410(f: _Facts) -> bool:
    if f.status != 410:
        return False
    if f.codes & _LIFECYCLE_CODES:
        return True
    text = f.message.lower()
    return re.search(r"\bmodel\b", text) is not None and _LIFECYCLE_RE.search(text) is not None


def _is_hard_cap_overflow(f: _Facts) -> bool:
    if f.status == 400 and "invalid_request_prompt_too_long" in f.text:
        return True
    return f.code == "5059" and _PROMPT_CAP_RE.search(f.text) is not None


def _innermost_message(message: str) -> str | None:
    """Peel up to 4 `Provider error NNN:` / JSON `error.message` envelopes; None = bad JSON."""
    text = message.strip()
    for _ in range(4):
        peeled = _PROVIDER_ERROR_RE.sub("", text, count=1)
        if peeled != text:
            text = peeled.strip()
            continue
        if text.startswith("{"):
            obj = _parse_object(text)
            if obj is None:
                return None
            err = obj.get("error")
            inner = err.get("message") if isinstance(err, Mapping) else None
            if not isinstance(inner, str):
                return None
            text = inner.strip()
            continue
        break
    return text


def is_definite_context_overflow(failure: Failure) -> bool:
    """Row 8 of §3.2: a status 400/413/422/5xx whose innermost message is a context overflow."""
    return _definite_overflow(_facts(failure), failure)


def _definite_overflow(f: _Facts, failure: Failure) -> bool:
    if f.status is None or not (f.status in (400, 413, 422) or f.status >= 500):
        return False
    message = failure.message
    if not message:
        raw = _error_obj(failure).get("message")
        message = raw if isinstance(raw, str) else ""
    if len(message) > ENVELOPE_MESSAGE_LIMIT:
        return False
    inner = _innermost_message(message)
    if inner is None:
        return False
    lowered = inner.lower()
    return lowered == "context_length_exceeded" or _has(lowered, _OVERFLOW_PHRASES)


def _is_quota_cap(f: _Facts) -> bool:
    if f.status == 429 and (
        "gousagelimiterror" in f.codes or "monthly usage limit reached" in f.text
    ):
        return True
    return _is_free_prompt_wording(f)


def _is_free_prompt_wording(f: _Facts) -> bool:
    return "err_free_prompt_cap" in f.text or (
        "free tier" in f.text and ("single request" in f.text or "prompt" in f.text)
    )


@dataclass(frozen=True)
class _Envelope:
    type: str
    code: str
    message: str
    param: str | None


def _envelope(
    failure: Failure, *, allow_data_frame: bool, codes: frozenset[str]
) -> _Envelope | None:
    """An intact `invalid_request_error` JSON envelope at status 400 (§5.1), or None."""
    if failure.status != 400:
        return None
    obj: Mapping[str, object] | None = failure.body
    if obj is None:
        text = failure.message.strip()
        if allow_data_frame:
            text = _peel_data_frame(text)
        for _ in range(3):
            head = _PROVIDER_400_RE.match(text)
            if head is None:
                break
            text = text[head.end() :].strip()
        obj = _parse_object(text)
    if obj is None:
        return None
    seen_code: str | None = None
    for level in range(4):
        err = obj.get("error")
        if not isinstance(err, Mapping):
            return None
        raw_code = err.get("code")
        if raw_code is not None and not isinstance(raw_code, str):
            return None
        code = normalize_code(raw_code)
        if code and seen_code and code != seen_code:
            return None  # conflicting codes fail closed
        seen_code = code or seen_code
        message = err.get("message")
        if not isinstance(message, str) or len(message) > ENVELOPE_MESSAGE_LIMIT:
            return None
        param = err.get("param")
        if param is not None and not isinstance(param, str):
            return None
        head = _PROVIDER_400_RE.match(message) if level < 3 and param is None else None
        if head is not None:
            inner = _parse_object(message[head.end() :].strip())
            if inner is None:
                return None
            obj = inner
            continue
        if normalize_code(err.get("type")) != "invalid_request_error":
            return None
        final_code = seen_code or ""
        if final_code not in codes:
            return None
        return _Envelope("invalid_request_error", final_code, message, param)
    return None


def _request_local_incompatibility(failure: Failure) -> str | None:
    """§5.1 plus the ChatGPT-account model refusal; returns a reason or None."""
    env = _envelope(failure, allow_data_frame=False, codes=_COMPAT_CODES)
    if env is not None:
        if (
            env.message == "Unsupported parameter: user"
            and env.param in (None, "user")
            and env.code != "unsupported_value"
        ):
            return "unsupported_user_param"
        if (
            env.code == "unsupported_value"
            and env.param in ("reasoning.effort", "reasoning_effort")
            and env.message.startswith("Unsupported value:")
            and "not supported" in env.message
        ):
            return "unsupported_effort"
        if (
            env.param == "input"
            and env.code in ("", "invalid_request_error")
            and _IMAGE_RE.match(env.message)
        ):
            return "image_unsupported"
    if _is_chatgpt_account_refusal(failure):
        return "chatgpt_account_model"
    return None


def _is_chatgpt_account_refusal(failure: Failure) -> bool:
    if failure.status != 400:
        return False
    body = failure.body
    if body is None:
        return _CHATGPT_MODEL_RE.search(failure.message) is not None
    detail = body.get("detail")
    err = body.get("error")
    if detail is not None and err is not None:
        return False  # competing envelopes stay terminal
    if isinstance(detail, str):
        return _CHATGPT_MODEL_RE.search(detail) is not None
    if isinstance(err, Mapping):
        message = err.get("message")
        return isinstance(message, str) and _CHATGPT_MODEL_RE.search(message) is not None
    return False


def _is_response_format_refusal(failure: Failure) -> bool:
    env = _envelope(failure, allow_data_frame=True, codes=_RESPONSE_FORMAT_CODES)
    if env is None or env.param not in (None, "response_format"):
        return False
    return _REFUSAL_RE.search(env.message.lower()) is not None


def is_spent_window(failure: Failure) -> bool:
    """A spent usage window (§3.4 rule 4): usage-limit codes or prose, any HTTP status.

    A per-minute quota message does not count; it is a request-rate limit.
    """
    return _spent_window(_facts(failure))


def _spent_window(f: _Facts) -> bool:
    if f.codes & _SPENT_CODES:
        return True
    if "usage limit reached" in f.text or "usage limit has been reached" in f.text:
        return True
    return _SPENT_WINDOW_RE.search(f.text) is not None and not _PER_MINUTE_RE.search(f.text)


# ---------------------------------------------------------------------------------------------
# Scope (§3.3) and the ordered table (§3.2)


def _scope(f: _Facts, classifier: str) -> Scope:
    codes = f.codes | {classifier}
    if f.status == 413 or codes & _NONE_SCOPE_CODES:
        return "none"
    free_prompt_wording = _is_free_prompt_wording(f)
    if f.status == 400 and ("free_rate_limited" in f.codes or free_prompt_wording):
        return "none"
    if f.status == 429 and (
        "gousagelimiterror" in f.codes or "monthly usage limit reached" in f.text
    ):
        return "provider"
    if free_prompt_wording:
        return "provider"
    if f.status in (401, 402, 403) or codes & PROVIDER_CODES:
        return "provider"
    return "target"


_STATUS_REASON: Mapping[int, str] = MappingProxyType(
    {
        401: "auth",
        402: "payment_required",
        403: "forbidden",
        404: "not_found",
        408: "timeout",
        425: "too_early",
        429: "rate_limited",
    }
)
_CODE_REASON: Mapping[str, str] = MappingProxyType(
    {
        "invalid_api_key": "auth",
        "permission_denied": "forbidden",
        "subscription_required": "subscription_required",
        "insufficient_quota": "quota",
        "payment_required": "payment_required",
        "billing_error": "payment_required",
        "insufficient_balance": "payment_required",
        "rate_limit_exceeded": "rate_limited",
        "server_is_overloaded": "overloaded",
        "upstream_server_error": "server_error",
    }
)


def _hop(f: _Facts, classifier: str, reason: str, row: int, code: str = "") -> Decision:
    scope = _scope(f, classifier)
    return Decision(
        action="hop",
        reason=reason,
        scope=scope,
        request_local=scope == "none",
        code=code or f.code or classifier,
        row=row,
    )


def _local_hop(reason: str, row: int, code: str, *, larger: bool = False) -> Decision:
    return Decision(
        action="hop",
        reason=reason,
        scope="none",
        request_local=True,
        needs_larger_context=larger,
        code=code,
        row=row,
    )


def _stop(reason: str, row: int, code: str) -> Decision:
    return Decision(action="stop", reason=reason, code=code, row=row)


_TRANSPORT_REASON: Mapping[str, str] = MappingProxyType(
    {
        "connect": "connection",
        "reset": "connection",
        "no_response": "connection",
        "timeout_connect": "timeout",
        "timeout_first_byte": "timeout",
        "timeout_idle": "timeout",
        "timeout_total": "timeout",
        "malformed": "malformed_response",
    }
)


def _before_status(failure: Failure) -> Decision | None:
    """The rows decided before any status: ocx's own limit, an undeclared tool, a transport
    failure (no status, no stream event); None for the rest."""
    if failure.transport == "local":
        # ocx ran out of its own pool slots or file descriptors before reaching the upstream:
        # not the target's fault. Another target (its own pool) may still serve the request.
        return Decision(
            action="hop",
            reason=f"local: {failure.error_code or 'overloaded'}",
            scope="none",
            request_local=True,
            code="ocx_overloaded",
            local_overload=True,
        )
    if failure.transport == "undeclared_tool":
        # The model called a tool the request did not declare (PRODUCT §5.4): a model-output
        # problem, not a provider outage, so it hops without cooling the target.
        return Decision(
            action="hop",
            reason="undeclared_tool",
            scope="none",
            request_local=True,
            code="undeclared_tool",
        )
    if failure.status is None and failure.stream_event is None:
        kind = failure.transport or "no_response"
        return Decision(
            action="hop",
            reason=_TRANSPORT_REASON.get(kind, "connection"),
            scope="target",
            code=kind,
        )
    return None


def classify(failure: Failure) -> Decision:
    """Decide hop or stop for one pre-commit failure, evaluating §3.2 row by row.

    A transport failure (no status) hops and cools the target (PRODUCT §5.2, §5.5). A stream
    event without a status gets one from `stream_failure_status`. Rows 7–8 (definite context
    overflow) hop without cooling and set `needs_larger_context`; the §5.1 compatibility refusals
    and the `response_format` refusal hop without cooling. Client aborts must be handled by the
    caller before classification; a 499 here stops without cooling.
    """
    early = _before_status(failure)
    if early is not None:
        return early
    f = _facts(failure)
    classifier = _shared_classifier(f)
    status = f.status
    if status == 499:
        return _stop("client_cancelled", 1, "client_cancelled")
    if "origin_rejected" in f.text or f.code == "origin_rejected":
        return _stop("origin_rejected", 2, "origin_rejected")
    if f.code in _NON_REPLAYABLE_CODES:
        return _stop("non_replayable", 3, f.code)
    if f.code == "cyber_policy":
        return _stop("cyber_policy", 4, "cyber_policy")
    if _is_lifecycle_410(f):
        return _hop(f, classifier, "model_retired", 5)
    if classifier == "cyber_policy":
        return _stop("cyber_policy", 6, "cyber_policy")
    if _is_hard_cap_overflow(f):
        return _local_hop("context_overflow", 7, "context_length_exceeded", larger=True)
    if _definite_overflow(f, failure):
        return _local_hop("context_overflow", 8, "context_length_exceeded", larger=True)
    if "input_admission_refused" in (f.code, classifier):
        return _local_hop("input_admission_refused", 9, "input_admission_refused")
    if _is_quota_cap(f):
        return _hop(f, classifier, "quota_cap", 10)
    model_code = next((c for c in (f.code, classifier) if c in _MODEL_CODES), None)
    if model_code is not None:
        return _hop(f, classifier, "model_unsupported", 11, model_code)
    if f.code == "free_rate_limited":
        return _hop(f, classifier, "free_rate_limited", 12)
    incompatible = _request_local_incompatibility(failure)
    if incompatible is not None:
        return _local_hop(incompatible, 13, "target_incompatible")
    if _is_response_format_refusal(failure):
        return _local_hop("response_format_unsupported", 14, "invalid_request_error")
    if classifier in ("origin_rejected", "context_length_exceeded", "invalid_request_error"):
        reason = "invalid_request" if classifier == "invalid_request_error" else classifier
        return _stop(reason, 15, classifier)
    if status is not None and (status in _STATUS_REASON or status >= 500):
        if _spent_window(f):
            reason = "usage_limit"
        elif classifier in ("insufficient_quota", "server_is_overloaded"):
            reason = _CODE_REASON[classifier]
        else:
            reason = _STATUS_REASON.get(status, "server_error")
        return _hop(f, classifier, reason, 16, f.code or classifier)
    if classifier in _ROW17_CODES:
        reason = "usage_limit" if _spent_window(f) else _CODE_REASON[classifier]
        return _hop(f, classifier, reason, 17, classifier)
    return _stop("unclassified", 18, f.code or classifier)


def overflow_allows(failed_window: int | None, candidate_window: int | None) -> bool:
    """After a definite context overflow, may the request hop to this candidate? (PRODUCT §5.2)

    Only when both context windows are known and the candidate's is strictly larger.
    """
    if failed_window is None or candidate_window is None:
        return False
    return candidate_window > failed_window


# ---------------------------------------------------------------------------------------------
# Usage-limit evidence for quota state (PRODUCT §8.2)

_USAGE_LIMIT_CODES = frozenset(
    {"usage_limit_reached", "usage_limit_exceeded", "1308", "gousagelimiterror"}
)


@dataclass(frozen=True)
class UsageLimit:
    """Structured evidence that a usage window is spent; `resets_at` in epoch ms if reported."""

    resets_at: int | None


def usage_limit_evidence(failure: Failure, *, now: int) -> UsageLimit | None:
    """Structured usage-limit evidence (a code or type, never prose), for the quota machine.

    Recognizes `usage_limit_reached` / `usage_limit_exceeded` / `1308` / `GoUsageLimitError`
    in `error.type` or `error.code`. The reset comes from `error.resets_at` (epoch seconds, or ms
    when ≥ 10¹²) or `error.resets_in_seconds` relative to `now`; None when neither is usable.
    """
    f = _facts(failure)
    if not f.codes & _USAGE_LIMIT_CODES:
        return None
    err = _error_obj(failure)
    resets_at = _number(err.get("resets_at"))
    if resets_at is not None and resets_at > 0:
        ms = int(resets_at if resets_at >= 1e12 else resets_at * 1000)
        return UsageLimit(resets_at=ms)
    resets_in = _number(err.get("resets_in_seconds"))
    if resets_in is not None and resets_in >= 0:
        return UsageLimit(resets_at=now + int(resets_in * 1000))
    return UsageLimit(resets_at=None)


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"\d+(?:\.\d+)?", value.strip()):
        return float(value)
    return None
