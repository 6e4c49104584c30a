"""Per-process routing runtime: the config snapshot, key cache, state store, HTTP clients.

A background task polls the config version (and the key table) every OCX_CONFIG_POLL_MS,
off the hot path; a change rebuilds the snapshot, clears the routing state of combos whose
definition changed, and replaces the HTTP clients of providers whose definition changed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings

from combos import selectors
from combos.engine.state import MemoryStateStore, StateStore
from combos.engine.types import ConfigSnapshot, ProviderSpec
from ocxsite import access
from ocxsite.access import KeyInfo
from providers.upstream import new_client

log = logging.getLogger("ocx.runtime")


def _load() -> tuple[ConfigSnapshot, dict[str, KeyInfo]]:
    return selectors.config_snapshot(), access.client_keys_active()


def _poll() -> tuple[int, dict[str, KeyInfo]]:
    return selectors.config_version(), access.client_keys_active()


class Runtime:
    def __init__(self, store: StateStore | None = None) -> None:
        self.snapshot: ConfigSnapshot | None = None
        self.keys: Mapping[str, KeyInfo] = {}
        self.store: StateStore = store or _default_store()
        self.clients: dict[str, httpx.AsyncClient] = {}
        self.rng = random.Random()
        self._started: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> ConfigSnapshot:
        snapshot = self.snapshot
        if snapshot is not None:
            return snapshot
        async with self._lock:
            if self.snapshot is None:
                snap, keys = await sync_to_async(_load, thread_sensitive=False)()
                self.apply(snap, keys)
                self._started = asyncio.get_running_loop().create_task(self._poll_forever())
        assert self.snapshot is not None
        return self.snapshot

    def apply(self, snapshot: ConfigSnapshot, keys: Mapping[str, KeyInfo]) -> None:
        old = self.snapshot
        self.keys = keys
        if old is not None:
            for combo_id, spec in old.combos.items():
                if snapshot.combos.get(combo_id) != spec:
                    self.store.clear(combo_id)
            for name, provider in old.providers.items():
                if snapshot.providers.get(name) != provider and name in self.clients:
                    client = self.clients.pop(name)
                    asyncio.get_running_loop().create_task(client.aclose())
        self.snapshot = snapshot

    async def _poll_forever(self) -> None:
        interval = settings.OCX_CONFIG_POLL_MS / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                version, keys = await sync_to_async(_poll, thread_sensitive=False)()
                if self.snapshot is None or version != self.snapshot.version:
                    snap, keys = await sync_to_async(_load, thread_sensitive=False)()
                    self.apply(snap, keys)
                    log.info("config version %s loaded", snap.version)
                else:
                    self.keys = keys
            except Exception:  # noqa: BLE001 - a failed poll keeps the last good snapshot
                log.exception(
                    "config poll failed; keeping version %s",
                    self.snapshot and self.snapshot.version,
                )

    def client(self, provider: ProviderSpec) -> httpx.AsyncClient:
        client = self.clients.get(provider.name)
        if client is None:
            client = self.clients[provider.name] = new_client(provider)
        return client


def _default_store() -> StateStore:
    return MemoryStateStore()


_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime
