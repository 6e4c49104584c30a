"""Writes of teams (a Django group and its `TeamProfile`), shared by the API, the CLI and the
admin. Every write names the users whose keys it touches in one key-table bump, so every worker
re-reads just their entries of the key map (budgets and allowed models of their teams)."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction

from accounts import key_services
from accounts.models import TeamProfile
from providers.services import keys_bump

# Like combo ids and provider names (routing.validate).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
_UNSET = object()


def team_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        return f"name: {NAME_RULE} (got {name!r})"
    return None


def team_set(
    *,
    name: str,
    members: object = _UNSET,
    budgets: object = _UNSET,
    allowed_models: object = _UNSET,
    managers: object = _UNSET,
) -> Group:
    """Create the team `name` or change it; only the arguments given change (None or [] empty
    a field). `members` and `managers` are usernames.

    Raises ValidationError naming the field (nothing is changed then)."""
    exists = Group.objects.filter(name=name).exists()
    # The name rule applies to new teams; a group made elsewhere keeps its name.
    problem = None if exists else team_name_problem(name)
    if problem is not None:
        raise ValidationError(problem)
    users = None if members is _UNSET else _users(members)
    manager_users = None if managers is _UNSET else _users(managers, field="managers")
    budget_value = None if budgets is _UNSET else key_services.budgets_value(budgets or None)
    models = None if allowed_models is _UNSET else _models(allowed_models)
    with transaction.atomic():
        group = Group.objects.select_for_update().filter(name=name).first()
        if group is None:
            group = Group(name=name)
            group.full_clean()
            group.save()
        profile = TeamProfile.objects.filter(group=group).first() or TeamProfile(group=group)
        before = set(group.user_set.values_list("pk", flat=True))
        if budget_value is not None:
            profile.budgets = budget_value
        if models is not None:
            profile.allowed_models = models
        profile.full_clean()
        profile.save()
        if users is not None:
            group.user_set.set(users)
        if manager_users is not None:
            profile.managers.set(manager_users)
        affected = before | {u.pk for u in users or ()}
        if affected:
            keys_bump(("user", str(pk)) for pk in affected)
    return group


def team_delete(*, name: str) -> bool:
    """Delete a team (its members stay users); False when there is none of that name."""
    with transaction.atomic():
        group = Group.objects.select_for_update().filter(name=name).first()
        if group is None:
            return False
        members = list(group.user_set.values_list("pk", flat=True))
        group.delete()
        if members:
            keys_bump(("user", str(pk)) for pk in members)
    return True


def _users(members: object, field: str = "members") -> list[Any]:
    if members is None:
        return []
    if not isinstance(members, list | tuple) or not all(isinstance(m, str) for m in members):
        raise ValidationError(f"{field} must be a list of usernames")
    wanted = list(dict.fromkeys(m.strip() for m in members))
    found = {u.get_username(): u for u in get_user_model().objects.filter(username__in=wanted)}
    for username in wanted:
        if username not in found:
            raise ValidationError(
                f"{field}: unknown user {username!r} (create it with `ocx user create`)"
            )
    return [found[u] for u in wanted]


def _models(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(m, str) for m in value):
        raise ValidationError('allowedModels must be a list of model names, e.g. ["combo/main"]')
    if any("\x00" in m for m in value):
        raise ValidationError("allowedModels must not contain NUL characters")
    models = sorted(set(value))
    problem = key_services.allowed_models_problem(models)
    if problem is not None:
        raise ValidationError(problem)
    return models
