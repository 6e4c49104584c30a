from __future__ import annotations

from typing import Any

from django import forms
from django.apps import apps
from django.contrib import admin
from django.db import transaction
from django.http import HttpRequest

from providers import presets, services
from providers.models import Provider, ProviderModel
from providers.sealing import mask, seal
from routing import validate


def _csv(value: str) -> list[str] | None:
    value = (value or "").strip()
    if value == "":
        return None
    if value == "-":
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


class ProviderForm(forms.ModelForm):  # type: ignore[type-arg]
    api_key = forms.CharField(
        label="API key",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave empty to keep the stored key. Prefer an environment variable.",
    )
    clear_api_key = forms.BooleanField(label="Remove the stored API key", required=False)
    preset = forms.ChoiceField(
        label="Preset",
        required=False,
        choices=[("", "— none —")]
        + [(n, f"{n}: {p['description']}") for n, p in presets.PRESETS.items()],
        # The option texts are long: the select wraps to the page instead of running past it.
        widget=forms.Select(attrs={"style": "max-width: 100%; width: 36em"}),
        help_text=(
            "Fills adapter, base URL, key variable, headers and the preset's models "
            f"(checked {presets.CHECKED}; check the numbers). Fields you fill in win."
        ),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # With a preset the adapter and base URL may be left empty (the preset fills them).
        for field in ("adapter", "base_url"):
            if field in self.fields:
                self.fields[field].required = False

    def _apply_preset(self, cleaned: dict[str, Any]) -> None:
        name = cleaned.get("preset")
        if not name:
            for field in ("adapter", "base_url"):
                if not cleaned.get(field):
                    self.add_error(field, "This field is required (or choose a preset).")
            return
        base = presets.preset_provider(name)
        for field, key in (("adapter", "adapter"), ("base_url", "baseUrl")):
            if not cleaned.get(field):
                cleaned[field] = base[key]
                setattr(self.instance, field, base[key])
        if not cleaned.get("api_key_env") and base.get("apiKeyEnv"):
            cleaned["api_key_env"] = base["apiKeyEnv"]
            self.instance.api_key_env = base["apiKeyEnv"]
        headers = {**base.get("headers", {}), **(cleaned.get("headers") or {})}
        cleaned["headers"] = headers
        self.instance.headers = headers

    class Meta:
        model = Provider
        fields = [
            "name",
            "adapter",
            "base_url",
            "api_key_env",
            "headers",
            "disabled",
            "connect_ms",
            "first_byte_ms",
            "idle_ms",
            "total_ms",
            "max_connections",
            "pricing_provider",
        ]
        help_texts = {
            "pricing_provider": (
                "The genai-prices provider id whose prices cost this provider's requests "
                "(openai, anthropic, openrouter, google, azure, …). Empty: inferred from the "
                "adapter and base URL; a local server has none. A model's own price wins."
            )
        }

    def raw(self) -> dict[str, object]:
        data = self.cleaned_data
        raw: dict[str, object] = {
            "adapter": data.get("adapter"),
            "baseUrl": data.get("base_url"),
            "headers": data.get("headers") or {},
            "disabled": bool(data.get("disabled")),
            "timeouts": {
                "connectMs": data.get("connect_ms"),
                "firstByteMs": data.get("first_byte_ms"),
                "idleMs": data.get("idle_ms"),
                "totalMs": data.get("total_ms"),
            },
            "maxConnections": data.get("max_connections"),
            "pricingProvider": data.get("pricing_provider") or None,
        }
        if data.get("api_key_env"):
            raw["apiKeyEnv"] = data["api_key_env"]
        return raw

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self._apply_preset(cleaned)
        name = cleaned.get("name")
        if name and not self.errors:
            # Looked up by name: providers sits below combos and never imports it.
            combo_model = apps.get_model("combos", "Combo")
            combo_ids = list(combo_model.objects.values_list("combo_id", flat=True))
            issues = validate.validate_provider(name, self.raw(), combo_ids=combo_ids)
            for issue in issues:
                self.add_error(None, issue.message)
        self._check_key_follows(cleaned)
        return cleaned

    def address_moved(self) -> bool:
        moved = {"adapter", "base_url"} & set(self.changed_data)
        return self.instance.pk is not None and bool(moved)

    def _check_key_follows(self, cleaned: dict[str, Any]) -> None:
        """A changed address needs the key again (services.key_follow_problem): a typed key,
        a changed key variable, or the stored key removed."""
        if not self.address_moved() or self.errors:
            return
        stored = Provider.objects.filter(pk=self.instance.pk).first()
        given = bool(cleaned.get("api_key") or cleaned.get("clear_api_key"))
        given = given or "api_key_env" in self.changed_data
        problem = services.key_follow_problem(
            stored,
            adapter=cleaned.get("adapter") or "",
            base_url=cleaned.get("base_url") or "",
            key_given=given,
        )
        if problem is not None:
            self.add_error("api_key", problem.removeprefix("apiKey: "))


class ProviderModelFormSet(forms.BaseInlineFormSet):  # type: ignore[type-arg]
    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        models: dict[str, object] = {}
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE") or not data.get("model_id"):
                continue
            entry: dict[str, object] = {}
            for field, key in (
                ("context_window", "contextWindow"),
                ("max_input_tokens", "maxInputTokens"),
                ("parallel_tool_calls", "parallelToolCalls"),
                ("prefill", "prefill"),
            ):
                if data.get(field) is not None:
                    entry[key] = data[field]
            if data.get("display_name"):
                entry["displayName"] = data["display_name"]
            if data.get("input_modalities") is not None:
                entry["inputModalities"] = data["input_modalities"]
            if data.get("reasoning_efforts") is not None:
                entry["reasoningEfforts"] = data["reasoning_efforts"]
            price = model_price(data)
            if price is not None:
                entry["price"] = price
            if data["model_id"] in models:
                raise forms.ValidationError(f"model {data['model_id']} is listed twice")
            models[data["model_id"]] = entry
        issues = validate.validate_provider(
            self.instance.name or "provider",
            {
                "adapter": self.instance.adapter or "openai-responses",
                "baseUrl": self.instance.base_url or "http://x",
                "models": models,
            },
            combo_ids=[],
        )
        messages = [i.message for i in issues if i.path[:1] == ("models",)]
        if messages:
            raise forms.ValidationError(messages)


# The model's `price` as three columns: (form field, JSON key, column label).
PRICE_COLUMNS = (
    ("price_input", "inputPerMTok", "input $/MTok"),
    ("price_cached_input", "cachedInputPerMTok", "cached input $/MTok"),
    ("price_output", "outputPerMTok", "output $/MTok"),
)


def model_price(data: dict[str, Any]) -> dict[str, object] | None:
    """The `price` object of a model row, or None when no price column is filled (the
    genai-prices data prices it). Checked by `validate.validate_provider` like the API."""
    price = {key: data[field] for field, key, _ in PRICE_COLUMNS if data.get(field) is not None}
    return price or None


class ProviderModelForm(forms.ModelForm):  # type: ignore[type-arg]
    input_modalities = forms.CharField(
        required=False, help_text="text or text,image; empty = not declared"
    )
    reasoning_efforts = forms.CharField(
        required=False, help_text="low,medium,high; empty = unknown; - = no effort control"
    )
    price_input = forms.FloatField(
        label=PRICE_COLUMNS[0][2],
        required=False,
        help_text="USD per million tokens; empty = the genai-prices price",
    )
    price_cached_input = forms.FloatField(
        label=PRICE_COLUMNS[1][2], required=False, help_text="empty = the input price"
    )
    price_output = forms.FloatField(label=PRICE_COLUMNS[2][2], required=False)

    class Meta:
        model = ProviderModel
        fields = [
            "model_id",
            "display_name",
            "context_window",
            "max_input_tokens",
            "input_modalities",
            "reasoning_efforts",
            "parallel_tool_calls",
            "prefill",
        ]
        help_texts = {
            "prefill": "Yes = the model continues a final assistant message (the provider "
            "documents prefill, e.g. Anthropic Messages); only such models are asked to "
            "continue a broken stream (combo after commit: continue). Unknown = not asked.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in ("input_modalities", "reasoning_efforts"):
            value = getattr(self.instance, field, None)
            if value is not None:
                self.initial[field] = ",".join(value) if value else "-"
        price = getattr(self.instance, "price", None) or {}
        for field, key, _ in PRICE_COLUMNS:
            if key in price:
                self.initial[field] = price[key]

    def save(self, commit: bool = True) -> Any:
        self.instance.price = model_price(self.cleaned_data)
        return super().save(commit)

    def clean_input_modalities(self) -> list[str] | None:
        return _csv(self.cleaned_data.get("input_modalities", ""))

    def clean_reasoning_efforts(self) -> list[str] | None:
        return _csv(self.cleaned_data.get("reasoning_efforts", ""))


class ProviderModelInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ProviderModel
    form = ProviderModelForm
    formset = ProviderModelFormSet
    extra = 0


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    class Media:
        css = {"all": ("ocx/provider-editor.css",)}

    form = ProviderForm
    inlines = [ProviderModelInline]
    list_display = ("name", "adapter", "base_url", "credential", "disabled")
    list_filter = ("adapter", "disabled")
    search_fields = ("name", "base_url")
    readonly_fields = ("stored_key",)
    fieldsets = (
        (None, {"fields": ("name", "adapter", "base_url", "disabled")}),
        ("Credential", {"fields": ("api_key_env", "api_key", "stored_key", "clear_api_key")}),
        (
            "Advanced",
            {
                "fields": (
                    "headers",
                    "connect_ms",
                    "first_byte_ms",
                    "idle_ms",
                    "total_ms",
                    "max_connections",
                )
            },
        ),
        ("Prices", {"fields": ("pricing_provider",)}),
    )

    @admin.display(description="credential")
    def credential(self, obj: Provider) -> str:
        if obj.api_key_env:
            return f"${obj.api_key_env}"
        return obj.api_key_hint or ("stored" if obj.api_key_sealed else "—")

    @admin.display(description="stored key")
    def stored_key(self, obj: Provider) -> str:
        return obj.api_key_hint or ("set" if obj.api_key_sealed else "none")

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        secret = form.cleaned_data.get("api_key")
        if secret:
            obj.api_key_sealed = seal(secret)
            obj.api_key_hint = mask(secret)
        elif form.cleaned_data.get("clear_api_key") or form.address_moved():
            # A new address given a new key variable: the sealed key stays behind.
            obj.api_key_sealed = ""
            obj.api_key_hint = ""
        super().save_model(request, obj, form, change)

    def get_fieldsets(self, request: HttpRequest, obj: Provider | None = None) -> Any:
        if obj is not None:
            return self.fieldsets
        first = ((None, {"fields": ("preset", "name", "adapter", "base_url", "disabled")}),)
        return first + tuple(self.fieldsets[1:])  # type: ignore[index]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        preset = form.cleaned_data.get("preset")
        if preset and not form.instance.models.exists():
            # The preset's models, unless models were entered inline.
            models = presets.preset_provider(preset).get("models", {})
            for model_id, spec in models.items():
                ProviderModel.objects.create(
                    provider=form.instance,
                    model_id=model_id,
                    context_window=spec.get("contextWindow"),
                    input_modalities=spec.get("inputModalities"),
                    reasoning_efforts=spec.get("reasoningEfforts"),
                    display_name=spec.get("displayName", ""),
                )
        with transaction.atomic():
            # A rename also drops the old name (combos over it point at the renamed row).
            names = {form.instance.name, form.initial.get("name") or form.instance.name}
            services.config_bump(("provider", n) for n in names)

    def delete_model(self, request: HttpRequest, obj: Provider) -> None:
        services.provider_delete(name=obj.name)
