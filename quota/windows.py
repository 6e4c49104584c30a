"""Quota windows: ingestion of structured quota signals and the per-credential state machine.

Pure and framework-free (PRODUCT §8). Parsers turn upstream signals — ``x-codex-*`` headers,
``usage_limit_reached`` error bodies, ``codex.rate_limits`` stream events, ``anthropic-ratelimit-*``
and ``x-ratelimit-*`` headers — into :class:`Window` values. :class:`CredentialQuota` is the frozen
state for one (provider, credential fingerprint) and the ``observe*`` / ``acquire_probe`` functions
are its pure transitions: ``available → limited → probing → available``. All times are epoch
milliseconds and ``now`` is always injected.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, cast

WindowName = Literal["five_hour", "weekly", "monthly", "custom"]
Scope = Literal["inference", "search", "mcp"]
Status = Literal["available", "limited", "probing"]
Eligibility = Literal["eligible", "ineligible", "probe"]

# Source labels (short: QuotaSnapshot.source is a 32-char column).
SOURCE_CODEX_HEADERS = "x-codex"
SOURCE_CODEX_EVENT = "codex.rate_limits"
SOURCE_USAGE_LIMIT = "usage_limit_reached"
SOURCE_ANTHROPIC_UNIFIED = "anthropic-unified"
SOURCE_ANTHROPIC = "anthropic-ratelimit"
SOURCE_OPENAI = "x-ratelimit"

# The codex limit family that applies to the credential as a whole; others are model-scoped.
CODEX_MAIN_LIMIT = "codex"

# Transition reasons.
REASON_LIMIT_REACHED = "usage_limit_reached"
REASON_PROBE_STARTED = "windows_reset_probe"
REASON_PROBE_FAILED = "probe_failed"
REASON_PROBE_STILL_LIMITED = "probe_still_limited"
REASON_AVAILABLE = "quota_available"

FRESHNESS_MS = 30 * 60 * 1000
DEFAULT_UNKNOWN_RESET_MS = 5 * 60 * 1000
DEFAULT_PROBE_BACKOFF_MS = 60 * 1000

_STATUSES: frozenset[str] = frozenset({"available", "limited", "probing"})
_NAMES: frozenset[str] = frozenset({"five_hour", "weekly", "monthly", "custom"})
_SCOPES: frozenset[str] = frozenset({"inference", "search", "mcp"})


@dataclass(frozen=True)
class Window:
    """One observed quota window.

    ``name`` is derived from ``window_minutes`` (300 → five_hour, 10080 → weekly, ≈43200 → monthly,
    else custom). ``used_percent`` is 0–100 (may exceed 100). ``resets_at_ms`` is absolute.
    ``source`` names the signal family; ``limit_id`` the bucket inside it (``codex``,
    ``codex_bengalfox``, ``requests``, ``tokens`` …). ``informational`` windows (short request/token
    rate limits) are recorded but never ranked by :func:`soonest_reset`; ``whole_credential`` is
    False for model- or feature-scoped buckets, which never limit the credential.
    """

    name: WindowName
    used_percent: float | None
    window_minutes: int | None
    resets_at_ms: int | None
    observed_at_ms: int
    scope: Scope = "inference"
    source: str = ""
    limit_id: str = ""
    informational: bool = False
    whole_credential: bool = True

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (inverse of :meth:`from_json`)."""
        return {
            "name": self.name,
            "used_percent": self.used_percent,
            "window_minutes": self.window_minutes,
            "resets_at_ms": self.resets_at_ms,
            "observed_at_ms": self.observed_at_ms,
            "scope": self.scope,
            "source": self.source,
            "limit_id": self.limit_id,
            "informational": self.informational,
            "whole_credential": self.whole_credential,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Window:
        """Rebuild a window from :meth:`to_json` output; raises ``ValueError`` on bad data."""
        name = data.get("name")
        scope = data.get("scope", "inference")
        if name not in _NAMES or scope not in _SCOPES:
            raise ValueError(f"bad window name/scope: {name!r}/{scope!r}")
        used = data.get("used_percent")
        return cls(
            name=cast(WindowName, name),
            used_percent=None if used is None else float(used),
            window_minutes=_opt_int(data.get("window_minutes")),
            resets_at_ms=_opt_int(data.get("resets_at_ms")),
            observed_at_ms=int(data["observed_at_ms"]),
            scope=cast(Scope, scope),
            source=str(data.get("source", "")),
            limit_id=str(data.get("limit_id", "")),
            informational=bool(data.get("informational", False)),
            whole_credential=bool(data.get("whole_credential", True)),
        )


@dataclass(frozen=True)
class Transition:
    """A state change of one credential: ``from_status → to_status`` for ``reason`` at ``at_ms``."""

    from_status: Status
    to_status: Status
    reason: str
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.from_status,
            "to": self.to_status,
            "reason": self.reason,
            "at_ms": self.at_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Transition:
        frm, to = data.get("from"), data.get("to")
        if frm not in _STATUSES or to not in _STATUSES:
            raise ValueError(f"bad transition statuses: {frm!r} → {to!r}")
        return cls(
            from_status=cast(Status, frm),
            to_status=cast(Status, to),
            reason=str(data.get("reason", "")),
            at_ms=int(data["at_ms"]),
        )


@dataclass(frozen=True)
class CredentialQuota:
    """Quota state of one (provider, credential fingerprint).

    ``exhausted`` holds the windows that put the credential into ``limited`` (with their resets).
    ``hold_until_ms`` is an extra not-before time used when a reset is unknown or a probe failed
    without new reset data. ``probe_lease_until_ms`` is the lease of the single in-flight probe.
    Never holds a secret: ``credential`` is a :func:`credential_fingerprint`.
    """

    provider: str
    credential: str
    status: Status = "available"
    exhausted: tuple[Window, ...] = ()
    hold_until_ms: int | None = None
    probe_lease_until_ms: int | None = None
    last_transition: Transition | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (for Redis); inverse of :meth:`from_json`."""
        return {
            "provider": self.provider,
            "credential": self.credential,
            "status": self.status,
            "exhausted": [w.to_json() for w in self.exhausted],
            "hold_until_ms": self.hold_until_ms,
            "probe_lease_until_ms": self.probe_lease_until_ms,
            "last_transition": (
                None if self.last_transition is None else self.last_transition.to_json()
            ),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CredentialQuota:
        """Rebuild state from :meth:`to_json` output; raises ``ValueError`` on bad data."""
        status = data.get("status", "available")
        if status not in _STATUSES:
            raise ValueError(f"bad status: {status!r}")
        lt = data.get("last_transition")
        return cls(
            provider=str(data["provider"]),
            credential=str(data["credential"]),
            status=cast(Status, status),
            exhausted=tuple(Window.from_json(w) for w in data.get("exhausted") or ()),
            hold_until_ms=_opt_int(data.get("hold_until_ms")),
            probe_lease_until_ms=_opt_int(data.get("probe_lease_until_ms")),
            last_transition=None if lt is None else Transition.from_json(lt),
        )


# --------------------------------------------------------------------------------------------
# Small value parsers


def _opt_int(value: object) -> int | None:
    return None if value is None else int(cast(Any, value))


def _num(value: object) -> float | None:
    """A finite number from a header/JSON value; empty, boolean or non-numeric values are absent."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        f = float(value)
    elif isinstance(value, str):
        s = value.strip()
        if not s:
            return None
        try:
            f = float(s)
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def _epoch_to_ms(value: float) -> int:
    """Unix seconds → ms; values that already look like ms (≥ 1e12) are kept."""
    return int(value) if value >= 1e12 else int(round(value * 1000))


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|h|m|s)")
_DURATION_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6}


