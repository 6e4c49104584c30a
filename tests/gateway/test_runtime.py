"""The worker's key map follows the key table, including writes that race a reload.

The runtime polls `ConfigState.keys_version`, a counter every key or user write bumps. A
signature derived from the key rows could return to an earlier value (create a key while the
map loads, then revoke it: count, last id and last change are back where they were) and leave a
revoked key accepted until the next unrelated key change — seen once in CI as a revocation
that did not reach the worker within 3 s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in
from django.db import Error as DbError
from django.db import connection
from django.test import RequestFactory

from accounts import access
from accounts.access import digest
from accounts.models import ClientKey
from combos import selectors
from gateway.runtime import Runtime
from providers import services as provider_services
from providers.services import Delta, versions_committed
from server.background import in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def on_loop(work: Callable[[], Awaitable[None]]) -> None:
    async def once() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        await work()
        # The poll's thread keeps its own connection; close it so the test database can go.
        await loop.run_in_executor(None, lambda: connection.close())

    asyncio.run(once())


def refresh(rt: Runtime) -> None:
    on_loop(rt.refresh)


def known(rt: Runtime, secret: str) -> bool:
    # A deactivated user's key stays in the map, marked (the proxy answers user_inactive).
    info = rt.keys.get(digest(secret))
    return info is not None and info.user_active


def keys_version() -> int:
    return selectors.config_versions()[1]


def config_version() -> int:
    return selectors.config_versions()[0]


def test_a_key_written_during_a_reload_and_then_revoked_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, first = access.client_key_create(username="ann")
    rt = Runtime()
    refresh(rt)
    assert known(rt, first)

    # The next reload sees a key that another request creates between the version read and
    # the key load.
    raced: list[str] = []
    real: Callable[..., dict[str, Any]] = access.client_keys_active

    def racing_load(**kwargs: Any) -> dict[str, Any]:
        if not raced:
            raced.append(access.client_key_create(username="bob")[1])
        return real(**kwargs)

    monkeypatch.setattr(access, "client_keys_active", racing_load)
    _, second = access.client_key_create(username="cid")
    refresh(rt)
    assert known(rt, second) and known(rt, raced[0])
    monkeypatch.setattr(access, "client_keys_active", real)

    bob_key = ClientKey.objects.get(user__username="bob")
    assert access.client_key_revoke(key_id=bob_key.pk) is True
    refresh(rt)
    assert not known(rt, raced[0])
    assert known(rt, first) and known(rt, second)


def test_every_key_write_moves_the_version_and_reaches_the_map() -> None:
    key, secret = access.client_key_create(username="dee")
    rt = Runtime()
    refresh(rt)
    assert rt.keys[digest(secret)].rpm_limit is None

    before = keys_version()
    key.rpm_limit = 7
    key.save()
    assert keys_version() == before + 1
    refresh(rt)
    assert rt.keys[digest(secret)].rpm_limit == 7

    user = get_user_model().objects.get(username="dee")
    user.is_active = False
    user.save()
    refresh(rt)
    assert not known(rt, secret)

    user.is_active = True
    user.save()
    refresh(rt)
    assert known(rt, secret)

    before = keys_version()
    key.delete()
    assert keys_version() == before + 1
    refresh(rt)
    assert not known(rt, secret)


def test_revoking_nothing_and_logging_in_leave_the_version_alone() -> None:
    key, _ = access.client_key_create(username="eve")
    access.client_key_revoke(key_id=key.pk)
    before = keys_version()
    assert access.client_key_revoke(key_id=key.pk) is False
    assert access.client_keys_revoke(keys=ClientKey.objects.filter(pk=key.pk)) == 0
    user = get_user_model().objects.get(username="eve")
    # (django-axes' receiver reads the request: a real one, as a login has.)
    user_logged_in.send(
        sender=type(user), request=RequestFactory().post("/admin/login/"), user=user
    )
    assert keys_version() == before


def test_a_poll_without_changes_loads_no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    access.client_key_create(username="fay")
    rt = Runtime()
    refresh(rt)
    loads: list[int] = []
    real = access.client_keys_active

    def counted(**kwargs: Any) -> dict[str, Any]:
        loads.append(1)
        return real(**kwargs)

    monkeypatch.setattr(access, "client_keys_active", counted)
    refresh(rt)
    refresh(rt)
    assert loads == []
    access.client_key_create(username="gus")
    refresh(rt)
    assert loads == [1]


def test_a_background_thread_whose_connection_broke_reconnects_on_the_next_call() -> None:
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip("Django never closes an in-memory SQLite database (the test database)")

    # One thread, so every call below shares its connection, as a long-lived poll thread does.
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        seen = [str(await in_thread(keys_version))]

        def break_socket() -> None:
            connection.ensure_connection()
            assert connection.connection is not None
            connection.connection.close()  # as when the database server restarts

        await in_thread(break_socket)
        try:
            await in_thread(keys_version)
            seen.append("no error")
        except DbError:
            seen.append("error")
        seen.append(str(await in_thread(keys_version)))
        await loop.run_in_executor(None, lambda: connection.close())
        return seen

    access.client_key_create(username="hal")
    version = keys_version()
    assert asyncio.run(scenario()) == [str(version), "error", str(version)]


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("redis_url", ["", "redis://127.0.0.1:1/0"])
def test_redis_py_loads_only_in_a_worker_that_uses_redis(redis_url: str) -> None:
    # Without REDIS_URL the guard, the Redis client and redis-py (4-5 MB) stay unloaded.
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, sys, django; django.setup(); "
        "import ocxsite.asgi, ocxsite.urls, ocxsite.views, gateway.live; "
        "from gateway.runtime import Runtime; r = Runtime(); "
        "print(json.dumps([bool(r.redis), sorted(m for m in "
        "('redis', 'state.resp', 'state.redis_guard') if m in sys.modules)]))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ocxsite.settings", "REDIS_URL": redis_url}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    shared, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    if redis_url:
        assert shared and loaded == ["redis", "state.redis_guard", "state.resp"]
    else:
        assert not shared and loaded == []


class _Subscribed:
    """A listener that is subscribed: the runtime's poll is then patient (a notice may be on
    its way)."""

    def __init__(self) -> None:
        self.subscribed = threading.Event()
        self.subscribed.set()


@pytest.fixture
def notices() -> Iterator[list[Delta]]:
    """The notices of writes, held back: a test delivers them (`deliver`)."""
    held: list[Delta] = []

    def hold(sender: object, delta: Delta | None = None, **kwargs: object) -> None:
        if delta is not None:
            held.append(delta)

    versions_committed.connect(hold, weak=False)
    yield held
    versions_committed.disconnect(hold)


def patient_poll(rt: Runtime) -> None:
    on_loop(lambda: rt.refresh(patient=True))


def deliver(rt: Runtime, notices: list[Delta]) -> None:
    """The notices held so far arrive, in order."""
    arrived = list(notices)
    notices.clear()

    async def bring_in() -> None:
        for delta in arrived:
            await rt.bring_in(delta)

    on_loop(bring_in)


def patient_runtime(notices: list[Delta]) -> Runtime:
    rt = Runtime()
    refresh(rt)
    rt.listener = _Subscribed()  # type: ignore[assignment]
    notices.clear()
    # The first patient poll never reloads: there is no previous poll to compare with.
    patient_poll(rt)
    assert rt.reloads == {"config": 0, "keys": 0}  # the first load is not a reload
    return rt


def test_a_stream_of_key_writes_is_left_to_its_notices(notices: list[Delta]) -> None:
    access.client_key_create(username="hal")
    rt = patient_runtime(notices)

    access.client_key_create(username="ida")  # its notices are on their way
    patient_poll(rt)  # reads ida's version
    deliver(rt, notices)
    _, jon = access.client_key_create(username="jon")
    deliver(rt, notices)
    served = keys_version()
    _, kim = access.client_key_create(username="kim")  # on their way again
    held = list(notices)
    # This poll finds kim's write unserved, but the runtime serves all the previous poll read:
    # the lag is the newest write's, not a missed notice.
    patient_poll(rt)
    assert rt.reloads == {"config": 0, "keys": 0}
    assert rt.keys_version == served and rt.patches["keys"] == 4
    assert known(rt, jon) and not known(rt, kim)

    # kim's notices are lost: the next poll finds the runtime still behind what the previous
    # one read, and reloads.
    notices.clear()
    patient_poll(rt)
    assert rt.reloads == {"config": 0, "keys": 1}
    assert rt.keys_version == keys_version() and known(rt, kim)

    # They arrive after all: nothing left to do.
    deliver(rt, held)
    assert rt.reloads == {"config": 0, "keys": 1} and rt.patches["keys"] == 4


def test_a_stream_of_provider_writes_is_left_to_its_notices(notices: list[Delta]) -> None:
    provider = {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1", "models": {"m": {}}}
    provider_services.provider_set(name="p", raw=provider)
    rt = patient_runtime(notices)

    def write(model: str) -> None:
        provider_services.provider_set(name="p", raw={**provider, "models": {model: {}}})

    write("a")
    patient_poll(rt)
    deliver(rt, notices)
    write("b")
    deliver(rt, notices)
    served = config_version()
    write("c")
    patient_poll(rt)
    assert rt.reloads == {"config": 0, "keys": 0}
    assert rt.snapshot is not None and rt.snapshot.version == served
    assert rt.patches["config"] == 2

    notices.clear()  # c's notice is lost
    patient_poll(rt)
    assert rt.reloads == {"config": 1, "keys": 0}
    assert rt.snapshot.version == config_version()
    assert set(rt.snapshot.providers["p"].models) == {"c"}
