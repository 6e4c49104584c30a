"""Caller-scoped rate limits on caller-forward targets (issue #43, point 3), end to end.

On a `chatgpt` target each caller is served with their own account: one caller's 429 (with
`Retry-After`) holds that caller's credential off that target, and nobody else. The next caller
is served by the same target (it was 503 `combo_unavailable`: the shared target was cooled);
the limited caller's next request does not reach the upstream while the hold lasts. With Redis
the hold is every worker's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Mock, Server, start_server
from tests.gateway.test_caller_credentials import chatgpt_only
from tests.gateway.test_quota_failover import account, ask, chatgpt_combo, served, status


def limited(seconds: int = 30) -> dict[str, object]:
    return {"status": 429, "headers": {"Retry-After": str(seconds)}}


def test_one_callers_429_leaves_the_target_to_the_others(server: Server, mock: Mock) -> None:
    c, key = chatgpt_only(server, mock)
    a, b = account("a", key), account("b", key)
    mock.script(c.pm, [limited()])

    r = ask(server, c, headers=a)
    assert r.status_code == 429, r.text
    # Nothing shared is cooled: the target stays available to the team.
    targets = status(server, c)["combos"][0]["targets"]
    assert all(t.get("until") is None for t in targets), targets

    # Another caller, their own account: served by the same target.
    assert served(ask(server, c, headers=b)) == c.primary_target
    assert served(ask(server, c, headers=b, stream=True)) == c.primary_target
    assert mock.hits(c.pm) == 3

    # The limited caller is held off that target: no upstream call while the hold lasts.
    r = ask(server, c, headers=a)
    assert r.status_code == 503, r.text
    assert mock.hits(c.pm) == 3
    # Only the credential's hash is kept: the token is nowhere in the answer or the log.
    token = a["Authorization"].removeprefix("Bearer ")
    assert token not in r.text and token not in "".join(server.output)


def test_a_held_caller_hops_to_a_stored_key_target(server: Server, mock: Mock) -> None:
    c, key = chatgpt_combo(server, mock)
    a, b = account("a", key), account("b", key)
    mock.script(c.pm, [limited()])
    assert served(ask(server, c, headers=a)) == c.fallback_target  # hopped at once
    # The held caller goes straight to the fallback; the other caller keeps the primary.
    assert served(ask(server, c, headers=a)) == c.fallback_target
    assert served(ask(server, c, headers=b)) == c.primary_target
    assert (mock.hits(c.pm), mock.hits(c.fm)) == (2, 2)


@pytest.fixture
def two_workers(redis_server: object, tmp_path: Path) -> Iterator[Server]:
    server, stop = start_server(
        tmp_path,
        workers=2,
        extra_env={"REDIS_URL": redis_server.url},  # type: ignore[attr-defined]
    )
    try:
        yield server
    finally:
        stop()


def test_the_hold_is_shared_by_every_worker(two_workers: Server, mock: Mock) -> None:
    server = two_workers
    c, key = chatgpt_only(server, mock)
    a, b = account("a", key), account("b", key)
    mock.script(c.pm, [limited()])
    assert ask(server, c, headers=a).status_code == 429
    # New connections: the requests spread over both workers.
    for _ in range(8):
        with httpx.Client(base_url=server.url, timeout=30) as fresh:
            assert ask(server, c, headers=a, client=fresh).status_code == 503
    assert mock.hits(c.pm) == 1
    assert served(ask(server, c, headers=b)) == c.primary_target