def _duration_ms(text: str) -> int | None:
    """Parse a Go-style duration (``6m0s``, ``20ms``, ``1h2m3.5s``) into ms."""
    s = text.strip()
    if not s:
        return None
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _DURATION_UNITS_MS[m.group(2)]
        pos = m.end()
    return int(round(total)) if pos == len(s) and pos > 0 else None


_FRACTION = re.compile(r"(\.\d{6})\d+")


def _rfc3339_ms(text: str) -> int | None:
    s = _FRACTION.sub(r"\1", text.strip())
    if not s:
        return None
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None  # an RFC 3339 reset always carries an offset; a naive one is ambiguous
    return int(round(dt.timestamp() * 1000))


def window_name(window_minutes: int | None) -> WindowName:
    """Name a window by its length: 300 → five_hour, 10080 → weekly, 28–31 days → monthly."""
    if window_minutes == 300:
        return "five_hour"
    if window_minutes == 10080:
        return "weekly"
    if window_minutes is not None and 40320 <= window_minutes <= 44640:
        return "monthly"
    return "custom"


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}


# --------------------------------------------------------------------------------------------
# Ingestion


_CODEX_FAMILY = re.compile(r"^x-([a-z0-9-]+?)-(primary|secondary|tertiary)-used-percent$")


def _codex_windows(h: Mapping[str, str], *, now: int) -> list[Window]:
    families: list[str] = []
    for key in h:
        m = _CODEX_FAMILY.match(key)
        if m and m.group(1) not in families:
            families.append(m.group(1))
    out: list[Window] = []
    for family in sorted(families):
        limit_id = family.replace("-", "_")
        main = limit_id == CODEX_MAIN_LIMIT
        for slot in ("primary", "secondary", "tertiary"):
            prefix = f"x-{family}-{slot}-"
            used = _num(h.get(prefix + "used-percent"))
            if used is None:
                continue  # Codex omits a window whose used-percent is missing
            minutes_f = _num(h.get(prefix + "window-minutes"))
            minutes = int(minutes_f) if minutes_f and minutes_f > 0 else None
            reset_at = _num(h.get(prefix + "reset-at"))
            after = _num(h.get(prefix + "reset-after-seconds"))
            resets: int | None = None
            if reset_at is not None and reset_at > 0:
                resets = _epoch_to_ms(reset_at)
            elif after is not None and after > 0:
                resets = now + int(round(after * 1000))
            if used == 0 and minutes is None and resets is None:
                continue  # placeholder slot (e.g. secondary 0 / 0 / empty)
            out.append(
                Window(
                    name=window_name(minutes),
                    used_percent=used,
                    window_minutes=minutes,
                    resets_at_ms=resets,
                    observed_at_ms=now,
                    source=SOURCE_CODEX_HEADERS,
                    limit_id=limit_id,
                    informational=not main,
                    whole_credential=main,
                )
            )
    return out


