from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from combos import selectors


def healthz(request: HttpRequest) -> JsonResponse:
    """Process alive; `configVersion` is the config this worker is serving (None before use)."""
    from ocxsite.runtime import get_runtime

    snapshot = get_runtime().snapshot
    return JsonResponse({"status": "ok", "configVersion": snapshot and snapshot.version})


def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    version: int | None = None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
        version = selectors.config_version()
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        checks["database"] = f"error: {type(exc).__name__}"
    if settings.OCX_REDIS_URL:
        import redis

        try:
            redis.Redis.from_url(settings.OCX_REDIS_URL, socket_timeout=1).ping()
            checks["redis"] = "ok"
        except redis.RedisError as exc:
            checks["redis"] = f"error: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", **checks, "configVersion": version},
        status=200 if ready else 503,
    )
