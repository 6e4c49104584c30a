"""The dashboard's live parts, for the script on `/admin/` (staff only: wrapped in
`admin.site.admin_view` where they are routed): the combos + quota fragment, re-rendered by
the same template as the page, and the chart data of one range."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

from dashboard import selectors
from dashboard.templatetags.ocx_dashboard import live_context


def live_fragment(request: HttpRequest) -> HttpResponse:
    html = render_to_string("dashboard/_live.html", live_context(), request=request)
    return HttpResponse(html, headers={"Cache-Control": "no-store"})


def chart_data(request: HttpRequest) -> JsonResponse:
    name = request.GET.get("range", selectors.DEFAULT_RANGE)
    if name not in selectors.RANGES:
        return JsonResponse(
            {"error": f"range: use one of {', '.join(selectors.RANGES)}; got {name!r}"},
            status=400,
        )
    return JsonResponse(selectors.charts(name), headers={"Cache-Control": "no-store"})
