"""Form controls of the key and user-budget admins: budgets as rows of kind / amount /
period-or-provider, allowed models as a multi-select of the catalog.

Every row list goes through `key_services.budgets_value` (`usage.budgets.parse_budgets`), the
one validator the API and the CLI use too; allowed models through `allowed_models_problem`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from django import forms
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from accounts import expiry, key_services
from accounts.models import ClientKey, UserBudget
from combos import selectors
from providers.models import Provider

# (kind value, label, what its third column holds)
KINDS: tuple[tuple[str, str], ...] = (
    ("tokens", "tokens"),
    ("usd", "USD"),
    ("windowPercent", "% of quota window"),
)
PERIODS = ("day", "week", "month")
BLANK_ROWS = 1  # empty rows offered below the stored ones ("Add another budget" adds more)
Row = tuple[str, str, str]  # kind, amount, scope ("period:day" or "provider:NAME")

BUDGETS_HELP = (
    "One budget per row: tokens or USD per day, week or month (calendar periods in "
    "OCX_TIME_ZONE), or a percentage of each quota window of a provider. Leave the amount "
    "empty to remove a row."
)
MODELS_HELP = (
    "The combos and provider models this key may use; none chosen: every model. Routing "
    "inside a combo may still use any of its targets."
)
EXPIRES_HELP = (
    "UTC. After this instant the key gets 401 key_expired. Empty: never expires. A past "
    "instant on an existing key expires it now (clear the field to undo)."
)


def _num(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def rows_of(value: object) -> list[Row]:
    """The rows to show for a stored budget list (JSON) or a submitted row list."""
    if isinstance(value, list) and all(isinstance(r, tuple) for r in value):
        return list(value)
    items = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
    rows: list[Row] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if "provider" in item or "windowPercent" in item:
            amount = item.get("windowPercent", "")
            rows.append(("windowPercent", _num(amount), f"provider:{item.get('provider', '')}"))
        elif "usd" in item:
            rows.append(("usd", _num(item.get("usd", "")), f"period:{item.get('period', '')}"))
        else:
            amount = item.get("tokens", "")
            rows.append(("tokens", _num(amount), f"period:{item.get('period', '')}"))
    return rows


class BudgetRowsWidget(forms.Widget):
    """Rows of three controls named `<name>-kind`, `<name>-amount`, `<name>-scope`."""

    class Media:
        js = ("ocx/key-forms.js",)
        css = {"all": ("ocx/key-forms.css",)}

    def __init__(self, providers: Sequence[str] = ()) -> None:
        super().__init__()
        self.providers = list(providers)

    def value_from_datadict(self, data: Any, files: Any, name: str) -> list[Row]:
        kinds = data.getlist(f"{name}-kind") if hasattr(data, "getlist") else []
        amounts = data.getlist(f"{name}-amount") if hasattr(data, "getlist") else []
        scopes = data.getlist(f"{name}-scope") if hasattr(data, "getlist") else []
        return [
            (str(k), str(a).strip(), str(s))
            for k, a, s in zip(kinds, amounts, scopes, strict=False)
        ]

    def value_omitted_from_data(self, data: Any, files: Any, name: str) -> bool:
        return f"{name}-kind" not in data

    def _scope_select(self, name: str, chosen: str, i: int) -> SafeString:
        periods = format_html_join(
            "",
            '<option value="period:{}"{}>per {}</option>',
            ((p, mark_safe(" selected") if chosen == f"period:{p}" else "", p) for p in PERIODS),
        )
        names = list(self.providers)
        stored = chosen.removeprefix("provider:")
        if chosen.startswith("provider:") and stored and stored not in names:
            names.append(stored)  # a removed provider stays visible (the save then names it)
        providers = format_html_join(
            "",
            '<option value="provider:{}"{}>{}</option>',
            ((p, mark_safe(" selected") if chosen == f"provider:{p}" else "", p) for p in names),
        )
        return format_html(
            '<select name="{}-scope" aria-label="period or provider of budget {}">'
            '<optgroup label="Period">{}</optgroup>'
            '<optgroup label="Provider (quota window)">{}</optgroup></select>',
            name,
            i + 1,
            periods,
            providers,
        )

    def _row(self, name: str, row: Row, i: int) -> SafeString:
        kind, amount, scope = row
        kinds = format_html_join(
            "",
            '<option value="{}"{}>{}</option>',
            ((k, mark_safe(" selected") if k == kind else "", label) for k, label in KINDS),
        )
        return format_html(
            '<div class="ocx-budget-row">'
            '<select name="{}-kind" aria-label="kind of budget {}">{}</select>'
            '<input type="number" name="{}-amount" value="{}" min="0" step="any" '
            'placeholder="amount" aria-label="amount of budget {}">'
            "{}</div>",
            name,
            i + 1,
            kinds,
            name,
            amount,
            i + 1,
            self._scope_select(name, scope, i),
        )

    def render(
        self,
        name: str,
        value: Any,
        attrs: dict[str, Any] | None = None,
        renderer: Any = None,
    ) -> SafeString:
        rows = [r for r in rows_of(value) if r[1]] + [("tokens", "", "period:day")] * BLANK_ROWS
        body = format_html_join("", "{}", ((self._row(name, r, i),) for i, r in enumerate(rows)))
        element = (attrs or {}).get("id", f"id_{name}")
        return format_html(
            '<div class="ocx-budget-rows" id="{}" data-name="{}">{}'
            '<button type="button" class="button ocx-add-budget">Add another budget</button>'
            "</div>",
            element,
            name,
            body,
        )


class BudgetRowsField(forms.Field):
    """Cleans to the canonical budget JSON (a list), validated by `parse_budgets`."""

    widget = BudgetRowsWidget

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("help_text", BUDGETS_HELP)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> list[dict[str, object]]:
        if not isinstance(value, list):
            return []
        items: list[dict[str, object]] = []
        errors: list[str] = []
        for i, (kind, amount, scope) in enumerate(value, start=1):
            if not amount:
                continue  # an empty row is no budget
            problem = _row_problem(kind, amount, scope)
            if problem is not None:
                errors.append(f"row {i}: {problem}")
                continue
            items.append(_row_json(kind, amount, scope))
        if errors:
            raise ValidationError(errors)
        return items

    def clean(self, value: Any) -> list[dict[str, object]]:
        items = self.to_python(value)
        try:
            return key_services.budgets_value(items or None)
        except ValidationError as exc:
            raise ValidationError(exc.messages) from None

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return _rows_key(rows_of(initial or [])) != _rows_key(rows_of(self.to_python(data)))
        except ValidationError:
            return True


def _rows_key(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r[1]]


def _row_problem(kind: str, amount: str, scope: str) -> str | None:
    if kind not in dict(KINDS):
        return "choose tokens, USD or % of quota window"
    try:
        number = float(amount)
    except ValueError:
        return f"the amount {amount!r} is not a number"
    if not math.isfinite(number):
        return "the amount must be a finite number"
    if kind == "tokens" and not number.is_integer():
        return "a tokens budget needs a whole number of tokens"
    if kind == "windowPercent" and not scope.startswith("provider:"):
        return "a quota-window budget needs a provider (third column)"
    if kind != "windowPercent" and not scope.startswith("period:"):
        return f"a {dict(KINDS)[kind]} budget needs a period (day, week or month)"
    return None


def _row_json(kind: str, amount: str, scope: str) -> dict[str, object]:
    number = float(amount)
    value: int | float = int(number) if number.is_integer() else number
    if kind == "windowPercent":
        return {"windowPercent": value, "provider": scope.removeprefix("provider:")}
    return {kind: value, "period": scope.removeprefix("period:")}


def allowed_model_choices(current: Sequence[str] = ()) -> list[tuple[str, str]]:
    """What a key may be limited to: every combo, then every provider model (declared or used
    by a combo) — the entries `allowed_models_problem` accepts — plus the key's current ones."""
    snapshot = selectors.config_snapshot()
    combos = sorted(f"combo/{c}" for c in snapshot.combos)
    targets = {f"{p.name}/{m}" for p in snapshot.providers.values() for m in p.models}
    targets |= {t.key for c in snapshot.combos.values() for t in c.targets}
    names = combos + sorted(targets)
    names += sorted(set(current) - set(names))
    return [(n, n) for n in names]


