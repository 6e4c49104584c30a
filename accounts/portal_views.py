"""The portal's pages (`/me/`): sign in, my keys (create, rotate, revoke: the secret shown once
with the Codex config.toml snippet), my usage, spend and budgets, the catalog download, and for
a team manager their teams. Writes go through `accounts.portal` (the API's rules too)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from accounts import portal, roles
from combos import selectors
from routing.catalog import build_catalog, catalog_json

LOGIN_URL = "/me/login/"


def _context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {
        "site_header": "ocx",
        "site_title": "ocx",
        "title": extra.pop("title", "My keys and usage"),
        "has_permission": False,  # the admin's navigation is not the portal's
        "is_staff": getattr(request.user, "is_staff", False),
        **extra,
    }


class PortalLogin(auth_views.LoginView):
    template_name = "portal/login.html"
    redirect_authenticated_user = True
    next_page = "/me/"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), **_context(self.request, title="Sign in")}


class PortalLogout(auth_views.LogoutView):
    next_page = LOGIN_URL


def _model_choices(user: Any) -> list[str]:
    within = portal.team_models(user)
    if within is not None:
        return within
    snapshot = selectors.config_snapshot()
    names = {c.public_id for c in snapshot.combos.values()}
    names |= {f"{p.name}/{m}" for p in snapshot.providers.values() for m in p.models}
    return sorted(names)


class KeyForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="e.g. laptop")
    expires_in_days = forms.IntegerField(
        label="Expires in (days)", required=False, min_value=1, help_text="empty: never"
    )
    allowed_models = forms.MultipleChoiceField(
        required=False,
        help_text="none chosen: every model your teams allow",
        widget=forms.SelectMultiple(attrs={"size": 6}),
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["allowed_models"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [(m, m) for m in _model_choices(user)]
        days = settings.OCX_PORTAL_MAX_EXPIRY_DAYS
        if days:
            self.fields["expires_in_days"].required = True
            self.fields["expires_in_days"].help_text = f"at most {days}"


def _home(request: HttpRequest, form: KeyForm | None = None, status: int = 200) -> HttpResponse:
    user = request.user
    context = _context(
        request,
        keys=portal.my_keys(user),
        form=form or KeyForm(user=user),
        usage=portal.usage_summary(user),
        policy=portal.policy(),
        can_create=portal.policy().members_create
        or user.is_superuser
        or roles.is_team_manager(user),
        team_models=portal.team_models(user),
        managed=portal.managed_view(user),
    )
    return TemplateResponse(request, "portal/home.html", context, status=status)


@login_required(login_url=LOGIN_URL)
def home(request: HttpRequest) -> HttpResponse:
    return _home(request)


def _secret_page(request: HttpRequest, key: Any, secret: str, *, rotated: bool) -> HttpResponse:
    base_url = request.build_absolute_uri("/v1")
    models = list(key.allowed_models) or _model_choices(request.user)
    combos = [m for m in models if m.startswith("combo/")]
    context = _context(
        request,
        title="Key rotated" if rotated else "Key created",
        key=key,
        secret=secret,
        rotated=rotated,
        snippet=portal.codex_snippet(
            base_url=base_url, model=(combos or models or ["combo/main"])[0]
        ),
    )
    response = TemplateResponse(request, "portal/secret.html", context)
    response["Cache-Control"] = "no-store"  # the secret must not stay in any cache
    return response


@login_required(login_url=LOGIN_URL)
@require_POST
def create_key(request: HttpRequest) -> HttpResponse:
    form = KeyForm(request.POST, user=request.user)
    if not form.is_valid():
        return _home(request, form, status=400)
    data = form.cleaned_data
    try:
        key, secret = portal.key_create(
            user=request.user,
            name=data["name"],
            expires_in_days=data.get("expires_in_days"),
            allowed_models=data.get("allowed_models") or [],
        )
    except portal.PortalError as exc:
        form.add_error(None, exc.message)
        return _home(request, form, status=exc.status)
    return _secret_page(request, key, secret, rotated=False)


@login_required(login_url=LOGIN_URL)
@require_POST
def rotate_key(request: HttpRequest, key_id: int) -> HttpResponse:
    try:
        key, secret = portal.key_rotate(user=request.user, key_id=key_id)
    except portal.PortalError as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect("/me/")
    return _secret_page(request, key, secret, rotated=True)


@login_required(login_url=LOGIN_URL)
@require_POST
def revoke_key(request: HttpRequest, key_id: int) -> HttpResponse:
    try:
        portal.key_revoke(user=request.user, key_id=key_id)
    except portal.PortalError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Key revoked: it no longer works.")
    return HttpResponseRedirect("/me/")


@login_required(login_url=LOGIN_URL)
def catalog(request: HttpRequest) -> HttpResponse:
    """The Codex model catalog (`model_catalog_json`), as `ocx catalog write` makes it."""
    result = build_catalog(selectors.config_snapshot())
    response = HttpResponse(catalog_json(result), content_type="application/json")
    response["Content-Disposition"] = 'attachment; filename="ocx-catalog.json"'
    return response
