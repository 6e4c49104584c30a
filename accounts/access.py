"""Client keys (`ocx_…`) and management tokens (`ocxm_…`): create, verify, revoke.

Only SHA-256 digests are stored; the secret is returned once, at creation.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import ClientKey, ManagementToken
from providers.services import keys_bump
from usage.budgets import ScopedBudget, scoped_budgets

CLIENT_PREFIX = "ocx_"
MGMT_PREFIX = "ocxm_"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class KeyInfo:
    """What the hot path needs to know about a verified client key."""

    id: int
    prefix: str
    user: str
    allowed_models: frozenset[str]
    rpm_limit: int | None
    # The key's own budgets, then its user's (usage.budgets); empty costs nothing per request.
    budgets: tuple[ScopedBudget, ...] = ()


class KeyOwnerError(Exception):
    """The user a new key is for cannot hold one; `code` is the API's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def client_key_create(
    *,
    username: str,
    name: str = "",
    allowed_models: list[str] | None = None,
    rpm_limit: int | None = None,
    budgets: list[dict[str, object]] | None = None,
    create_user: bool = True,
) -> tuple[ClientKey, str]:
    """Mint a key for `username`. An unknown user is created (a key-only user) when
    `create_user`, else refused; a deactivated user gets no key (KeyOwnerError either way)."""
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.filter(username=username).first()
        if user is None:
            if not create_user:
                raise KeyOwnerError(
                    "user_unknown",
                    f"no user {username}: create it with `ocx user create {username}` "
                    "(or pass --create-user)",
                )
            # A user created here logs in only once given a password (`ocx user create`).
            user = user_model.objects.create(username=username, password=make_password(None))
        elif not user.is_active:
            raise KeyOwnerError(
                "user_inactive",
                f"user {username} is deactivated: reactivate it with `ocx user activate "
                f"{username}` before giving it a key",
            )
        secret = CLIENT_PREFIX + secrets.token_urlsafe(32)
        key = ClientKey(
            user=user,
            name=name,
            prefix=secret[:10],
            digest=digest(secret),
            allowed_models=sorted(set(allowed_models or [])),
            rpm_limit=rpm_limit,
            budgets=list(budgets or []),  # validated by full_clean (usage.budgets)
        )
        key.full_clean()
        key.save()
    return key, secret


def client_key_revoke(*, key_id: int) -> bool:
    return client_keys_revoke(keys=ClientKey.objects.filter(pk=key_id)) == 1


def client_keys_revoke(*, keys: QuerySet[ClientKey]) -> int:
    """Revoke the unrevoked keys among `keys`; returns how many. An update sends no signal,
    hence the explicit bump."""
    with transaction.atomic():
        count = keys.filter(revoked__isnull=True).update(revoked=timezone.now())
        if count:
            keys_bump()
    return count


def keys_changed(sender: object, **kwargs: object) -> None:
    """Receiver for saves and deletes of client keys and users (connected in `apps.py`): bump
    the key-table version so every worker reloads its key map within a poll interval."""
    if kwargs.get("update_fields") == frozenset({"last_login"}):
        return  # a login changes nothing the proxy reads
    keys_bump()


def client_keys_active() -> dict[str, KeyInfo]:
    """digest → KeyInfo for every unrevoked key (the proxy caches this map)."""
    return {
        k.digest: KeyInfo(
            id=k.pk,
            prefix=k.prefix,
            user=k.user.get_username(),
            allowed_models=frozenset(k.allowed_models or ()),
            rpm_limit=k.rpm_limit,
            budgets=scoped_budgets(k),
        )
        for k in ClientKey.objects.filter(
            revoked__isnull=True, user__is_active=True
        ).select_related("user", "user__ocx_budget")
    }


def mgmt_token_create(*, username: str, name: str = "") -> tuple[ManagementToken, str]:
    user_model = get_user_model()
    with transaction.atomic():
        # A user created here logs in only once given a password (`ocx user create`).
        user, _ = user_model.objects.get_or_create(
            username=username, defaults={"password": make_password(None)}
        )
        if not user.is_staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
        secret = MGMT_PREFIX + secrets.token_urlsafe(32)
        token = ManagementToken(user=user, name=name, prefix=secret[:11], digest=digest(secret))
        token.full_clean()
        token.save()
    return token, secret


def mgmt_token_revoke(*, token_id: int) -> bool:
    """Revoke one management token; False when there is no unrevoked token `token_id`. The
    next request with it is refused (tokens are looked up on every request, not cached)."""
    return bool(
        ManagementToken.objects.filter(pk=token_id, revoked__isnull=True).update(
            revoked=timezone.now()
        )
    )


def mgmt_user_for(secret: str) -> AbstractBaseUser | None:
    """The active staff user owning this management token, or None."""
    bootstrap = settings.OCX_ADMIN_TOKEN
    # Bytes: compare_digest refuses a str with non-ASCII characters (a header may carry any).
    if bootstrap and secrets.compare_digest(secret.encode(), bootstrap.encode()):
        return _bootstrap_admin()
    if not secret.startswith(MGMT_PREFIX):
        return None
    token = (
        ManagementToken.objects.select_related("user")
        .filter(digest=digest(secret), revoked__isnull=True)
        .first()
    )
    if token is None or not token.user.is_active or not token.user.is_staff:
        return None
    return token.user


def _bootstrap_admin() -> AbstractBaseUser:
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    if not created and not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    return user
