"""The writes of an SSO sign-in (docs/people.md#sso): who the provider's account is in ocx (its
stored subject; on a first sign-in a new member, or an existing user of that name whose
e-mail is the verified one), and the teams and role the provider's claims give them. Every
change is on the audit trail as `sso`, by the user signing in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from accounts import roles
from accounts.models import SsoIdentity
from audit import context
from providers.services import keys_bump


class SsoRefused(Exception):
    """The sign-in is refused; `message` says why, for the person signing in."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Claims:
    subject: str
    username: str
    email: str
    email_verified: bool
    teams: list[str] | None  # None: OCX_OIDC_TEAMS_CLAIM is not set (teams are left alone)
    role: str | None  # None: no group maps to a role (the role is left alone)


def _verified(value: object) -> bool:
    # Some providers send the claim as a string.
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, str) and v]
    return []


def read_claims(claims: Mapping[str, Any]) -> Claims:
    """What ocx takes from the provider's claims. Raises SsoRefused (no subject, no user name,
    an address outside OCX_OIDC_ALLOWED_DOMAINS or not verified there)."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise SsoRefused("The identity provider sent no subject (sub) for your account.")
    raw_email = claims.get("email")
    email = raw_email.strip() if isinstance(raw_email, str) else ""
    verified = bool(email) and _verified(claims.get("email_verified"))
    domains = settings.OCX_OIDC_ALLOWED_DOMAINS
    if domains:
        allowed = ", ".join(domains)
        if not email:
            raise SsoRefused(f"The identity provider sent no e-mail address; ocx takes {allowed}.")
        if email.rpartition("@")[2].lower() not in domains:
            raise SsoRefused(f"{email} is not an address ocx takes ({allowed}).")
        if not verified:
            raise SsoRefused(f"{email} is not verified at the identity provider.")
    claim = settings.OCX_OIDC_USERNAME_CLAIM
    username = claims.get(claim)
    if not isinstance(username, str) or not username.strip():
        username = email
    if not username:
        raise SsoRefused(f"The identity provider sent neither {claim} nor email for your account.")
    teams = None
    if settings.OCX_OIDC_TEAMS_CLAIM:
        teams = _names(claims.get(settings.OCX_OIDC_TEAMS_CLAIM))
    role = None
    admin_groups, viewer_groups = settings.OCX_OIDC_ADMIN_GROUPS, settings.OCX_OIDC_VIEWER_GROUPS
    if admin_groups or viewer_groups:
        groups = set(_names(claims.get(settings.OCX_OIDC_GROUPS_CLAIM)))
        if groups & set(admin_groups):
            role = roles.ADMIN
        elif groups & set(viewer_groups):
            role = roles.VIEWER
        else:
            role = roles.MEMBER
    return Claims(
        subject=subject,
        username=username.strip(),
        email=email,
        email_verified=verified,
        teams=teams,
        role=role,
    )


def _linked_user(*, issuer: str, found: Claims) -> Any:
    """The user a first sign-in of this provider account becomes: a new member, or the user of
    that name when their e-mail is the verified one (never a user name alone: that would let an
    account at the provider take over an ocx admin). Raises SsoRefused."""
    user_model = get_user_model()
    user = user_model.objects.select_for_update().filter(username=found.username).first()
    if user is None:
        user = user_model(username=found.username, email=found.email)
        user.set_unusable_password()  # signs in through the provider only (an admin may set one)
        try:
            user.full_clean()
        except ValidationError as exc:
            problems = "; ".join(m for ms in exc.message_dict.values() for m in ms)
            raise SsoRefused(f"ocx cannot name a user {found.username!r}: {problems}") from None
        user.save()
        return user
    if SsoIdentity.objects.filter(user=user).exists():
        raise SsoRefused(
            f"The ocx user {found.username} signs in with another account of the identity provider."
        )
    same_email = bool(user.email) and user.email.lower() == found.email.lower()
    if not (found.email_verified and same_email):
        raise SsoRefused(
            f"An ocx user named {found.username} exists already and its e-mail is not your "
            "verified address at the identity provider, so ocx does not sign you in as that "
            "user. Ask an ocx admin to set that user's e-mail to your address."
        )
    return user


def sso_sign_in(*, issuer: str, claims: Mapping[str, Any]) -> AbstractBaseUser:
    """The user the provider's (verified) claims sign in, with their teams and role brought in
    line with the claims. Raises SsoRefused (nothing is changed then)."""
    found = read_claims(claims)
    try:
        return _sign_in(issuer=issuer, found=found)
    except IntegrityError:
        # Two first sign-ins of one account at once: the other one made the user.
        raise SsoRefused("This account was signing in twice at once. Start again.") from None


def _sign_in(*, issuer: str, found: Claims) -> AbstractBaseUser:
    with context.acting(via="sso", actor=found.username), transaction.atomic():
        identity = (
            SsoIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=found.subject)
            .first()
        )
        if identity is not None:
            user: Any = identity.user
        else:
            user = _linked_user(issuer=issuer, found=found)
            if not user.is_active:
                raise SsoRefused(_DEACTIVATED)
            SsoIdentity.objects.create(user=user, issuer=issuer, subject=found.subject)
        if not user.is_active:
            raise SsoRefused(_DEACTIVATED)
        with context.acting(via="sso", actor=user.get_username()):
            _sync(user, found)
    return user


_DEACTIVATED = "Your ocx account is deactivated. Ask an ocx admin to activate it."


def _sync(user: Any, found: Claims) -> None:
    if found.role is not None and roles.role_of(user) != found.role:
        user.is_staff, user.is_superuser = roles.role_flags(found.role)
        user.save(update_fields=["is_staff", "is_superuser"])
    if found.teams is not None:
        # Teams that exist in ocx only; the claim never creates one.
        wanted = set(Group.objects.filter(name__in=found.teams).values_list("pk", flat=True))
        current = set(user.groups.values_list("pk", flat=True))
        if wanted != current:
            if current - wanted:
                user.groups.remove(*(current - wanted))
            if wanted - current:
                user.groups.add(*(wanted - current))
            # Each worker re-reads this user's keys (their teams' budgets and models).
            keys_bump([("user", str(user.pk))])
