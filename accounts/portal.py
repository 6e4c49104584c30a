"""The portal (`/me/`, `/api/me/...`): a user's own keys, usage, spend and budgets, within the
policy knobs (OCX_PORTAL_*): docs/people.md. Shared by the pages and the API."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils import timezone

from accounts import access, expiry, key_services, roles
from accounts.models import ClientKey, UserBudget
from usage import budget_selectors
from usage.budgets import ScopedBudget, stored_budgets
from usage.selectors import usage_rows

COUNTERS = ("requests", "input_tokens", "output_tokens", "cost_usd")


class PortalError(Exception):
    """A refused portal action: `status` (400, 403, 404) and a message for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Policy:
    members_create: bool
    max_keys: int  # 0: no limit
    max_expiry_days: int  # 0: no limit (and no expiry required)


def policy() -> Policy:
    return Policy(
        members_create=settings.OCX_PORTAL_MEMBERS_CREATE_KEYS,
        max_keys=settings.OCX_PORTAL_MAX_KEYS,
        max_expiry_days=settings.OCX_PORTAL_MAX_EXPIRY_DAYS,
    )


def my_keys(user: Any) -> list[ClientKey]:
    """The user's unrevoked keys, newest first."""
    return list(ClientKey.objects.filter(user=user, revoked__isnull=True).order_by("-pk"))


def team_models(user: Any) -> list[str] | None:
    """The models the user's teams allow (each narrowing team's list, intersected); None:
    no team narrows, any model the key allows."""
    allowed: set[str] | None = None
    for _, models in access.team_models(access.teams_by_user([user.pk]).get(user.pk, ())):
        allowed = set(models) if allowed is None else allowed & models
    return None if allowed is None else sorted(allowed)


def key_create(
    *,
    user: Any,
    name: str,
    expires_in_days: int | None = None,
    allowed_models: list[str] | None = None,
    now: dt.datetime | None = None,
) -> tuple[ClientKey, str]:
    """Mint a key for `user` themselves, within the policy and their teams' allowed models."""
    now = now or timezone.now()
    rules = policy()
    if not rules.members_create and not (user.is_superuser or roles.is_team_manager(user)):
        raise PortalError(403, "members may not create keys here: ask an administrator")
    name = name.strip()
    if not name:
        raise PortalError(400, "name: give the key a name (e.g. laptop)")
    if len(name) > 64 or "\x00" in name:
        raise PortalError(400, "name: at most 64 characters")
    if rules.max_keys and len(my_keys(user)) >= rules.max_keys:
        raise PortalError(
            403, f"you have {rules.max_keys} keys, the most allowed: revoke one first"
        )
    expires = None
    if expires_in_days is not None:
        if expires_in_days < 1:
            raise PortalError(400, "expiresInDays: at least 1")
        if rules.max_expiry_days and expires_in_days > rules.max_expiry_days:
            raise PortalError(400, f"expiresInDays: at most {rules.max_expiry_days}")
        expires = now + dt.timedelta(days=expires_in_days)
    elif rules.max_expiry_days:
        raise PortalError(400, f"expiresInDays: required, at most {rules.max_expiry_days}")
    models = sorted(set(allowed_models or []))
    within = team_models(user)
    if models:
        problem = key_services.allowed_models_problem(models)
        if problem is not None:
            raise PortalError(400, problem)
        outside = [m for m in models if within is not None and m not in within]
        if outside:
            raise PortalError(400, f"allowedModels: your teams do not allow {outside[0]}")
    try:
        return access.client_key_create(
            username=user.get_username(),
            name=name,
            allowed_models=models,
            expires=expires,
            create_user=False,
        )
    except access.KeyOwnerError as exc:
        raise PortalError(403, exc.message) from None


def _own_key(user: Any, key_id: int) -> ClientKey:
    key = ClientKey.objects.filter(pk=key_id, revoked__isnull=True).first()
    if key is None or key.user_id != user.pk:
        # Another user's key is as unknown as a missing one: the portal names none of them.
        raise PortalError(404, "no such key of yours")
    return key


def key_rotate(*, user: Any, key_id: int) -> tuple[ClientKey, str]:
    _own_key(user, key_id)
    try:
        return access.client_key_rotate(key_id=key_id)
    except ClientKey.DoesNotExist:
        raise PortalError(404, "no such key of yours") from None


def key_revoke(*, user: Any, key_id: int) -> None:
    _own_key(user, key_id)
    access.client_key_revoke(key_id=key_id)


