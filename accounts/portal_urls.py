"""`/me/`: the portal (docs/people.md)."""

from __future__ import annotations

from django.urls import path

from accounts import portal_views

urlpatterns = [
    path("", portal_views.home, name="portal-home"),
    path("login/", portal_views.PortalLogin.as_view(), name="portal-login"),
    path("logout/", portal_views.PortalLogout.as_view(), name="portal-logout"),
    path("keys/", portal_views.create_key, name="portal-key-create"),
    path("keys/<int:key_id>/rotate/", portal_views.rotate_key, name="portal-key-rotate"),
    path("keys/<int:key_id>/revoke/", portal_views.revoke_key, name="portal-key-revoke"),
    path("catalog.json", portal_views.catalog, name="portal-catalog"),
]
