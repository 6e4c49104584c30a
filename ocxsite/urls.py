from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.urls import include, path, re_path

from dashboard import views as dashboard_views
from ocxsite import views
from ocxsite.api import api

# A disallowed Host (and other bad requests) on Django's paths: see server/http_errors.py.
handler400 = "server.http_errors.bad_request"

admin.site.site_header = "ocx administration"
admin.site.site_title = "ocx"
# ocx has no site outside the admin: "View site" pointed at `/`, a 404.
admin.site.site_url = None

# The admin pages of the models that moved out of the `ocxsite` app (keys and tokens to
# `accounts`, the request log and budget events to `usage`): old bookmarks keep working.
_MOVED_ADMIN = {
    "clientkey": "accounts",
    "userbudget": "accounts",
    "managementtoken": "accounts",
    "requestlog": "usage",
    "budgetevent": "usage",
}


def moved_admin(request: HttpRequest, model: str, rest: str) -> HttpResponsePermanentRedirect:
    query = request.META.get("QUERY_STRING", "")
    target = f"/admin/{_MOVED_ADMIN[model]}/{model}/{rest}"
    return HttpResponsePermanentRedirect(target + (f"?{query}" if query else ""))


urlpatterns = [
    re_path(
        r"^admin/ocxsite/(?P<model>clientkey|userbudget|managementtoken|requestlog|budgetevent)/"
        r"(?P<rest>.*)$",
        moved_admin,
    ),
    # The dashboard's live parts (the page itself is the admin index); staff only.
    path(
        "admin/dashboard/live/",
        admin.site.admin_view(dashboard_views.live_fragment),
        name="ocx-dashboard-live",
    ),
    path(
        "admin/dashboard/charts/",
        admin.site.admin_view(dashboard_views.chart_data),
        name="ocx-dashboard-charts",
    ),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("me/", include("accounts.portal_urls")),  # the portal (docs/people.md)
    # Sign-in with the company's identity provider (docs/people.md#sso).
    path("", include("accounts.sso_urls")),
    path("healthz", views.healthz),
    path("readyz", views.readyz),
    path("metrics", views.metrics_view),
]
