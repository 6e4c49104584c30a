from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse

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
        raw: dict[str, object] = {
            "targets": [r[1] for r in rows],
            "strategy": combo.strategy,
            "stickyLimit": combo.sticky_limit,
            "waitForCooldownMs": combo.wait_for_cooldown_ms,
            "defaultEffort": combo.default_effort or None,
            "defaultEffortMode": combo.default_effort_mode,
            "reasoningEffortMode": combo.reasoning_effort_mode,
            "imageInput": combo.image_input,
            "nativeAlias": combo.native_alias,
        }
        if combo.cooldown_ms is not None:
            raw["cooldownMs"] = combo.cooldown_ms
        if combo.cooldown_wait_policy:
            raw["cooldownWaitPolicy"] = combo.cooldown_wait_policy
        if combo.alias:
            raw["alias"] = combo.alias
        if combo.display_name:
            raw["displayName"] = combo.display_name
        if combo.override_target:
            raw["override"] = {"target": combo.override_target}
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
    list_display = ("combo_id", "public_id", "strategy", "target_list", "mode")
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

    @admin.display(description="mode")
    def mode(self, obj: Combo) -> str:
        return f"pin {obj.override_target}" if obj.override_target else "auto"

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        # Normalize positions to the saved order and publish the change to every worker.
        for i, target in enumerate(form.instance.targets.order_by("position", "id")):
            if target.position != i:
                ComboTarget.objects.filter(pk=target.pk).update(position=i)
        with transaction.atomic():
            provider_services.config_bump()
        if not change or form.has_changed() or any(f.has_changed() for f in formsets):
            # Reset the shared (Redis) routing state of the old and new id once.
            clear_on_commit({form.initial.get("combo_id") or "", form.instance.combo_id})

    def delete_model(self, request: HttpRequest, obj: Combo) -> None:
        combo_id = obj.combo_id
        super().delete_model(request, obj)
        provider_services.config_bump()
        clear_on_commit([combo_id])

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        combo_ids = list(queryset.values_list("combo_id", flat=True))
        super().delete_queryset(request, queryset)
        provider_services.config_bump()
        clear_on_commit(combo_ids)

    @admin.action(description="Set mode to automatic (clear the override)")
    def clear_override(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic():
            pinned = queryset.exclude(override_target=None)
            combo_ids = list(pinned.values_list("combo_id", flat=True))
            count = pinned.update(override_target=None)
            provider_services.config_bump()
            clear_on_commit(combo_ids)
        self.message_user(request, f"{count} combo(s) set to automatic.", messages.SUCCESS)

    @admin.action(description="Export the Codex model catalog (JSON)")
    def export_catalog(self, request: HttpRequest, queryset: Any) -> HttpResponse:
        result = build_catalog(selectors.config_snapshot())
        response = HttpResponse(catalog_json(result), content_type="application/json")
        response["Content-Disposition"] = 'attachment; filename="ocx-catalog.json"'
        return response
