"""Caller-credential failures stay with the caller (issue #26, point 2), end to end.

A `chatgpt` (caller-forward) provider authenticates with the caller's own token. When the
upstream refuses that token (401/403/`invalid_api_key`), the failure is the caller's: nothing
shared is cooled or marked, the caller gets the upstream's error (sanitized), and the next
caller with a valid token is served. Decision: the request hops on to targets that use a stored
key (they may serve this caller), but never to another caller-forward target (the same token
would be refused there too).
"""

from __future__ import annotations

import uuid
from typing import Any

from tests.conftest import Mock, Server
from tests.gateway.test_quota_failover import (
    FALLBACK_KEY,
    Combo,
    account,
    ask,
    chatgpt_combo,
    quota,
    served,
    status,
    sync,
)

GARBAGE = "garbage-caller-token-Qx7pL2mN9vR4"


def refused(token: str) -> dict[str, Any]:
    return {
        "status": 401,
        "body": {
            "error": {
                "message": f"Incorrect API key provided: {token}. You can find your API key at …",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
                "param": None,
            }
        },
    }


def chatgpt_only(server: Server, mock: Mock) -> tuple[Combo, str]:
    """A combo whose only target is a `chatgpt` provider."""
    tag = uuid.uuid4().hex[:6]
    key = server.create_key()
    c = Combo(id=f"q{tag}", primary=f"cg-{tag}", fallback="", pm=f"qa-{tag}", fm="", headers={})
    server.put_provider(
        c.primary,
        {
            "adapter": "chatgpt",
            "baseUrl": mock.url + "/v1",
            "models": {c.pm: {"contextWindow": 100000}},
        },
    )
    server.put_combo(
        c.id, {"targets": [{"provider": c.primary, "model": c.pm}], "strategy": "failover"}
    )
    sync(server)
    return c, key


def bad(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {GARBAGE}", "x-ocx-key": key}


def test_refused_caller_token_cools_nothing_for_the_team(server: Server, mock: Mock) -> None:
    c, key = chatgpt_only(server, mock)
    before = status(server, c)["combos"][0]["targets"]
    mock.script(c.pm, [refused(GARBAGE)])

    r = ask(server, c, headers=bad(key))
    # The caller gets the upstream's own status and message, its token masked.
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert error["message"].startswith(
        f"Provider error 401 from {c.primary_target}: Incorrect API key provided: "
    ), error["message"]
    assert GARBAGE not in r.text
    assert "provided: …9vR4." in error["message"]  # `…last4` of the token
    assert mock.hits(c.pm) == 1  # not retried on the same target

    # Nothing in the shared routing state: no cooldown, same states as before.
    after = status(server, c)["combos"][0]["targets"]
    assert [t["state"] for t in after] == [t["state"] for t in before]
    assert all(t.get("until") is None for t in after)

    # The next caller, with a valid token, is served at once (was 503 combo_unavailable).
    good = account("good", key)
    r = ask(server, c, headers=good)
    assert served(r) == c.primary_target
    assert [e["headers"]["authorization"] for e in mock.log(c.pm)] == [
        f"Bearer {GARBAGE}",
        good["Authorization"],
    ]


def test_refused_caller_token_403_and_stream(server: Server, mock: Mock) -> None:
    c, key = chatgpt_only(server, mock)
    mock.script(
        c.pm,
        [{"status": 403, "body": {"error": {"message": "forbidden", "type": "x", "code": None}}}],
    )
    r = ask(server, c, headers=bad(key), stream=True)
    assert r.status_code == 403, r.text
    r = ask(server, c, headers=account("good", key), stream=True)
    assert served(r) == c.primary_target


def test_refused_caller_token_hops_to_a_stored_key_target(server: Server, mock: Mock) -> None:
    c, key = chatgpt_combo(server, mock)
    mock.script(c.pm, [refused(GARBAGE)])
    r = ask(server, c, headers=bad(key))
    # A provider with its own key may serve this caller: the request hops there.
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "2"
    # The caller's token never reaches the fallback.
    (fb,) = mock.log(c.fm)
    assert fb["headers"]["authorization"] == f"Bearer {FALLBACK_KEY}"
    # The primary is neither cooled nor left: a valid caller is served by it.
    targets = status(server, c)["combos"][0]["targets"]
    assert all(t.get("until") is None for t in targets)
    r = ask(server, c, headers=account("good", key))
    assert served(r) == c.primary_target
    assert r.headers["x-ocx-attempts"] == "1"


def test_second_chatgpt_target_is_not_tried_with_a_refused_token(
    server: Server, mock: Mock
) -> None:
    tag = uuid.uuid4().hex[:6]
    key = server.create_key()
    names = [f"cg1-{tag}", f"cg2-{tag}"]
    models = [f"m1-{tag}", f"m2-{tag}"]
    for name, model in zip(names, models, strict=True):
        server.put_provider(
            name,
            {
                "adapter": "chatgpt",
                "baseUrl": mock.url + "/v1",
                "models": {model: {"contextWindow": 100000}},
            },
        )
    combo = f"q{tag}"
    server.put_combo(
        combo,
        {
            "targets": [{"provider": n, "model": m} for n, m in zip(names, models, strict=True)],
            "strategy": "failover",
        },
    )
    sync(server)
    mock.script(models[0], [refused(GARBAGE)])
    r = server.http.post(
        "/v1/responses", json={"model": f"combo/{combo}", "input": "hi"}, headers=bad(key)
    )
    assert r.status_code == 401, r.text
    assert mock.hits(models[1]) == 0


def test_quota_windows_of_one_account_stay_that_accounts(server: Server, mock: Mock) -> None:
    c, key = chatgpt_combo(server, mock)
    a, b = account("a", key), account("b", key)
    mock.script(
        c.pm,
        [
            {"rate_limits": {"primary": {"used_percent": 100, "window_minutes": 300}}},
            {"rate_limits": {"primary": {"used_percent": 10, "window_minutes": 300}}},
        ],
    )
    served(ask(server, c, headers=a))
    served(ask(server, c, headers=b))
    mine = [x for x in quota(server)["credentials"] if x["provider"] == c.primary]
    percents = sorted(w["usedPercent"] for x in mine for w in x["windows"])
    assert percents == [10, 100]
    assert len(mine) == 2
