"""`/login/sso` and its callback. The views (mozilla-django-oidc, PyJWT and `cryptography`
under it) are imported at the first sign-in: a worker that serves none stays lean (a Daphne
worker loads no `cryptography` bindings, tests/server/test_daphne_main.py)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path


def start(request: HttpRequest) -> HttpResponse:
    from accounts.sso_views import SsoStart

    response: HttpResponse = SsoStart.as_view()(request)
    return response


def callback(request: HttpRequest) -> HttpResponse:
    from accounts.sso_views import SsoCallback

    response: HttpResponse = SsoCallback.as_view()(request)
    return response


urlpatterns = [
    # 404 unless configured (docs/people.md#sso).
    path("login/sso", start, name="ocx-sso-start"),
    path("login/sso/callback", callback, name="ocx-sso-callback"),
]
