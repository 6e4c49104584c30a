"""A committed write is served by the next request: reload here, then tell the other workers.

`providers.services` sends `versions_committed` after every transaction that bumped the config
or key-table version commits. The receiver here (connected in `apps.py`), running in the thread
that made the write:

1. reloads this process's runtime, if it serves requests: the snapshot and key map are read in
   this thread and handed to the runtime on its event loop, and the write returns only once they
   are applied (read-your-writes on the worker that took the write);
2. with `REDIS_URL`, publishes `{configVersion, keysVersion, ack, delta}` on `{prefix}:config`.
   Every worker's runtime listens (`Listener`), brings in the change and acknowledges on
   `{prefix}:config:ack:{ack}`; the writer waits, bounded by `ACK_WAIT_S`, until as many workers
   acknowledged as received the message, so when the write returns every listening worker
   serves it.

`delta` (`providers.services.Delta`) says what the write touched: `{"domain": "keys"|"config",
"from": n, "to": n + 1, "changes": [{"kind": "key", "id": "12"}, ...] | null}`. A worker serving
exactly `from` re-reads only those entries (one key, one user's keys, one combo, one provider and
the combos over it); a worker serving anything else (a notice it missed), a null `changes` or a
notice without `delta` reloads that domain whole.

The runtime's config poll stays as the safety net (a lost message, a Redis outage, a worker that
was reconnecting). Without Redis there is one server process: a write made by another process
(the `ocx` CLI) reaches it at its next poll.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from providers.services import Change, Delta

log = logging.getLogger("ocx.confignotify")

# How long a write waits for the other workers to acknowledge, and for this process's reload.
ACK_WAIT_S = 1.0
LOCAL_WAIT_S = 5.0
# Reconnect backoff of a worker's listener (seconds, doubled per failure, with jitter).
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
# How long a worker's reload on a notice may take before it gives up (the poll retries).
RELOAD_TIMEOUT_S = 5.0
ACK_TTL_S = 30


def channel(prefix: str) -> str:
    return f"{prefix}:config"


def ack_key(prefix: str, token: str) -> str:
    return f"{prefix}:config:ack:{token}"


@dataclass(frozen=True)
class Notice:
    config_version: int
    keys_version: int
    ack: str | None
    delta: Delta | None = None


def encode(notice: Notice) -> str:
    doc: dict[str, object] = {
        "configVersion": notice.config_version,
        "keysVersion": notice.keys_version,
        "ack": notice.ack,
    }
    if notice.delta is not None:
        d = notice.delta
        doc["delta"] = {
            "domain": d.domain,
            "from": d.base,
            "to": d.version,
            "changes": None
            if d.changes is None
            else [{"kind": kind, "id": ident} for kind, ident in d.changes],
        }
    return json.dumps(doc)


_KINDS = {"config": ("combo", "provider"), "keys": ("key", "user")}


def _delta(doc: object) -> Delta | None:
    """The `delta` of a notice, or None when absent or malformed (the worker reloads)."""
    if not isinstance(doc, dict):
        return None
    domain, base, version, raw = (
        doc.get("domain"),
        doc.get("from"),
        doc.get("to"),
        doc.get("changes"),
    )
    if domain not in _KINDS or not isinstance(base, int) or not isinstance(version, int):
        return None
    if raw is None:
        return Delta(domain, base, version, None)
    if not isinstance(raw, list):
        return None
    changes: list[Change] = []
    for item in raw:
        kind = item.get("kind") if isinstance(item, dict) else None
        ident = item.get("id") if isinstance(item, dict) else None
        if kind not in _KINDS[domain] or not isinstance(ident, str):
            return None
        changes.append((kind, ident))
    return Delta(domain, base, version, tuple(changes))


def decode(data: bytes | str) -> Notice | None:
    """The notice in a channel message, or None for anything malformed (ignored)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    config_version, keys_version, ack = (
        doc.get("configVersion"),
        doc.get("keysVersion"),
        doc.get("ack"),
    )
    if not isinstance(config_version, int) or not isinstance(keys_version, int):
        return None
    return Notice(
        config_version,
        keys_version,
        ack if isinstance(ack, str) and ack else None,
        _delta(doc.get("delta")),
    )


# --- the write side (any thread that committed a write) ------------------------------------

_client_lock = threading.Lock()
_client: Any = None  # (url, client): one connection pool per process, shared by its threads


def _redis() -> Any:
    global _client
    url: str = settings.OCX_REDIS_URL or ""
    with _client_lock:
        if _client is None or _client[0] != url:
            import redis

            _client = (
                url,
                redis.Redis.from_url(
                    url, socket_connect_timeout=0.5, socket_timeout=ACK_WAIT_S + 1.0
                ),
            )
        return _client[1]


def publish(
    config_version: int,
    keys_version: int,
    *,
    wait_s: float = ACK_WAIT_S,
    delta: Delta | None = None,
) -> int:
    """Publish the versions and wait (at most `wait_s`) until every worker that received them
    acknowledged; returns how many did. A Redis failure is logged, not raised: the write has
    committed and the workers' poll picks it up."""
    import redis

    token = uuid.uuid4().hex
    notice = Notice(config_version, keys_version, token if wait_s > 0 else None, delta)
    try:
        client = _redis()
        receivers = int(client.publish(channel(settings.OCX_STATE_KEY_PREFIX), encode(notice)))
        if notice.ack is None or receivers == 0:
            return 0
        key = ack_key(settings.OCX_STATE_KEY_PREFIX, token)
        acked = 0
        published = time.monotonic()
        loop_deadline = published + wait_s
        try:
            while acked < receivers:
                remaining = loop_deadline - time.monotonic()
                if remaining <= 0 or client.blpop([key], timeout=remaining) is None:
                    break
                acked += 1
        finally:
            client.delete(key)
        log.info(
            "config version %s keys version %s: %s of %s workers reloaded in %.1f ms",
            config_version,
            keys_version,
            acked,
            receivers,
            (time.monotonic() - published) * 1000,
        )
        if acked < receivers:
            log.warning(
                "config version %s: %s of %s workers acknowledged within %.1fs; "
                "the others pick it up at their next poll",
                config_version,
                acked,
                receivers,
                wait_s,
            )
        return acked
    except redis.RedisError as exc:
        log.warning("could not notify the workers of config version %s: %s", config_version, exc)
        return 0


# --- the worker side (a runtime's event loop) ----------------------------------------------


class Listener:
    """Subscribes to the config channel and calls `on_notice` for every notice (then
    acknowledges it), and `on_notice(None)` after every (re)subscription, when a notice may have
    been missed. Reconnects with backoff for as long as the worker runs."""

    def __init__(
        self,
        url: str,
        prefix: str,
        on_notice: Callable[[Notice | None], Awaitable[None]],
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.on_notice = on_notice
        self.subscribed = asyncio.Event()
        self.received = 0
        self._rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self, wait_s: float = 1.0) -> None:
        """Start listening; wait (bounded) until subscribed, so a write committed after this
        returns is announced to this worker."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            async with asyncio.timeout(wait_s):
                await self.subscribed.wait()
        except TimeoutError:
            log.warning("config channel not subscribed yet; relying on the poll until it is")

    async def stop(self) -> None:
        task, self._task = self._task, None
        self._stopped = True
        # The redis client can swallow one cancellation inside a read, so cancel until it ends.
        for _ in range(50):
            if task is None or task.done():
                break
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)

    async def _run(self) -> None:
        import redis
        import redis.asyncio as aredis

        backoff = BACKOFF_MIN_S
        first = True
        while not self._stopped:
            client = aredis.Redis.from_url(
                self.url,
                socket_connect_timeout=2,
                socket_keepalive=True,
                health_check_interval=15,
                client_name=f"{self.prefix}:config-listener",
            )
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel(self.prefix))
                self.subscribed.set()
                backoff = BACKOFF_MIN_S
                if not first:
                    log.info("config channel subscribed again")
                    await self._deliver(None)  # notices sent while disconnected were lost
                first = False
                while not self._stopped:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
                    if message is None or message.get("type") != "message":
                        continue
                    notice = decode(message["data"])
                    if notice is None:
                        continue
                    self.received += 1
                    try:
                        await self._deliver(notice)
                    finally:
                        if notice.ack is not None:
                            await self._ack(client, notice.ack)
            except (redis.RedisError, OSError) as exc:
                self.subscribed.clear()
                log.warning("config channel: %s; reconnecting in %.1fs", exc, backoff)
            finally:
                await _close(pubsub, client)
            await asyncio.sleep(backoff * (0.5 + self._rng.random()))
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _deliver(self, notice: Notice | None) -> None:
        import redis

        try:
            await self.on_notice(notice)
        except (redis.RedisError, OSError):
            raise  # the connection's: reconnect
        except Exception:  # noqa: BLE001 - a failed handler must not end the listener for good
            log.exception("config notice handler failed; still listening")

    async def _ack(self, client: Any, token: str) -> None:
        key = ack_key(self.prefix, token)
        async with client.pipeline(transaction=False) as pipe:
            pipe.rpush(key, "1")
            pipe.expire(key, ACK_TTL_S)
            await pipe.execute()


async def _close(pubsub: Any, client: Any) -> None:
    import redis

    for closing in (pubsub.aclose, client.aclose):
        try:
            await closing()
        except (redis.RedisError, OSError) as exc:
            log.debug("closing the config channel connection: %s", exc)