class ModelPicker(FilteredSelectMultiple):
    """Django's two-pane picker, wrapped: its script puts the panes first in the select's
    parent, which without a wrapper is the form row (the label would end up behind them)."""

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        inner = super().render(name, value, attrs, renderer)
        return format_html('<div class="ocx-model-picker">{}</div>', inner)


class AllowedModelsField(forms.MultipleChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("help_text", MODELS_HELP)
        kwargs.setdefault("widget", ModelPicker("allowed models", is_stacked=False))
        super().__init__(**kwargs)

    def clean(self, value: Any) -> list[str]:
        models = sorted(set(super().clean(value)))
        problem = key_services.allowed_models_problem(models)
        if problem is not None:
            raise ValidationError(problem)
        return models


def _providers() -> list[str]:
    return sorted(Provider.objects.values_list("name", flat=True))


class UserBudgetForm(forms.ModelForm):  # type: ignore[type-arg]
    budgets = BudgetRowsField()

    class Meta:
        model = UserBudget
        fields = ("user", "budgets")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["budgets"].widget.providers = _providers()  # type: ignore[attr-defined]


class ClientKeyForm(forms.ModelForm):  # type: ignore[type-arg]
    """The key admin's add and change form."""

    budgets = BudgetRowsField()
    allowed_models = AllowedModelsField()

    class Meta:
        model = ClientKey
        fields = ("user", "name", "allowed_models", "rpm_limit", "budgets", "expires")
        help_texts = {"expires": EXPIRES_HELP}
        labels = {"rpm_limit": "Requests per minute", "expires": "Expires"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["budgets"].widget.providers = _providers()  # type: ignore[attr-defined]
        current = list(self.instance.allowed_models or []) if self.instance.pk else []
        self.fields["allowed_models"].choices = allowed_model_choices(current)  # type: ignore[attr-defined]
        if "rpm_limit" in self.fields:
            self.fields["rpm_limit"].widget.attrs["min"] = 1

    def clean_user(self) -> Any:
        user = self.cleaned_data.get("user")
        if user is not None and not user.is_active and not self.instance.pk:
            raise ValidationError(
                f"user {user.get_username()} is deactivated: reactivate it before giving it a key"
            )
        return user

    def clean_rpm_limit(self) -> int | None:
        value: int | None = self.cleaned_data.get("rpm_limit")
        if value is not None and value < 1:
            raise ValidationError("requests per minute must be at least 1 (empty: no limit)")
        return value

    def clean_expires(self) -> dt.datetime | None:
        value: dt.datetime | None = self.cleaned_data.get("expires")
        if value is not None and self.instance.pk is None:
            try:
                expiry.future_expiry(value, now=timezone.now(), field="the expiry")
            except expiry.ExpiryError as exc:
                raise ValidationError(str(exc)) from None
        return value


def form_values(form: ClientKeyForm) -> Mapping[str, Any]:
    """The cleaned values `access.client_key_create` takes."""
    data = form.cleaned_data
    return {
        "username": data["user"].get_username(),
        "name": data.get("name") or "",
        "allowed_models": data.get("allowed_models") or [],
        "rpm_limit": data.get("rpm_limit"),
        "budgets": data.get("budgets") or [],
        "expires": data.get("expires"),
    }