def _anthropic_windows(h: Mapping[str, str], *, now: int) -> list[Window]:
    out: list[Window] = []
    pre = "anthropic-ratelimit-unified-"
    overall = h.get(pre + "status", "").strip().lower()
    claim = h.get(pre + "representative-claim", "").strip().lower()
    overall_reset = _num(h.get(pre + "reset"))
    for tag, minutes, claim_names in (
        ("5h", 300, ("five_hour", "5h")),
        ("7d", 10080, ("seven_day", "7d")),
    ):
        util = _num(h.get(f"{pre}{tag}-utilization"))
        status = h.get(f"{pre}{tag}-status", "").strip().lower()
        reset = _num(h.get(f"{pre}{tag}-reset"))
        # A structured "rejected" is evidence of exhaustion even if utilization rounds below 1.
        rejected = status == "rejected" or (overall == "rejected" and claim in claim_names)
        if util is None and not rejected:
            continue
        used = 100.0 * util if util is not None else 0.0
        if rejected:
            used = max(used, 100.0)
            if reset is None and claim in claim_names:
                reset = overall_reset
        out.append(
            Window(
                name=window_name(minutes),
                used_percent=used,
                window_minutes=minutes,
                resets_at_ms=None if reset is None or reset <= 0 else _epoch_to_ms(reset),
                observed_at_ms=now,
                source=SOURCE_ANTHROPIC_UNIFIED,
                limit_id=f"unified_{tag}",
            )
        )
    for bucket in ("requests", "tokens", "input-tokens", "output-tokens"):
        base = f"anthropic-ratelimit-{bucket}-"
        limit = _num(h.get(base + "limit"))
        remaining = _num(h.get(base + "remaining"))
        if limit is None or remaining is None or limit <= 0:
            continue
        out.append(
            Window(
                name="custom",
                used_percent=_used_from_remaining(limit, remaining),
                window_minutes=None,
                resets_at_ms=_rfc3339_ms(h.get(base + "reset", "")),
                observed_at_ms=now,
                source=SOURCE_ANTHROPIC,
                limit_id=bucket.replace("-", "_"),
                informational=True,
            )
        )
    return out


def _used_from_remaining(limit: float, remaining: float) -> float:
    return 100.0 * (1.0 - max(0.0, min(remaining, limit)) / limit)


