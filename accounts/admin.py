from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from accounts import access, key_services
from accounts.models import ClientKey, ManagementToken, UserBudget
from usage.budgets import stored_budgets

BUDGETS_HELP = (
    'A list of budgets: {"tokens": 100000, "period": "day"} (day, week or month, in '
    'OCX_TIME_ZONE) and/or {"windowPercent": 30, "provider": "NAME"} (at most 30 points of each '
    "quota window of that provider). [] for none."
)


class BudgetsForm(forms.ModelForm):  # type: ignore[type-arg]
    """Stores budgets in their canonical form (one object is taken as a list of one)."""

    class Meta:
        # The admin's form factory derives its Meta from this one, so both admins show it.
        help_texts = {"budgets": BUDGETS_HELP}

    def clean_budgets(self) -> object:
        try:
            return key_services.budgets_value(self.cleaned_data.get("budgets") or None)
        except ValidationError as exc:
            raise forms.ValidationError(exc.messages) from None


class ClientKeyForm(BudgetsForm):
    def clean_allowed_models(self) -> object:
        models = self.cleaned_data.get("allowed_models") or []
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise forms.ValidationError('a list of model names, e.g. ["combo/main"]')
        problem = key_services.allowed_models_problem(models)
        if problem is not None:
            raise forms.ValidationError(problem)
        return sorted(set(models))


def _budgets_text(obj: ClientKey | UserBudget) -> str:
    return ", ".join(b.describe() for b in stored_budgets(obj.budgets)) or "-"


class KeyUserFilter(admin.SimpleListFilter):
    """`?user=NAME`: one user's keys. Offered from each row's user link rather than as a list of
    every user (thousands at a team's scale)."""

    title = "user"
    parameter_name = "user"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        chosen = self.value()
        return [(chosen, chosen)] if chosen else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.value()
        return queryset.filter(user__username=chosen) if chosen else queryset


@admin.register(ClientKey)
class ClientKeyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = ClientKeyForm
    list_display = ("prefix", "user_link", "name", "rpm_limit", "budget_list", "created", "revoked")
    list_filter = ("revoked", KeyUserFilter)
    list_select_related = ("user",)
    list_per_page = 100
    search_fields = ("prefix", "user__username", "name")
    readonly_fields = ("prefix", "digest", "created", "revoked")
    fields = (
        "user",
        "name",
        "allowed_models",
        "rpm_limit",
        "budgets",
        "prefix",
        "created",
        "revoked",
    )
    actions = ["revoke"]

    @admin.display(description="budgets")
    def budget_list(self, obj: ClientKey) -> str:
        return _budgets_text(obj)

    @admin.display(description="user", ordering="user__username")
    def user_link(self, obj: ClientKey) -> str:
        name = obj.user.get_username()
        return format_html('<a href="?{}">{}</a>', urlencode({"user": name}), name)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Keys are created with `ocx key create` or POST /api/keys, which show the secret once.
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ClientKey]) -> None:
        count = access.client_keys_revoke(keys=queryset)
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)


@admin.register(UserBudget)
class UserBudgetAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A user's budgets, shared by all their keys."""

    form = BudgetsForm
    list_display = ("user", "budget_list", "updated")
    search_fields = ("user__username",)
    fields = ("user", "budgets")
    raw_id_fields = ("user",)

    @admin.display(description="budgets")
    def budget_list(self, obj: UserBudget) -> str:
        return _budgets_text(obj)


@admin.register(ManagementToken)
class ManagementTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("prefix", "user", "name", "created", "revoked")
    readonly_fields = ("prefix", "digest", "created", "revoked", "user")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ManagementToken]) -> None:
        count = queryset.filter(revoked__isnull=True).update(revoked=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)


# The Teams page (its own module; imported here so that the admin's autodiscovery finds it).
from accounts import team_admin  # noqa: E402, F401
