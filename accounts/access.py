"""Client keys (`ocx_…`) and management tokens (`ocxm_…`): create, verify, revoke.

Only SHA-256 digests are stored; the secret is returned once, at creation.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import math
import secrets
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.models import ClientKey, ManagementToken, TeamProfile, UserBudget
from audit import trail
from providers.services import keys_bump
from usage.budgets import ScopedBudget, scoped_budgets, stored_budgets

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
    # The owner's pk: a user write replaces the entries of that user's keys.
    user_id: int = 0
    # False: the owner is deactivated (the proxy answers 401 user_inactive, not "invalid key").
    user_active: bool = True
    # Epoch seconds from which this secret is refused (401 key_expired): the key's expiry, or
    # for a rotated key's previous secret the end of its grace period. One float comparison.
    expires_at: float = math.inf
    # True: this entry is the previous secret of a rotated key (the message says so).
    previous: bool = False
    # (team name, its allowedModels) of each team of the owner that narrows models.
    team_models: tuple[tuple[str, frozenset[str]], ...] = ()


def model_refusal(key: KeyInfo, model: str) -> str | None:
    """Why `key` may not use `model` (the 403 model_not_allowed message), or None.

    The key's own list, when it has one, must name the model exactly; so must the list of every
    team of its user that has one (an intersection: a team narrows, never widens)."""
    if key.allowed_models and model not in key.allowed_models:
        return f"This key may not use model {model}"
    for team, allowed in key.team_models:
        if model not in allowed:
            return f"This key may not use model {model} (team {team} does not allow it)"
    return None


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
    expires: dt.datetime | None = None,
) -> tuple[ClientKey, str]:
    """Mint a key for `username`. An unknown user is created (a key-only user) when
    `create_user`, else refused; a deactivated user gets no key (KeyOwnerError either way).
    A past `expires` is the caller's to refuse (`accounts.expiry.future_expiry`)."""
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
        secret = _client_secret()
        key = ClientKey(
            user=user,
            name=name,
            prefix=secret[:10],
            digest=digest(secret),
            allowed_models=sorted(set(allowed_models or [])),
            rpm_limit=rpm_limit,
            budgets=list(budgets or []),  # validated by full_clean (usage.budgets)
            expires=expires,
        )
        key.full_clean()
        key.save()
    return key, secret


def _client_secret() -> str:
    return CLIENT_PREFIX + secrets.token_urlsafe(32)


def client_key_rotate(
    *, key_id: int, grace: dt.timedelta = dt.timedelta(0), now: dt.datetime | None = None
) -> tuple[ClientKey, str]:
    """Give an unrevoked key a new secret, returned once. The row stays (same id, user, name,
    budgets, limits, allowed models, expiry and budget counters); the old secret keeps working
    for `grace` (0: not at all), then gets 401 key_expired. A secret still in its grace from an
    earlier rotation stops at once: only the latest previous secret is kept.

    Raises ClientKey.DoesNotExist for an unknown or revoked key."""
    now = now or timezone.now()
    with transaction.atomic():
        key = ClientKey.objects.select_for_update().get(pk=key_id, revoked__isnull=True)
        secret = _client_secret()
        key.previous_digest = key.digest
        key.previous_until = now + grace
        key.rotated = now
        key.digest = digest(secret)
        key.prefix = secret[:10]
        key.full_clean()
        key.save()  # the post_save receiver bumps the key table: every worker reloads it
    return key, secret


def client_key_revoke(*, key_id: int) -> bool:
    return client_keys_revoke(keys=ClientKey.objects.filter(pk=key_id)) == 1


def client_keys_revoke(*, keys: QuerySet[ClientKey]) -> int:
    """Revoke the unrevoked keys among `keys`; returns how many. An update sends no signal,
    hence the explicit bump."""
    with transaction.atomic():
        # The ids first: the notice names them (an admin queryset may be DISTINCT, which
        # cannot be locked; a key revoked meanwhile is only re-read by the workers).
        ids = list(keys.filter(revoked__isnull=True).values_list("pk", flat=True))
        for pk in ids:
            trail.touch("key", pk)  # an update sends no signal: the audit trail is told
        count = ClientKey.objects.filter(pk__in=ids, revoked__isnull=True).update(
            revoked=timezone.now()
        )
        if count:
            keys_bump(("key", str(pk)) for pk in ids)
    return count


def keys_changed(sender: object, **kwargs: object) -> None:
    """Receiver for saves and deletes of client keys, user budgets and users (connected in
    `apps.py`): bump the key-table version, naming what changed, so every worker updates
    those entries of its key map."""
    if kwargs.get("update_fields") == frozenset({"last_login"}):
        return  # a login changes nothing the proxy reads
    instance = kwargs.get("instance")
    if isinstance(instance, ClientKey):
        keys_bump([("key", str(instance.pk))])
    elif isinstance(instance, UserBudget):
        keys_bump([("user", str(instance.user_id))])
    elif isinstance(instance, get_user_model()):
        keys_bump([("user", str(instance.pk))])
    else:
        keys_bump()


