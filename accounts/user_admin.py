"""The admin's Users page with ocx's roles (docs/people.md): one "role" choice (admin, viewer,
member) instead of Django's staff/superuser boxes and per-user permissions, and the teams each
user manages."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.http import HttpRequest

from accounts import roles

ROLE_CHOICES = [
    ("", "— keep —"),
    (roles.ADMIN, "admin: everything"),
    (roles.VIEWER, "viewer: reads every admin page and GET /api/..., writes nothing"),
    (roles.MEMBER, "member: the portal at /me/ only"),
]
ROLE_HELP = "Team managers are named on each team (Teams page, or `ocx team set T --manager U`)."


class _RoleMixin(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES, required=False, help_text=ROLE_HELP)

    def apply_role(self, user: Any) -> None:
        role = self.cleaned_data.get("role")
        if role:
            user.is_staff, user.is_superuser = roles.role_flags(role)


class RoleChangeForm(_RoleMixin, UserChangeForm):  # type: ignore[type-arg]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["role"].initial = roles.role_of(self.instance)


class RoleCreationForm(_RoleMixin, AdminUserCreationForm):  # type: ignore[type-arg]
    pass


class OcxUserAdmin(UserAdmin):  # type: ignore[type-arg]
    form = RoleChangeForm
    add_form = RoleCreationForm
    list_display = ("username", "role", "managed", "is_active", "last_login")
    list_filter = ("is_superuser", "is_staff", "is_active", "groups")
    fieldsets = (
        (None, {"fields": ("username", "password")}),
        ("Personal info", {"fields": ("first_name", "last_name", "email")}),
        ("Role and teams", {"fields": ("role", "is_active", "groups")}),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = (
        (None, {"classes": ("wide",), "fields": ("username", "usable_password", "password1")}),
        (None, {"classes": ("wide",), "fields": ("password2", "role")}),
    )

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).prefetch_related("managed_teams__group")

    @admin.display(description="role")
    def role(self, obj: Any) -> str:
        return roles.role_of(obj)

    @admin.display(description="manages")
    def managed(self, obj: Any) -> str:
        return ", ".join(sorted(p.group.name for p in obj.managed_teams.all())) or "-"

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        form.apply_role(obj)
        super().save_model(request, obj, form, change)


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), OcxUserAdmin)
