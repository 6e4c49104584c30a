from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from accounts import access, expiry, key_forms
from accounts.models import ClientKey, ManagementToken, UserBudget
from usage import budget_selectors, ledger_view
from usage.budgets import scoped_budgets, stored_budgets

BUDGETS_HELP = key_forms.BUDGETS_HELP
GRACE_CHOICES: tuple[tuple[int, str], ...] = (
    (0, "none: the old secret stops now"),
    (3600, "1 hour"),
    (86400, "1 day"),
    (7 * 86400, "7 days"),
    (30 * 86400, "30 days"),
)


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
    """Keys are added here too: the secret is shown once, on the page the save answers with
    (never in a URL, a message or a log); "Rotate selected key" shows a new one the same way."""

    form = key_forms.ClientKeyForm
    list_display = (
        "prefix",
        "user_link",
        "name",
        "rpm_limit",
        "budget_use",
        "expiry",
        "created",
        "revoked",
    )
    list_filter = ("revoked", KeyUserFilter)
    list_select_related = ("user", "user__ocx_budget")
    list_per_page = 100
    search_fields = ("prefix", "user__username", "name")
    autocomplete_fields = ("user",)  # thousands of users: a search box, not a list
    readonly_fields = ("prefix", "created", "rotated", "previous_until", "revoked", "budget_use")
    actions = ["revoke", "rotate"]
    add_fields = ("user", "name", "allowed_models", "rpm_limit", "budgets", "expires")
    change_fields = (
        *add_fields,
        "budget_use",
        "prefix",
        "created",
        "rotated",
        "previous_until",
        "revoked",
    )

    def get_fields(self, request: HttpRequest, obj: ClientKey | None = None) -> Any:
        return self.change_fields if obj is not None else self.add_fields

    def get_readonly_fields(self, request: HttpRequest, obj: ClientKey | None = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    @admin.display(description="expires", ordering="expires")
    def expiry(self, obj: ClientKey) -> str:
        if obj.expires is None:
            return "-"
        past = obj.expires <= timezone.now()
        return f"{'expired' if past else ''} {expiry.iso(obj.expires)}".strip()

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: ClientKey | None = None,
    ) -> HttpResponse:
        if add:
            # The save answers with the secret's page: no "save and add another/continue".
            context.update(show_save_and_add_another=False, show_save_and_continue=False)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def save_model(self, request: HttpRequest, obj: ClientKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key, secret = access.client_key_create(**key_forms.form_values(form), create_user=False)
        # The admin goes on with `obj` (its log entry, the answer): make it the stored row.
        for field in ClientKey._meta.concrete_fields:
            setattr(obj, field.attname, getattr(key, field.attname))
        obj._state.adding, obj._state.db = False, key._state.db
        request._ocx_new_secret = secret  # type: ignore[attr-defined]  # for response_add only

    def response_add(
        self, request: HttpRequest, obj: ClientKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        secret = getattr(request, "_ocx_new_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        return self._secret_page(request, obj, secret, title="Client key created")

    def _secret_page(
        self, request: HttpRequest, key: ClientKey, secret: str, *, title: str
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "key": key,
            "secret": secret,
            "expires": expiry.iso(key.expires) if key.expires else None,
            "previous_until": (
                expiry.iso(key.previous_until)
                if key.rotated is not None
                and key.previous_until is not None
                and key.previous_until > key.rotated
                else None
            ),
            "rotated": title != "Client key created",
            "opts": self.opts,
            "media": self.media,
        }
        response = TemplateResponse(request, "admin/accounts/clientkey/secret.html", context)
        response["Cache-Control"] = "no-store"  # the secret must not stay in any cache
        return response

    @admin.display(description="budgets and use")
    def budget_use(self, obj: ClientKey) -> str:
        """Each budget of the key and its user: what its period used, as recorded."""
        if obj.pk is None:
            return "—"
        teams = access.team_budgets(access.teams_by_user([obj.user_id]).get(obj.user_id, ()))
        uses = budget_selectors.budget_use(scoped_budgets(obj) + teams)
        if not uses:
            return "—"
        # The budget that binds the key first (its own, its user's or a team's: issue 42).
        return ledger_view.binding_html(uses)

    @admin.display(description="user", ordering="user__username")
    def user_link(self, obj: ClientKey) -> str:
        name = obj.user.get_username()
        return format_html('<a href="?{}">{}</a>', urlencode({"user": name}), name)

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ClientKey]) -> None:
        count = access.client_keys_revoke(keys=queryset)
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)

    @admin.action(description="Rotate selected key", permissions=["change"])
    def rotate(
        self, request: HttpRequest, queryset: QuerySet[ClientKey]
    ) -> HttpResponseBase | None:
        """First a page to choose the grace period, then the new secret, shown once."""
        keys = list(queryset.select_related("user")[:2])
        if len(keys) != 1 or keys[0].revoked is not None:
            self.message_user(
                request, "Select exactly one unrevoked key to rotate.", messages.ERROR
            )
            return None
        key = keys[0]
        if request.POST.get("confirm") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": "Rotate a client key",
                "key": key,
                "grace_choices": GRACE_CHOICES,
                "opts": self.opts,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/accounts/clientkey/rotate.html", context)
        try:
            grace = expiry.grace_value(int(request.POST.get("grace", "")))
        except (ValueError, expiry.ExpiryError):
            self.message_user(request, "Choose a grace period.", messages.ERROR)
            return None
        try:
            key, secret = access.client_key_rotate(key_id=key.pk, grace=grace)
        except ClientKey.DoesNotExist:
            self.message_user(request, "The key was revoked meanwhile.", messages.ERROR)
            return None
        self.log_change(request, key, f"Rotated the secret (grace {_grace_text(grace)}).")
        return self._secret_page(request, key, secret, title="Client key rotated")


@admin.register(UserBudget)
class UserBudgetAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A user's budgets, shared by all their keys."""

    form = key_forms.UserBudgetForm
    list_display = ("user", "budget_list", "updated")
    search_fields = ("user__username",)
    fields = ("user", "budgets")
    autocomplete_fields = ("user",)

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

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ManagementToken]) -> None:
        count = access.mgmt_tokens_revoke(tokens=queryset)
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)


def _grace_text(grace: dt.timedelta) -> str:
    seconds = int(grace.total_seconds())
    return dict(GRACE_CHOICES).get(seconds, f"{seconds} s").split(":")[0]


# The Teams and Users pages (their own modules; imported here so that the admin's
# autodiscovery finds them).
from accounts import team_admin, user_admin  # noqa: E402, F401