def _openai_reset_ms(text: str, *, now: int) -> int | None:
    value = _num(text)
    if value is None:
        rel = _duration_ms(text)
        return None if rel is None else now + rel
    if value >= 1e9:  # an absolute epoch (seconds or ms) rather than a delay
        return _epoch_to_ms(value)
    return now + int(round(value * 1000))


def _openai_windows(h: Mapping[str, str], *, now: int) -> list[Window]:
    out: list[Window] = []
    for bucket in ("requests", "tokens"):
        limit = _num(h.get(f"x-ratelimit-limit-{bucket}"))
        remaining = _num(h.get(f"x-ratelimit-remaining-{bucket}"))
        if limit is None or remaining is None or limit <= 0:
            continue
        out.append(
            Window(
                name="custom",
                used_percent=_used_from_remaining(limit, remaining),
                window_minutes=None,
                resets_at_ms=_openai_reset_ms(h.get(f"x-ratelimit-reset-{bucket}", ""), now=now),
                observed_at_ms=now,
                source=SOURCE_OPENAI,
                limit_id=bucket,
                informational=True,
            )
        )
    return out


def windows_from_headers(headers: Mapping[str, str], *, now: int) -> list[Window]:
    """All quota windows in one response's headers (case-insensitive keys).

    Families: ``x-codex-*`` (and any ``x-<name>-primary-used-percent`` family; only ``codex`` is
    credential-wide, other families are model-scoped), ``anthropic-ratelimit-unified-*`` (5h/7d
    utilization fractions), ``anthropic-ratelimit-{requests,tokens,…}-*`` and OpenAI-style
    ``x-ratelimit-*`` (both marked ``informational``). Unparseable values are treated as absent.
    Codex credits headers are ignored (``has-credits: false`` is normal for subscription plans).
    """
    h = _lower(headers)
    # Most responses carry none of these: one pass over the names settles it.
    if not any("ratelimit" in name or name.endswith("used-percent") for name in h):
        return []
    return _codex_windows(h, now=now) + _anthropic_windows(h, now=now) + _openai_windows(h, now=now)


def _error_object(body: object) -> Mapping[str, Any] | None:
    """The error object: ``{"error": {…}}``, ``{"response": {"error": {…}}}`` or the body itself."""
    if not isinstance(body, Mapping):
        return None
    err = body.get("error")
    if isinstance(err, Mapping):
        return err
    resp = body.get("response")
    if isinstance(resp, Mapping) and isinstance(resp.get("error"), Mapping):
        return cast(Mapping[str, Any], resp["error"])
    return body


def _code_token(value: object) -> str:
    return value.strip().lower().replace("-", "_") if isinstance(value, str) else ""


def is_usage_limit_error(status: int, body: Mapping[str, Any] | None) -> bool:
    """True when the body carries ``usage_limit_reached`` as its error ``type`` or ``code``.

    Any HTTP status qualifies; only structured fields count — the ``message`` prose is never read.
    ``usage-limit-reached`` is normalised to ``usage_limit_reached``.
    """
    del status  # evidence is the structured type/code, whatever the status
    err = _error_object(body)
    if err is None:
        return False
    return SOURCE_USAGE_LIMIT in (_code_token(err.get("type")), _code_token(err.get("code")))


def windows_from_error(
    status: int,
    body: Mapping[str, Any] | None,
    headers: Mapping[str, str] | None,
    *,
    now: int,
) -> list[Window]:
    """Windows of an error response: its headers plus one exhausted window for a usage-limit error.

    The usage-limit window has ``used_percent`` 100, source ``usage_limit_reached`` and its reset
    from ``resets_at`` (Unix s) or else ``resets_in_seconds``. It takes the name/minutes of a header
    window of the active family that is at ≥ 100 % (preferring one with the same reset), and is
    dropped as a duplicate when such a header window has the same reset. ``x-codex-active-limit``
    picks the family; a non-``codex`` family is model-scoped (not credential-wide).
    """
    h = _lower(headers or {})
    out = windows_from_headers(h, now=now)
    if not is_usage_limit_error(status, body):
        return out
    err = _error_object(body) or {}
    resets: int | None = None
    at = _num(err.get("resets_at"))
    within = _num(err.get("resets_in_seconds"))
    if at is not None and at > 0:
        resets = _epoch_to_ms(at)
    elif within is not None and within >= 0:
        resets = now + int(round(within * 1000))
    active = _code_token(h.get("x-codex-active-limit")) or CODEX_MAIN_LIMIT
    main = active == CODEX_MAIN_LIMIT
    full = [
        w
        for w in out
        if w.source == SOURCE_CODEX_HEADERS
        and w.limit_id == active
        and w.used_percent is not None
        and w.used_percent >= 100
    ]
    # Same reset within a second (headers and body are both second-granular) ⇒ same window.
    same = [w for w in full if resets is not None and w.resets_at_ms is not None]
    same = [w for w in same if abs(cast(int, w.resets_at_ms) - cast(int, resets)) <= 1000]
    if same:
        return out
    like = full[0] if full else None
    out.append(
        Window(
            name=like.name if like else "custom",
            used_percent=100.0,
            window_minutes=like.window_minutes if like else None,
            resets_at_ms=resets,
            observed_at_ms=now,
            source=SOURCE_USAGE_LIMIT,
            limit_id=active,
            informational=not main,
            whole_credential=main,
        )
    )
    return out