def key_json(key: ClientKey) -> dict[str, object]:
    return {
        "id": key.pk,
        "prefix": key.prefix,
        "name": key.name,
        "allowedModels": list(key.allowed_models),
        "created": key.created.isoformat(),
        "expiresAt": expiry.iso(key.expires) if key.expires else None,
        "rotated": expiry.iso(key.rotated) if key.rotated else None,
    }


def _starts(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    local = now.astimezone(ZoneInfo(settings.OCX_TIME_ZONE))
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)


def _sums(row: dict[str, Any]) -> dict[str, object]:
    return {
        "requests": int(row["requests"] or 0),
        "tokens": int(row["input_tokens"] or 0) + int(row["output_tokens"] or 0),
        "costUsd": round(float(row["cost_usd"] or 0), 6),
    }


def applying_budgets(user: Any) -> list[ScopedBudget]:
    """Every budget that applies to the user's requests: each key's, their own, their teams'."""
    name = user.get_username()
    keys = ClientKey.objects.filter(user=user, revoked__isnull=True).order_by("pk")
    out = [
        ScopedBudget("key", f"k{k.pk}", f"key {k.prefix}… of {name}", b)
        for k in keys
        for b in stored_budgets(k.budgets)
    ]
    own = UserBudget.objects.filter(user=user).first()
    out += [
        ScopedBudget("user", f"u{user.pk}", f"user {name}", b)
        for b in stored_budgets(own.budgets if own else [])
    ]
    teams = access.teams_by_user([user.pk]).get(user.pk, [])
    return out + list(access.team_budgets(teams))


def usage_summary(user: Any, *, now: dt.datetime | None = None) -> dict[str, object]:
    """Today, this month (in OCX_TIME_ZONE), this month by model, and each budget that applies
    with what is left of it."""
    now = now or timezone.now()
    day, month = _starts(now)
    until = now + dt.timedelta(minutes=1)  # the current minute's bucket counts
    mine = {"user": user.get_username()}
    today = usage_rows(since=day, until=until, counters=COUNTERS, filters=mine)[0]
    this_month = usage_rows(since=month, until=until, counters=COUNTERS, filters=mine)[0]
    by_model = usage_rows(
        since=month, until=until, group=["model"], counters=COUNTERS, filters=mine
    )
    budgets = []
    for use in budget_selectors.budget_use(applying_budgets(user)):
        left = None if use.used is None else max(use.limit - use.used, 0)
        budgets.append(
            {
                "owner": use.owner,
                "budget": use.budget,
                "used": use.used,
                "limit": use.limit,
                "left": left,
                "resetsAt": use.resets_at.isoformat() if use.resets_at else None,
                "text": use.text,
            }
        )
    return {
        "user": user.get_username(),
        "today": _sums(today),
        "month": _sums(this_month),
        "byModel": [{"model": r["model"] or None, **_sums(r)} for r in by_model],
        "budgets": budgets,
    }


def managed_view(user: Any) -> list[dict[str, object]]:
    """For a team manager: each team they manage with its members, their keys and this month's
    usage per member."""
    out: list[dict[str, object]] = []
    _, month = _starts(timezone.now())
    for group in roles.managed_teams(user):
        members = list(group.user_set.order_by("username"))
        names = [m.get_username() for m in members]
        usage = {
            r["user"]: _sums(r)
            for r in usage_rows(
                since=month,
                until=timezone.now() + dt.timedelta(minutes=1),
                group=["user"],
                counters=COUNTERS,
                filters={"user__in": names},
            )
        }
        keys = ClientKey.objects.filter(user__in=members, revoked__isnull=True).order_by("pk")
        by_user: dict[int, list[str]] = {}
        for k in keys:
            by_user.setdefault(k.user_id, []).append(f"{k.prefix}… {k.name}".strip())
        out.append(
            {
                "team": group.name,
                "members": [
                    {
                        "user": m.get_username(),
                        "keys": by_user.get(m.pk, []),
                        "month": usage.get(m.get_username(), _sums(dict.fromkeys(COUNTERS, 0))),
                    }
                    for m in members
                ],
            }
        )
    return out


def codex_snippet(*, base_url: str, model: str = "combo/main") -> str:
    """The Codex config.toml lines for ocx (the key goes in OCX_API_KEY)."""
    return (
        f'model = "{model}"\n'
        'model_provider = "ocx"\n\n'
        "[model_providers.ocx]\n"
        'name = "ocx"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "OCX_API_KEY"\n'
    )
