from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import RelatedFieldWidgetWrapper
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme

from audit import trail
from combos import selectors, services
from combos.models import Combo, ComboTarget
from combos.state_reset import clear_on_commit
from providers import services as provider_services
from providers.errors import ConfigError
from routing import validate
from routing.catalog import build_catalog, catalog_json

COMBO_HELP = {
    "combo_id": "Letters, numbers, dot, underscore or hyphen (max 64). Clients ask for "
    "combo/ID (or the alias).",
    "display_name": "The name Codex shows in its model picker. Empty = the model id "
    "(required for a native alias).",
    "strategy": "How a target is picked: failover = the first eligible target in the order "
    "below; round-robin / random = by weight; least-used; reset-window = the soonest quota "
    "reset first. Default failover.",
    "sticky_limit": "Round-robin: successful requests a target serves before the next one "
    "takes over (1-100). Default 1; other strategies ignore it.",
    "cooldown_ms": "How long a failed target rests when the upstream sends no Retry-After or "
    "reset time (1-600000 ms). Empty = the upstream hint, else 60 s (5 s for a request-rate "
    "429, 10 min for a spent quota or a bad key).",
    "wait_for_cooldown_ms": "When every target is cooling, wait up to this long for one to "
    "recover (0-600000 ms). 0 = answer at once with the cooldown error.",
    "cooldown_wait_policy": "before-last-resort: wait for a cooling target before calling "
    "last-resort targets. Empty = last-resort targets are ordinary targets.",
    "default_effort": "The reasoning effort added when a request sets none (or always, in "
    "force mode), resolved to each target's ladder. Empty = nothing added.",
    "default_effort_mode": "fallback = only when the request has no effort; force = replace "
    "the caller's effort. Default fallback.",
    "reasoning_effort_mode": "strict = an unknown effort ladder keeps the caller's controls; "
    "adaptive = they are removed. Default strict; target order is not affected.",
    "image_input": "auto = images pass to targets (the catalog lists image only if every "
    "target takes it); disabled = image requests get 400 before any target is called.",
    "after_commit": "When a stream breaks after its first output (cut, or silent past the "
    "target's idle timeout): error = end it with an explicit error (default; the client "
    "resends); continue = ask a prefill-capable target to continue the text so far in the "
    "same stream (text-only answers; never after a tool call); buffer = send nothing until "
    "the answer is complete, and restart on the next target when it breaks (costs "
    "first-token latency).",
    "max_continuations": "continue mode: continuations one request may make (1-3). Default 1.",
    "buffer_max_bytes": "buffer mode: the largest answer held back (1024-67108864 bytes); a "
    "larger one ends with an explicit error. Default 4194304 (4 MiB).",
    "alias": "Another model name clients may use instead of combo/ID. Empty = combo/ID only.",
    "native_alias": "Let the alias take over a bare OpenAI model name such as gpt-5.5 "
    "(needs a display name). Off = the alias must not look like an OpenAI model.",
    "override_target": "Manual override: provider/model of one target below to pin every "
    "request to. Empty = automatic (the strategy decides).",
    "retry_attempts": "Retry the same target before hopping, up to this many times (1-3), on a "
    "transient failure before any output: a 429 whose Retry-After fits the max wait, a 500/502/"
    "503/504 that is not quota or billing, a refused or reset connection. Never on quota, auth, "
    "other 4xx, context overflow or refusals. Empty = off: hop at once.",
    "retry_max_wait_ms": "The longest wait before such a retry (0-10000 ms): a longer "
    "Retry-After hops at once; without one the wait is 100-500 ms. Set both or neither.",
}
TARGET_HELP = {
    "position": "The order: drag the handle to move a target.",
    "provider": "The provider that serves this target.",
    "model": "The model id sent upstream: one the provider declares, or another id (saved "
    "with a warning).",
    "weight": "Share for round-robin and random (1-10000). Default 1; other strategies ignore it.",
    "last_resort": "Called only after waiting for cooling targets (needs the cooldown wait "
    "policy before-last-resort). Off = an ordinary target.",
}
# validate.Issue path heads (camelCase) -> the form field that shows the message.
COMBO_FIELD = {
    "strategy": "strategy",
    "stickyLimit": "sticky_limit",
    "cooldownMs": "cooldown_ms",
    "waitForCooldownMs": "wait_for_cooldown_ms",
    "cooldownWaitPolicy": "cooldown_wait_policy",
    "defaultEffort": "default_effort",
    "defaultEffortMode": "default_effort_mode",
    "reasoningEffortMode": "reasoning_effort_mode",
    "imageInput": "image_input",
    "afterCommit": "after_commit",
    "maxContinuations": "max_continuations",
    "bufferMaxBytes": "buffer_max_bytes",
    "alias": "alias",
    "nativeAlias": "native_alias",
    "displayName": "display_name",
    "override": "override_target",
    "retrySameTarget": "retry_attempts",
}
# Issues of an object field's own keys (path head + key) -> their form field.
COMBO_SUBFIELD = {
    "retrySameTarget.attempts": "retry_attempts",
    "retrySameTarget.maxWaitMs": "retry_max_wait_ms",
}
TARGET_FIELD = {"provider": "provider", "model": "model", "weight": "weight"}
TARGET_FIELD["lastResort"] = "last_resort"
# Only the camelCase names: "override" or "weight" already read as words.
_CAMEL = sorted(
    (n for n in {*COMBO_FIELD, *COMBO_SUBFIELD, *TARGET_FIELD} if n != n.lower()), key=len
)
_NAMES = re.compile(r"\b(" + "|".join(map(re.escape, reversed(_CAMEL))) + r")\b")
_TARGET_PATH = re.compile(r"targets\[(\d+)\](?:\.(\w+))?")


