"""Quota-aware failover end to end: a real `ocx serve`, a real `ocx mock-upstream`.

PRODUCT §8 (windows, the available → limited → probing → available state machine with strict
all-window recovery, provider-scoped credentials, manual override, status and transitions,
nothing changes without quota data), §4.2 (`/api/status`, `/api/quota`, `PUT /api/combos`
override), §4.4 (`ocx combo mode`); codex-wire.md §4 (x-codex-* headers, usage_limit_reached).

Every test uses its own provider names, so quota state (kept per provider and credential for the
life of the server) never leaks from one test into the next. Resets are 1–4 s in the future.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import math
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, Mock, Server, sse_events

PRIMARY_KEY = "sk-test-quota-primary-aaaaaaaaaaaaaaaa"
FALLBACK_KEY = "sk-test-quota-fallback-bbbbbbbbbbbbbbb"
LIMITED = 'Primary provider usage limit reached; switched to "{fallback}".'
RESTORED = 'Primary provider quota is available again; switched back to "{primary}".'


@dataclass
class Combo:
    id: str
    primary: str  # provider names
    fallback: str
    pm: str  # models on the mock
    fm: str
    headers: dict[str, str]

    @property
    def primary_target(self) -> str:
        return f"{self.primary}/{self.pm}"

    @property
    def fallback_target(self) -> str:
        return f"{self.fallback}/{self.fm}"

    def targets(self) -> list[dict[str, str]]:
        return [
            {"provider": self.primary, "model": self.pm},
            {"provider": self.fallback, "model": self.fm},
        ]


def provider(base_url: str, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "adapter": "openai-responses",
        "baseUrl": base_url,
        "timeouts": {"firstByteMs": 3000, "idleMs": 3000},
        "models": {model: {"contextWindow": 100000}},
        **extra,
    }


def sync(server: Server) -> None:
    server.http.get("/v1/models")
    server.wait_synced()


def setup(
    server: Server,
    mock: Mock,
    *,
    primary: dict[str, Any] | None = None,
    fallback: dict[str, Any] | None = None,
) -> Combo:
    """A failover combo primary → fallback on the mock, with fresh provider and model names."""
    tag = uuid.uuid4().hex[:6]
    c = Combo(
        id=f"q{tag}",
        primary=f"pri-{tag}",
        fallback=f"fb-{tag}",
        pm=f"qa-{tag}",
        fm=f"qb-{tag}",
        headers={"Authorization": f"Bearer {server.create_key()}"},
    )
    url = mock.url + "/v1"
    server.put_provider(c.primary, provider(url, c.pm, **(primary or {"apiKey": PRIMARY_KEY})))
    server.put_provider(c.fallback, provider(url, c.fm, **(fallback or {"apiKey": FALLBACK_KEY})))
    server.put_combo(c.id, {"targets": c.targets(), "strategy": "failover"})
    sync(server)
    return c


def ask(
    server: Server,
    c: Combo,
    *,
    stream: bool = False,
    headers: dict[str, str] | None = None,
    client: httpx.Client | None = None,
) -> httpx.Response:
    body = {"model": f"combo/{c.id}", "input": "hi", "stream": stream}
    return (client or server.http).post("/v1/responses", json=body, headers=headers or c.headers)


def served(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.headers["x-ocx-target"]


def reset_in(seconds: int) -> int:
    """An absolute reset in Unix seconds (the wire's granularity), `seconds` to `seconds + 1`
    from now."""
    return math.ceil(time.time()) + seconds


def wait_past(epoch_s: int, margin: float = 0.25) -> None:
    time.sleep(max(0.0, epoch_s + margin - time.time()))


def usage_limit(resets_at: int, **extra: Any) -> dict[str, Any]:
    return {
        "usage_limit": {
            "resets_at": resets_at,
            "resets_in_seconds": max(1, resets_at - int(time.time())),
            **extra,
        }
    }


def iso(epoch_s: int) -> str:
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def status(server: Server, c: Combo) -> dict[str, Any]:
    r = server.api.get("/api/status", params={"combo": c.id})
    assert r.status_code == 200, r.text
    return r.json()


def quota(server: Server) -> dict[str, Any]:
    r = server.api.get("/api/quota")
    assert r.status_code == 200, r.text
    return r.json()


def poll(fn: Any, timeout: float = 6.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def transitions_of(server: Server, c: Combo) -> list[dict[str, Any]]:
    return [t for t in status(server, c)["recentTransitions"] if t["provider"] == c.primary]


# ---------------------------------------------------------------------------------------------
# (1) Below 100 % the primary stays active


def test_primary_stays_active_below_100_percent(server: Server, mock: Mock) -> None:
    c = setup(server, mock)
    mock.script(
        c.pm,
        [
            {"rate_limits": {"primary": {"used_percent": 85, "window_minutes": 300}}},
            {
                "rate_limits": {
                    "primary": {"used_percent": 99.5, "window_minutes": 300},
                    "secondary": {"used_percent": 60, "window_minutes": 10080},
                }
            },
        ],
        then={"rate_limits": {"primary": {"used_percent": 99, "window_minutes": 300}}},
    )
    for stream in (False, True, False, True):
        r = ask(server, c, stream=stream)
        assert served(r) == c.primary_target
        assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits(c.pm) == 4
    assert mock.hits(c.fm) == 0

    # The windows are recorded, the credential stays available.
    mine = [q for q in quota(server)["credentials"] if q["provider"] == c.primary]
    assert len(mine) == 1
    assert mine[0]["status"] == "available"
    assert mine[0]["exhausted"] == []
    assert {w["window"] for w in mine[0]["windows"]} == {"five_hour", "weekly"}
    combo = status(server, c)["combos"][0]
    assert list(combo["wouldServe"].values()) == [c.primary_target]
    assert combo["exhaustedWindows"] == []


# ---------------------------------------------------------------------------------------------
# (2) Exhausting either window moves the failing request and the next ones to the fallback


@pytest.mark.parametrize("stream", [False, True])
def test_usage_limit_429_moves_request_and_next_to_fallback(
    server: Server, mock: Mock, stream: bool
) -> None:
    c = setup(server, mock)
    mock.script(c.pm, [usage_limit(reset_in(60))])

    r = ask(server, c, stream=stream)
    assert served(r) == c.fallback_target  # the failing request itself, before commit
    assert r.headers["x-ocx-attempts"] == "2"
    if stream:
        events = [e for e, _ in sse_events(r.text)]
        assert events.count("response.completed") == 1
        assert "response.failed" not in events

    for _ in range(3):
        r = ask(server, c, stream=stream)
        assert served(r) == c.fallback_target
        assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits(c.pm) == 1  # zero further primary hits
    assert mock.hits(c.fm) == 4


@pytest.mark.parametrize(
    "rate_limits",
    [
        {"primary": {"used_percent": 100, "window_minutes": 300, "reset_after_seconds": 60}},
        {
            "primary": {"used_percent": 30, "window_minutes": 300},
            "secondary": {"used_percent": 100, "window_minutes": 10080, "reset_after_seconds": 60},
        },
    ],
    ids=["five_hour", "weekly"],
)
def test_success_at_100_percent_moves_next_request_to_fallback(
    server: Server, mock: Mock, rate_limits: dict[str, Any]
) -> None:
    c = setup(server, mock)
    mock.script(c.pm, [{"rate_limits": rate_limits}])

    r = ask(server, c)
    assert served(r) == c.primary_target  # a success: it was served, nothing to retry
    for stream in (False, True, False):
        r = ask(server, c, stream=stream)
        assert served(r) == c.fallback_target
        assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits(c.pm) == 1
    assert mock.hits(c.fm) == 3
    exhausted = status(server, c)["combos"][0]["exhaustedWindows"]
    expected = "five_hour" if "reset_after_seconds" in rate_limits["primary"] else "weekly"
    assert [w["window"] for w in exhausted] == [expected]


def test_window_below_100_percent_with_past_reset_is_not_evidence(
    server: Server, mock: Mock
) -> None:
    c = setup(server, mock)
    past = int(time.time()) - 10
    mock.script(
        c.pm,
        [
            {
                "rate_limits": {
                    "primary": {"used_percent": 100, "window_minutes": 300, "reset_at": past}
                }
            }
        ],
    )
    assert served(ask(server, c)) == c.primary_target
    assert served(ask(server, c)) == c.primary_target
    assert mock.hits(c.fm) == 0


# ---------------------------------------------------------------------------------------------
# (3) Strict all-window recovery, one probe at a time


def test_strict_recovery_waits_for_every_window_then_probes_once(
    server: Server, mock: Mock
) -> None:
    c = setup(server, mock)
    five_hour = reset_in(1)
    weekly = five_hour + 2
    weekly_headers = {
        "x-codex-secondary-used-percent": "100",
        "x-codex-secondary-window-minutes": "10080",
        "x-codex-secondary-reset-at": str(weekly),
    }
    mock.script(
        c.pm,
        [{**usage_limit(five_hour, window_minutes=300), "headers": weekly_headers}],
        then={"deltas": 6, "delta_ms": 120},
    )
    r = ask(server, c)
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "2"
    exhausted = status(server, c)["combos"][0]["exhaustedWindows"]
    assert sorted((w["window"], w["resetsAt"]) for w in exhausted) == [
        ("five_hour", iso(five_hour)),
        ("weekly", iso(weekly)),
    ]

    # The 5-hour window has reset, the weekly one has not: the primary is not restored.
    wait_past(five_hour)
    assert time.time() < weekly
    for _ in range(2):
        assert served(ask(server, c)) == c.fallback_target
    assert mock.hits(c.pm) == 1

    # After the last reset exactly one request probes the primary; the others stay away.
    wait_past(weekly)

    def one(i: int) -> str:
        if i:
            time.sleep(0.15)  # let the first request take the probe lease
        with httpx.Client(base_url=server.url, timeout=20) as client:
            return served(ask(server, c, stream=True, client=client))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        targets = list(pool.map(one, range(4)))
    assert sorted(targets) == sorted([c.primary_target] + [c.fallback_target] * 3), targets
    assert mock.hits(c.pm) == 2  # the usage limit and exactly one probe

    # The probe succeeded with no window at 100 %: the primary is used again.
    r = ask(server, c)
    assert served(r) == c.primary_target
    assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits(c.pm) == 3
    combo = status(server, c)["combos"][0]
    assert combo["exhaustedWindows"] == []
    assert list(combo["wouldServe"].values()) == [c.primary_target]


# ---------------------------------------------------------------------------------------------
# (4) A failed probe re-limits with the new reset


def test_failed_probe_relimits_with_new_reset(server: Server, mock: Mock) -> None:
    c = setup(server, mock)
    first = reset_in(1)
    mock.script(c.pm, [usage_limit(first)])
    assert served(ask(server, c)) == c.fallback_target
    wait_past(first)

    second = reset_in(2)
    mock.script(c.pm, [usage_limit(second)])  # the probe hits the limit again
    r = ask(server, c)
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "2"  # the probe, then the fallback
    assert mock.hits(c.pm) == 2

    mine = [q for q in quota(server)["credentials"] if q["provider"] == c.primary]
    assert mine[0]["status"] == "limited"
    assert [w["resetsAt"] for w in mine[0]["exhausted"]] == [iso(second)]
    assert mine[0]["nextChangeAt"] == iso(second)
    assert status(server, c)["combos"][0]["lastTransition"]["reason"] == "probe_still_limited"

    for _ in range(2):
        assert served(ask(server, c)) == c.fallback_target
    assert mock.hits(c.pm) == 2

    wait_past(second)
    assert served(ask(server, c)) == c.primary_target  # the second probe succeeds
    assert served(ask(server, c)) == c.primary_target
    assert mock.hits(c.pm) == 4


# ---------------------------------------------------------------------------------------------
# (5) Manual override


def test_override_pins_and_releases(server: Server, mock: Mock) -> None:
    c = setup(server, mock)
    r = server.api.put(
        "/api/combos",
        json={
            "id": c.id,
            "combo": {
                "targets": c.targets(),
                "strategy": "failover",
                "override": {"target": c.fallback_target},
            },
        },
    )
    assert r.status_code == 200, r.text
    sync(server)
    assert status(server, c)["combos"][0]["mode"] == f"pin {c.fallback_target}"
    for stream in (False, True, False):
        assert served(ask(server, c, stream=stream)) == c.fallback_target
    assert mock.hits(c.pm) == 0  # the primary is available, yet never used

    r = server.api.put(
        "/api/combos",
        json={"id": c.id, "combo": {"targets": c.targets(), "override": None}},
    )
    assert r.status_code == 200, r.text
    assert r.json()["combo"].get("override") is None
    sync(server)
    assert status(server, c)["combos"][0]["mode"] == "auto"
    assert served(ask(server, c)) == c.primary_target

    # The CLI pins and releases too (`ocx combo mode`), against the server's database.
    def cli(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "ocxsite.cli", "combo", "mode", c.id, *args],
            cwd=ROOT,
            env=server.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert c.fallback_target in cli("pin", c.fallback_target)
    sync(server)
    assert served(ask(server, c)) == c.fallback_target
    assert "automatic" in cli("auto")
    sync(server)
    assert served(ask(server, c)) == c.primary_target
    assert mock.hits(c.pm) == 2


def test_override_pins_even_to_a_limited_primary_while_tracking_continues(
    server: Server, mock: Mock
) -> None:
    c = setup(server, mock)
    mock.script(
        c.pm,
        [{"rate_limits": {"primary": {"used_percent": 100, "reset_after_seconds": 60}}}],
    )
    assert served(ask(server, c)) == c.primary_target
    assert served(ask(server, c)) == c.fallback_target  # automatic: limited

    server.put_combo(c.id, {"targets": c.targets(), "override": {"target": c.primary_target}})
    sync(server)
    assert served(ask(server, c)) == c.primary_target  # pinned: no automatic switching
    combo = status(server, c)["combos"][0]
    assert combo["mode"] == f"pin {c.primary_target}"
    assert list(combo["wouldServe"].values()) == [c.primary_target]
    mine = [q for q in quota(server)["credentials"] if q["provider"] == c.primary]
    assert mine[0]["status"] == "limited"  # the automatic tracking continued underneath
    server.put_combo(c.id, {"targets": c.targets(), "override": None})
    sync(server)
    # `auto` resumes from the current truth: still limited.
    assert served(ask(server, c)) == c.fallback_target


# ---------------------------------------------------------------------------------------------
# (6) ChatGPT accounts keep separate state


def chatgpt_combo(server: Server, mock: Mock) -> tuple[Combo, str]:
    """A `chatgpt` (caller-forward) primary and an API-key fallback; returns (combo, ocx key)."""
    tag = uuid.uuid4().hex[:6]
    key = server.create_key()  # before the sync below, so that the worker knows it
    c = Combo(
        id=f"q{tag}",
        primary=f"cg-{tag}",
        fallback=f"fb-{tag}",
        pm=f"qa-{tag}",
        fm=f"qb-{tag}",
        headers={},
    )
    server.put_provider(
        c.primary,
        {
            "adapter": "chatgpt",
            "baseUrl": mock.url + "/v1",
            "models": {c.pm: {"contextWindow": 100000}},
        },
    )
    server.put_provider(c.fallback, provider(mock.url + "/v1", c.fm, apiKey=FALLBACK_KEY))
    server.put_combo(c.id, {"targets": c.targets(), "strategy": "failover"})
    sync(server)
    return c, key


def account(name: str, key: str) -> dict[str, str]:
    """A caller with its own ChatGPT token and account id; the ocx key goes in x-ocx-key."""
    return {
        "Authorization": f"Bearer chatgpt-token-{name}-{key[-6:]}",
        "chatgpt-account-id": f"acct-{name}-{key[-6:]}",
        "x-ocx-key": key,
    }


def test_chatgpt_accounts_have_separate_quota_state(server: Server, mock: Mock) -> None:
    c, key = chatgpt_combo(server, mock)
    a, b = account("a", key), account("b", key)
    mock.script(
        c.pm,
        [
            {"rate_limits": {"primary": {"used_percent": 40, "window_minutes": 300}}},
            usage_limit(reset_in(60)),
        ],
    )
    assert served(ask(server, c, headers=b)) == c.primary_target
    r = ask(server, c, headers=a)
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "2"
    assert served(ask(server, c, headers=a)) == c.fallback_target
    assert mock.hits(c.pm) == 2

    primary_log = mock.log(c.pm)
    assert [e["headers"]["authorization"] for e in primary_log] == [
        b["Authorization"],
        a["Authorization"],
    ]
    assert [e["headers"]["chatgpt-account-id"] for e in primary_log] == [
        b["chatgpt-account-id"],
        a["chatgpt-account-id"],
    ]
    # The ChatGPT token never crosses to the fallback, and the ocx key reaches no upstream.
    for e in mock.log(c.fm):
        assert e["headers"]["authorization"] == f"Bearer {FALLBACK_KEY}"
        assert "chatgpt-account-id" not in e["headers"]
    for e in mock.log():
        assert key not in str(e["headers"])

    # One record per account: A limited, B available; no token anywhere in the answers.
    q = quota(server)
    mine = {x["status"] for x in q["credentials"] if x["provider"] == c.primary}
    assert mine == {"available", "limited"}
    assert len([x for x in q["credentials"] if x["provider"] == c.primary]) == 2
    report = status(server, c)
    assert len(report["combos"][0]["wouldServe"]) == 2
    for text in (str(q), str(report)):
        assert "chatgpt-token" not in text and "acct-" not in text


def test_chatgpt_account_limit_does_not_move_other_accounts(server: Server, mock: Mock) -> None:
    c, key = chatgpt_combo(server, mock)
    a, b = account("a", key), account("b", key)
    mock.script(c.pm, [usage_limit(reset_in(60))])

    r = ask(server, c, headers=a)
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "2"
    assert served(ask(server, c, headers=a)) == c.fallback_target
    assert served(ask(server, c, headers=b)) == c.primary_target  # B is still served
    assert served(ask(server, c, headers=a)) == c.fallback_target
    assert served(ask(server, c, headers=b, stream=True)) == c.primary_target
    assert [e["headers"]["chatgpt-account-id"] for e in mock.log(c.pm)] == [
        a["chatgpt-account-id"],
        b["chatgpt-account-id"],
        b["chatgpt-account-id"],
    ]
    # Status lists the accounts that reported quota data: A, limited, goes to the fallback.
    combo = status(server, c)["combos"][0]
    assert list(combo["wouldServe"].values()) == [c.fallback_target]


# ---------------------------------------------------------------------------------------------
# (7) Status, quota and transitions


def test_status_quota_and_transition_messages(server: Server, mock: Mock) -> None:
    c = setup(server, mock)
    resets = reset_in(1)
    mock.script(c.pm, [usage_limit(resets)])
    # The fallback reports informational OpenAI-style rate limits of its own key.
    openai_limits = {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms",
    }
    mock.script(c.fm, [], then={"headers": openai_limits})
    assert served(ask(server, c)) == c.fallback_target

    combo = status(server, c)["combos"][0]
    assert combo["mode"] == "auto"
    assert list(combo["wouldServe"].values()) == [c.fallback_target]
    # Out of quota ranks before the cooling the same usage-limit 429 set (PRODUCT §8.7).
    assert combo["targets"][0]["state"] == "out_of_quota"
    assert combo["targets"][0]["credential"]
    assert combo["targets"][0]["until"] == iso(resets)
    assert [(w["provider"], w["window"], w["resetsAt"]) for w in combo["exhaustedWindows"]] == [
        (c.primary, "five_hour", iso(resets))
    ]
    last = combo["lastTransition"]
    assert (last["from"], last["to"], last["reason"]) == (
        "available",
        "limited",
        "usage_limit_reached",
    )
    assert combo["nextChangeAt"] == iso(resets)

    limited = LIMITED.format(fallback=c.fallback)
    got = poll(lambda: [t for t in transitions_of(server, c) if t["message"] == limited])
    assert got, transitions_of(server, c)
    assert (got[0]["from"], got[0]["to"]) == ("available", "limited")
    assert PRIMARY_KEY not in str(status(server, c))

    q = quota(server)
    mine = [x for x in q["credentials"] if x["provider"] == c.primary]
    assert len(mine) == 1 and mine[0]["status"] == "limited"
    assert mine[0]["eligibility"] == "ineligible"
    assert any(w["window"] == "five_hour" and w["usedPercent"] == 100 for w in mine[0]["windows"])
    snaps = poll(lambda: [s for s in quota(server)["snapshots"] if s["provider"] == c.primary])
    assert snaps and snaps[0]["window"] == "five_hour" and snaps[0]["usedPercent"] == 100
    assert snaps[0]["credential"] == mine[0]["credential"]
    assert PRIMARY_KEY not in str(q)

    wait_past(resets)
    assert served(ask(server, c)) == c.primary_target  # the probe succeeds
    restored = RESTORED.format(primary=c.primary)
    got = poll(lambda: [t for t in transitions_of(server, c) if t["message"] == restored])
    assert got, transitions_of(server, c)
    assert got[0]["to"] == "available"
    combo = status(server, c)["combos"][0]
    assert combo["lastTransition"]["to"] == "available"
    assert list(combo["wouldServe"].values()) == [c.primary_target]
    assert combo["exhaustedWindows"] == []

    # `ocx status` shows the same, from the server's database.
    out = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "status", c.id, "--json"],
        cwd=ROOT,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert restored in [t["message"] for t in report["recentTransitions"]]
    assert report["combos"][0]["mode"] == "auto"


# ---------------------------------------------------------------------------------------------
# (8) A fallback without a credential fails closed, naming the variable


def test_missing_fallback_credential_answers_503_naming_the_variable(
    server: Server, mock: Mock
) -> None:
    env = f"PROVIDER_TEST_UNSET_{uuid.uuid4().hex[:8].upper()}"
    assert env not in server.env
    c = setup(server, mock, fallback={"apiKeyEnv": env})
    mock.script(c.pm, [usage_limit(reset_in(60))])

    first = ask(server, c)  # the primary's own usage-limit answer is all there is
    assert first.status_code == 429, first.text
    assert mock.hits(c.fm) == 0

    r = ask(server, c)
    # The primary is back in a minute: a usage limit until then (PRODUCT §9.10), not a sleep.
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("usage_limit_reached", "combo_unavailable")
    assert 58 <= error["resets_in_seconds"] <= 61
    assert f"{c.primary}/{c.pm}: Out of quota until " in error["message"]
    # The provider is named, with each target's state; never the server's variable (#26, #28).
    assert (
        f"{c.fallback}/{c.fm}: credential_missing: the credential of provider "
        in (error["message"])
    )
    assert env not in r.text
    assert PRIMARY_KEY not in r.text
    assert mock.hits(c.pm) == 1
    assert mock.hits(c.fm) == 0


# ---------------------------------------------------------------------------------------------
# (9) Nothing changes without quota data


def test_provider_without_quota_data_is_unchanged(server: Server, mock: Mock) -> None:
    c = setup(server, mock)
    mock.script(c.pm, [{"status": 429, "headers": {"Retry-After": "1"}}])
    r = ask(server, c)
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "2"
    time.sleep(1.1)
    assert served(ask(server, c)) == c.primary_target  # the cooldown, not quota, decided
    assert served(ask(server, c, stream=True)) == c.primary_target
    time.sleep(2.2)  # longer than the snapshot writer's flush interval

    q = quota(server)
    assert not [x for x in q["credentials"] if x["provider"] in (c.primary, c.fallback)]
    assert not [s for s in q["snapshots"] if s["provider"] in (c.primary, c.fallback)]
    combo = status(server, c)["combos"][0]
    assert combo["exhaustedWindows"] == [] and combo["lastTransition"] is None
    # Healthy with no quota data: available (not "unknown"), with that as the detail.
    assert [t["state"] for t in combo["targets"]] == ["available", "available"]
    assert [t["detail"] for t in combo["targets"]] == ["no quota data yet"] * 2
    assert not transitions_of(server, c)
