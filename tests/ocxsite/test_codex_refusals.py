"""The real Codex CLI with its DEFAULT retries against ocx's refusals (issue #46, PRODUCT §9.10).

`tests/ocxsite/test_codex_cli.py` turns Codex's own retries off (ocx does the failover); here
they are Codex's defaults (`request_max_retries` 4, `stream_max_retries` 5), as a new user
runs it. For each refusal `codex exec` must end within seconds with ocx's reason on screen:

* a spent budget, a combo cooling for minutes and an upstream's long Retry-After are usage
  limits: Codex stops after ONE request and shows ocx's message (`x-codex-promo-message`);
* an expired or revoked key (401) and a model the key may not use (403) keep their status:
  Codex re-sends them 5 times by design (0.2-3.2 s apart, ~6 s in all; no 401/403 shape stops
  it sooner, docs/codex.md), then shows ocx's message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import Mock, Server
from tests.ocxsite.test_codex_cli import (
    Codex,
    isolated_env,
    write_catalog,
    write_config,
)

API_KEY = "sk-test-codex-refusals-dddddddddddddddd"
# combo → its one model on the mock
COMBOS = {
    "rf-plain": "rf-plain-m",
    "rf-cool": "rf-cool-m",
    "rf-limit": "rf-limit-m",
    "rf-other": "rf-other-m",
}
USAGE_LIMIT = "ve hit your usage limit."  # Codex writes You’ve (a curly apostrophe)
# Codex's full 401/403 run is ~6.2 s of backoff; a usage limit is one request.
QUICK_S = 20


@pytest.fixture(scope="module")
def codex_default(
    ocx_server: Server, mock_upstream: Mock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Codex]:
    server = ocx_server
    server.put_provider(
        "up-rf",
        {
            "adapter": "openai-responses",
            "baseUrl": mock_upstream.url + "/v1",
            "apiKey": API_KEY,
            "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
            "models": {
                m: {"contextWindow": 100000, "inputModalities": ["text"]} for m in COMBOS.values()
            },
        },
    )
    for combo_id, model in COMBOS.items():
        server.put_combo(combo_id, {"targets": [{"provider": "up-rf", "model": model}]})
    key = server.create_key(user="codex-refusals")
    server.wait_synced()
    home = tmp_path_factory.mktemp("codex-default-home")
    catalog = write_catalog(server, home)
    write_config(home, catalog, server, retries=True)
    yield Codex(server, home, catalog, isolated_env(home, key))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def with_key(codex: Codex, key: str) -> Codex:
    return replace(codex, env={**codex.env, "OCX_API_KEY": key})


def new_key(server: Server, user: str, **extra: object) -> tuple[str, int]:
    key = server.create_key(user=user, **extra)
    listed = server.api.get("/api/keys", params={"user": user}).json()["keys"][0]
    return key, int(listed["id"])


def timed_exec(codex: Codex, model: str, workdir: Path) -> tuple[str, float, int]:
    """(everything Codex printed, seconds it ran, exit code)."""
    started = time.monotonic()
    run = codex.exec(model, "Say something.", workdir)
    return run.stdout + run.stderr, time.monotonic() - started, run.returncode


def logged(server: Server, user: str, status: int, expected: int) -> int:
    """How many requests of `user` with `status` the request log holds, once it holds
    `expected` (the log is written in batches; Codex has exited, so all of them ran)."""
    deadline = time.monotonic() + 10
    while True:
        rows = server.api.get("/api/requests", params={"user": user, "limit": 100}).json()
        found = sum(1 for r in rows["requests"] if r["status"] == status)
        if found >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_spent_budget_stops_codex_at_once_with_the_budget_message(
    codex_default: Codex, mock: Mock, workdir: Path
) -> None:
    server = codex_default.server
    user = f"cx-budget-{uuid.uuid4().hex[:6]}"
    key, _ = new_key(server, user, budget={"tokens": 1, "period": "day"})
    mock.script(COMBOS["rf-plain"], [], then={"usage": {"input_tokens": 60, "output_tokens": 40}})
    spend = server.http.post(
        "/v1/responses",
        json={"model": "combo/rf-plain", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert spend.status_code == 200, spend.text  # admitted, then 100 of 1 tokens used

    shown, seconds, code = timed_exec(with_key(codex_default, key), "combo/rf-plain", workdir)
    assert code != 0
    assert seconds < QUICK_S, shown
    assert USAGE_LIMIT in shown, shown
    assert "Budget exceeded: key " in shown and "may use 1 tokens per day" in shown, shown
    assert "Reconnecting" not in shown, shown
    assert logged(server, user, 429, 1) == 1  # one request: no retry, no sleep
    assert mock.hits(COMBOS["rf-plain"]) == 1  # only the request that spent it


def test_long_cooling_combo_stops_codex_at_once_naming_combo_and_target(
    codex_default: Codex, mock: Mock, workdir: Path
) -> None:
    server = codex_default.server
    model = COMBOS["rf-cool"]
    mock.script(model, [{"status": 429, "headers": {"Retry-After": "300"}}])
    user = f"cx-cool-{uuid.uuid4().hex[:6]}"
    key, _ = new_key(server, user)
    cooled = server.http.post(
        "/v1/responses",
        json={"model": "combo/rf-cool", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert cooled.status_code == 429  # the target now cools for 5 minutes

    shown, seconds, code = timed_exec(with_key(codex_default, key), "combo/rf-cool", workdir)
    assert code != 0
    assert seconds < QUICK_S, shown
    assert USAGE_LIMIT in shown, shown
    assert f"No available targets for combo: rf-cool: up-rf/{model}: Cooling until" in shown
    assert "Reconnecting" not in shown, shown
    assert logged(server, user, 429, 2) == 2  # the one that cooled it, and Codex's one
    assert mock.hits(model) == 1  # the cooling target was never asked again


def test_upstream_long_retry_after_stops_codex_at_once(
    codex_default: Codex, mock: Mock, workdir: Path
) -> None:
    server = codex_default.server
    model = COMBOS["rf-limit"]
    mock.script(model, [{"status": 429, "headers": {"Retry-After": "120"}}])
    user = f"cx-limit-{uuid.uuid4().hex[:6]}"
    key, _ = new_key(server, user)

    shown, seconds, code = timed_exec(with_key(codex_default, key), "combo/rf-limit", workdir)
    assert code != 0
    assert seconds < QUICK_S, shown  # was: a 117 s sleep, then the same again
    assert USAGE_LIMIT in shown, shown
    assert f"Provider error 429 from up-rf/{model}" in shown, shown
    assert logged(server, user, 429, 1) == 1
    assert mock.hits(model) == 1


def _refused_six_times(
    codex: Codex, workdir: Path, model: str, reason: str, user: str | None, status: int
) -> None:
    shown, seconds, code = timed_exec(codex, model, workdir)
    assert code != 0
    assert seconds < QUICK_S, shown
    assert reason in shown, shown
    if user is not None:
        # Codex's design for 401/403: the first request and 5 re-sends.
        assert logged(codex.server, user, status, 6) == 6


def test_expired_key_shows_ocx_message(codex_default: Codex, mock: Mock, workdir: Path) -> None:
    server = codex_default.server
    user = f"cx-exp-{uuid.uuid4().hex[:6]}"
    key, key_id = new_key(server, user)
    r = server.api.patch(f"/api/keys/{key_id}", json={"expiresAt": "2020-01-01T00:00Z"})
    assert r.status_code == 200
    deadline = time.monotonic() + 5
    while server.http.get("/v1/models", headers={"x-ocx-key": key}).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _refused_six_times(
        with_key(codex_default, key),
        workdir,
        "combo/rf-plain",
        "expired at 2020-01-01T00:00:00Z: ask an ocx administrator for a new key",
        user,
        401,
    )
    assert mock.hits(COMBOS["rf-plain"]) == 0


def test_revoked_key_shows_ocx_message(codex_default: Codex, mock: Mock, workdir: Path) -> None:
    server = codex_default.server
    key, key_id = new_key(server, f"cx-rev-{uuid.uuid4().hex[:6]}")
    assert server.api.delete(f"/api/keys/{key_id}").status_code == 200
    deadline = time.monotonic() + 5
    while server.http.get("/v1/models", headers={"x-ocx-key": key}).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # A revoked key is no key: the request log cannot name its user.
    _refused_six_times(
        with_key(codex_default, key),
        workdir,
        "combo/rf-plain",
        "Missing or invalid ocx client key",
        None,
        401,
    )
    assert mock.hits(COMBOS["rf-plain"]) == 0


def test_model_not_allowed_shows_ocx_message(
    codex_default: Codex, mock: Mock, workdir: Path
) -> None:
    server = codex_default.server
    user = f"cx-deny-{uuid.uuid4().hex[:6]}"
    key, _ = new_key(server, user, allowedModels=["combo/rf-plain"])
    _refused_six_times(
        with_key(codex_default, key),
        workdir,
        "combo/rf-other",
        "This key may not use model combo/rf-other",
        user,
        403,
    )
    assert mock.hits(COMBOS["rf-other"]) == 0
