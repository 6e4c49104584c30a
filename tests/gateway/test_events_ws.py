"""`/ws/events` (PRODUCT §4.3, §8.6): staff only; routing and quota events reach subscribers.

In-process against `ocxsite.asgi.application` with `channels.testing.WebsocketCommunicator`,
authenticated by a real Django session cookie (the `AuthMiddlewareStack` path). With REDIS_URL
the channel layer is Redis, which other processes may share: receivers skip foreign events.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from gateway.events import EVENTS_GROUP
from gateway.runtime import Runtime
from ocxsite.asgi import application
from quota import windows as qw
from quota.models import QuotaTransition
from routing.types import ComboSpec, ConfigSnapshot, TargetSpec

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie(*, staff: bool) -> bytes:
    user = get_user_model().objects.create_user(
        username=f"u{uuid.uuid4().hex[:8]}", password="pw-0123456789", is_staff=staff
    )
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


@pytest.fixture
def staff_cookie() -> bytes:
    return session_cookie(staff=True)


@pytest.fixture
def user_cookie() -> bytes:
    return session_cookie(staff=False)


def communicator(
    cookie: bytes | None = None,
    origin: bytes | None = b"http://testserver",
    host: bytes = b"testserver",
    secure: bool = False,
) -> WebsocketCommunicator:
    """A connection to /ws/events from a page of `origin` (a browser always sends one), made to
    `host` over ws (or wss)."""
    headers = [(b"host", host)] + ([(b"cookie", cookie)] if cookie else [])
    if origin is not None:
        headers.append((b"origin", origin))
    ws = WebsocketCommunicator(application, "/ws/events", headers=headers)
    if secure:
        ws.scope["scheme"] = "wss"
    return ws


@pytest.mark.parametrize(
    ("origin", "host", "secure"),
    [
        (b"http://evil.example", b"testserver", False),
        (b"https://testserver.evil.example", b"testserver", False),
        (b"null", b"testserver", False),
        (None, b"testserver", False),
        # Issue #43: the scheme and the port count, not only the host.
        (b"https://testserver", b"testserver", False),
        (b"http://testserver", b"testserver", True),
        (b"http://testserver:8080", b"testserver", False),
        (b"http://localhost:9999", b"localhost:8787", False),
        # This site's origin, but its host is not one of OCX_ALLOWED_HOSTS.
        (b"http://evil.example", b"evil.example", False),
    ],
)
async def test_foreign_or_missing_origin_is_refused(
    staff_cookie: bytes, origin: bytes | None, host: bytes, secure: bool
) -> None:
    ws = communicator(staff_cookie, origin=origin, host=host, secure=secure)
    connected, code = await ws.connect()
    assert connected is False
    assert code == 1000  # the origin check closes before the consumer runs
    await ws.disconnect()


@pytest.mark.parametrize(
    ("origin", "host", "secure"),
    [
        (b"http://testserver", b"testserver", False),
        (b"http://testserver:80", b"testserver", False),
        (b"http://localhost:8787", b"localhost:8787", False),
        (b"https://127.0.0.1", b"127.0.0.1", True),
        (b"https://127.0.0.1", b"127.0.0.1:443", True),
        (b"http://[::1]:8787", b"[::1]:8787", False),
    ],
)
async def test_this_sites_origin_is_accepted(
    staff_cookie: bytes, origin: bytes, host: bytes, secure: bool
) -> None:
    ws = communicator(staff_cookie, origin=origin, host=host, secure=secure)
    connected, _ = await ws.connect()
    assert connected is True
    await ws.disconnect()


async def receive_matching(
    ws: WebsocketCommunicator, match: Any, timeout: float = 5.0
) -> dict[str, Any]:
    """The first event for which `match(event)` holds (other processes may publish too)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no matching event arrived"
        event = await ws.receive_json_from(timeout=remaining)
        if match(event):
            return event


