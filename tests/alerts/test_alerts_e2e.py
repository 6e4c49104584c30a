"""Alerts end to end (issue 45): a real `ocx serve` and `ocx mock-upstream`, a Slack
destination that is a real HTTP receiver. The team lead's channel gets the 80 % budget message
(naming the key's user), the cooldown and recovery messages and the key-expiry warning without a
dashboard open; a refused stored key and a combo with no target left are told too; a restart
between an event and its delivery loses nothing."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.alerts.receiver import Receiver, serve
from tests.conftest import Mock, Server, _stop, start_server

USAGE = {"input_tokens": 60, "output_tokens": 40}  # 100 tokens per answer
API_KEY = "sk-test-alerts-aaaaaaaaaaaaaaaaaaaaaaaa"
EVENTS = [
    "budget",
    "target_cooled",
    "target_recovered",
    "combo_unavailable",
    "key_expiring",
    "provider_auth_failed",
]
ENV = {
    "OCX_ALERT_POLL_MS": "100",
    "OCX_ALERT_RETRY_MS": "200",
    "OCX_PUBLIC_URL": "https://ocx.example",
}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec, stop = serve()
    try:
        yield rec
    finally:
        stop()


def slack_texts(receiver: Receiver) -> list[str]:
    return [json.loads(r.body)["text"] for r in receiver.received]


def wait_text(receiver: Receiver, prefix: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while True:
        for text in slack_texts(receiver):
            if text.startswith(prefix):
                return text
        assert time.monotonic() < deadline, f"no {prefix!r} in {slack_texts(receiver)}"
        time.sleep(0.05)


def setup(server: Server, mock: Mock, receiver: Receiver) -> None:
    server.put_provider(
        "p",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": API_KEY,
            "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
            "models": {m: {"contextWindow": 100000} for m in ("hot", "cold", "locked")},
        },
    )
    server.put_combo(
        "team", {"targets": [{"provider": "p", "model": "hot"}, {"provider": "p", "model": "cold"}]}
    )
    server.put_combo("solo", {"targets": [{"provider": "p", "model": "locked"}]})
    r = server.api.put(
        "/api/alerts",
        json={
            "name": "leads",
            "alert": {"kind": "slack", "url": receiver.url + "/services/T/B/X", "events": EVENTS},
        },
    )
    assert r.status_code == 200, r.text
    server.wait_synced()


def new_key(server: Server, user: str, **extra: object) -> tuple[dict[str, object], dict[str, str]]:
    r = server.api.post("/api/keys", json={"user": user, **extra})
    assert r.status_code == 201, r.text
    created = r.json()
    headers = {"Authorization": f"Bearer {created['key']}"}
    deadline = time.monotonic() + 5
    while server.http.get("/v1/models", headers=headers).status_code == 401:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return created, headers


def ask(server: Server, model: str, headers: dict[str, str]) -> int:
    r = server.http.post("/v1/responses", json={"model": model, "input": "hi"}, headers=headers)
    return r.status_code


def test_a_slack_channel_hears_budget_cooldown_expiry_and_nothing_is_lost_on_restart(
    tmp_path: Path, mock: Mock, receiver: Receiver
) -> None:
    server, stop = start_server(tmp_path, extra_env=ENV)
    try:
        setup(server, mock, receiver)
        key, headers = new_key(server, "ann", budget={"tokens": 250, "period": "day"})
        mock.script(
            "hot", [{"status": 429, "headers": {"Retry-After": "1"}}], then={"usage": USAGE}
        )
        mock.script("cold", [], then={"usage": USAGE})

        assert (
            ask(server, "combo/team", headers) == 200
        )  # hot 429 → cooled; cold serves: 100 tokens
        cooled = wait_text(receiver, "[ocx] Target p/hot of combo team is cooling down for ")
        assert cooled.endswith(": rate_limited\nhttps://ocx.example/admin/combos/combo/?q=team"), (
            cooled
        )
        time.sleep(1.1)  # the upstream's Retry-After: 1 passes (the cooldown is real)
        assert ask(server, "combo/team", headers) == 200  # hot probed and served: 200 tokens (80 %)
        assert wait_text(receiver, "[ocx] Target p/hot of combo team served again") == (
            "[ocx] Target p/hot of combo team served again after its cooldown\n"
            "https://ocx.example/admin/combos/combo/?q=team"
        )
        budget = wait_text(receiver, "[ocx] Budget 80%: ")
        owner = f"key {key['prefix']}… of ann"  # a key's budget names its user
        assert budget.startswith(
            f"[ocx] Budget 80%: {owner} has used 80% of its budget of 250 tokens per day "
            "(200 of 250); it resets at "
        ), budget
        assert budget.endswith(
            f"\nhttps://ocx.example/admin/accounts/clientkey/{key['id']}/change/"
        )
        assert receiver.received[0].path == "/services/T/B/X"
        metrics = server.http.get("/metrics").text
        assert 'ocx_alert_deliveries_total{destination="leads",result="sent"} 3.0' in metrics

        # The receiver goes down; an event (100 %) happens and is not delivered yet.
        receiver.statuses = [503] * 10_000
        tried = receiver.attempts
        new_key(server, "bob", expiresIn="3d")  # expires in 3 days: the 7-day warning is due
        assert ask(server, "combo/team", headers) == 200  # 300 tokens: past 100 %
        deadline = time.monotonic() + 20
        while receiver.attempts < tried + 2:  # the 100 % message was written and tried twice
            assert time.monotonic() < deadline
            time.sleep(0.05)
        listed = server.api.get("/api/alerts").json()["alerts"][0]
        assert listed["pending"] >= 1
        metrics = server.http.get("/metrics").text
        assert 'ocx_alert_deliveries_total{destination="leads",result="retry"}' in metrics
        assert not any(t.startswith("[ocx] Budget 100%") for t in slack_texts(receiver))
        _stop(server.proc)  # a restart between the event and its delivery

        receiver.statuses = []
        server2, _ = start_server(
            tmp_path, extra_env=ENV, database_url=server.env.get("DATABASE_URL")
        )
        try:
            full = wait_text(receiver, "[ocx] Budget 100%: ")
            assert f"{owner} has used 100% of its budget of 250 tokens per day" in full
            expiring = wait_text(receiver, "[ocx] Client key ")
            assert " of bob expires in 2 day(s) 23 hour(s), at " in expiring, expiring
            assert "\nhttps://ocx.example/admin/accounts/clientkey/" in expiring
            assert sum(t.startswith("[ocx] Budget 100%") for t in slack_texts(receiver)) == 1
            # Every message is delivered: the outbox empties (the sender marks a message sent
            # just after the receiver has it).
            deadline = time.monotonic() + 20
            while True:
                after = server2.api.get("/api/alerts").json()["alerts"][0]
                if (after["pending"], after["failed"]) == (0, 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert (after["pending"], after["failed"]) == (0, 0)
        finally:
            _stop(server2.proc)
    finally:
        stop()


def test_a_refused_stored_key_and_a_combo_with_no_target_left(
    tmp_path: Path, mock: Mock, receiver: Receiver
) -> None:
    server, stop = start_server(tmp_path, extra_env=ENV)
    try:
        setup(server, mock, receiver)
        _, headers = new_key(server, "cy")
        mock.script("locked", [], then={"status": 401})

        assert ask(server, "combo/solo", headers) == 401  # the upstream refused the stored key
        refused = wait_text(receiver, "[ocx] Provider p refused its stored key")
        assert refused == (
            "[ocx] Provider p refused its stored key with HTTP 401 (combo solo, target p/locked)"
            "\nhttps://ocx.example/admin/providers/provider/?q=p"
        )
        assert ask(server, "combo/solo", headers) == 429  # long cooling: a usage limit
        unavailable = wait_text(receiver, "[ocx] Combo solo has no target left")
        # The wait is what was left of the 600 s cooldown when the event was noticed.
        assert re.fullmatch(
            r"\[ocx\] Combo solo has no target left \(p/locked: cooling\); earliest retry in "
            r"(59\d|600) s\nhttps://ocx\.example/admin/combos/combo/\?q=solo",
            unavailable,
        ), unavailable
    finally:
        stop()
