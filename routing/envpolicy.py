"""Which environment variables a provider's `apiKeyEnv` may name (issue #26, point 4).

A provider's key read from the environment is sent to that provider's URL, which staff choose:
an `apiKeyEnv` naming the server's own configuration (the database URL with its password, the
secret key) would send it there. Refused always: `DATABASE_URL`, `REDIS_URL`, every `OCX_*`,
`DJANGO_*` and `PG*` variable (libpq reads `PGPASSWORD` and its siblings, issue #43); also the
names in `OCX_PROVIDER_ENV_DENY`; and, when `OCX_PROVIDER_ENV_ALLOW` is set, every name that
starts with none of its prefixes. Names are compared case-insensitively. The one check for every
path (`routing.validate_providers._validate_provider`) and for stored providers at dispatch
(`combos.selectors.credential_for`) and in `ocx doctor`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

ALWAYS_DENIED = frozenset({"DATABASE_URL", "REDIS_URL"})
DENIED_PREFIXES = ("OCX_", "DJANGO_", "PG")


@dataclass(frozen=True)
class EnvPolicy:
    deny: frozenset[str] = frozenset()
    allow: tuple[str, ...] = ()  # prefixes; empty = no allow-list

    @classmethod
    def of(cls, deny: Iterable[str] = (), allow: Iterable[str] = ()) -> EnvPolicy:
        return cls(frozenset(d.upper() for d in deny), tuple(a.upper() for a in allow))


_active = EnvPolicy()


def configure(policy: EnvPolicy) -> None:
    """Set the policy from the settings (`ocxsite.apps`, at startup)."""
    global _active
    _active = policy


def active() -> EnvPolicy:
    return _active


def refusal(name: str, policy: EnvPolicy | None = None) -> str | None:
    """Why `apiKeyEnv: name` is refused, or None when it may be used."""
    return _refusal(name, _active if policy is None else policy)


@functools.lru_cache(maxsize=1024)
def _refusal(name: str, policy: EnvPolicy) -> str | None:
    upper = name.upper()
    if upper in ALWAYS_DENIED or upper.startswith(DENIED_PREFIXES) or upper in policy.deny:
        return "apiKeyEnv may not name the server's own configuration"
    if policy.allow and not upper.startswith(policy.allow):
        return "apiKeyEnv must start with one of OCX_PROVIDER_ENV_ALLOW: " + ", ".join(policy.allow)
    return None
