"""Admin live badges, the events page, and the out-of-quota save guard (reference §2.7)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos.models import Combo
from combos.services import combo_set
from gateway.runtime import get_runtime
from providers.models import Provider
from providers.services import provider_set
from quota import windows as qw
from quota.tracker import MemoryJsonStore, Record
from routing.state import ComboState, MemoryStateStore
from tests.combos.test_admin import _combo_post

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "r@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def live_state(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[MemoryStateStore, MemoryJsonStore]]:
    # This process's own stores, whatever an earlier test left in the shared runtime.
    runtime = get_runtime()
    store, quota = MemoryStateStore(), MemoryJsonStore()
    monkeypatch.setattr(runtime, "store", store)
    monkeypatch.setattr(runtime.tracker, "store", quota)
    yield store, quota


def _providers() -> tuple[Provider, Provider]:
    for name in ("p1", "p2"):
        provider_set(
            name=name,
            raw={
                "adapter": "openai-responses",
                "baseUrl": "http://127.0.0.1:9/v1",
                "apiKeyEnv": "K",
            },
        )
    return Provider.objects.get(name="p1"), Provider.objects.get(name="p2")


def _exhausted(provider: str, reset_in_ms: int) -> Record:
    now = int(time.time() * 1000)
    window = qw.Window(
        name="five_hour",
        used_percent=100.0,
        window_minutes=300,
        resets_at_ms=now + reset_in_ms,
        observed_at_ms=now,
        source=qw.SOURCE_CODEX_HEADERS,
    )
    state, _ = qw.observe(qw.CredentialQuota(provider, "fp1"), [window], now=now)
    assert state.status == "limited"
    return Record(state, (window,))


def _exhausted_for(provider: str, secret: str, reset_in_ms: int) -> Record:
    record = _exhausted(provider, reset_in_ms)
    fp = qw.credential_fingerprint(secret)
    return Record(replace(record.state, credential=fp), record.windows)


@pytest.mark.skipif(bool(__import__("os").environ.get("REDIS_URL")), reason="memory store only")
def test_badges_show_every_target_state(
    staff: Client,
    live_state: tuple[MemoryStateStore, MemoryJsonStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One badge per state of `eligibility.target_state` (PRODUCT §8.7), as the admin shows it."""
    store, quota = live_state
    monkeypatch.setenv("K", "sk-badges")
    monkeypatch.delenv("K_UNSET", raising=False)
    _providers()
    for name, extra in (
        ("p3", {}),
        ("p4", {}),
        ("p5", {"apiKeyEnv": "K_UNSET"}),
        ("p6", {"disabled": True}),
    ):
        raw = {"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1", "apiKeyEnv": "K"}
        provider_set(name=name, raw={**raw, **extra})
    targets = [{"provider": f"p{i}", "model": f"m{i}"} for i in range(1, 7)]
    combo_set(combo_id="main", raw={"targets": targets})
    now = int(time.time() * 1000)
    store._states["main"] = ComboState(
        cooldowns={"p2/m2": now + 60_000, "p3/m3": now - 1},
        probes={"p3/m3": now + 60_000},
    )
    quota.data[f"quota:p1:{qw.credential_fingerprint('sk-badges')}"] = _exhausted_for(
        "p1", "sk-badges", 3_600_000
    ).to_json()
    combo = Combo.objects.get(combo_id="main")
    page = staff.get(f"/admin/combos/combo/{combo.pk}/change/").content.decode()
    assert 'class="ocx-badge ocx-out_of_quota" data-target="p1/m1"' in page
    # End times are <time> elements the browser shows in its own zone, with a fallback.
    assert re.search(
        r'p1/m1: Out of quota until <time class="ocx-until" datetime="20\d\d-[-\dT:.]+Z">'
        r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d UTC \(in (59 min \d+ s|1 h 0 min)\)</time>",
        page,
    ), page
    assert 'class="ocx-badge ocx-cooling" data-target="p2/m2"' in page
    assert re.search(
        r'p2/m2: Cooling until <time class="ocx-until" datetime="[-\dT:.]+Z">'
        r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d UTC \(in (59 s|1 min)\)</time>",
        page,
    ), page
    assert "p3/m3: Probing" in page
    assert 'title="no quota data yet">p4/m4: Available' in page
    assert 'class="ocx-badge ocx-no_credential" data-target="p5/m5"' in page
    assert "p5/m5: No credential" in page
    assert "environment variable K_UNSET is not set" in page
    assert "p6/m6: Disabled" in page
    assert "Quota unknown" not in page
    assert "ocx/live.js" in page
    # A pin shows first, whatever the automatic state (here: the cooling target).
    combo_set(combo_id="main", raw={"targets": targets, "override": {"target": "p2/m2"}})
    store._states["main"] = ComboState(cooldowns={"p2/m2": now + 60_000})
    page = staff.get("/admin/combos/combo/").content.decode()
    assert 'class="ocx-badge ocx-pinned" data-target="p2/m2"' in page
    assert "p2/m2: Pinned" in page
    # A healthy target with no quota data ever seen is available, not "unknown".
    store._states.clear()
    quota.data.clear()
    combo_set(combo_id="main", raw={"targets": targets})
    page = staff.get("/admin/combos/combo/").content.decode()
    assert "p1/m1: Available" in page
    assert "Quota unknown" not in page


