"""Synchronous readers of the live routing state, for the admin, the API and the CLI.

With `REDIS_URL` the state every worker shares is read from Redis; otherwise it is the
state of this process's runtime (the whole truth with one worker).
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from combos.engine.state import ComboState, MemoryStateStore
from quota.tracker import MemoryJsonStore, Record


def _redis() -> Any:
    import redis

    url = settings.OCX_REDIS_URL
    assert url is not None
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def combo_state(combo_id: str) -> ComboState:
    prefix = settings.OCX_STATE_KEY_PREFIX
    if settings.OCX_REDIS_URL:
        raw = _redis().get(f"{prefix}:combo:{combo_id}")
        if raw is None:
            return ComboState()
        try:
            return ComboState.from_json(raw.decode())
        except ValueError:
            return ComboState()
    from ocxsite.runtime import get_runtime

    store = get_runtime().store
    if isinstance(store, MemoryStateStore):
        return store._states.get(combo_id, ComboState())  # noqa: SLF001 - same process, read only
    return ComboState()


def quota_records() -> dict[tuple[str, str], Record]:
    """Every (provider, credential) with quota data."""
    raws: dict[str, Any] = {}
    if settings.OCX_REDIS_URL:
        client = _redis()
        prefix = f"{settings.OCX_STATE_KEY_PREFIX}:quota:"
        keys = list(client.scan_iter(match=prefix + "*", count=500))
        for key, raw in zip(keys, client.mget(keys) if keys else [], strict=True):
            if raw is not None:
                name = key.decode() if isinstance(key, bytes) else key
                try:
                    raws[name[len(settings.OCX_STATE_KEY_PREFIX) + 1 :]] = json.loads(raw)
                except ValueError:
                    continue
    else:
        from ocxsite.runtime import get_runtime

        store = get_runtime().tracker.store
        if isinstance(store, MemoryJsonStore):
            raws = dict(store.data)
    out: dict[tuple[str, str], Record] = {}
    for key, raw in raws.items():
        _, provider, credential = key.split(":", 2)
        try:
            out[(provider, credential)] = Record.from_json(raw)
        except (KeyError, ValueError, TypeError):
            continue
    return out


def shared() -> bool:
    return bool(settings.OCX_REDIS_URL)
