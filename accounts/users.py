"""Users (`ocx user create|list|deactivate|activate|remove`): staff users log in to /admin/;
every user may hold client keys. Deactivating a user stops their keys and tokens (the rows
stay); removing one revokes them for good (the rows and the usage history stay)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Q

from accounts import roles
from accounts.models import ClientKey, ManagementToken

# Used when the settings name no validators: an admin login deserves a real password.
FALLBACK_VALIDATORS: list[dict[str, Any]] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 10},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]


def _validators() -> list[Any]:
    configured = password_validation.get_default_password_validators()
    return configured or password_validation.get_password_validators(FALLBACK_VALIDATORS)


@dataclass(frozen=True)
class UserRow:
    username: str
    role: str  # accounts.roles: admin, viewer or member
    is_staff: bool
    is_active: bool
    has_password: bool
    active_keys: int


def user_create(
    *, username: str, password: str | None, is_staff: bool = False, role: str | None = None
) -> AbstractBaseUser:
    """Create a user; `password` None = no login (a key-only user). `role` (accounts.roles):
    admin (everything), viewer (reads the admin and the API) or member (the portal only);
    `is_staff` alone means admin, as `--staff` always did.

    Raises ValidationError (an existing name, an empty name, an unknown role, a password the
    validators refuse)."""
    user_model = get_user_model()
    username = username.strip()
    staff, superuser = _flags(role or (roles.ADMIN if is_staff else roles.MEMBER))
    with transaction.atomic():
        if user_model.objects.filter(username=username).exists():
            raise ValidationError(f"user {username} already exists")
        user = user_model(username=username, is_staff=staff, is_superuser=superuser)
        if password is None:
            if staff:
                raise ValidationError("an admin or viewer needs a password to log in to /admin/")
            user.set_unusable_password()
        else:
            password_validation.validate_password(password, user, _validators())
            user.set_password(password)
        user.full_clean()
        user.save()
    return user


def _flags(role: str) -> tuple[bool, bool]:
    try:
        return roles.role_flags(role)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def user_set_role(*, username: str, role: str) -> AbstractBaseUser:
    """Give a user the role admin, viewer or member (team managers are named per team:
    `team_services.team_set(managers=...)`)."""
    staff, superuser = _flags(role)
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.select_for_update().filter(username=username).first()
        if user is None:
            raise ValidationError(f"no user {username}")
        user.is_staff, user.is_superuser = staff, superuser
        user.full_clean(exclude=["password"])
        user.save(update_fields=["is_staff", "is_superuser"])
    return user


def user_deactivate(*, username: str) -> int:
    """Deactivate a user: their keys and management tokens stop working and they can no longer
    log in (the rows stay, for the request log). Returns how many active keys they held."""
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.select_for_update().filter(username=username).first()
        if user is None:
            raise ValidationError(f"no user {username}")
        if not user.is_active:
            raise ValidationError(f"user {username} is already inactive")
        user.is_active = False
        # Users created by `ocx key create` before they had unusable passwords store "".
        user.full_clean(exclude=["password"])
        user.save(update_fields=["is_active"])  # the post_save receiver bumps the key table
        return ClientKey.objects.filter(user=user, revoked__isnull=True).count()


def user_activate(*, username: str) -> int:
    """Reactivate a deactivated user: their unrevoked keys and tokens work again. Returns how
    many unrevoked keys they hold."""
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.select_for_update().filter(username=username).first()
        if user is None:
            raise ValidationError(f"no user {username}")
        if user.is_active:
            raise ValidationError(f"user {username} is already active")
        user.is_active = True
        user.full_clean(exclude=["password"])
        user.save(update_fields=["is_active"])  # the post_save receiver bumps the key table
        return ClientKey.objects.filter(user=user, revoked__isnull=True).count()


def user_remove(*, username: str) -> int:
    """Remove a user from use for good: revoke every key and management token, deactivate the
    login. The row stays (renamed nothing, deleted nothing) so the request log and usage history
    keep naming them. Returns how many keys were revoked."""
    from accounts import access

    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.select_for_update().filter(username=username).first()
        if user is None:
            raise ValidationError(f"no user {username}")
        revoked = access.client_keys_revoke(keys=ClientKey.objects.filter(user=user))
        access.mgmt_tokens_revoke(tokens=ManagementToken.objects.filter(user=user))
        if user.is_active or user.has_usable_password():
            user.is_active = False
            user.set_unusable_password()
            user.full_clean(exclude=["password"])
            user.save(update_fields=["is_active", "password"])
        return revoked


def users_list() -> list[UserRow]:
    user_model = get_user_model()
    rows = user_model.objects.annotate(
        active_keys=Count("client_keys", filter=Q(client_keys__revoked__isnull=True))
    ).order_by("username")
    return [
        UserRow(
            username=u.get_username(),
            role=roles.role_of(u),
            is_staff=u.is_staff,
            is_active=u.is_active,
            has_password=u.has_usable_password(),
            active_keys=u.active_keys,
        )
        for u in rows
    ]
