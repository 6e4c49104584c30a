"""The caller's credentials on a target: the (provider, fingerprint) pair whose quota applies, the
secrets a request masks, and the `Access` that `eligibility.target_state` reads."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from combos.selectors import credential_for
from providers.masking import Masker, bearer_value
from providers.upstream import Caller
from quota.tracker import Gate
from quota.windows import (
    credential_fingerprint,
)
from routing.eligibility import (
    RESOLVED,
    Access,
    Quota,
    credential_problem,
)
from routing.types import ConfigSnapshot, TargetSpec

# The quota gate's verdict per credential, as the target state reads it.
_QUOTA: Mapping[str, Quota] = {
    "eligible": "available",
    "ineligible": "limited",
    "probe": "probe_due",
}


def credential_pair(
    snapshot: ConfigSnapshot, target: TargetSpec, caller: Caller
) -> tuple[str, str] | None:
    """(provider, credential fingerprint) whose quota applies to this request on `target`."""
    provider = snapshot.providers.get(target.provider)
    if provider is None:
        return None
    if provider.adapter == "chatgpt":
        # Every ChatGPT account has its own windows: the caller's own token decides.
        secret = caller.headers.get("authorization", "") + caller.headers.get(
            "chatgpt-account-id", ""
        )
    else:
        secret = credential_for(provider) or ""
    return (provider.name, fingerprint(secret)) if secret else None


def request_masker(snapshot: ConfigSnapshot, forwarded: Mapping[str, str]) -> Masker:
    """Every credential value this request could meet: the config's keys, the caller's token."""
    return Masker(
        functools.partial(config_secrets, snapshot),
        functools.partial(bearer_value, forwarded.get("authorization")),
    )


# The config's credential values, read once per snapshot: every request masks (issue #43).
_secrets_of: list[tuple[ConfigSnapshot, tuple[str | None, ...]]] = []


def config_secrets(snapshot: ConfigSnapshot) -> tuple[str | None, ...]:
    if _secrets_of and _secrets_of[0][0] is snapshot:
        return _secrets_of[0][1]
    found = tuple(credential_for(p) for p in snapshot.providers.values())
    _secrets_of[:] = [(snapshot, found)]
    return found


@functools.lru_cache(maxsize=4096)
def fingerprint(secret: str) -> str:
    return credential_fingerprint(secret)


def target_access(
    snapshot: ConfigSnapshot,
    target: TargetSpec,
    caller: Caller,
    gate: Gate,
    pair: tuple[str, str] | None,
) -> Access:
    """The caller's credential and its quota on `target`, for `eligibility.target_state`."""
    provider = snapshot.providers.get(target.provider)
    if provider is None:
        return RESOLVED
    secret = None if provider.adapter == "chatgpt" else credential_for(provider)
    missing = credential_problem(provider, secret, caller_token="authorization" in caller.headers)
    if pair is None or pair not in gate.verdicts:
        return Access(missing=missing, credential=None if pair is None else pair[1])
    return Access(
        missing=missing,
        credential=pair[1],
        quota=_QUOTA[gate.verdicts[pair]],
        quota_until=gate.recovery.get(pair),
        probe_granted=pair in gate.probes,
    )
