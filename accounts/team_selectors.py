"""Reads of teams: every Django group is a team; its `TeamProfile` (if any) holds its budgets
and allowed models."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from django.contrib.auth.models import Group
from django.db.models import QuerySet

from accounts.models import TeamProfile
from usage.budgets import budgets_json, stored_budgets


@dataclass(frozen=True)
class TeamRow:
    name: str
    members: tuple[str, ...]  # usernames, sorted
    budgets: list[dict[str, object]]  # canonical JSON (usage.budgets)
    allowed_models: tuple[str, ...]
    managers: tuple[str, ...] = ()  # usernames, sorted

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "members": list(self.members),
            "budgets": self.budgets,
            "allowedModels": list(self.allowed_models),
            "managers": list(self.managers),
        }

    def describe_budgets(self) -> str:
        return ", ".join(b.describe() for b in stored_budgets(self.budgets)) or "none"


def _rows(groups: QuerySet[Group]) -> list[TeamRow]:
    out = []
    groups = groups.select_related("ocx_team").prefetch_related("user_set", "ocx_team__managers")
    for g in groups.order_by("name"):
        try:
            profile: TeamProfile | None = g.ocx_team
        except TeamProfile.DoesNotExist:
            profile = None
        out.append(
            TeamRow(
                name=g.name,
                members=tuple(sorted(u.get_username() for u in g.user_set.all())),
                budgets=budgets_json(stored_budgets(profile.budgets)) if profile else [],
                allowed_models=tuple(profile.allowed_models) if profile else (),
                managers=tuple(sorted(u.get_username() for u in profile.managers.all()))
                if profile
                else (),
            )
        )
    return out


def team_list(team_ids: Collection[int] | None = None) -> list[TeamRow]:
    """Every team, or those among `team_ids`."""
    groups = Group.objects.all()
    if team_ids is not None:
        groups = groups.filter(pk__in=list(team_ids))
    return _rows(groups)


def team_id(name: str) -> int | None:
    return Group.objects.filter(name=name).values_list("pk", flat=True).first()


def team_get(name: str) -> TeamRow | None:
    rows = _rows(Group.objects.filter(name=name))
    return rows[0] if rows else None
