from __future__ import annotations

from django.contrib import admin
from django.urls import path

from dashboard import views as dashboard_views
from ocxsite import views
from ocxsite.api import api

# A disallowed Host (and other bad requests) on Django's paths: see ocxsite/http_errors.py.
handler400 = "ocxsite.http_errors.bad_request"

admin.site.site_header = "ocx administration"
admin.site.site_title = "ocx"
# ocx has no site outside the admin: "View site" pointed at `/`, a 404.
admin.site.site_url = None

urlpatterns = [
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
    path("healthz", views.healthz),
    path("readyz", views.readyz),
    path("metrics", views.metrics_view),
]
