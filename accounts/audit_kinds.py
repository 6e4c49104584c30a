"""What the audit trail records of keys, management tokens, teams and users (with their role
and budgets). Secrets (a key's digest, a token's, a password's hash) read `***`."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from accounts import roles
from accounts.models import ClientKey, ManagementToken, SsoIdentity, TeamProfile, UserBudget
from audit import trail


def _username(user_id: int | None) -> str | None:
    if user_id is None:
        return None
    found = get_user_model().objects.filter(pk=user_id).values_list("username", flat=True)
    return found.first()


def read_key(key_id: str) -> trail.Snapshot:
    key = ClientKey.objects.filter(pk=int(key_id)).first()
    if key is None:
        return None
    fields = trail.row_fields(
        key, exclude=("updated", "digest", "previous_digest", "user", "created")
    )
    fields["user"] = _username(key.user_id)
    fields["secret"] = key.digest
    return f"key {key.prefix}… of {fields['user']}", fields


def read_token(token_id: str) -> trail.Snapshot:
    token = ManagementToken.objects.filter(pk=int(token_id)).first()
    if token is None:
        return None
    fields = trail.row_fields(token, exclude=("digest", "user", "created"))
    fields["user"] = _username(token.user_id)
    fields["secret"] = token.digest
    return f"token {token.prefix}… of {fields['user']}", fields


def read_team(group_id: str) -> trail.Snapshot:
    group = Group.objects.filter(pk=int(group_id)).first()
    if group is None:
        return None
    profile = TeamProfile.objects.filter(group=group).first()
    fields: dict[str, object] = {
        "name": group.name,
        "members": sorted(group.user_set.values_list("username", flat=True)),
        "managers": sorted(profile.managers.values_list("username", flat=True)) if profile else [],
        "budgets": profile.budgets if profile else [],
        "allowed_models": profile.allowed_models if profile else [],
    }
    return f"team {group.name}", fields


def read_user(user_id: str) -> trail.Snapshot:
    user = get_user_model().objects.filter(pk=int(user_id)).first()
    if user is None:
        return None
    budget = UserBudget.objects.filter(user=user).first()
    identity = SsoIdentity.objects.filter(user=user).first()
    fields: dict[str, object] = {
        "username": user.get_username(),
        "email": user.email,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "role": roles.role_of(user),
        "is_active": user.is_active,
        "password": user.password if user.has_usable_password() else None,
        "budgets": budget.budgets if budget else [],
        # The identity provider's account the user signs in with (docs/people.md#sso).
        "sso": f"{identity.issuer} {identity.subject}" if identity else None,
    }
    return f"user {user.get_username()}", fields


def _team_ids_of_groups(instance: Any, reverse: bool, pk_set: set[Any] | None) -> list[Any]:
    # user.groups (forward: instance a user) or group.user_set (reverse: instance a group).
    if reverse:
        return [instance.pk]
    if pk_set is None:
        return list(instance.groups.values_list("pk", flat=True))
    return list(pk_set)


def _team_ids_of_managers(instance: Any, reverse: bool, pk_set: set[Any] | None) -> list[Any]:
    # profile.managers (forward: instance a profile) or user.managed_teams (reverse).
    if not reverse:
        return [instance.group_id]
    profiles = TeamProfile.objects.all()
    if pk_set is None:
        profiles = profiles.filter(managers=instance)
    else:
        profiles = profiles.filter(pk__in=list(pk_set))
    return list(profiles.values_list("group_id", flat=True))


def register() -> None:
    user_model = get_user_model()
    trail.register("key", read_key, secrets=("secret",))
    trail.register("token", read_token, secrets=("secret",))
    trail.register("team", read_team)
    trail.register("user", read_user, secrets=("password",))
    trail.watch(ClientKey, "key", lambda k: k.pk, owner=True)
    trail.watch(ManagementToken, "token", lambda t: t.pk, owner=True)
    trail.watch(Group, "team", lambda g: g.pk, owner=True)
    trail.watch(TeamProfile, "team", lambda p: p.group_id)
    trail.watch(user_model, "user", lambda u: u.pk, owner=True)
    trail.watch(UserBudget, "user", lambda b: b.user_id)
    trail.watch(SsoIdentity, "user", lambda i: i.user_id)
    trail.watch_m2m(user_model.groups.through, "team", _team_ids_of_groups)
    trail.watch_m2m(TeamProfile.managers.through, "team", _team_ids_of_managers)
