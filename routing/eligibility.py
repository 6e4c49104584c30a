"""The state of one combo target right now: the single eligibility rule (PRODUCT §8.7).

`target_state` is the one function that says whether a target may be picked and why not. The
selector (`strategies.assess`, hence every request), `/api/status`, `ocx status`, the admin
badges and "Needs attention" all derive from it, so what they show is what the router does.

States, in precedence order (the first that applies is shown):
`pinned` (the combo's manual override), `disabled` (provider disabled or missing),
`no_credential`, `out_of_quota` (until, for one credential), `cooling` (until, reason),
`probing` (a half-open or quota probe is in flight elsewhere), `available`.

`skip` is the router's own verdict: None when the target may be picked now, else the skip
reason the request log records. It keeps the selector's check order (provider, credential,
quota, override, cooldown, probe), so it may name a different cause than `state` when several
apply (e.g. a pinned target whose provider is disabled is `pinned` and skipped as
`provider_disabled`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from routing import envpolicy
from routing.state import ComboState
from routing.types import ProviderSpec, TargetSpec

State = Literal[
    "pinned", "disabled", "no_credential", "out_of_quota", "cooling", "probing", "available"
]
STATES: tuple[State, ...] = (
    "pinned",
    "disabled",
    "no_credential",
    "out_of_quota",
    "cooling",
    "probing",
    "available",
)

# Quota of the caller's credential on a target: no data ever seen, available, limited (until
# a recovery time), recovery due (a probe may be tried), or a probe in flight elsewhere.
Quota = Literal["none", "available", "limited", "probe_due", "probing"]

SKIP_PROVIDER_MISSING = "provider_missing"
SKIP_PROVIDER_DISABLED = "provider_disabled"
SKIP_CREDENTIAL = "credential_missing"
SKIP_QUOTA_EXHAUSTED = "quota_exhausted"
SKIP_QUOTA_PROBING = "quota_probing"
SKIP_OVERRIDE = "override"
SKIP_COOLING = "cooling"
SKIP_PROBING = "probing"
# Skips that hold whatever the request or the wait does (checked before the caller predicate).
HARD_SKIPS = (SKIP_PROVIDER_MISSING, SKIP_PROVIDER_DISABLED)


@dataclass(frozen=True)
class Access:
    """What the caller brings to one target: its credential and that credential's quota.

    `missing`: why no credential resolves (names an environment variable, never a value), None
    when one does. `credential`: the fingerprint whose quota applies. `quota_until`: the
    recovery time when limited, the lease end while probing. `probe_granted`: this caller holds
    the quota probe lease (for a status view: the next request would take it)."""

    missing: str | None = None
    credential: str | None = None
    quota: Quota = "none"
    quota_until: int | None = None
    probe_granted: bool = False


RESOLVED = Access()
AccessOf = Callable[[TargetSpec], Access]


@dataclass(frozen=True)
class TargetState:
    """One target's state. `until`: when it ends (epoch ms) for out_of_quota, cooling and
    probing. `reason`: the cooldown's classification when known. `credential`: the quota
    fingerprint an out_of_quota state is for. `detail`: one human line (never a secret)."""

    target: str
    state: State
    skip: str | None = None
    until: int | None = None
    reason: str | None = None
    credential: str | None = None
    detail: str | None = None

    @property
    def eligible(self) -> bool:
        return self.skip is None


@functools.lru_cache(maxsize=4096)
def _available(key: str, fresh: bool) -> TargetState:
    return TargetState(key, "available", None, detail="no quota data yet" if fresh else None)


def forwards_caller_credential(provider: ProviderSpec) -> bool:
    """True when `provider` authenticates with the caller's own credential (`chatgpt`), never a
    stored one: a refusal of that credential is the caller's, not the target's (issue #26)."""
    return provider.adapter == "chatgpt"


def callers_credential_refused(status: int | None, code: str) -> bool:
    """A caller-forward upstream refused the caller's credential: 401, 403 or `invalid_api_key`
    (`code` is `classify.classifier_code` of the failure)."""
    return status in (401, 403) or code == "invalid_api_key"


def callers_rate_limit(status: int | None, reason: str) -> bool:
    """A caller-forward upstream's rate or usage limit (a 429, `rate_limited`, `usage_limit`):
    the caller's account's, held for that caller on that target only (issue #43)."""
    return status == 429 or reason in ("rate_limited", "usage_limit")


def credential_problem(
    provider: ProviderSpec, secret: str | None, *, caller_token: bool
) -> str | None:
    """Why `provider` has no credential for this caller (None when it has one).

    `secret` is the provider's own resolved key (`combos.selectors.credential_for`);
    `caller_token` says whether the caller sent its own bearer (only `chatgpt` uses it)."""
    if provider.adapter == "chatgpt":
        return None if caller_token else "caller ChatGPT token"
    if secret is None:
        if provider.api_key_env and envpolicy.refusal(provider.api_key_env) is not None:
            return "apiKeyEnv refused by the server's policy (see ocx doctor)"
        if provider.api_key_env:
            return f"environment variable {provider.api_key_env} is not set"
        if provider.adapter != "openai-chat" or provider.api_key is not None:
            return "no API key stored"
        # A local OpenAI-compatible server (e.g. Ollama) may need no key at all.
    return None


def target_state(
    target: TargetSpec,
    *,
    providers: Mapping[str, ProviderSpec],
    state: ComboState,
    now: int,
    override: str | None = None,
    access: Access = RESOLVED,
    reasons: Mapping[str, str] | None = None,
) -> TargetState:
    """The state of `target` at `now` (see the module doc for the precedence and `skip`).

    `state` is the combo's routing state (cooldowns, half-open leases), `override` the combo's
    pin, `access` the caller's credential and quota for this target, `reasons` the known
    cooldown classifications by target key."""
    key = target.key
    provider = providers.get(target.provider)
    if (
        override is None
        and provider is not None
        and not provider.disabled
        and access.missing is None
        and (access.quota == "none" or access.quota == "available")
        and key not in state.cooldowns
        and key not in state.probes
    ):
        # The common case on the hot path: nothing applies, one shared value per target.
        return _available(key, access.quota == "none")
    pinned = override == key
    unusable = _unusable(target, provider, access, pinned)
    if unusable is not None:
        return unusable
    if pinned:
        # A manual pin bypasses quota, cooldowns and probes (no automatic switching, §8.5).
        return TargetState(key, "pinned", None, detail="every request goes here (manual pin)")
    return _held_off(key, state=state, now=now, override=override, access=access, reasons=reasons)


def _unusable(
    target: TargetSpec, provider: ProviderSpec | None, access: Access, pinned: bool
) -> TargetState | None:
    """A target no request can use: its provider missing or disabled, or no credential."""
    key = target.key
    skip: str | None = None
    shown: State | None = "pinned" if pinned else None
    detail: str | None = None

    def show(name: State) -> None:
        nonlocal shown
        if shown is None:
            shown = name

    if provider is None:
        skip = SKIP_PROVIDER_MISSING
        detail = f"provider {target.provider} is not configured"
        show("disabled")
    elif provider.disabled:
        skip = SKIP_PROVIDER_DISABLED
        detail = f"provider {provider.name} is disabled"
        show("disabled")
    elif access.missing is not None:
        skip = f"{SKIP_CREDENTIAL}: {access.missing}"
        detail = f"no credential: {access.missing}" if pinned else access.missing
        show("no_credential")
    if skip is not None:
        if pinned:
            detail = f"pinned, but {detail}"
        return TargetState(key, shown or "available", skip, detail=detail)
    return None


def _held_off(
    key: str,
    *,
    state: ComboState,
    now: int,
    override: str | None,
    access: Access,
    reasons: Mapping[str, str] | None,
) -> TargetState:
    """A usable, unpinned target: held off by its quota, a cooldown, a probe or another
    target's pin, or available (with what the status pages say of it)."""
    skip: str | None = None
    shown: State | None = None
    until: int | None = None
    credential: str | None = None
    detail: str | None = None

    def show(name: State) -> None:
        nonlocal shown
        if shown is None:
            shown = name

    quota = access.quota
    if quota == "limited":
        skip = SKIP_QUOTA_EXHAUSTED
        until, credential = access.quota_until, access.credential
        show("out_of_quota")
    elif quota == "probing" or (quota == "probe_due" and not access.probe_granted):
        skip = SKIP_QUOTA_PROBING
        detail = "quota recovery probe in flight"
    elif quota == "probe_due":
        detail = "quota recovery probe (the next request tries it)"
    if skip is None and override is not None:
        skip = SKIP_OVERRIDE
    cooling = state.cooling_until(key, now)
    reason: str | None = None
    if cooling is not None:
        show("cooling")
        if shown == "cooling":
            until = cooling
            reason = (reasons or {}).get(key)
        skip = skip or SKIP_COOLING
    elif state.probe_held(key, now):
        show("probing")
        if shown == "probing":
            until, detail = state.probes.get(key), "half-open probe in flight"
        skip = skip or SKIP_PROBING
    if skip == SKIP_QUOTA_PROBING:
        show("probing")
        if shown == "probing" and until is None:
            until = access.quota_until
    if shown is None and quota == "none":
        detail = "no quota data yet"
    elif shown is None and state.is_half_open(key, now):
        detail = "half-open: the next request probes it"
    if skip == SKIP_OVERRIDE and shown is None:
        detail = f"not used while the combo is pinned to {override}"
    return TargetState(
        key,
        shown or "available",
        skip,
        until=until,
        reason=reason,
        credential=credential,
        detail=detail,
    )
