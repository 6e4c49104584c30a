"""The admin's Teams: Django groups with members, budgets and allowed models. It replaces the
stock Groups page (ocx's roles are not group permissions: docs/people.md);
writes go through `team_services`, which tell every worker."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from accounts import key_services, team_services
from accounts.access import team_budgets
from accounts.models import Team, TeamProfile
from combos import selectors
from usage import budget_selectors, ledger_view
from usage.budgets import stored_budgets

BUDGETS_HELP = (
    'A list of budgets shared by the team\'s members: {"tokens": 100000, "period": "month"} '
    '(day, week or month) and/or {"windowPercent": 30, "provider": "NAME"}. [] for none. '
    "Every team of a user applies to every key of that user."
)


class Picker(FilteredSelectMultiple):
    """The two-box picker, wrapped as the admin wraps its relation widgets: without the wrapper
    its script puts the boxes before the field's label."""

    def render(self, *args: Any, **kwargs: Any) -> SafeString:
        return format_html(
            '<div class="related-widget-wrapper">{}</div>', super().render(*args, **kwargs)
        )


def _model_choices(stored: list[str]) -> list[tuple[str, str]]:
    """Combos and provider models a key could be allowed, plus whatever is stored."""
    snapshot = selectors.config_snapshot()
    names = {c.public_id for c in snapshot.combos.values()}
    names |= {t.key for c in snapshot.combos.values() for t in c.targets}
    names |= {f"{p.name}/{m}" for p in snapshot.providers.values() for m in p.models}
    names |= set(stored)
    return [(n, n) for n in sorted(names)]


class TeamForm(forms.ModelForm):  # type: ignore[type-arg]
    members = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.order_by("username"),
        required=False,
        widget=Picker("members", is_stacked=False),
    )
    managers = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.order_by("username"),
        required=False,
        widget=Picker("managers", is_stacked=False),
        help_text="Team managers manage this team's members and keys and see its usage "
        "(docs/people.md); they need not be members.",
    )
    budgets = forms.JSONField(required=False, initial=list, help_text=BUDGETS_HELP)
    allowed_models = forms.MultipleChoiceField(
        required=False,
        widget=Picker("allowed models", is_stacked=False),
        help_text="None chosen: members' keys may use any model their key allows. Otherwise a "
        "request's model must be one of these and allowed by the key's own list.",
    )

    class Meta:
        model = Team
        fields = ("name",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored: list[str] = []
        if self.instance.pk is not None:
            profile = TeamProfile.objects.filter(group_id=self.instance.pk).first()
            self.fields["members"].initial = list(self.instance.user_set.all())
            if profile is not None:
                self.fields["managers"].initial = list(profile.managers.all())
                stored = list(profile.allowed_models)
                self.fields["budgets"].initial = profile.budgets
                self.fields["allowed_models"].initial = stored
        models_field = self.fields["allowed_models"]
        assert isinstance(models_field, forms.MultipleChoiceField)
        models_field.choices = _model_choices(stored)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        problem = team_services.team_name_problem(name)
        if problem is not None:
            raise forms.ValidationError(problem.removeprefix("name: "))
        return name

    def clean_budgets(self) -> object:
        try:
            return key_services.budgets_value(self.cleaned_data.get("budgets") or None)
        except ValidationError as exc:
            raise forms.ValidationError(exc.messages) from None

    def clean_allowed_models(self) -> list[str]:
        models = sorted(set(self.cleaned_data.get("allowed_models") or []))
        problem = key_services.allowed_models_problem(models)
        if problem is not None:
            raise forms.ValidationError(problem)
        return models


admin.site.unregister(Group)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = TeamForm
    list_display = ("name", "member_count", "member_list", "budget_list", "model_list")
    search_fields = ("name", "user__username")
    fields = ("name", "members", "managers", "budgets", "budget_use", "allowed_models")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return (
            super()
            .get_queryset(request)
            .annotate(member_total=Count("user", distinct=True))
            .select_related("ocx_team")
            .prefetch_related("user_set")
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Renaming is not offered: the usage history names teams by their current name.
        return ("name", "budget_use") if obj is not None else ("budget_use",)

    @admin.display(description="budget use")
    def budget_use(self, obj: Team) -> str:
        if obj.pk is None:
            return "-"
        return self.budget_list(obj)

    @admin.display(description="members", ordering="member_total")
    def member_count(self, obj: Team) -> int:
        return int(getattr(obj, "member_total", 0))

    @admin.display(description="who")
    def member_list(self, obj: Team) -> str:
        names = sorted(u.get_username() for u in obj.user_set.all())
        shown = ", ".join(names[:8])
        return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "-"

    @admin.display(description="budgets and use")
    def budget_list(self, obj: Team) -> str:
        """Each budget of the team and what its period used, with a bar (issue 42)."""
        profile = _profile(obj)
        if profile is None or not stored_budgets(profile.budgets):
            return "-"
        return ledger_view.uses_html(budget_selectors.budget_use(team_budgets([profile])))

    @admin.display(description="allowed models")
    def model_list(self, obj: Team) -> str:
        profile = _profile(obj)
        return ", ".join(profile.allowed_models) if profile and profile.allowed_models else "any"

    def save_model(self, request: HttpRequest, obj: Team, form: Any, change: bool) -> None:
        data = form.cleaned_data
        group = team_services.team_set(
            name=obj.name,
            members=[u.get_username() for u in data.get("members") or []],
            budgets=data.get("budgets") or [],
            allowed_models=data.get("allowed_models") or [],
            managers=[u.get_username() for u in data.get("managers") or []],
        )
        obj.pk = obj.id = group.pk
        obj._state.adding = False

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        return None  # members, budgets and models were written by save_model

    def delete_model(self, request: HttpRequest, obj: Team) -> None:
        team_services.team_delete(name=obj.name)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Team]) -> None:
        for name in list(queryset.values_list("name", flat=True)):
            team_services.team_delete(name=name)


def _profile(obj: Group) -> TeamProfile | None:
    try:
        return obj.ocx_team
    except TeamProfile.DoesNotExist:
        return None
