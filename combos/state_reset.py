"""Forget the shared routing state of combos whose definition was written (Redis mode).

A PUT/DELETE of a combo resets its routing state (cooldowns, rotation, leases). With one worker
the runtime does this itself when it loads the new config version; with `REDIS_URL` the state is
shared, so the write path deletes the keys exactly once, after the transaction commits, instead
of every worker clearing (and possibly wiping state another worker already wrote for the new
definition). Key layout: `state.redis_state.RedisStateStore` (`{prefix}:combo:{id}`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction

log = logging.getLogger("ocx.state")


def state_key(combo_id: str) -> str:
    return f"{settings.OCX_STATE_KEY_PREFIX}:combo:{combo_id}"


def combo_state_clear(combo_ids: Iterable[str]) -> None:
    """Delete the shared state of `combo_ids` now; a no-op without `REDIS_URL`.

    A Redis failure is logged, not raised: the config write already committed.
    """
    url = settings.OCX_REDIS_URL
    keys = sorted({state_key(c) for c in combo_ids if c})
    if not url or not keys:
        return
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.delete(*keys)
        finally:
            client.close()
    except redis.RedisError:
        log.exception("could not clear the routing state of %s", ", ".join(keys))


def clear_on_commit(combo_ids: Iterable[str]) -> None:
    """Schedule `combo_state_clear(combo_ids)` for after the current transaction commits
    (immediately when no transaction is open)."""
    ids = sorted(set(combo_ids))
    if ids and settings.OCX_REDIS_URL:
        transaction.on_commit(lambda: combo_state_clear(ids))


def combo_target_state_clear(combo_id: str, key: str) -> None:
    """Clear one target's entries (`routing.state.reset_target`) in the shared state of
    `combo_id`, with a compare-and-set (another worker may write meanwhile); a no-op without
    `REDIS_URL`. A Redis failure is logged, not raised: the reset already committed."""
    url = settings.OCX_REDIS_URL
    if not url:
        return
    import redis

    from routing.state import ComboState, reset_target

    name = state_key(combo_id)
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            with client.pipeline() as pipe:
                for _ in range(20):
                    try:
                        pipe.watch(name)
                        raw = pipe.get(name)
                        if raw is None:
                            return
                        text = raw.decode() if isinstance(raw, bytes) else str(raw)
                        state = ComboState.from_json(text)
                        new = reset_target(state, key)
                        if new == state:
                            return
                        ttl = pipe.pttl(name)
                        pipe.multi()
                        if new == ComboState():
                            pipe.delete(name)
                        elif ttl and ttl > 0:
                            pipe.set(name, new.to_json(), px=ttl)
                        else:
                            pipe.set(name, new.to_json())
                        pipe.execute()
                        return
                    except redis.WatchError:
                        continue
            log.warning("could not clear %s of combo %s: the state kept changing", key, combo_id)
        finally:
            client.close()
    except (redis.RedisError, ValueError):
        log.exception("could not clear the routing state of %s in %s", key, name)


def target_clear_on_commit(combo_id: str, key: str) -> None:
    if settings.OCX_REDIS_URL:
        transaction.on_commit(lambda: combo_target_state_clear(combo_id, key))
