"""Writes of client-key settings and user budgets, shared by the API, the CLI and the admin.

Creating and revoking keys lives in `accounts.access`; this adds the checks behind
`/api/keys` and `ocx key set`: allowed models must name something routable, budgets must
validate (`usage.budgets.parse_budgets`).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction

from accounts.models import ClientKey, UserBudget
from combos import selectors
from providers.models import Provider
from routing.validate import resolve_model
from usage.budgets import BudgetError, budgets_json, parse_budgets, stored_budgets

_UNSET = object()


def allowed_models_problem(models: Iterable[str]) -> str | None:
    """Why a key's allowed-model list cannot be stored, or None.

    Each entry must be an existing `combo/<id>`, a combo alias, or `<provider>/<model>` of a
    configured provider whose model is declared on the provider or used by a combo."""
    models = list(models)
    if not models:
        return None
    snapshot = selectors.config_snapshot_current()
    used = {t.key for c in snapshot.combos.values() for t in c.targets}
    for model in models:
        resolution = resolve_model(model, snapshot)
        if resolution.kind == "combo":
            continue
        if resolution.kind == "unknown_combo":
            return f"unknown combo {resolution.combo_id} in allowedModels ({model})"
        if resolution.kind == "target":
            assert resolution.provider is not None and resolution.model is not None
            provider = snapshot.providers[resolution.provider]
            if resolution.model in provider.models or model in used:
                continue
            return (
                f"unknown model {model} in allowedModels: provider {resolution.provider} "
                f"declares no model {resolution.model} and no combo uses it"
            )
        return (
            f"unknown model {model} in allowedModels "
            "(expected combo/<id>, a combo alias or <provider>/<model>)"
        )
    return None


def budgets_value(raw: object) -> list[dict[str, object]]:
    """Validated, canonical JSON of a budget object or list; raises ValidationError."""
    try:
        budgets = parse_budgets(raw, providers=set(Provider.objects.values_list("name", flat=True)))
    except BudgetError as exc:
        raise ValidationError(str(exc)) from None
    return budgets_json(budgets)


def client_key_update(
    *,
    key_id: int,
    name: object = _UNSET,
    allowed_models: object = _UNSET,
    rpm_limit: object = _UNSET,
    budgets: object = _UNSET,
    expires: object = _UNSET,
) -> ClientKey:
    """Change an unrevoked key's settings; only the arguments given change. `expires` None
    removes the expiry; a past instant is allowed here (it expires the key now, reversibly).

    Raises ClientKey.DoesNotExist for an unknown or revoked key, ValidationError for bad values
    (nothing is changed then)."""
    with transaction.atomic():
        key = ClientKey.objects.select_for_update().get(pk=key_id, revoked__isnull=True)
        if name is not _UNSET:
            key.name = str(name)
        if allowed_models is not _UNSET:
            models = sorted(set(allowed_models or []))  # type: ignore[call-overload]
            problem = allowed_models_problem(models)
            if problem is not None:
                raise ValidationError(problem)
            key.allowed_models = models
        if rpm_limit is not _UNSET:
            key.rpm_limit = rpm_limit  # type: ignore[assignment]
        if budgets is not _UNSET:
            key.budgets = budgets_value(budgets)
        if expires is not _UNSET:
            key.expires = expires  # type: ignore[assignment]
        key.full_clean()
        key.save()  # the post_save receiver bumps the key table: every worker reloads
    return key


def user_budgets_set(*, username: str, budgets: object) -> UserBudget | None:
    """Set (replace) a user's budgets; an empty value removes them. Raises ValidationError."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValidationError(f"no user {username}")
    value = budgets_value(budgets)
    with transaction.atomic():
        row = UserBudget.objects.filter(user=user).first()
        if not value:
            if row is not None:
                row.delete()
            return None
        row = row or UserBudget(user=user)
        row.budgets = value
        row.full_clean()
        row.save()
    return row


def user_budgets_get(*, username: str) -> list[dict[str, object]]:
    row = UserBudget.objects.filter(user__username=username).first()
    return budgets_json(stored_budgets(row.budgets)) if row is not None else []