def client_keys_active(
    *,
    key_ids: Collection[int] = (),
    user_ids: Collection[int] = (),
    every: bool = True,
    inactive_users: bool = False,
) -> dict[str, KeyInfo]:
    """digest → KeyInfo for every unrevoked key of an active user; with `every` False, only
    those among `key_ids` and the keys of `user_ids`. The proxy's map (`inactive_users`) also
    holds the keys of deactivated users, marked, so that their holders learn why they fail."""
    rows = ClientKey.objects.filter(revoked__isnull=True)
    if not inactive_users:
        rows = rows.filter(user__is_active=True)
    if not every:
        rows = rows.filter(Q(pk__in=list(key_ids)) | Q(user_id__in=list(user_ids)))
    keys = list(rows.select_related("user", "user__ocx_budget"))
    teams = teams_by_user(None if every else {k.user_id for k in keys})
    out: dict[str, KeyInfo] = {}
    for k in keys:
        expires_at = k.expires.timestamp() if k.expires is not None else math.inf
        info = KeyInfo(
            id=k.pk,
            prefix=k.prefix,
            user=k.user.get_username(),
            allowed_models=frozenset(k.allowed_models or ()),
            rpm_limit=k.rpm_limit,
            budgets=scoped_budgets(k) + team_budgets(teams.get(k.user_id, ())),
            user_id=k.user_id,
            user_active=k.user.is_active,
            expires_at=expires_at,
            team_models=team_models(teams.get(k.user_id, ())),
        )
        out[k.digest] = info
        if k.previous_digest and k.previous_until is not None:
            # Kept after its grace too: its holder learns it was rotated, not "invalid key".
            grace_end = min(k.previous_until.timestamp(), expires_at)
            out[k.previous_digest] = dataclasses.replace(info, expires_at=grace_end, previous=True)
    return out


def teams_by_user(user_ids: Collection[int] | None) -> dict[int, list[TeamProfile]]:
    """user pk → the profiles (with their group) of the user's teams, by team name; all users
    when `user_ids` is None. Two queries whatever the number of keys: the teams, then the
    memberships of those teams (no list of every user id in a query)."""
    profiles = {p.group_id: p for p in TeamProfile.objects.select_related("group")}
    if not profiles:
        return {}
    memberships = get_user_model().groups.through.objects.filter(group_id__in=list(profiles))
    if user_ids is not None:
        memberships = memberships.filter(user_id__in=list(user_ids))
    out: dict[int, list[TeamProfile]] = {}
    for user_id, group_id in memberships.values_list("user_id", "group_id"):
        out.setdefault(user_id, []).append(profiles[group_id])
    for teams in out.values():
        teams.sort(key=lambda p: p.group.name)
    return out


def team_budgets(teams: Iterable[TeamProfile]) -> tuple[ScopedBudget, ...]:
    """Every budget of every team given, kept in the team's counters (`t<group id>`)."""
    return tuple(
        ScopedBudget("team", f"t{p.group_id}", f"team {p.group.name}", b)
        for p in teams
        for b in stored_budgets(p.budgets)
    )


def team_models(teams: Iterable[TeamProfile]) -> tuple[tuple[str, frozenset[str]], ...]:
    """(team name, allowed models) of each team given that narrows models."""
    return tuple((p.group.name, frozenset(p.allowed_models)) for p in teams if p.allowed_models)


def mgmt_token_create(*, username: str, name: str = "") -> tuple[ManagementToken, str]:
    user_model = get_user_model()
    with transaction.atomic():
        # A user created here logs in only once given a password (`ocx user create`).
        user, _ = user_model.objects.get_or_create(
            username=username, defaults={"password": make_password(None)}
        )
        # The token acts with its user's rights (docs/people.md): it changes no role.
        secret = MGMT_PREFIX + secrets.token_urlsafe(32)
        token = ManagementToken(user=user, name=name, prefix=secret[:11], digest=digest(secret))
        token.full_clean()
        token.save()
    return token, secret


def mgmt_token_revoke(*, token_id: int) -> bool:
    """Revoke one management token; False when there is no unrevoked token `token_id`. The
    next request with it is refused (tokens are looked up on every request, not cached)."""
    return mgmt_tokens_revoke(tokens=ManagementToken.objects.filter(pk=token_id)) == 1


def mgmt_tokens_revoke(*, tokens: QuerySet[ManagementToken]) -> int:
    """Revoke the unrevoked tokens among `tokens`; returns how many."""
    with transaction.atomic():
        ids = list(tokens.filter(revoked__isnull=True).values_list("pk", flat=True))
        for pk in ids:
            trail.touch("token", pk)  # an update sends no signal: the audit trail is told
        return ManagementToken.objects.filter(pk__in=ids, revoked__isnull=True).update(
            revoked=timezone.now()
        )


def mgmt_user_for(secret: str) -> AbstractBaseUser | None:
    """The active user owning this management token, or None; the route decides what that
    user's role may do (accounts.api_auth)."""
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
    if token is None or not token.user.is_active:
        return None
    return token.user


def _bootstrap_admin() -> AbstractBaseUser:
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    if created:
        # Unusable, not empty: nobody can log in as it with a password (issue #43).
        user.set_unusable_password()
        user.save(update_fields=["password"])
    elif not (user.is_staff and user.is_superuser):
        # OCX_ADMIN_TOKEN is the admin's credential: its user has the admin role.
        user.is_staff = user.is_superuser = True
        user.save(update_fields=["is_staff", "is_superuser"])
    return user
