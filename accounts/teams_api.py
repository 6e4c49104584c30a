"""`/api/teams`: teams (Django groups) with members, budgets and allowed models."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router
from ninja.errors import HttpError

from accounts import team_selectors, team_services
from accounts.api_auth import manager_auth, scope
from accounts.team_schemas import (
    TeamDeleteOut,
    TeamListOut,
    TeamOneOut,
    TeamPut,
    TeamPutOut,
)

router = Router(tags=["teams"])


def _visible(request: HttpRequest, name: str) -> bool:
    allowed = scope(request)
    return allowed.every or team_selectors.team_id(name) in allowed.team_ids


@router.get("", response=TeamListOut, operation_id="list_teams", auth=manager_auth)
def list_teams(request: HttpRequest) -> dict[str, object]:
    """Every team (a team manager: the teams they manage)."""
    allowed = scope(request)
    rows = team_selectors.team_list(None if allowed.every else allowed.team_ids)
    return {"teams": [t.to_json() for t in rows]}


@router.get("/{name}", response=TeamOneOut, operation_id="get_team", auth=manager_auth)
def get_team(request: HttpRequest, name: str) -> dict[str, object]:
    row = team_selectors.team_get(name)
    if row is None:
        raise HttpError(404, f"unknown team {name}")
    if not _visible(request, name):
        raise HttpError(403, f"forbidden: you do not manage team {name}")
    return {"team": row.to_json()}


@router.put("", response=TeamPutOut, operation_id="put_team", auth=manager_auth)
def put_team(request: HttpRequest, payload: TeamPut) -> dict[str, object]:
    """Create or change a team; fields left out of `team` keep their stored values. A team
    manager changes only the members of a team they manage."""
    given = payload.team.model_fields_set
    if not scope(request).every:
        if not _visible(request, payload.name):
            raise HttpError(403, f"forbidden: you do not manage team {payload.name}")
        if given - {"members"}:
            raise HttpError(
                403, f"forbidden: a team manager changes members only, not {sorted(given)[0]}"
            )
    changes: dict[str, Any] = {}
    if "members" in given:
        changes["members"] = payload.team.members
    if "budgets" in given:
        changes["budgets"] = payload.team.budgets
    if "allowedModels" in given:
        changes["allowed_models"] = payload.team.allowedModels
    if "managers" in given:
        changes["managers"] = payload.team.managers
    # A Django ValidationError is a 400 naming the field (ocxsite.api's handler).
    team_services.team_set(name=payload.name, **changes)
    row = team_selectors.team_get(payload.name)
    assert row is not None
    return {"success": True, "team": row.to_json()}


@router.delete("", response=TeamDeleteOut, operation_id="delete_team")
def delete_team(request: HttpRequest, name: str = "") -> dict[str, object]:
    if not name.strip():
        raise HttpError(400, "name query param is required")
    if not team_services.team_delete(name=name):
        raise HttpError(404, f"unknown team {name}")
    return {"success": True, "name": name}
