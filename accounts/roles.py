"""Roles (docs/people.md) on Django's own flags and permissions:

- *admin*: a superuser; everything.
- *viewer*: staff, not a superuser; reads every admin page and every `GET /api/...`, writes
  nothing (the admin through `ViewOnlyStaffBackend`'s view permissions).
- *team manager*: any user named a manager of a team (`TeamProfile.managers`); manages the keys,
  members and usage of those teams.
- *member*: every other active user; the portal only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import BaseBackend
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError

from accounts import key_services
from accounts.models import TeamProfile
from usage.budgets import TokenBudget, UsdBudget, WindowBudget, stored_budgets

ADMIN = "admin"
VIEWER = "viewer"
MEMBER = "member"
ROLES = (ADMIN, VIEWER, MEMBER)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def role_of(user: Any) -> str:
    if user.is_superuser:
        return ADMIN
    if user.is_staff:
        return VIEWER
    return MEMBER


def role_flags(role: str) -> tuple[bool, bool]:
    """(is_staff, is_superuser) of a role."""
    if role not in ROLES:
        raise ValueError(f"role: use {', '.join(ROLES)} (got {role!r})")
    return role in (ADMIN, VIEWER), role == ADMIN


def managed_teams(user: Any) -> list[Group]:
    """The teams `user` manages, by name."""
    if not getattr(user, "pk", None):
        return []
    return list(Group.objects.filter(ocx_team__managers=user).order_by("name"))


def managed_member_ids(team_ids: Iterable[int]) -> frozenset[int]:
    """The pks of the members of the teams `team_ids`."""
    through = get_user_model().groups.through
    return frozenset(
        through.objects.filter(group_id__in=list(team_ids)).values_list("user_id", flat=True)
    )


@dataclass(frozen=True)
class Scope:
    """What a caller may act on: everything (`every`), or the members of `team_ids`."""

    every: bool
    team_ids: frozenset[int] = frozenset()
    user_ids: frozenset[int] = frozenset()

    def covers_user(self, user_id: int) -> bool:
        return self.every or user_id in self.user_ids

    def covers_team(self, team_id: int) -> bool:
        return self.every or team_id in self.team_ids

    def usernames(self) -> frozenset[str] | None:
        """None: every user; else the usernames of the members of the teams in scope."""
        if self.every:
            return None
        names = get_user_model().objects.filter(pk__in=list(self.user_ids))
        return frozenset(names.values_list("username", flat=True))


def scope_for(user: Any, *, read: bool) -> Scope:
    """An admin acts on everything; a viewer reads everything; a team manager acts on (and
    reads) the members of the teams they manage; anyone else on nothing."""
    if user.is_superuser or (read and user.is_staff):
        return Scope(every=True)
    team_ids = frozenset(g.pk for g in managed_teams(user))
    return Scope(every=False, team_ids=team_ids, user_ids=managed_member_ids(team_ids))


def is_team_manager(user: Any) -> bool:
    return bool(getattr(user, "pk", None)) and TeamProfile.objects.filter(managers=user).exists()


class ViewOnlyStaffBackend(BaseBackend):
    """Gives every active staff user every `view_…` permission: a viewer reads each admin page
    (and changes none: no add, change or delete permission). It authenticates nobody."""

    def has_perm(self, user_obj: Any, perm: str, obj: object = None) -> bool:
        if user_obj.is_active and user_obj.is_staff and perm.partition(".")[2].startswith("view_"):
            return True
        return False

    def has_module_perms(self, user_obj: Any, app_label: str) -> bool:
        return bool(user_obj.is_active and user_obj.is_staff)


def _cap_key(budget: object) -> tuple[str, str] | None:
    if isinstance(budget, TokenBudget):
        return ("tokens", budget.period)
    if isinstance(budget, UsdBudget):
        return ("usd", budget.period)
    if isinstance(budget, WindowBudget):
        return ("windowPercent", budget.provider)
    return None


def _cap_value(budget: object) -> float:
    if isinstance(budget, TokenBudget):
        return budget.tokens
    if isinstance(budget, UsdBudget):
        return budget.usd
    return budget.percent if isinstance(budget, WindowBudget) else math.inf


def budget_over_team(raw: object, *, owner_id: int, team_ids: Iterable[int]) -> str | None:
    """What a team manager may not set: a budget above the same kind of budget (same period or
    provider) of a team they manage that the owner is in. None: within every such team's."""
    try:
        wanted = stored_budgets(key_services.budgets_value(raw))
    except ValidationError:
        return None  # the write's own validation names the problem
    teams = TeamProfile.objects.filter(
        group_id__in=list(team_ids), group__user__pk=owner_id
    ).select_related("group")
    for team in teams:
        caps = {_cap_key(b): _cap_value(b) for b in stored_budgets(team.budgets)}
        for budget in wanted:
            cap = caps.get(_cap_key(budget))
            if cap is not None and _cap_value(budget) > cap:
                return (
                    f"budgets: {budget.describe()} is more than team {team.group.name}'s "
                    "budget; a team manager sets budgets up to the team's"
                )
    return None
