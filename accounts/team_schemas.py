"""Schemas of `/api/teams` (camelCase JSON)."""

from __future__ import annotations

from typing import Any

from ninja import Field, Schema
from pydantic import ConfigDict


class TeamIn(Schema):
    """Fields left out keep their stored values (a new team starts empty); null or [] empties."""

    model_config = ConfigDict(extra="forbid")

    members: list[str] | None = Field(None, description="usernames (existing users)")
    budgets: list[dict[str, Any]] | None = Field(None, description="budgets (docs/budgets.md)")
    allowedModels: list[str] | None = Field(
        None, description="narrows what members' keys may use; [] for no narrowing"
    )
    managers: list[str] | None = Field(
        None, description="usernames of the team's managers (docs/people.md); admins only"
    )


class TeamPut(Schema):
    model_config = ConfigDict(extra="forbid")

    name: str
    team: TeamIn


class TeamOut(Schema):
    name: str
    members: list[str]
    budgets: list[dict[str, Any]]
    allowedModels: list[str]
    managers: list[str]


class TeamListOut(Schema):
    teams: list[TeamOut]


class TeamOneOut(Schema):
    team: TeamOut


class TeamPutOut(Schema):
    success: bool
    team: TeamOut


class TeamDeleteOut(Schema):
    success: bool
    name: str
