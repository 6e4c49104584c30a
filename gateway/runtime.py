"""Per-process routing runtime: the config snapshot, key cache, state store, HTTP clients.

A committed write is brought into the writing process's runtime before the write returns, and
with `REDIS_URL` into every other worker on a notice (`gateway.confignotify`). The notice names
what changed (`providers.services.Delta`): a worker serving the version just before it re-reads
only those keys, combos or providers (`gateway.config_delta`); any other case reloads the
domain whole. A background task also polls the config version and the key-table version every
OCX_CONFIG_POLL_MS, off the hot path, as the safety net (with a listener subscribed, it reloads
only a domain still behind what the previous poll saw: a newer write's notice may be on its
way). A change clears the routing state of combos whose definition changed, and replaces the
HTTP clients of providers whose definition changed.

The state store is `RedisStateStore` when `REDIS_URL` is set (shared by every worker; the write
path in `combos.services` / `combos.admin` resets changed combos' keys once, see
`combos.state_reset`), else a per-process `MemoryStateStore` that this runtime clears itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import random
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError as DbInterfaceError
from django.db import OperationalError as DbOperationalError

from accounts import access
from accounts.access import KeyInfo
from accounts.expiry_alerts import check_expiring
from alerts.outbox import AlertQueue
from alerts.sender import Sender
from combos import selectors
from dashboard import services as dashboard_services
from dashboard.services import STORED_KINDS
from gateway import alerting, config_delta, confignotify
from gateway.events import EVENTS_GROUP
from providers.services import Delta
from providers.upstream import ProviderClient
from quota import services as quota_services
from quota.tracker import JsonStore, MemoryJsonStore, QuotaTracker
from quota.windows import Transition, Window, transition_message
from routing.state import MemoryStateStore, StateStore
from routing.types import ConfigSnapshot, ProviderSpec
from server import lifecycle, metrics
from server.background import BatchWriter, in_thread
from state import caller_limits
from state.budget_store import MemoryBudgetStore
from state.ratelimit import MemoryLimiter, RedisLimiter
from state.recall_store import MemoryRecall, RedisRecall
from usage import budget_events, requestlog, verify
from usage.reservations import Reservations

if TYPE_CHECKING:
    from state.redis_guard import GuardedLimiter, GuardedRecall, GuardedStateStore, RedisBreaker

log = logging.getLogger("ocx.runtime")


def _proxy_keys() -> config_delta.KeyMap:
    # Deactivated users' keys too, marked: their holders get 401 user_inactive, not "invalid".
    return config_delta.KeyMap(access.client_keys_active(inactive_users=True))


def _load(known_keys: int = -1) -> tuple[int, ConfigSnapshot, dict[str, KeyInfo] | None]:
    """The key version, the snapshot and the key map (None: still the `known_keys` version,
    e.g. the map `preload_keys` read at the worker's start)."""
    # The key version is read before the keys: a key write racing this load leaves the stored
    # version past the one recorded here, so the next poll reloads (the counter never repeats).
    _, keys_version = selectors.config_versions()
    keys = None if keys_version == known_keys else _proxy_keys()
    return keys_version, selectors.config_snapshot(), keys


def _poll(known_keys: int) -> tuple[int, int, dict[str, KeyInfo] | None]:
    version, keys_version = selectors.config_versions()
    keys = None if keys_version == known_keys else _proxy_keys()
    return version, keys_version, keys


Patch = config_delta.KeysPatch | config_delta.ConfigPatch


def _read_patch(snapshot: ConfigSnapshot, delta: Delta) -> Patch | None:
    """What the delta's entries are now (ORM, any thread); None: the domain reloads whole."""
    if delta.changes is None:
        return None
    if delta.domain == "keys":
        return config_delta.read_keys(delta.changes)
    return config_delta.read_config(snapshot, delta.changes)


class Runtime:
    def __init__(self, store: StateStore | None = None) -> None:
        self.snapshot: ConfigSnapshot | None = None
        self.keys: Mapping[str, KeyInfo] = {}
        self.keys_version = -1
        # One circuit breaker per worker in front of every Redis-backed store (redis_guard).
        # The guard, its stores and redis-py load only where Redis is used (4-5 MB of a
        # worker otherwise).
        self.redis: RedisBreaker | None = None
        if settings.OCX_REDIS_URL:
            from state.redis_guard import RedisBreaker

            self.redis = RedisBreaker(
                settings.OCX_REDIS_URL,
                timeout_s=settings.OCX_REDIS_TIMEOUT_MS / 1000,
                on_change=self._on_redis,
            )
        self.store: StateStore = store or _default_store(self.redis)
        self.clients: dict[str, ProviderClient] = {}
        self.rng = random.Random()
        self.shared = bool(settings.OCX_REDIS_URL)
        self.tracker = QuotaTracker(
            _quota_store(self.redis), on_transition=self._on_transition, on_windows=self._on_windows
        )
        self.requestlog = requestlog.new_writer(lambda: self.snapshot)
        self.snapshots: BatchWriter[tuple[str, str, list[Window]]] = BatchWriter(
            "quota snapshots", quota_services.snapshots_write, maxsize=2000, flush_s=2.0
        )
        self.transitions: BatchWriter[quota_services.TransitionEvent] = BatchWriter(
            "quota transitions", quota_services.transitions_write, maxsize=1000
        )
        # Cooldowns and hops kept for the events page's history and the dashboard.
        self.routing_events: BatchWriter[dict[str, object]] = BatchWriter(
            "routing events", _write_routing_events, maxsize=1000, flush_s=1.0
        )
        # Alerts noticed on the /v1 path (gateway.alerting), written to the outbox off it.
        self.alerts = AlertQueue()
        self.quota_watch = alerting.QuotaWatch(settings.OCX_ALERT_QUOTA_PERCENT)
        self.recall: MemoryRecall | GuardedRecall = MemoryRecall()
        self.limiter: MemoryLimiter | GuardedLimiter = MemoryLimiter()
        # A caller-forward target's rate limit, per caller credential (issue #43).
        self.caller_limits = caller_limits.new(
            settings.OCX_REDIS_URL, settings.OCX_STATE_KEY_PREFIX, self.redis
        )
        if settings.OCX_REDIS_URL and self.redis is not None:
            from state.redis_guard import GuardedLimiter, GuardedRecall

            url, prefix = settings.OCX_REDIS_URL, settings.OCX_STATE_KEY_PREFIX
            self.recall = GuardedRecall(RedisRecall(url, prefix), self.redis)
            # While Redis is out each worker allows its share: `limit / workers`.
            workers = int(os.environ.get("OCX_WORKER_COUNT") or 1)
            self.limiter = GuardedLimiter(RedisLimiter(url, prefix), self.redis, workers)
        # Budgets per key and user (PRODUCT §9.5): counters in Redis when set.
        self.budget_events = budget_events.new_writer()
        self.budgets = budget_events.new_gate(
            self.emit, lambda: int(time.time() * 1000), self.budget_events
        )
        if self.redis is not None and settings.OCX_REDIS_URL:
            from state.redis_guard import GuardedBudgetStore

            # While Redis is out each worker spends its share of what was left (redis_guard).
            workers = int(os.environ.get("OCX_WORKER_COUNT") or 1)
            self.budgets.store = GuardedBudgetStore(self.budgets.store, self.redis, workers)
        # Admission reserves each request's expected cost (issue 42: bounded overshoot).
        self.reservations = Reservations(self.budgets)
        counters = self.budgets.store
        if isinstance(counters, MemoryBudgetStore):
            # `GET /api/usage/verify` compares this worker's counters with the records.
            verify.serve_counters(lambda: verify.memory_counters(counters))
        self._started: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # The event loop serving requests (set by `ready()`): a write made in another thread of
        # this process hands its reload to it (`reload_from_thread`).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listener: confignotify.Listener | None = None
        self._refresh_lock = asyncio.Lock()
        # Whole reloads of the snapshot / key map, and writes applied entry by entry.
        self.reloads = {"config": 0, "keys": 0}
        self.patches = {"config": 0, "keys": 0}
        # The versions the last poll saw in the database (`refresh(patient=True)`).
        self._polled: tuple[int, int] | None = None

    def state_along(self, combo_id: str) -> tuple[str, ...]:
        """The Redis name of the combo's routing state when it lives in Redis: the quota gate
        reads it in its own round trip (`QuotaTracker.gate(along=…)`), so that a pick that
        writes nothing needs no check of its own (`prime_state`)."""
        guarded = _guarded_state(self.store)
        return () if guarded is None else (guarded.shared_key(combo_id),)

    def prime_state(self, combo_id: str, raw: bytes | None) -> None:
        guarded = _guarded_state(self.store)
        if guarded is not None:
            guarded.prime(combo_id, raw)

    async def ready(self) -> ConfigSnapshot:
        snapshot = self.snapshot
        if snapshot is not None:
            return snapshot
        async with self._lock:
            if self.snapshot is None:
                self.loop = asyncio.get_running_loop()
                if settings.OCX_REDIS_URL and self.listener is None:
                    # Subscribed before the first load: no write can fall between the two.
                    self.listener = confignotify.Listener(
                        settings.OCX_REDIS_URL, settings.OCX_STATE_KEY_PREFIX, self._on_notice
                    )
                    await self.listener.start()
                keys_version, snap, keys = await in_thread(_load, self.keys_version)
                if keys is None:  # the preloaded map is current: not read twice
                    self.apply(snap, self.keys, keys_version)
                    self._budgets_changed()
                else:
                    self.apply(snap, keys, keys_version)
                self._started = asyncio.get_running_loop().create_task(self._poll_forever())
        assert self.snapshot is not None
        return self.snapshot

    def apply(
        self, snapshot: ConfigSnapshot, keys: Mapping[str, KeyInfo], keys_version: int
    ) -> None:
        old = self.snapshot
        new_keys = keys is not self.keys
        self.keys, self.keys_version = keys, keys_version
        if new_keys:  # a config write keeps the key map: no pass over its budgets
            self._budgets_changed()
        if old is not None:
            local = isinstance(self.store, _local_state_stores())
            for combo_id, spec in old.combos.items():
                # A shared (Redis) store is reset once by the config write path instead.
                new_spec = snapshot.combos.get(combo_id)
                if new_spec != spec and local:
                    self.store.forget(combo_id)  # type: ignore[attr-defined]
                elif new_spec is not None and new_spec.resets != spec.resets and local:
                    self._apply_resets(combo_id, spec.resets, new_spec.resets)
            for name, provider in old.providers.items():
                new = snapshot.providers.get(name)
                # The clients depend only on the timeouts and the pool size; in-flight streams
                # keep theirs until they end, so an old pool is closed only after its longest
                # request could run.
                changed = new is None or (new.timeouts, new.max_connections) != (
                    provider.timeouts,
                    provider.max_connections,
                )
                if changed and name in self.clients:
                    pool = self.clients.pop(name)
                    grace_s = min(provider.timeouts.total_ms, 600_000) / 1000
                    asyncio.get_running_loop().create_task(_close_later(pool, grace_s))
        self.snapshot = snapshot

    def _apply_resets(
        self, combo_id: str, before: Mapping[str, int], after: Mapping[str, int]
    ) -> None:
        """An operator cleared a combo's routing state, or one target's (`combos.services.
        combo_reset`): this worker's own copy follows (the shared one was cleared once)."""
        store = self.store
        assert isinstance(store, _local_state_stores())
        if after.get("*", 0) > before.get("*", 0):
            store.forget(combo_id)
            return
        for key, at in after.items():
            if key != "*" and at > before.get(key, 0):
                store.forget_target(combo_id, key)

    def offer(
        self,
        snapshot: ConfigSnapshot | None,
        keys: Mapping[str, KeyInfo] | None,
        keys_version: int,
    ) -> None:
        """Apply what a reload read, unless this runtime already serves something newer (a poll
        and a write's reload can finish in either order). Loop thread only."""
        current = self.snapshot
        for domain, loaded in (("config", snapshot), ("keys", keys)):
            if loaded is not None:
                self.reloads[domain] += 1
                metrics.CONFIG_RELOADS.labels(domain).inc()
        newer_keys = keys is not None and keys_version > self.keys_version
        if snapshot is not None and (current is None or snapshot.version > current.version):
            if newer_keys:
                assert keys is not None
                self.apply(snapshot, keys, keys_version)
            else:
                self.apply(snapshot, self.keys, self.keys_version)
            log.info("config version %s loaded", snapshot.version)
        elif newer_keys:
            assert keys is not None
            self.keys, self.keys_version = keys, keys_version
            self._budgets_changed()

    def _budgets_patched(
        self, before: Mapping[str, KeyInfo], patch: config_delta.KeysPatch
    ) -> None:
        """`_budgets_changed` for a patch: only the patched keys' budgets are looked at (a pass
        over 10,000 keys' budgets costs a worker ~80 ms)."""
        if not isinstance(before, config_delta.KeyMap):
            self._budgets_changed()
            return
        digests = {d for k in patch.key_ids for d in before.by_id.get(k, ())}
        digests |= {d for u in patch.user_ids for d in before.by_user.get(u, ())}
        old = [sb for d in digests if d in before for sb in before[d].budgets]
        new = [sb for info in patch.fresh.values() for sb in info.budgets]
        if self.budgets.replaced(self.keys, old, new):
            with contextlib.suppress(RuntimeError):  # no running loop: the first request seeds
                asyncio.get_running_loop().create_task(self.budgets.seed(new, wait=False))

    def _budgets_changed(self) -> None:
        """A new key map: its budgets' counters not seeded yet are raised to what was recorded
        this period, in the background (a request with such a budget waits for it)."""
        self.budgets.retain(self.keys)
        if self.budgets.recorded is not None and self.budgets.unseeded(
            [sb for info in self.keys.values() for sb in info.budgets]
        ):
            with contextlib.suppress(RuntimeError):  # no running loop: the first request seeds
                asyncio.get_running_loop().create_task(
                    self.budgets.seed(every=self.keys, wait=False)
                )

    async def refresh(self, *, patient: bool = False) -> None:
        """One poll: reload the snapshot when the config version moved, the key map when the
        key-table version moved (each alone). `patient` (the poll, with a listener
        subscribed): only a domain still behind the versions the previous poll read, since the
        notice of a write this poll sees may be on its way and applies it for far less."""
        async with self._refresh_lock:
            if self.snapshot is None:
                loaded_version, snap, loaded = await in_thread(_load)
                self.apply(snap, self.keys if loaded is None else loaded, loaded_version)
                log.info("config version %s loaded", snap.version)
                return
            version, keys_version = await in_thread(selectors.config_versions)
            stale_config = version != self.snapshot.version
            stale_keys = keys_version != self.keys_version
            if patient and self.listener is not None and self.listener.subscribed.is_set():
                seen, self._polled = self._polled, (version, keys_version)
                # Only a domain still behind what the previous poll read. Under a stream of
                # writes every poll finds the newest write's notice on its way, and a whole
                # reload there (about 0.4 s of CPU at 10,000 keys) would patch nothing in; a
                # version the database no longer has is never loaded (`offer`).
                stale_config &= seen is not None and self.snapshot.version < seen[0]
                stale_keys &= seen is not None and self.keys_version < seen[1]
            # The key version was read before the keys: a racing key write moves it past.
            keys = await in_thread(_proxy_keys) if stale_keys else None
            fresh = await in_thread(selectors.config_snapshot) if stale_config else None
            if fresh is not None or keys is not None:
                self.offer(fresh, keys, keys_version)

    def take(self, delta: Delta, patch: Patch | None) -> bool:
        """Apply one write read by `_read_patch` if this runtime serves exactly the version
        before it (else False: a gap, the caller reloads). Loop thread only."""
        if patch is None or self.snapshot is None:
            return False
        if isinstance(patch, config_delta.KeysPatch):
            if delta.domain != "keys" or self.keys_version != delta.base:
                return False
            before = self.keys
            self.keys = config_delta.patched_keys(before, patch)
            self.keys_version = delta.version
            self._budgets_patched(before, patch)
        else:
            # The reads were made against the snapshot served: it must still be that one.
            if delta.domain != "config" or self.snapshot is not patch.base:
                return False
            if patch.base.version != delta.base:
                return False
            self.apply(
                config_delta.patched_snapshot(patch, delta.version), self.keys, self.keys_version
            )
        self.patches[delta.domain] += 1
        metrics.CONFIG_PATCHES.labels(delta.domain).inc()
        return True

    def serves(self, delta: Delta) -> bool:
        """Whether this runtime already serves the delta's version (or a later one)."""
        if self.snapshot is None:
            return False
        served = self.keys_version if delta.domain == "keys" else self.snapshot.version
        return served >= delta.version

    async def bring_in(self, delta: Delta) -> None:
        """A write named by a notice: read just its entries and apply them when this runtime
        serves the version before it; else (a missed notice, a bulk write) reload."""
        async with self._refresh_lock:
            snapshot = self.snapshot
            if snapshot is None or self.serves(delta):
                return
            current = self.keys_version if delta.domain == "keys" else snapshot.version
            if current == delta.base and delta.changes is not None:
                patch = await in_thread(_read_patch, snapshot, delta)
                if self.take(delta, patch):
                    return
        log.info(
            "config %s version %s: reloading (a notice was missed)", delta.domain, delta.version
        )
        await self.refresh()

    async def _on_notice(self, notice: confignotify.Notice | None) -> None:
        """A write committed somewhere (None: a notice may have been missed): bring it in."""
        # `ready()` may be loading a config read before this write: wait for it, then compare.
        try:
            # Inside the `try`: a first load that fails (database down) must not end the listener.
            snapshot = self.snapshot or await self.ready()
            if notice is not None and notice.delta is not None:
                async with asyncio.timeout(confignotify.RELOAD_TIMEOUT_S):
                    await self.bring_in(notice.delta)
                return
            if (
                notice is not None
                and notice.config_version <= snapshot.version
                and notice.keys_version <= self.keys_version
            ):
                return  # this worker took the write, or a poll got there first
            async with asyncio.timeout(confignotify.RELOAD_TIMEOUT_S):
                await self.refresh()
        except Exception:  # noqa: BLE001 - the poll retries; a notice must not kill the listener
            log.exception("reload on a config notice failed; the poll retries")

    async def _poll_forever(self) -> None:
        interval = settings.OCX_CONFIG_POLL_MS / 1000
        failing = False
        while True:
            await asyncio.sleep(interval)
            try:
                # Bounded: a stuck database call must not freeze the worker's view for good.
                async with asyncio.timeout(max(5.0, 10 * interval)):
                    await self.refresh(patient=True)
            except (DbOperationalError, DbInterfaceError) as exc:
                # The database is down or restarting: said once, not every poll interval.
                if not failing:
                    log.warning(
                        "database unreachable (%s): serving config version %s until it is back",
                        type(exc).__name__,
                        self.snapshot and self.snapshot.version,
                    )
                failing = True
            except Exception:  # noqa: BLE001 - a failed poll keeps the last good snapshot
                log.exception(
                    "config poll failed; keeping version %s",
                    self.snapshot and self.snapshot.version,
                )
            else:
                if failing:
                    log.warning("database reachable again: config polling resumed")
                failing = False

    def client(self, provider: ProviderSpec) -> ProviderClient:
        client = self.clients.get(provider.name)
        if client is None:
            client = self.clients[provider.name] = ProviderClient(provider)
        return client

    def _on_windows(self, pair: tuple[str, str], windows: list[Window]) -> None:
        self.snapshots.submit((pair[0], pair[1], windows))
        self.quota_watch.check(self.alerts, pair, windows, int(time.time() * 1000))

    async def _on_transition(self, provider: str, credential: str, transition: Transition) -> None:
        message = transition_text(self.snapshot, provider, transition)
        # Provider ids and reasons only: the credential is a fingerprint, never the secret.
        log.info(
            "quota transition provider=%s credential=%s %s->%s reason=%s: %s",
            provider,
            credential,
            transition.from_status,
            transition.to_status,
            transition.reason,
            message,
        )
        metrics.QUOTA_STATE.labels(provider, credential).set(
            1 if transition.to_status == "limited" else 0
        )
        self.transitions.submit(
            quota_services.TransitionEvent(provider, credential, transition, message)
        )
        self.emit(
            {
                "kind": "quota",
                "provider": provider,
                "credential": credential,
                "from": transition.from_status,
                "to": transition.to_status,
                "reason": transition.reason,
                "at": transition.at_ms,
                "message": message,
            }
        )

    def _on_redis(self, degraded: bool, detail: dict[str, object]) -> None:
        metrics.REDIS_DEGRADED.set(1 if degraded else 0)
        if degraded:
            metrics.REDIS_OUTAGES.inc()
        # Delivered only where the channel layer still works (it lives in Redis too): the
        # "back" event always is, and carries the outage's length.
        # `message`: what the admin's live events list shows.
        message = (
            f"Redis unreachable ({detail.get('reason')}): a worker routes on its own copy of "
            "the routing state"
            if degraded
            else f"Redis available again after {detail.get('outageS')} s: "
            f"{detail.get('mergedStates')} state(s) merged back, shared routing resumed"
        )
        self.emit(
            {
                "kind": "dependency",
                "dependency": "redis",
                "status": "degraded" if degraded else "ok",
                "at": int(time.time() * 1000),
                "message": message,
                **detail,
            },
            force=True,
        )

    async def flush(self) -> None:
        """Write everything the background writers hold (graceful shutdown)."""
        for writer in (
            self.requestlog,
            self.snapshots,
            self.transitions,
            self.routing_events,
            self.budget_events,
            self.alerts,
        ):
            await writer.drain()

    def emit(self, event: dict[str, object], *, force: bool = False) -> None:
        """Push a routing event to `/ws/events` subscribers (fire and forget); cooldowns and
        hops are also stored, off the hot path. `at`: when it happened (epoch ms)."""
        if "at" not in event:
            event = {**event, "at": int(time.time() * 1000)}
        if event.get("kind") in STORED_KINDS:
            self.routing_events.submit(event)
        if event.get("kind") == "cooldown":
            alerting.cooled(self.alerts, event, int(event["at"]))  # type: ignore[call-overload]
        layer = get_channel_layer()
        if layer is None:
            return
        if self.redis is not None and self.redis.open and not force:
            return  # the Redis channel layer is unreachable: do not pile up failing sends
        task = asyncio.get_running_loop().create_task(
            layer.group_send(EVENTS_GROUP, {"type": "ocx.event", "event": event})
        )
        task.add_done_callback(_log_failure)


async def _close_later(client: ProviderClient, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    await client.aclose()


def _write_routing_events(events: list[dict[str, object]]) -> None:
    dashboard_services.routing_events_write(events=events)


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not publish a routing event: %s", task.exception())


def transition_text(snapshot: ConfigSnapshot | None, provider: str, transition: Transition) -> str:
    """PRODUCT §8.6 wording, naming the fallback a combo led by `provider` switches to."""
    fallback = None
    if snapshot is not None:
        for combo in snapshot.combos.values():
            if combo.targets and combo.targets[0].provider == provider:
                others = [t.provider for t in combo.targets if t.provider != provider]
                if others:
                    fallback = others[0]
                    break
    return transition_message(transition, primary=provider, fallback=fallback or "the next target")


def _guarded_state(store: StateStore) -> GuardedStateStore | None:
    """The store as the Redis guard's, when it is one (the guard loads only with Redis)."""
    guard = sys.modules.get("state.redis_guard")
    if guard is not None and isinstance(store, guard.GuardedStateStore):
        return cast("GuardedStateStore", store)
    return None


def _local_state_stores() -> tuple[type[MemoryStateStore | GuardedStateStore], ...]:
    """The stores that keep this worker's own copy of the combo states (`apply` resets it):
    in memory, and the Redis guard's copy when the guard is loaded at all."""
    guard = sys.modules.get("state.redis_guard")
    return (MemoryStateStore,) if guard is None else (MemoryStateStore, guard.GuardedStateStore)


def _quota_store(breaker: RedisBreaker | None) -> JsonStore:
    if settings.OCX_REDIS_URL and breaker is not None:
        from state.redis_guard import GuardedJsonStore
        from state.redis_store import RedisJsonStore

        shared = RedisJsonStore(settings.OCX_REDIS_URL, settings.OCX_STATE_KEY_PREFIX)
        return GuardedJsonStore(shared, breaker)
    return MemoryJsonStore()


def _default_store(breaker: RedisBreaker | None) -> StateStore:
    if settings.OCX_REDIS_URL and breaker is not None:
        from state.redis_guard import GuardedStateStore
        from state.redis_state import RedisStateStore

        shared = RedisStateStore(settings.OCX_REDIS_URL, settings.OCX_STATE_KEY_PREFIX)
        return GuardedStateStore(shared, breaker)
    return MemoryStateStore()


_runtime: Runtime | None = None


def reload_from_thread(timeout: float, delta: Delta | None = None) -> bool:
    """Make this process's runtime serve the committed config and key table before returning
    (called by the thread that committed a write; `delta`: what it wrote). The ORM reads run
    here, in the calling thread; the event loop only swaps the result in. False when there is
    nothing to reload (no runtime serving in this process, e.g. the CLI) or the loop did not
    answer in time."""
    rt = _runtime
    loop = rt.loop if rt is not None else None
    if rt is None or loop is None or loop.is_closed():
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return False  # a thread running a loop must not block: the notice or poll catches up
    if rt.snapshot is None:
        # The first load is running and may have read the config before this write.
        return _wait(asyncio.run_coroutine_threadsafe(_settle(rt), loop), timeout)
    if delta is not None:
        if rt.serves(delta):
            return True
        patch = _read_patch(rt.snapshot, delta)

        async def take() -> None:
            if not rt.take(delta, patch):
                await rt.bring_in(delta)  # a gap: reloads on the loop

        return _wait(asyncio.run_coroutine_threadsafe(take(), loop), timeout)
    version, keys_version, keys = _poll(rt.keys_version)
    snap: ConfigSnapshot | None = None
    if version != rt.snapshot.version:
        keys_version, snap, keys = _load()
    if snap is None and keys is None:
        return True

    async def swap() -> None:
        rt.offer(snap, keys, keys_version)

    return _wait(asyncio.run_coroutine_threadsafe(swap(), loop), timeout)


async def _settle(rt: Runtime) -> None:
    await rt.ready()
    await rt.refresh()


def _wait(future: concurrent.futures.Future[None], timeout: float) -> bool:
    try:
        future.result(timeout)
    except TimeoutError:
        future.cancel()
        log.warning("this worker's config reload after a write took over %.1fs", timeout)
        return False
    return True


def on_versions_committed(sender: object, delta: Delta | None = None, **kwargs: object) -> None:
    """Receiver of `providers.services.versions_committed` (connected in `ocxsite/apps.py`; it
    lives here, not in `confignotify`, which the runtime imports). A transaction that bumped
    twice announces twice, one delta each, in order."""
    versions = selectors.config_versions()
    reload_from_thread(timeout=confignotify.LOCAL_WAIT_S, delta=delta)
    if settings.OCX_REDIS_URL:
        confignotify.publish(*versions, delta=delta)


async def _flush_runtime() -> None:
    if _runtime is not None:  # only if this worker ever served
        await _runtime.flush()
    if _sender is not None:
        # The outbox is written; another worker or the next start sends from here on.
        await _sender.stop()


def _start_sender(loop: asyncio.AbstractEventLoop) -> None:
    """Every `ocx serve` worker runs an alert sender from its start; only the holder of the
    sender lease sends (alerts.sender)."""
    global _sender
    if _sender is None and os.environ.get("OCX_WORKER"):
        _sender = Sender(periodic=(check_expiring,))
        _sender.start(loop)


_sender: Sender | None = None
lifecycle.on_flush(_flush_runtime)
lifecycle.on_start(_start_sender)


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime


def preload_keys() -> bool:
    """Read this worker's key map before it accepts traffic (called at import of the ASGI
    application in a worker, in its main thread, before any loop runs): the body limit of a
    `/v1` request depends on whether its key is known, and a worker that had not loaded its map
    yet used to give any `ocx_…` key the authenticated limit (issue #43). False (logged) when
    the database cannot be read: the worker is then cold, and an unknown key gets the
    unauthenticated limit until its first load."""
    from django.db import DatabaseError, connections

    def read() -> tuple[int, config_delta.KeyMap]:
        try:
            return selectors.config_versions()[1], _proxy_keys()
        finally:
            connections.close_all()

    rt = get_runtime()
    if rt.keys_version >= 0:
        return True
    # In a thread of its own, waited for: uvicorn imports the application on its running loop
    # (no ORM there), and nothing is served until the import is done anyway.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        try:
            keys_version, keys = pool.submit(read).result()
        except DatabaseError as exc:
            log.warning("could not preload the key map: %s", type(exc).__name__)
            return False
    if rt.keys_version < 0:
        rt.keys, rt.keys_version = keys, keys_version
    return True


_warming: set[asyncio.Task[ConfigSnapshot]] = set()


def _warm(loop: asyncio.AbstractEventLoop) -> None:
    """The first full load (snapshot, key map, notices, the poll) as the worker starts, not at
    its first `/v1` request: from then on the preloaded key map follows every write."""
    task = loop.create_task(get_runtime().ready())
    _warming.add(task)
    task.add_done_callback(_warmed)


def _warmed(task: asyncio.Task[ConfigSnapshot]) -> None:
    _warming.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # The first request tries again (and answers the outage as usual).
        log.warning("first config load failed: %s", type(task.exception()).__name__)


lifecycle.on_start(_warm)