@pytest.mark.skipif(bool(__import__("os").environ.get("REDIS_URL")), reason="memory store only")
def test_save_blocked_only_when_every_usable_target_is_out_of_quota(
    staff: Client, live_state: tuple[MemoryStateStore, MemoryJsonStore]
) -> None:
    _, quota = live_state
    p1, p2 = _providers()
    quota.data["quota:p1:fp1"] = _exhausted("p1", 3_600_000).to_json()
    # One usable target still has quota: the save goes through.
    assert staff.post("/admin/combos/combo/add/", _combo_post(p1, p2)).status_code == 302
    Combo.objects.all().delete()
    quota.data["quota:p2:fp1"] = _exhausted("p2", 7_200_000).to_json()
    response = staff.post("/admin/combos/combo/add/", _combo_post(p1, p2))
    assert response.status_code == 200
    text = response.content.decode()
    assert "Every usable target is out of quota: p1/m1 until" in text
    assert "p2/m2 until" in text
    assert not Combo.objects.exists()


def test_events_page_listens_on_the_websocket(staff: Client) -> None:
    page = staff.get("/admin/combos/combo/events/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="ocx-event-list"' in body
    assert 'id="ocx-conn"' in body  # the connected/disconnected indicator
    assert "ocx/events.js" in body
    script = staff.get("/static/ocx/events.js")
    assert script.status_code == 200
    assert b"/ws/events" in b"".join(script.streaming_content)  # type: ignore[attr-defined]


@pytest.mark.skipif(not __import__("os").environ.get("REDIS_URL"), reason="needs REDIS_URL")
def test_badges_read_the_shared_redis_state(
    staff: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Redis the badges show what any worker wrote there (the store the router reads)."""
    import asyncio
    import uuid

    from state.redis_state import RedisStateStore

    settings.OCX_STATE_KEY_PREFIX = f"ocx-badges-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("K", "sk-badges")
    _providers()
    combo_set(
        combo_id="main",
        raw={"targets": [{"provider": "p1", "model": "m1"}, {"provider": "p2", "model": "m2"}]},
    )
    until = int(time.time() * 1000) + 60_000

    async def write() -> None:
        store = RedisStateStore(settings.OCX_REDIS_URL, settings.OCX_STATE_KEY_PREFIX)
        try:
            await store.update("main", lambda s: (ComboState(cooldowns={"p1/m1": until}), None))
        finally:
            await store.aclose()

    asyncio.run(write())
    page = staff.get("/admin/combos/combo/").content.decode()
    assert 'class="ocx-badge ocx-cooling" data-target="p1/m1"' in page
    assert "p2/m2: Available" in page