async def test_anonymous_connection_is_refused() -> None:
    ws = communicator()
    connected, code = await ws.connect()
    assert not connected
    assert code == 4403
    await ws.disconnect()


async def test_non_staff_connection_is_refused(user_cookie: bytes) -> None:
    ws = communicator(user_cookie)
    connected, code = await ws.connect()
    assert not connected
    assert code == 4403
    await ws.disconnect()


async def test_garbage_session_is_refused() -> None:
    ws = communicator(b"sessionid=not-a-session")
    connected, _ = await ws.connect()
    assert not connected
    await ws.disconnect()


async def test_staff_receives_group_events(staff_cookie: bytes) -> None:
    ws = communicator(staff_cookie)
    connected, _ = await ws.connect()
    assert connected
    try:
        marker = uuid.uuid4().hex
        event = {"kind": "cooldown", "combo": "c1", "target": "p/m", "until": 1, "marker": marker}
        await get_channel_layer().group_send(EVENTS_GROUP, {"type": "ocx.event", "event": event})
        got = await receive_matching(ws, lambda e: e.get("marker") == marker)
        assert got == event
    finally:
        await ws.disconnect()


async def test_two_staff_subscribers_both_receive(staff_cookie: bytes) -> None:
    first, second = communicator(staff_cookie), communicator(staff_cookie)
    assert (await first.connect())[0]
    assert (await second.connect())[0]
    try:
        marker = uuid.uuid4().hex
        event = {"kind": "hop", "marker": marker}
        await get_channel_layer().group_send(EVENTS_GROUP, {"type": "ocx.event", "event": event})
        for ws in (first, second):
            assert await receive_matching(ws, lambda e: e.get("marker") == marker) == event
    finally:
        await first.disconnect()
        await second.disconnect()


async def test_quota_transition_reaches_the_websocket(staff_cookie: bytes) -> None:
    """A usage-limit folded into a real runtime's tracker is stored, and pushed to staff in the
    concise wording of PRODUCT §8.6 — provider ids only, never the credential."""
    ws = communicator(staff_cookie)
    connected, _ = await ws.connect()
    assert connected
    tag = uuid.uuid4().hex[:6]
    primary, fallback = f"openai-{tag}", f"fallback-provider-{tag}"
    runtime = Runtime()
    runtime.snapshot = ConfigSnapshot(
        version=1,
        providers={},
        combos={
            "c": ComboSpec(id="c", targets=(TargetSpec(primary, "m"), TargetSpec(fallback, "m")))
        },
    )
    secret = f"sk-secret-{tag}-0123456789"
    pair = (primary, qw.credential_fingerprint(secret))
    now = int(time.time() * 1000)
    body = {"error": {"type": "usage_limit_reached", "resets_in_seconds": 60}}
    try:
        windows = qw.windows_from_error(429, body, {}, now=now)
        transition = await runtime.tracker.ingest(pair, windows, outcome="failure", now=now)
        assert transition is not None and transition.to_status == "limited"

        got = await receive_matching(
            ws, lambda e: e.get("kind") == "quota" and e.get("provider") == primary
        )
        assert got["from"] == "available" and got["to"] == "limited"
        assert got["reason"] == "usage_limit_reached"
        assert got["credential"] == pair[1]
        assert got["message"] == f'Primary provider usage limit reached; switched to "{fallback}".'
        assert secret not in str(got)

        # The same transition is stored off the hot path.
        def stored() -> list[QuotaTransition]:
            return list(QuotaTransition.objects.filter(provider=primary))

        rows: list[QuotaTransition] = []
        for _ in range(50):
            rows = await sync_to_async(stored)()
            if rows:
                break
            await asyncio.sleep(0.1)
        assert [(r.from_state, r.to_state, r.message) for r in rows] == [
            ("available", "limited", got["message"])
        ]
    finally:
        await ws.disconnect()
        for writer in (runtime.transitions, runtime.snapshots, runtime.requestlog):
            task = getattr(writer, "_task", None)
            if task is not None:
                task.cancel()
