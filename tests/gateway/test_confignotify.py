"""The config channel (`gateway.confignotify`) and the writing process's own reload.

Real Redis (`REDIS_URL`, CI's second pass) and the real test database; the listeners and the
runtime run on an event loop in a background thread, as they do in a worker while the write
arrives on Django's sync thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from accounts import access
from accounts.access import digest
from gateway import confignotify, runtime
from gateway.confignotify import Listener, Notice
from providers import services as provider_services
from routing.types import ConfigSnapshot

REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set")
T = TypeVar("T")


class LoopThread:
    """An event loop running in its own thread (a worker's loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        # One executor thread, so the runtime's ORM calls share one connection to close.
        self.loop.set_default_executor(ThreadPoolExecutor(1))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.get_running_loop().run_in_executor(None, lambda: connection.close())

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    try:
        yield lt
    finally:
        lt.close()


@pytest.fixture
def channel_settings(settings: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """This test's own Redis prefix (channel), and a fresh publishing client."""
    prefix = f"ocx-test-{uuid.uuid4().hex[:10]}"
    settings.OCX_REDIS_URL = REDIS_URL
    settings.OCX_STATE_KEY_PREFIX = prefix
    monkeypatch.setattr(confignotify, "_client", None)
    return prefix


class Recorder:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.notices: list[Notice | None] = []
        self.delay_s = delay_s
        self.resubscribed = threading.Event()

    async def __call__(self, notice: Notice | None) -> None:
        self.notices.append(notice)
        if notice is None:
            self.resubscribed.set()
        await asyncio.sleep(self.delay_s)


def test_notices_round_trip_and_malformed_ones_are_ignored() -> None:
    notice = Notice(12, 7, "abc")
    assert confignotify.decode(confignotify.encode(notice)) == notice
    assert confignotify.decode(b'{"configVersion": 3, "keysVersion": 4}') == Notice(3, 4, None)
    for bad in (b"not json", b"[1, 2]", b'{"configVersion": "3", "keysVersion": 4}', b"{}"):
        assert confignotify.decode(bad) is None


@needs_redis
def test_a_publish_waits_for_every_listener_to_acknowledge(
    channel_settings: str, loop_thread: LoopThread
) -> None:
    fast, slow = Recorder(), Recorder(delay_s=0.6)
    listeners = [Listener(REDIS_URL or "", channel_settings, r) for r in (fast, slow)]
    for listener in listeners:
        loop_thread.run(listener.start())
        assert listener.subscribed.is_set()

    started = time.monotonic()
    assert confignotify.publish(7, 3) == 2
    assert time.monotonic() - started >= 0.6  # it waited for the slow listener's reload
    for recorder in (fast, slow):
        assert len(recorder.notices) == 1
        got = recorder.notices[0]
        assert got is not None and (got.config_version, got.keys_version) == (7, 3)

    # A listener slower than the wait: the writer gives up after `wait_s`, with one ack.
    started = time.monotonic()
    assert confignotify.publish(8, 3, wait_s=0.2) == 1
    assert time.monotonic() - started < 0.55
    # Once nobody listens, a publish has nothing to wait for.
    for listener in listeners:
        loop_thread.run(listener.stop())
    assert confignotify.publish(10, 3, wait_s=5) == 0


@needs_redis
def test_a_listener_whose_connection_drops_resubscribes_and_catches_up(
    channel_settings: str, loop_thread: LoopThread
) -> None:
    import redis

    recorder = Recorder()
    listener = Listener(REDIS_URL or "", channel_settings, recorder)
    loop_thread.run(listener.start())
    client = redis.Redis.from_url(REDIS_URL or "")
    try:
        ours = [
            c
            for c in client.client_list()
            if c.get("name") == f"{channel_settings}:config-listener"
        ]
        assert len(ours) == 1
        client.client_kill_filter(_id=ours[0]["id"])
        # After reconnecting it asks for a reload (notices sent meanwhile were lost) ...
        assert recorder.resubscribed.wait(10)
        assert None in recorder.notices
        # ... and hears the next notice.
        assert confignotify.publish(5, 5) == 1
        assert recorder.notices[-1] == Notice(5, 5, recorder.notices[-1].ack)  # type: ignore[union-attr]
    finally:
        client.close()
        loop_thread.run(listener.stop())


def test_a_redis_outage_breaks_neither_side(
    settings: Any, monkeypatch: pytest.MonkeyPatch, loop_thread: LoopThread
) -> None:
    dead = "redis://127.0.0.1:1/0"
    settings.OCX_REDIS_URL = dead
    monkeypatch.setattr(confignotify, "_client", None)
    started = time.monotonic()
    assert confignotify.publish(1, 1) == 0  # logged, not raised
    assert time.monotonic() - started < 3
    listener = Listener(dead, "ocx-test-dead", Recorder())
    loop_thread.run(listener.start(wait_s=0.3))  # returns; the poll covers until it subscribes
    assert not listener.subscribed.is_set()
    loop_thread.run(listener.stop())


# --- the writing process reloads before the write returns -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_key_user_and_config_writes_are_in_the_runtime_when_they_return(
    settings: Any, monkeypatch: pytest.MonkeyPatch, loop_thread: LoopThread
) -> None:
    settings.OCX_CONFIG_POLL_MS = 600_000  # only the write path can bring a change in
    settings.OCX_REDIS_URL = None  # one process: the local reload alone
    rt = runtime.Runtime()
    monkeypatch.setattr(runtime, "_runtime", rt)
    loop_thread.run(rt.ready())

    _, secret = access.client_key_create(username="ann")
    assert digest(secret) in rt.keys

    user = get_user_model().objects.get(username="ann")
    user.is_active = False
    user.save()
    # Kept, marked: the proxy answers 401 user_inactive (issue 28 item 3).
    assert not rt.keys[digest(secret)].user_active

    before = rt.snapshot.version if rt.snapshot else -1
    provider_services.disabled_models_set(models=["p/m"])
    assert rt.snapshot is not None and rt.snapshot.version == before + 1
    assert rt.snapshot.disabled_models == frozenset({"p/m"})

    # Not a server process (no loop, e.g. the CLI): nothing to reload, the write still works.
    monkeypatch.setattr(runtime, "_runtime", None)
    assert runtime.reload_from_thread(timeout=1) is False
    provider_services.disabled_models_set(models=[])
    assert rt.snapshot.disabled_models == frozenset({"p/m"})


def test_a_reload_never_replaces_newer_config_or_keys_with_older(loop_thread: LoopThread) -> None:
    """A poll and a write's reload may finish in either order: the older result is dropped."""
    rt = runtime.Runtime()
    key = access.KeyInfo(
        id=1, prefix="ocx_abc", user="u", allowed_models=frozenset(), rpm_limit=None
    )

    def snap(version: int) -> ConfigSnapshot:
        return ConfigSnapshot(version=version, providers={}, combos={})

    async def scenario() -> list[tuple[int, int, bool]]:
        seen = []
        rt.offer(snap(5), {"d1": key}, 7)
        seen.append((rt.snapshot.version if rt.snapshot else -1, rt.keys_version, "d1" in rt.keys))
        rt.offer(snap(4), {}, 6)  # an older read finishing late
        seen.append((rt.snapshot.version if rt.snapshot else -1, rt.keys_version, "d1" in rt.keys))
        rt.offer(snap(6), {}, 6)  # newer config, older keys: keys kept
        seen.append((rt.snapshot.version if rt.snapshot else -1, rt.keys_version, "d1" in rt.keys))
        rt.offer(None, {}, 8)  # newer keys alone
        seen.append((rt.snapshot.version if rt.snapshot else -1, rt.keys_version, "d1" in rt.keys))
        return seen

    assert loop_thread.run(scenario()) == [(5, 7, True), (5, 7, True), (6, 7, True), (6, 8, False)]


def test_a_notice_whose_first_load_fails_does_not_escape(
    loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database is down while a worker's first config load runs: the notice handler logs it
    (the poll retries) instead of raising into the listener."""
    from django.db import OperationalError

    rt = runtime.Runtime()

    async def failing_ready() -> ConfigSnapshot:
        raise OperationalError("database is down")

    monkeypatch.setattr(rt, "ready", failing_ready)
    loop_thread.run(rt._on_notice(Notice(3, 3, None)))
    loop_thread.run(rt._on_notice(None))


@needs_redis
def test_a_listener_keeps_listening_after_its_handler_fails(
    channel_settings: str, loop_thread: LoopThread
) -> None:
    seen: list[Notice | None] = []

    async def flaky(notice: Notice | None) -> None:
        seen.append(notice)
        if len(seen) == 1:
            raise ValueError("a bug in a reload")

    listener = Listener(REDIS_URL or "", channel_settings, flaky)
    loop_thread.run(listener.start())
    try:
        assert confignotify.publish(3, 3) == 1  # acknowledged although the handler failed
        assert confignotify.publish(4, 4) == 1  # and the listener still hears the next one
        assert [(n.config_version, n.keys_version) for n in seen if n is not None] == [
            (3, 3),
            (4, 4),
        ]
    finally:
        loop_thread.run(listener.stop())