def _obj_window(obj: object, *, now: int, source: str, limit_id: str, main: bool) -> Window | None:
    """One window from a snapshot object (snake_case, camelCase or wham ``*_window`` shapes)."""
    if not isinstance(obj, Mapping):
        return None
    used = _num(obj.get("used_percent", obj.get("usedPercent")))
    if used is None:
        return None
    minutes_f = _num(obj.get("window_minutes", obj.get("windowDurationMins")))
    if minutes_f is None:
        secs = _num(obj.get("limit_window_seconds"))
        minutes_f = None if secs is None else secs / 60
    minutes = int(minutes_f) if minutes_f and minutes_f > 0 else None
    resets: int | None = None
    for key in ("reset_at", "resets_at", "resetsAt"):
        at = _num(obj.get(key))
        if at is not None and at > 0:
            resets = _epoch_to_ms(at)
            break
    if resets is None:
        for key in ("resets_in_seconds", "reset_after_seconds"):
            after = _num(obj.get(key))
            if after is not None and after > 0:
                resets = now + int(round(after * 1000))
                break
    if used == 0 and minutes is None and resets is None:
        return None
    return Window(
        name=window_name(minutes),
        used_percent=used,
        window_minutes=minutes,
        resets_at_ms=resets,
        observed_at_ms=now,
        source=source,
        limit_id=limit_id,
        informational=not main,
        whole_credential=main,
    )


def windows_from_event(event_json: Mapping[str, Any], *, now: int) -> list[Window]:
    """Windows from a ``codex.rate_limits`` stream event (``rate_limits.primary/secondary``).

    Accepts ``reset_at`` (the event's spelling), ``resets_at`` and ``resets_in_seconds``. The
    family is ``metered_limit_name`` (default ``codex``); other families are model-scoped. Any other
    event type yields ``[]``.
    """
    if event_json.get("type") != "codex.rate_limits":
        return []
    limits = event_json.get("rate_limits")
    if not isinstance(limits, Mapping):
        return []
    raw_id = event_json.get("metered_limit_name") or event_json.get("limit_id")
    limit_id = _code_token(raw_id) or CODEX_MAIN_LIMIT
    main = limit_id == CODEX_MAIN_LIMIT
    out: list[Window] = []
    for slot in ("primary", "secondary", "tertiary"):
        w = _obj_window(
            limits.get(slot), now=now, source=SOURCE_CODEX_EVENT, limit_id=limit_id, main=main
        )
        if w is not None:
            out.append(w)
    return out


# --------------------------------------------------------------------------------------------
# Evidence helpers


def _applies(w: Window) -> bool:
    return w.scope == "inference" and w.whole_credential


def is_exhausted(window: Window, *, now: int) -> bool:
    """Structured evidence that ``window`` blocks its credential now.

    A credential-wide inference window that is a usage-limit error, or at ≥ 100 % with a reset
    strictly in the future. A past or missing reset is not evidence (it never blocks forever).
    """
    if not _applies(window):
        return False
    if window.source == SOURCE_USAGE_LIMIT:
        return True
    return (
        window.used_percent is not None
        and window.used_percent >= 100
        and window.resets_at_ms is not None
        and window.resets_at_ms > now
    )


def _still_full(window: Window) -> bool:
    """A probe response showing a credential-wide window at 100 % means still limited."""
    return _applies(window) and (
        window.source == SOURCE_USAGE_LIMIT
        or (window.used_percent is not None and window.used_percent >= 100)
    )


def soonest_reset(
    windows: Iterable[Window], *, now: int, max_age_ms: int = FRESHNESS_MS
) -> int | None:
    """Earliest future reset (absolute ms) for the ``reset-window`` strategy, or None.

    Only fresh windows count (``now − observed_at ≤ max_age_ms``; exactly 30 min is still fresh),
    only credential-wide inference windows, never informational ones, and only resets ``> now``.
    The strategy's score is ``soonest_reset − now`` (+∞ for None).
    """
    best: int | None = None
    for w in windows:
        if not _applies(w) or w.informational or now - w.observed_at_ms > max_age_ms:
            continue
        if w.resets_at_ms is None or w.resets_at_ms <= now:
            continue
        if best is None or w.resets_at_ms < best:
            best = w.resets_at_ms
    return best


def credential_fingerprint(secret: str) -> str:
    """A short, stable, non-reversible fingerprint (16 hex chars of a domain-separated sha256).

    Safe to log and store; raises ``ValueError`` for an empty secret so anonymous callers never
    share one state.
    """
    if not secret:
        raise ValueError("empty credential")
    return hashlib.sha256(b"ocx-credential-v1\x00" + secret.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# State machine


def recovery_at(state: CredentialQuota) -> int | None:
    """When a limited credential may be probed: the LAST reset of all exhausted windows (strict)."""
    times = [w.resets_at_ms for w in state.exhausted if w.resets_at_ms is not None]
    if state.hold_until_ms is not None:
        times.append(state.hold_until_ms)
    return max(times) if times else None


def next_change_at(state: CredentialQuota) -> int | None:
    """Next probe/reset time for status: recovery time when limited, lease end when probing."""
    if state.status == "limited":
        return recovery_at(state)
    if state.status == "probing":
        return state.probe_lease_until_ms
    return None


def _to(
    state: CredentialQuota, to: Status, reason: str, *, now: int, **changes: Any
) -> tuple[CredentialQuota, Transition]:
    t = Transition(from_status=state.status, to_status=to, reason=reason, at_ms=now)
    return replace(state, status=to, last_transition=t, **changes), t


def _hold(windows: Sequence[Window], *, now: int, unknown_reset_ms: int) -> int | None:
    """A not-before time when some exhausted window has no usable future reset."""
    unknown = any(w.resets_at_ms is None or w.resets_at_ms <= now for w in windows)
    return now + unknown_reset_ms if unknown else None


def _merge(old: Sequence[Window], new: Sequence[Window]) -> tuple[Window, ...]:
    """New evidence replaces old windows of the same (limit, name, source); others are kept."""

    def key(w: Window) -> tuple[str, str, str]:
        return (w.limit_id, w.name, w.source)

    fresh = {key(w) for w in new}
    return tuple(w for w in old if key(w) not in fresh) + tuple(new)


def _limit(
    state: CredentialQuota,
    full: Sequence[Window],
    *,
    now: int,
    unknown_reset_ms: int,
    reason: str,
) -> tuple[CredentialQuota, Transition | None]:
    hold = _hold(full, now=now, unknown_reset_ms=unknown_reset_ms)
    if state.status == "limited":
        # Already limited: fold in the new resets; strict recovery keeps older windows too.
        holds = [h for h in (state.hold_until_ms, hold) if h is not None]
        merged = replace(
            state,
            exhausted=_merge(state.exhausted, full),
            hold_until_ms=max(holds) if holds else None,
        )
        return merged, None
    return _to(
        state,
        "limited",
        reason,
        now=now,
        exhausted=tuple(full),
        hold_until_ms=hold,
        probe_lease_until_ms=None,
    )


def observe(
    state: CredentialQuota,
    windows: Iterable[Window],
    *,
    now: int,
    unknown_reset_ms: int = DEFAULT_UNKNOWN_RESET_MS,
) -> tuple[CredentialQuota, Transition | None]:
    """Fold observed windows (headers or a ``codex.rate_limits`` event) into the state.

    Enters/extends ``limited`` only on structured evidence (:func:`is_exhausted`). Never restores:
    non-exhausted windows while limited or probing change nothing (recovery needs a probe success).
    ``unknown_reset_ms`` bounds a usage-limit error without a usable reset.
    """
    full = [w for w in windows if is_exhausted(w, now=now)]
    if not full:
        return state, None
    reason = REASON_PROBE_STILL_LIMITED if state.status == "probing" else REASON_LIMIT_REACHED
    return _limit(state, full, now=now, unknown_reset_ms=unknown_reset_ms, reason=reason)


def observe_success(
    state: CredentialQuota,
    windows: Iterable[Window] = (),
    *,
    now: int,
    unknown_reset_ms: int = DEFAULT_UNKNOWN_RESET_MS,
) -> tuple[CredentialQuota, Transition | None]:
    """A successful response (with its windows). Completes a probe: ``probing → available`` when no
    credential-wide window is still at 100 %, otherwise ``→ limited`` with the new resets. A success
    while ``limited`` (a request started before the limit) does not restore."""
    ws = list(windows)
    if state.status == "probing":
        full = [w for w in ws if _still_full(w)]
        if full:
            return _limit(
                state,
                full,
                now=now,
                unknown_reset_ms=unknown_reset_ms,
                reason=REASON_PROBE_STILL_LIMITED,
            )
        return _to(
            state,
            "available",
            REASON_AVAILABLE,
            now=now,
            exhausted=(),
            hold_until_ms=None,
            probe_lease_until_ms=None,
        )
    return observe(state, ws, now=now, unknown_reset_ms=unknown_reset_ms)


def observe_failure(
    state: CredentialQuota,
    windows: Iterable[Window] = (),
    *,
    now: int,
    unknown_reset_ms: int = DEFAULT_UNKNOWN_RESET_MS,
    probe_backoff_ms: int = DEFAULT_PROBE_BACKOFF_MS,
) -> tuple[CredentialQuota, Transition | None]:
    """A failed response (windows from :func:`windows_from_error`). Quota evidence limits from any
    state; a failed probe without new evidence returns to ``limited`` with its old windows and a
    ``probe_backoff_ms`` hold. Other failures of an available credential change nothing (cooldowns
    are the combo engine's business)."""
    ws = list(windows)
    if state.status == "probing":
        full = [w for w in ws if _still_full(w)]
        if full:
            return _limit(
                state,
                full,
                now=now,
                unknown_reset_ms=unknown_reset_ms,
                reason=REASON_PROBE_STILL_LIMITED,
            )
        return _to(
            state,
            "limited",
            REASON_PROBE_FAILED,
            now=now,
            hold_until_ms=now + probe_backoff_ms,
            probe_lease_until_ms=None,
        )
    return observe(state, ws, now=now, unknown_reset_ms=unknown_reset_ms)


def eligibility(state: CredentialQuota, *, now: int) -> Eligibility:
    """``eligible`` (available), ``ineligible`` (limited before the last reset, or a live probe
    lease), or ``probe`` (the caller may try :func:`acquire_probe`)."""
    if state.status == "available":
        return "eligible"
    if state.status == "limited":
        at = recovery_at(state)
        return "ineligible" if at is not None and now < at else "probe"
    lease = state.probe_lease_until_ms
    return "ineligible" if lease is not None and now < lease else "probe"


def acquire_probe(
    state: CredentialQuota, *, now: int, lease_ms: int
) -> tuple[CredentialQuota, bool]:
    """Try to become the single probe.

    Returns ``(state, True)`` for an available credential (no probe needed) or when the lease is
    granted (``→ probing``, lease ``now + lease_ms``; a lost probe's expired lease may be
    re-granted), ``(state, False)`` otherwise. Store the new state with compare-and-set so only one
    caller wins.
    """
    verdict = eligibility(state, now=now)
    if verdict == "eligible":
        return state, True
    if verdict == "ineligible":
        return state, False
    lease = now + lease_ms
    if state.status == "probing":
        return replace(state, probe_lease_until_ms=lease), True
    new, _ = _to(state, "probing", REASON_PROBE_STARTED, now=now, probe_lease_until_ms=lease)
    return new, True


def transition_message(transition: Transition, *, primary: str, fallback: str) -> str:
    """The concise user-facing wording of PRODUCT §8.6 (provider ids only, never credentials)."""
    frm, to = transition.from_status, transition.to_status
    if to == "available":
        return f'Primary provider quota is available again; switched back to "{primary}".'
    if to == "limited" and frm == "available":
        return f'Primary provider usage limit reached; switched to "{fallback}".'
    if to == "limited":
        return f'Primary provider is still limited; staying on "{fallback}".'
    return f'Primary provider quota windows have reset; probing "{primary}".'
