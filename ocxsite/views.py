from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from combos import selectors


def healthz(request: HttpRequest) -> JsonResponse:
    """Process alive; `configVersion` is the config this worker is serving (None before use)."""
    from gateway.runtime import get_runtime

    snapshot = get_runtime().snapshot
    return JsonResponse({"status": "ok", "configVersion": snapshot and snapshot.version})


def readyz(request: HttpRequest) -> JsonResponse:
    """`ok`; `degraded` (still 200, so a load balancer keeps the worker: it serves, with the
    detail of what is missing); `unavailable` (503) only when it cannot serve at all."""
    from gateway.runtime import get_runtime

    runtime = get_runtime()
    checks: dict[str, str] = {}
    detail: list[str] = []
    version: int | None = None
    serving = runtime.snapshot is not None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
        version = selectors.config_version()
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        checks["database"] = f"error: {type(exc).__name__}"
        detail.append(
            "database unreachable: proxying from the loaded configuration; request log "
            "queued; the management API and admin answer 503"
        )
    out: dict[str, object] = {}
    if settings.OCX_REDIS_URL:
        breaker = runtime.redis
        if breaker is not None and breaker.open:
            checks["redis"] = f"error: {breaker.reason}"
        else:
            import redis  # only where Redis is used: 4-5 MB of a worker otherwise

            client = redis.Redis.from_url(
                settings.OCX_REDIS_URL, socket_timeout=1, socket_connect_timeout=1
            )
            try:
                client.ping()
                checks["redis"] = "ok"
            except redis.RedisError as exc:
                checks["redis"] = f"error: {type(exc).__name__}"
            finally:
                client.close()
        if checks["redis"] != "ok":
            detail.append(
                "redis unreachable: each worker routes on its own copy of the routing state; "
                "rpm limits are limit/workers per worker"
            )
        if breaker is not None:
            out["routingState"] = breaker.status()
    if all(v == "ok" for v in checks.values()):
        status = "ok"
    elif checks["database"] == "ok" or serving:
        status = "degraded"
    else:
        status = "unavailable"
    if detail:
        out["detail"] = detail
    return JsonResponse(
        {"status": status, **checks, "configVersion": version, **out},
        status=503 if status == "unavailable" else 200,
    )


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text format. Open like /healthz: it carries counts, never secrets."""
    from server import metrics

    _observe_cooldowns()
    body, content_type = metrics.render()
    return HttpResponse(body, content_type=content_type)


def _observe_cooldowns() -> None:
    """`ocx_cooldowns_active`: targets of each combo cooling right now, read at scrape time
    from the live routing state (Redis when shared, else this process's store)."""
    import logging
    import time

    from combos import live
    from gateway.runtime import get_runtime
    from server import metrics

    try:
        snapshot = get_runtime().snapshot or selectors.config_snapshot()
        now = int(time.time() * 1000)
        states = live.load(list(snapshot.combos), reasons=False)
        for combo in snapshot.combos.values():
            state = states.combo_state(combo.id)
            active = sum(1 for t in combo.targets if state.cooling_until(t.key, now) is not None)
            metrics.COOLING.labels(combo.id).set(active)
    except Exception:  # noqa: BLE001 - a scrape must still answer with the other metrics
        logging.getLogger("ocx.metrics").warning("could not read cooldowns", exc_info=True)
