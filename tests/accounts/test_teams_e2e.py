"""Teams enforced end to end (issue 27) against a real `ocx serve` and `ocx mock-upstream`: a
team's budget is shared by its members' keys (429 naming "team infra"); a team's allowedModels
narrow what a member's key may use (403) and a key's own list cannot widen them; team writes
(API and CLI, another process) reach a running server without a restart; with Redis and three
workers, every worker serves a team write as soon as it returns."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.conftest import Mock, Server, start_server
from tests.ocxsite.test_security import ocx
from tests.server.test_workers import REDIS_URL, needs_redis, spread_clients
from tests.usage.test_budgets_e2e import (
    USAGE,
    ask,
    midnight_utc,
    new_key,
    refused_body,
    setup_provider,
    wait_for_output,
)


def put_team(server: Server, name: str, **team: Any) -> dict[str, Any]:
    r = server.api.put("/api/teams", json={"name": name, "team": team})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()["team"]
    return body


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_team_budget_is_shared_by_its_members_and_named_in_the_429(
    server: Server, mock: Mock
) -> None:
    setup_provider(server, mock, "tb", "tm")
    reset = midnight_utc()
    ann, ben, cy = unique("ann"), unique("ben"), unique("cy")
    _, ann_h = new_key(server, ann)
    _, ben_h = new_key(server, ben)
    _, cy_h = new_key(server, cy)
    mock.script("tm", [], then={"usage": USAGE})
    team = unique("infra")
    # Written while the server runs: the answer comes once the worker serves it.
    put_team(server, team, members=[ann, ben], budgets=[{"tokens": 250, "period": "day"}])

    assert ask(server.http, "tb/tm", ann_h).status_code == 200  # 100
    assert ask(server.http, "tb/tm", ben_h).status_code == 200  # 200
    assert ask(server.http, "tb/tm", ann_h).status_code == 200  # 200 < 250: admitted → 300
    assert mock.hits("tm") == 3
    for headers in (ann_h, ben_h):
        r = ask(server.http, "tb/tm", headers)
        assert r.status_code == 429
        assert r.json() == refused_body(f"team {team}", "250 tokens per day", "300 tokens", reset)
        assert r.headers["x-ocx-budget-limit"] == "250"
        assert r.headers["x-ocx-budget-remaining"] == "0"
    assert mock.hits("tm") == 3  # refused requests reached no upstream
    # The 80 % and 100 % events name the team.
    assert "(300 of 250)" in wait_for_output(server, f"budget 100%: team {team} has used 100%")
    wait_for_output(server, f"budget 80%: team {team} has used 80%")
    # A user outside the team is not held by its budget.
    assert ask(server.http, "tb/tm", cy_h).status_code == 200

    # Leaving the team frees ben at once (no restart), ann stays held.
    put_team(server, team, members=[ann])
    assert ask(server.http, "tb/tm", ben_h).status_code == 200
    assert ask(server.http, "tb/tm", ann_h).status_code == 429
    # Joining a used-up team holds the newcomer too.
    put_team(server, team, members=[ann, cy])
    r = ask(server.http, "tb/tm", cy_h)
    assert r.status_code == 429 and f"team {team} may use" in r.json()["error"]["message"]


def test_team_allowed_models_narrow_and_a_key_cannot_widen(server: Server, mock: Mock) -> None:
    setup_provider(server, mock, "ta", "a", "b")
    mock.script("a", [], then={"usage": USAGE})
    mock.script("b", [], then={"usage": USAGE})
    user = unique("dev")
    _, free = new_key(server, user)  # no list of its own
    _, wide = new_key(server, user, allowedModels=["ta/b"])  # only b
    _, both = new_key(server, user, allowedModels=["ta/a", "ta/b"])
    assert ask(server.http, "ta/b", free).status_code == 200
    team = unique("infra")
    put_team(server, team, members=[user], allowedModels=["ta/a"])

    assert ask(server.http, "ta/a", free).status_code == 200
    r = ask(server.http, "ta/b", free)
    assert r.status_code == 403
    assert r.json() == {
        "error": {
            "type": "permission_error",
            "code": "model_not_allowed",
            "message": f"This key may not use model ta/b (team {team} does not allow it)",
        }
    }
    # The key's own list names b, the team does not: refused (a key cannot widen its team).
    r = ask(server.http, "ta/b", wide)
    assert r.status_code == 403
    assert r.json()["error"]["message"] == (
        f"This key may not use model ta/b (team {team} does not allow it)"
    )
    # The team allows a, the key does not: refused by the key's list.
    r = ask(server.http, "ta/a", wide)
    assert r.status_code == 403
    assert r.json()["error"]["message"] == "This key may not use model ta/a"
    assert ask(server.http, "ta/a", both).status_code == 200
    # /v1/models lists what both allow.
    listed = server.http.get("/v1/models", headers=both).json()["data"]
    assert [m["id"] for m in listed] == ["ta/a"]
    assert server.http.get("/v1/models", headers=wide).json()["data"] == []
    hits = mock.hits("b")

    # A second team with its own list: both lists apply (an intersection).
    other = unique("sec")
    put_team(server, other, members=[user], allowedModels=["ta/b"])
    r = ask(server.http, "ta/a", free)
    assert r.status_code == 403
    assert r.json()["error"]["message"] == (
        f"This key may not use model ta/a (team {other} does not allow it)"
    )
    # Lifting the narrowing (and removing the other team) is served at once.
    put_team(server, team, allowedModels=[])
    assert server.api.delete("/api/teams", params={"name": other}).status_code == 200
    assert ask(server.http, "ta/b", free).status_code == 200
    assert ask(server.http, "ta/b", wide).status_code == 200
    assert mock.hits("b") == hits + 2


def test_a_cli_team_write_reaches_the_running_server(server: Server, mock: Mock) -> None:
    setup_provider(server, mock, "tc", "a", "b")
    mock.script("b", [], then={"usage": USAGE})
    user = unique("cli")
    _, headers = new_key(server, user)
    assert ask(server.http, "tc/b", headers).status_code == 200
    team = unique("ops")
    out = ocx(server, "team", "set", team, "--member", user, "--allowed-model", "tc/a")
    assert f"  members: {user}\n" in out
    # Another process wrote it: the server picks it up at its next poll (or the Redis notice).
    deadline = time.monotonic() + 5
    while ask(server.http, "tc/b", headers).status_code != 403:
        assert time.monotonic() < deadline, "the team written by the CLI was not picked up"
        time.sleep(0.05)
    ocx(server, "team", "remove", team)
    deadline = time.monotonic() + 5
    while ask(server.http, "tc/b", headers).status_code != 200:
        assert time.monotonic() < deadline, "the removed team was not picked up"
        time.sleep(0.05)


@needs_redis
def test_every_worker_serves_a_team_write_when_it_returns(
    tmp_path_factory: pytest.TempPathFactory, mock: Mock
) -> None:
    server, stop = start_server(
        tmp_path_factory.mktemp("ocx-team-workers"),
        workers=3,
        extra_env={"REDIS_URL": REDIS_URL or ""},
    )
    clients: list[Any] = []
    try:
        setup_provider(server, mock, "tw", "a", "b")
        mock.script("a", [], then={"usage": USAGE})
        mock.script("b", [], then={"usage": USAGE})
        user = unique("w")
        _, headers = new_key(server, user)
        clients = spread_clients(server, headers)
        for client in clients:
            deadline = time.monotonic() + 5
            while client.http.get("/v1/models").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.02)

        def status(client: Any, model: str) -> int:
            body = {"model": model, "input": "hi"}
            code: int = client.http.post("/v1/responses", json=body).status_code
            return code

        assert [status(c, "tw/b") for c in clients] == [200] * len(clients)
        team = unique("infra")
        put_team(server, team, members=[user], allowedModels=["tw/a"])
        # No waiting: the PUT returned once every listening worker applied it.
        assert [status(c, "tw/b") for c in clients] == [403] * len(clients)
        assert [status(c, "tw/a") for c in clients] == [200] * len(clients)
        put_team(server, team, members=[])
        assert [status(c, "tw/b") for c in clients] == [200] * len(clients)
    finally:
        for c in clients:
            c.close()
        stop()