def human_message(message: str, *, in_row: bool = False) -> str:
    """An engine message in the admin's words: `stickyLimit` → "sticky limit",
    `targets[0].weight` → "target 1's weight" (just "weight" in that target's own row), the
    first letter capitalised."""

    def field(name: str) -> str:
        found = COMBO_SUBFIELD.get(name) or COMBO_FIELD.get(name) or TARGET_FIELD.get(name)
        return (found or name).replace("_", " ")

    def target(m: re.Match[str]) -> str:
        row = f"target {int(m[1]) + 1}"
        if in_row:
            return field(m[2]) if m[2] else "this target"
        return f"{row}'s {field(m[2])}" if m[2] else row

    text = _TARGET_PATH.sub(target, message)
    text = _NAMES.sub(lambda m: field(m[1]), text)
    return text[:1].upper() + text[1:]


class ComboForm(forms.ModelForm):  # type: ignore[type-arg]
    # The browser's own check says 1-100 like the help; the server's is the engine's rule
    # (a model field's "greater than or equal to 0" contradicted the help).
    sticky_limit = forms.IntegerField(
        initial=1,
        widget=forms.NumberInput(attrs={"min": 1, "max": 100}),
        help_text=COMBO_HELP["sticky_limit"],
    )
    max_continuations = forms.IntegerField(
        initial=1,
        widget=forms.NumberInput(attrs={"min": 1, "max": 3}),
        help_text=COMBO_HELP["max_continuations"],
    )

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
            "after_commit",
            "max_continuations",
            "buffer_max_bytes",
            "alias",
            "native_alias",
            "display_name",
            "override_target",
            "retry_attempts",
            "retry_max_wait_ms",
        ]
        help_texts = COMBO_HELP

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The targets formset validates the whole combo and puts each combo-level issue next
        # to its field here; the admin builds the formset on this form's instance.
        self.instance._combo_form = self


class ComboTargetForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = ComboTarget
        fields = ["position", "provider", "model", "weight", "last_resort"]
        widgets = {"position": forms.HiddenInput(attrs={"class": "ocx-position"})}
        help_texts = TARGET_HELP

    def has_changed(self) -> bool:
        # The drag script renumbers every row; a blank extra row stays blank (not "changed").
        if self.instance.pk is None:
            return any(name != "position" for name in self.changed_data)
        return super().has_changed()


class ComboTargetFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    """Runs the one combo validation function over the form and its ordered targets, and shows
    each issue next to its field (a target's issue in its row, the rest on the combo form)."""

    combo_issues = False

    def is_valid(self) -> bool:
        valid = super().is_valid()
        return valid and not self.combo_issues

    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        rows: list[tuple[int, int, forms.BaseForm, dict[str, Any]]] = []
        for n, form in enumerate(self.forms):
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE"):
                continue
            provider = data.get("provider")
            rows.append(
                (
                    data.get("position") or 0,
                    n,
                    form,
                    {
                        "provider": provider.name if provider else "",
                        "model": data.get("model") or "",
                        "weight": data.get("weight") if data.get("weight") is not None else 1,
                        "lastResort": bool(data.get("last_resort")),
                    },
                )
            )
        rows.sort(key=lambda r: (r[0], r[1]))
        combo: Combo = self.instance
        raw = selectors.combo_raw(combo, [r[3] for r in rows])
        from providers.models import Provider

        issues = validate.validate_combo(
            combo.combo_id,
            raw,
            providers={
                p.name: validate.ProviderInfo(name=p.name, disabled=p.disabled)
                for p in Provider.objects.all()
            },
            combos=selectors.combo_aliases(),
            exclude_combo_id=combo.combo_id
            if combo.pk is None
            else Combo.objects.get(pk=combo.pk).combo_id,
            require_enabled_target=True,
        )
        if issues:
            self._place(issues, [r[2] for r in rows])
            return
        blocked = _all_out_of_quota([r[3] for r in rows])
        if blocked is not None:
            raise forms.ValidationError(blocked)

    def _place(self, issues: list[validate.Issue], ordered: list[forms.BaseForm]) -> None:
        """Each issue next to its field; what has no field goes above the targets table."""
        combo_form: forms.ModelForm[Any] | None = getattr(self.instance, "_combo_form", None)
        loose: list[str] = []
        for issue in issues:
            head = issue.path[0] if issue.path else None
            if head == "targets" and len(issue.path) >= 2 and isinstance(issue.path[1], int):
                form = ordered[issue.path[1]]
                field = TARGET_FIELD.get(str(issue.path[2])) if len(issue.path) > 2 else "model"
                if field is not None and not form.has_error(field):
                    form.add_error(field, human_message(issue.message, in_row=True))
                    continue
                if field is not None:
                    continue
            sub = ".".join(map(str, issue.path[:2])) if len(issue.path) > 1 else ""
            field = "combo_id" if head is None else COMBO_SUBFIELD.get(sub)
            field = field or (None if head is None else COMBO_FIELD.get(str(head)))
            if combo_form is not None and field is not None and field in combo_form.fields:
                if not combo_form.has_error(field):
                    combo_form.add_error(field, human_message(issue.message))
                self.combo_issues = True
                continue
            loose.append(human_message(issue.message))
        if loose:
            raise forms.ValidationError(loose)


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
    form = ComboTargetForm
    formset = ComboTargetFormSet
    fields = ("position", "provider", "model", "weight", "last_resort")
    ordering = ("position",)
    classes = ("ocx-targets",)
    verbose_name = "target"
    verbose_name_plural = "targets, tried in this order (drag ☰ to reorder)"

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        wrapper = getattr(field, "widget", None)
        if isinstance(wrapper, RelatedFieldWidgetWrapper):
            # Only "add a provider" beside the select; edit/delete/view crowd the row.
            wrapper.can_change_related = False
            wrapper.can_delete_related = False
            wrapper.can_view_related = False
        return field

    def get_extra(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> int:
        # A new combo starts with one empty target row; an existing one with none.
        return 1 if obj is None else 0


@admin.register(Combo)
class ComboAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = ComboForm
    inlines = [ComboTargetInline]
    list_display = ("combo_id", "public_id", "strategy", "target_list", "mode", "live")
    readonly_fields = ("live",)
    list_filter = ("strategy",)
    search_fields = ("combo_id", "alias", "display_name")
    actions = ["clear_override", "reset_state", "export_catalog"]
    # The first fieldset (identity) is followed by the targets table (change_form.html).
    fieldsets = (
        (None, {"fields": ("combo_id", "display_name", "strategy")}),
        (
            "Routing",
            {
                "fields": (
                    "sticky_limit",
                    "cooldown_ms",
                    "wait_for_cooldown_ms",
                    "cooldown_wait_policy",
                    "retry_attempts",
                    "retry_max_wait_ms",
                )
            },
        ),
        ("Model names", {"fields": ("alias", "native_alias")}),
        (
            "Request shaping",
            {
                "classes": ("collapse",),
                "fields": (
                    "default_effort",
                    "default_effort_mode",
                    "reasoning_effort_mode",
                    "image_input",
                ),
            },
        ),
        (
            "When a stream breaks after it started",
            {"fields": ("after_commit", "max_continuations", "buffer_max_bytes")},
        ),
        ("Manual override", {"fields": ("override_target",)}),
        ("Live status", {"fields": ("live",)}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        # A combo being added has no live status yet.
        fieldsets = super().get_fieldsets(request, obj)
        return fieldsets if obj is not None else fieldsets[:-1]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        # The editor's model picker: each provider's declared models, by provider pk.
        from providers.models import ProviderModel

        declared: dict[str, list[str]] = {}
        for provider_pk, model_id in ProviderModel.objects.values_list("provider", "model_id"):
            declared.setdefault(str(provider_pk), []).append(model_id)
        context["declared_models"] = declared
        return super().render_change_form(request, context, add, change, form_url, obj)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # One config read per page, shared by the notes and every row's badges.
        snapshot = request._ocx_snapshot = selectors.config_snapshot()  # type: ignore[attr-defined]
        context = {**(extra_context or {}), "needs_attention": selectors.needs_attention(snapshot)}
        return super().changelist_view(request, extra_context=context)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        # The page's badges in one live-state read (not a config reload per row).
        from combos.status import page_badges

        cl = super().get_changelist_instance(request)
        rows = list(cl.result_list)
        badges = page_badges([c.combo_id for c in rows], getattr(request, "_ocx_snapshot", None))
        for combo in rows:
            combo._ocx_badges = badges.get(combo.combo_id)
        return cl

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

        if hasattr(obj, "_ocx_badges"):  # computed for the list page (None: no targets)
            return str(obj._ocx_badges or "—")
        return live_badges(obj.combo_id)

    def get_urls(self) -> list[Any]:
        urls = super().get_urls()
        view = self.admin_site.admin_view(self.events_view)
        reset = self.admin_site.admin_view(self.reset_view)
        return [
            path("events/", view, name="combos_combo_events"),
            path("<str:combo_id>/reset/", reset, name="combos_combo_reset"),
            *urls,
        ]

    def reset_view(self, request: HttpRequest, combo_id: str) -> HttpResponse:
        """POST from a target's "Clear" button (or with no target: the whole combo)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        target = request.POST.get("target") or None
        try:
            spec = services.combo_reset(combo_id=combo_id, target=target)
        except ConfigError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            what = f"{target} in combo {spec.id}" if target else f"combo {spec.id}"
            self.message_user(request, f"Cleared the routing state of {what}.", messages.SUCCESS)
        back = request.POST.get("next") or request.META.get("HTTP_REFERER") or ""
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = reverse("admin:index")
        return HttpResponseRedirect(back)

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
            old_id = form.initial.get("combo_id") or form.instance.combo_id
            ids = {old_id, form.instance.combo_id}
            provider_services.config_bump(("combo", c) for c in ids)
        for note in selectors.combo_warnings(form.instance.combo_id):
            messages.warning(request, note)

    def delete_model(self, request: HttpRequest, obj: Combo) -> None:
        combo_id = obj.combo_id
        super().delete_model(request, obj)
        clear_on_commit([combo_id])
        provider_services.config_bump([("combo", combo_id)])

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        combo_ids = list(queryset.values_list("combo_id", flat=True))
        super().delete_queryset(request, queryset)
        clear_on_commit(combo_ids)
        provider_services.config_bump(("combo", c) for c in combo_ids)

    @admin.action(description="Set mode to automatic (clear the override)", permissions=["change"])
    def clear_override(self, request: HttpRequest, queryset: Any) -> None:
        with transaction.atomic():
            pinned = queryset.exclude(override_target=None)
            combo_ids = list(pinned.values_list("combo_id", flat=True))
            for combo_id in combo_ids:
                trail.touch("combo", combo_id)  # an update sends no signal
            count = pinned.update(override_target=None)
            clear_on_commit(combo_ids)
            provider_services.config_bump(("combo", c) for c in combo_ids)
        self.message_user(request, f"{count} combo(s) set to automatic.", messages.SUCCESS)

    @admin.action(description="Clear cooldowns (reset the routing state)", permissions=["change"])
    def reset_state(self, request: HttpRequest, queryset: Any) -> None:
        ids = list(queryset.values_list("combo_id", flat=True))
        for combo_id in ids:
            services.combo_reset(combo_id=combo_id)
        self.message_user(
            request,
            f"Cleared the routing state (cooldowns, probes, rotation) of {len(ids)} combo(s).",
            messages.SUCCESS,
        )

    @admin.action(description="Export the Codex model catalog (JSON)")
    def export_catalog(self, request: HttpRequest, queryset: Any) -> HttpResponse:
        result = build_catalog(selectors.config_snapshot())
        response = HttpResponse(catalog_json(result), content_type="application/json")
        response["Content-Disposition"] = 'attachment; filename="ocx-catalog.json"'
        return response
