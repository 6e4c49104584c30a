from __future__ import annotations

from django.contrib import admin
from django.urls import path

from ocxsite import views
from ocxsite.api import api

# A disallowed Host (and other bad requests) on Django's paths: see ocxsite/http_errors.py.
handler400 = "ocxsite.http_errors.bad_request"

admin.site.site_header = "ocx administration"
admin.site.site_title = "ocx"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("healthz", views.healthz),
    path("readyz", views.readyz),
    path("metrics", views.metrics_view),
]
