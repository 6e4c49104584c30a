"""The loader behind `combos.live.load`: the live routing state from the stores the server uses.

With `REDIS_URL`: the shared `RedisStateStore` and quota `RedisJsonStore` (fresh clients per
read, so the CLI and the server's worker threads read the same keys the proxy writes).
Otherwise, in the serving process (`local`): this process's runtime stores. A process that is
not the server without Redis gets `NO_LIVE_STATE`. Cooldown reasons come from the request log.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import replace
from types import MappingProxyType

from asgiref.sync import async_to_sync
from django.conf import settings

from combos import live as combos_live
from combos.live import NO_LIVE_STATE, REDIS_UNREACHABLE, LiveSnapshot

log = logging.getLogger("ocx.status")

REASON_SCAN_ROWS = 200


async def _read_redis(combo_ids: Collection[str]) -> LiveSnapshot:
    from state.redis_state import RedisStateStore
    from state.redis_store import RedisJsonStore

    url, prefix = settings.OCX_REDIS_URL, settings.OCX_STATE_KEY_PREFIX
    assert url is not None
    store = RedisStateStore(url, prefix, socket_timeout=2.0)
    quota = RedisJsonStore(url, prefix)
    try:
        return await combos_live.read(store, quota, combo_ids, source="redis")
    finally:
        await store.aclose()
        await quota._cas.redis.aclose()  # noqa: SLF001 - the store has no close of its own


async def _read_local(combo_ids: Collection[str]) -> LiveSnapshot:
    from gateway.runtime import get_runtime

    runtime = get_runtime()
    return await combos_live.read(
        runtime.store, runtime.tracker.store, combo_ids, source="this process"
    )


def _reasons(snapshot: LiveSnapshot) -> Mapping[str, Mapping[str, str]]:
    """The classification of each still-running cooldown, from the latest attempt that set it."""
    from usage.models import RequestLog

    wanted = {
        (combo_id, key): until
        for combo_id, state in snapshot.states.items()
        for key, until in state.cooldowns.items()
    }
    if not wanted:
        return MappingProxyType({})
    out: dict[str, dict[str, str]] = {}
    combos = {combo_id for combo_id, _ in wanted}
    for attempts in RequestLog.objects.filter(combo__in=combos).values_list("combo", "attempts")[
        :REASON_SCAN_ROWS
    ]:
        combo_id, rows = attempts
        for row in rows or ():
            key = row.get("target") if isinstance(row, dict) else None
            if not isinstance(key, str):
                continue
            until = wanted.get((combo_id, key))
            if until is not None and row.get("cooledUntil") == until and row.get("reason"):
                out.setdefault(combo_id, {}).setdefault(key, str(row["reason"]))
    return MappingProxyType(out)


def _worker_copy(combo_ids: Collection[str]) -> LiveSnapshot | None:
    """While Redis is out the serving worker routes on its own copy (`redis_guard`): that
    copy is then the truth for this worker. None outside a worker with guarded stores."""
    from gateway.runtime import get_runtime
    from state.redis_guard import GuardedJsonStore, GuardedStateStore

    runtime = get_runtime()
    store, quota = runtime.store, runtime.tracker.store
    if not isinstance(store, GuardedStateStore) or not isinstance(quota, GuardedJsonStore):
        return None
    # Memory stores only: their coroutines never wait, so any event loop may run them.
    return async_to_sync(combos_live.read)(
        store.local, quota.local, combo_ids, source="this worker"
    )


def _breaker_open() -> bool:
    from gateway.runtime import get_runtime

    breaker = get_runtime().redis
    return breaker is not None and breaker.open


def load(combo_ids: Collection[str], local: bool, reasons: bool) -> LiveSnapshot:
    if settings.OCX_REDIS_URL:
        import redis  # only where Redis is used: 4-5 MB of a worker otherwise

        copy = _worker_copy(combo_ids) if local and _breaker_open() else None
        try:
            snapshot = copy or async_to_sync(_read_redis)(combo_ids)
        except (redis.RedisError, OSError) as exc:
            # Status still answers (the worker's own copy, else the configured view) and says
            # why it has no shared state.
            log.warning("cannot read the live routing state from Redis: %s", type(exc).__name__)
            copy = _worker_copy(combo_ids) if local else None
            if copy is None:
                return REDIS_UNREACHABLE
            snapshot = copy
    elif local:
        snapshot = async_to_sync(_read_local)(combo_ids)
    else:
        return NO_LIVE_STATE
    return replace(snapshot, reasons=_reasons(snapshot)) if reasons else snapshot
