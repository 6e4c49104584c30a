"""Admin: alert destinations (with *Send test*) and the outbox (failures, *Retry now*)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from alerts import selectors, services
from alerts.models import EVENTS, KINDS, PENDING, AlertDestination, AlertMessage


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.replace("\n", ",").split(",") if part.strip()]


class DestinationForm(forms.ModelForm):  # type: ignore[type-arg]
    kind = forms.ChoiceField(choices=[(k, k) for k in KINDS])
    url = forms.CharField(
        required=False, help_text="slack and webhook: the incoming-webhook URL", max_length=2000
    )
    to = forms.CharField(required=False, help_text="email: addresses, comma-separated")
    events = forms.MultipleChoiceField(
        choices=[(e, e) for e in EVENTS], widget=forms.CheckboxSelectMultiple
    )
    new_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput,
        label="secret",
        help_text="webhook: HMAC-SHA256 key for x-ocx-signature; blank keeps the stored one "
        "(it is never shown)",
    )
    clear_secret = forms.BooleanField(required=False, label="remove the secret")
    teams = forms.CharField(
        required=False, help_text="only events of these teams (comma-separated)"
    )
    combos = forms.CharField(
        required=False, help_text="only events of these combos (comma-separated)"
    )

    class Meta:
        model = AlertDestination
        fields = ("name",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        row = self.instance
        if row.pk:
            self.fields["kind"].initial = row.kind
            self.fields["url"].initial = row.url
            self.fields["to"].initial = ", ".join(row.to)
            self.fields["events"].initial = list(row.events)
            self.fields["teams"].initial = ", ".join(row.teams)
            self.fields["combos"].initial = ", ".join(row.combos)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        changes: dict[str, Any] = {
            "kind": data.get("kind"),
            "url": data.get("url") or "",
            "to": _split(data.get("to") or ""),
            "events_wanted": list(data.get("events") or []),
            "teams": _split(data.get("teams") or ""),
            "combos": _split(data.get("combos") or ""),
        }
        if data.get("clear_secret"):
            changes["secret"] = ""
        elif data.get("new_secret"):
            changes["secret"] = data["new_secret"]
        self.instance.name = data.get("name", "")
        try:
            services.apply_changes(self.instance, **changes)
        except ValidationError as exc:
            field = next(iter(exc.message_dict)) if hasattr(exc, "error_dict") else None
            target = {"events_wanted": "events", "secret": "new_secret"}.get(field or "", field)
            if target in self.fields:
                self.add_error(target, exc.message_dict[field or ""])
            else:
                raise
        return data


@admin.register(AlertDestination)
class AlertDestinationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = DestinationForm
    list_display = ("name", "kind", "where", "event_list", "team_list", "combo_list")
    search_fields = ("name",)
    actions = ["send_test"]
    fields = (
        "name",
        "kind",
        "url",
        "to",
        "events",
        "new_secret",
        "clear_secret",
        "teams",
        "combos",
    )

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        # Only `name` is copied onto the row by the ModelForm; the rest is checked and set by
        # the services (`DestinationForm.clean`), as the API and the CLI do.
        kwargs["fields"] = ["name"]
        return super().get_form(request, obj, change, **kwargs)

    @admin.display(description="to")
    def where(self, obj: AlertDestination) -> str:
        return ", ".join(obj.to) if obj.kind == "email" else selectors.masked_url(obj.url)

    @admin.display(description="events")
    def event_list(self, obj: AlertDestination) -> str:
        return ", ".join(obj.events)

    @admin.display(description="teams")
    def team_list(self, obj: AlertDestination) -> str:
        return ", ".join(obj.teams) or "all"

    @admin.display(description="combos")
    def combo_list(self, obj: AlertDestination) -> str:
        return ", ".join(obj.combos) or "all"

    @admin.action(description="Send test")
    def send_test(self, request: HttpRequest, queryset: QuerySet[AlertDestination]) -> None:
        for row in queryset:
            error = services.send_test(name=row.name)
            if error is None:
                self.message_user(request, f"Test message sent to {row.name}.", messages.SUCCESS)
            else:
                self.message_user(request, f"{row.name}: the test failed: {error}", messages.ERROR)


@admin.register(AlertMessage)
class AlertMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "created",
        "destination",
        "event",
        "status",
        "attempts",
        "folded",
        "next_at",
        "last_error",
        "text",
    )
    list_filter = ("status", "event", "destination")
    search_fields = ("key",)
    actions = ["retry_now"]
    readonly_fields = (
        "destination",
        "event",
        "key",
        "payload",
        "created",
        "folded",
        "status",
        "attempts",
        "next_at",
        "last_error",
        "sent_at",
    )

    @admin.display(description="text")
    def text(self, obj: AlertMessage) -> str:
        return str(obj.payload.get("text", ""))[:200]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Retry now")
    def retry_now(self, request: HttpRequest, queryset: QuerySet[AlertMessage]) -> None:
        # A failed message gets another 24 h from now; the sender picks them up on its next pass.
        n = queryset.exclude(status="sent").update(
            status=PENDING, next_at=timezone.now(), created=timezone.now()
        )
        self.message_user(request, f"{n} message(s) will be sent again.", messages.SUCCESS)
