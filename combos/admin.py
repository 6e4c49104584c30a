from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from combos import selectors
from combos.engine import validate
from combos.engine.catalog import build_catalog, catalog_json
from combos.models import Combo, ComboTarget
from combos.state_reset import clear_on_commit
from providers import services as provider_services


class ComboForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Combo
        fields = [
            "combo_id",
            "strategy",
            "sticky_limit",
            "cooldown_ms",
            "wait_for_cooldown_ms",
            "cooldown_wait_policy",
            "default_effort",
            "default_effort_mode",
            "reasoning_effort_mode",
            "image_input",
            "alias",
            "native_alias",
            "display_name",
            "override_target",
        ]
        help_texts = {
            "override_target": "Manual override: provider/model of one target; empty = automatic.",
        }


class ComboTargetFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    """Runs the one combo validation function over the form and its ordered targets."""

    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        rows = []
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE"):
                continue
            provider = data.get("provider")
            rows.append(
                (
                    data.get("position") or 0,
                    {
                        "provider": provider.name if provider else "",
                        "model": data.get("model") or "",
                        "weight": data.get("weight") if data.get("weight") is not None else 1,
                        "lastResort": bool(data.get("last_resort")),
                    },
                )
            )
        rows.sort(key=lambda r: r[0])
        combo: Combo = self.instance
        raw = selectors.combo_raw(combo, [r[1] for r in rows])
        from providers.models import Provider

        issues = validate.validate_combo(
            combo.combo_id,
            raw,
            providers={
                p.name: validate.ProviderInfo(name=p.name, disabled=p.disabled)
                for p in Provider.objects.all()
            },
            combos=selectors.combos_raw_map(),
            exclude_combo_id=combo.combo_id
            if combo.pk is None
            else Combo.objects.get(pk=combo.pk).combo_id,
            require_enabled_target=True,
        )
        if issues:
            raise forms.ValidationError([i.message for i in issues])
        blocked = _all_out_of_quota([r[1] for r in rows])
        if blocked is not None:
            raise forms.ValidationError(blocked)


def _all_out_of_quota(targets: list[dict[str, Any]]) -> str | None:
    """The reason to refuse a save when every usable target has a confirmed, current,
    exhausted inference quota for its credential (reference §2.7); None otherwise."""
    from combos import live
    from providers.models import Provider
    from quota import windows as qw

    now = int(time.time() * 1000)
    records = live.load((), reasons=False).records
    providers = {
        p.name: p for p in Provider.objects.filter(name__in=[t["provider"] for t in targets])
    }
    usable = []
    for t in targets:
        provider = providers.get(t["provider"])
        if provider is None or provider.disabled:
            continue
        if provider.adapter == "chatgpt":
            # Caller-forward credentials are per user: never "confirmed" for everyone.
            return None
        usable.append(t)
    reasons = []
    for t in usable:
        limited = [
            r
            for (name, _), r in records.items()
            if name == t["provider"]
            and qw.eligibility(r.state, now=now) == "ineligible"
            and any(qw.is_exhausted(w, now=now) for w in r.state.exhausted)
        ]
        if not limited:
            return None
        until = max(qw.recovery_at(r.state) or 0 for r in limited)
        when = dt.datetime.fromtimestamp(until / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        reasons.append(f"{t['provider']}/{t['model']} until {when}")
    if not reasons:
        return None
    return "Every usable target is out of quota: " + "; ".join(reasons)


class ComboTargetInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ComboTarget
    formset = ComboTargetFormSet
    fields = ("position", "provider", "model", "weight", "last_resort")
    ordering = ("position",)
    extra = 0


@admin.register(Combo)
class ComboAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = ComboForm
    inlines = [ComboTargetInline]
    list_display = ("combo_id", "public_id", "strategy", "target_list", "mode", "live")
    readonly_fields = ("live",)
    list_filter = ("strategy",)
    search_fields = ("combo_id", "alias", "display_name")
    actions = ["clear_override", "export_catalog"]
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "combo_id",
                    "strategy",
                    "sticky_limit",
                    "display_name",
                    "alias",
                    "native_alias",
                )
            },
        ),
        ("Cooldowns", {"fields": ("cooldown_ms", "wait_for_cooldown_ms", "cooldown_wait_policy")}),
        (
            "Request shaping",
            {
                "fields": (
                    "default_effort",
                    "default_effort_mode",
                    "reasoning_effort_mode",
                    "image_input",
                )
            },
        ),
        ("Manual override", {"fields": ("override_target",)}),
        ("Live status", {"fields": ("live",)}),
    )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        context = {**(extra_context or {}), "needs_attention": selectors.needs_attention()}
        return super().changelist_view(request, extra_context=context)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).prefetch_related("targets__provider")

    @admin.display(description="model id")
    def public_id(self, obj: Combo) -> str:
        return obj.alias or f"combo/{obj.combo_id}"

    @admin.display(description="targets")
    def target_list(self, obj: Combo) -> str:
        return ", ".join(f"{t.provider.name}/{t.model}" for t in obj.targets.all())

    @admin.display(description="live status")
    def live(self, obj: Combo) -> str:
        if obj.pk is None:
            return "—"
        from combos.status import live_badges

        return live_badges(obj.combo_id)

    def get_urls(self) -> list[Any]:
        urls = super().get_urls()
        view = self.admin_site.admin_view(self.events_view)
        return [path("events/", view, name="combos_combo_events"), *urls]

    def events_view(self, request: HttpRequest) -> HttpResponse:
        context = {**self.admin_site.each_context(request), "title": "Routing events"}
        return TemplateResponse(request, "admin/combos/combo/events.html", context)

    @admin.display(description="mode")
    def mode(self, obj: Combo) -> str:
        return f"pin {obj.override_target}" if obj.override_target else "auto"

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        # Normalize positions to the saved order and publish the change to every worker.
        for i, target in enumerate(form.instance.targets.order_by("position", "id")):
            if target.position != i:
                ComboTarget.objects.filter(pk=target.pk).update(position=i)
        if not change or form.has_changed() or any(f.has_changed() for f in formsets):
            # Reset the shared (Redis) routing state of the old and new id once, before the
            # bump tells the workers to reload.
            clear_on_commit({form.initial.get("combo_id") or "", form.instance.combo_id})
        with transaction.atomic():
            provider_services.config_bump()

    def delete_model(self, request: HttpRequest, obj: Combo) -> None:
        combo_id = obj.combo_id
        super().delete_model(request, obj)
        clear_on_commit([combo_id])
        provider_services.config_bump()

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        combo_ids = list(queryset.values_list("combo_id", flat=True))
        super().delete_queryset(request, queryset)
        clear_on_commit(combo_ids)
        provider_services.config_bump()

    @admin.action(description="Set mode to automatic (clear the override)")
    def clear_override(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic():
            pinned = queryset.exclude(override_target=None)
            combo_ids = list(pinned.values_list("combo_id", flat=True))
            count = pinned.update(override_target=None)
            clear_on_commit(combo_ids)
            provider_services.config_bump()
        self.message_user(request, f"{count} combo(s) set to automatic.", messages.SUCCESS)

    @admin.action(description="Export the Codex model catalog (JSON)")
    def export_catalog(self, request: HttpRequest, queryset: Any) -> HttpResponse:
        result = build_catalog(selectors.config_snapshot())
        response = HttpResponse(catalog_json(result), content_type="application/json")
        response["Content-Disposition"] = 'attachment; filename="ocx-catalog.json"'
        return response
