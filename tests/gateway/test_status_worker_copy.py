"""Status during a Redis outage: the answering worker's own copy, the state it routes on."""

from __future__ import annotations

import time
from typing import Any

import pytest

from combos.services import combo_set
from combos.status import status_report
from gateway.runtime import get_runtime
from providers.services import provider_set
from routing.state import ComboState
from state.redis_guard import GuardedJsonStore, GuardedStateStore, RedisBreaker
from state.redis_state import RedisStateStore
from state.redis_store import RedisJsonStore

pytestmark = pytest.mark.django_db
DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def test_status_shows_the_workers_copy_while_redis_is_out(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.OCX_REDIS_URL = DOWN
    breaker = RedisBreaker(DOWN, timeout_s=0.05)
    store = GuardedStateStore(RedisStateStore(DOWN), breaker)
    quota = GuardedJsonStore(RedisJsonStore(DOWN), breaker)
    runtime = get_runtime()
    monkeypatch.setattr(runtime, "redis", breaker)
    monkeypatch.setattr(runtime, "store", store)
    monkeypatch.setattr(runtime.tracker, "store", quota)
    for name in ("p1", "p2"):
        provider_set(
            name=name,
            raw={"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1", "apiKey": "k"},
        )
    targets = [{"provider": "p1", "model": "m1"}, {"provider": "p2", "model": "m2"}]
    combo_set(combo_id="main", raw={"targets": targets})
    until = int(time.time() * 1000) + 60_000
    store.local.seed("main", ComboState(cooldowns={"p1/m1": until}))

    report = status_report("main")
    assert report["liveState"] == "this worker"
    assert "own copy" in report["note"]
    combo = report["combos"][0]
    assert combo["wouldServe"] == {"default": "p2/m2"}
    assert [t["state"] for t in combo["targets"]] == ["cooling", "available"]

    # Another process (the CLI) has no such copy: it says Redis is unreachable.
    other = status_report("main", local=False)
    assert other["liveState"] == "redis unreachable"
    assert other["combos"][0]["wouldServe"] == {"default": "p1/m1"}
