"""Expired and rotated client keys through a real `ocx serve` and the mock upstream (issue 27):
an expired key gets 401 key_expired saying when, and reaches no upstream (the mock's counter);
a rotation with grace keeps both secrets working, one without grace stops the old at once.
The grace boundary itself (t + grace - 1 s) is tested at an injected time in
tests/accounts/test_key_expiry.py."""

from __future__ import annotations

import time
import uuid

import httpx

from tests.conftest import Mock, Server
from tests.gateway.test_proxy_failover import provider, sync


def ask(server: Server, combo_id: str, key: str) -> httpx.Response:
    body = {"model": f"combo/{combo_id}", "input": "hi"}
    return server.http.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"})


def until(server: Server, combo_id: str, key: str, status: int) -> httpx.Response:
    # A key write reaches the worker at once with Redis, else at its next poll (100 ms here).
    deadline = time.monotonic() + 5
    while (r := ask(server, combo_id, key)).status_code != status:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    return r


def setup(server: Server, mock: Mock) -> tuple[str, str]:
    model = "kx-" + uuid.uuid4().hex[:6]
    server.put_provider("kx", provider(mock.url + "/v1", model))
    combo_id = "k" + uuid.uuid4().hex[:8]
    server.put_combo(combo_id, {"targets": [{"provider": "kx", "model": model}]})
    sync(server)
    return combo_id, model


def test_an_expired_key_gets_key_expired_and_reaches_no_upstream(
    server: Server, mock: Mock
) -> None:
    combo_id, model = setup(server, mock)
    key = server.create_key(user="exp-ann", expiresIn="1h")
    assert ask(server, combo_id, key).status_code == 200
    assert mock.hits(model) == 1
    listed = server.api.get("/api/keys", params={"user": "exp-ann"}).json()["keys"][0]
    r = server.api.patch(f"/api/keys/{listed['id']}", json={"expiresAt": "2020-01-01T00:00Z"})
    assert r.status_code == 200 and r.json()["expiresAt"] == "2020-01-01T00:00:00Z"
    r = until(server, combo_id, key, 401)
    assert r.json() == {
        "error": {
            "type": "invalid_request_error",
            "code": "key_expired",
            "message": f"This ocx key ({listed['prefix']}…) expired at 2020-01-01T00:00:00Z: "
            "ask an ocx administrator for a new key or a later expiry "
            "(ocx key set ID --expires 30d)",
        }
    }
    models = server.http.get("/v1/models", headers={"x-ocx-key": key})
    assert models.status_code == 401 and models.json()["error"]["code"] == "key_expired"
    assert mock.hits(model) == 1  # neither request reached the upstream
    # The request log names whose key it was (written in batches: wait for the row).
    deadline = time.monotonic() + 5
    while not (
        rows := [
            r
            for r in server.api.get("/api/requests", params={"user": "exp-ann"}).json()["requests"]
            if r["status"] == 401
        ]
    ):
        assert time.monotonic() < deadline, "the refused request was not logged"
        time.sleep(0.1)
    assert rows[0]["outcome"] == "key_expired" and rows[0]["keyPrefix"] == listed["prefix"]
    # Clearing the expiry brings the key back.
    server.api.patch(f"/api/keys/{listed['id']}", json={"expiresAt": None})
    until(server, combo_id, key, 200)
    assert mock.hits(model) == 2


def test_rotation_with_and_without_grace(server: Server, mock: Mock) -> None:
    combo_id, model = setup(server, mock)
    first = server.create_key(user="rot-bo", budgets=[{"tokens": 1000000, "period": "day"}])
    key_id = server.api.get("/api/keys", params={"user": "rot-bo"}).json()["keys"][0]["id"]
    r = server.api.post(f"/api/keys/{key_id}/rotate", json={"graceSeconds": 3600})
    assert r.status_code == 200, r.text
    second = r.json()["key"]
    assert r.json()["id"] == key_id and r.json()["budgets"] == [
        {"tokens": 1000000, "period": "day"}
    ]
    until(server, combo_id, second, 200)
    assert ask(server, combo_id, first).status_code == 200  # still inside its hour of grace
    hits = mock.hits(model)
    r = server.api.post(f"/api/keys/{key_id}/rotate")  # no body: no grace
    third = r.json()["key"]
    r = until(server, combo_id, second, 401)
    assert r.json()["error"]["code"] == "key_expired"
    assert r.json()["error"]["message"].startswith(
        "This ocx key was rotated: its previous secret stopped working at "
    )
    # The first secret is no longer anyone's previous secret: just an unknown key.
    assert ask(server, combo_id, first).json()["error"]["code"] == "invalid_api_key"
    assert mock.hits(model) == hits
    assert until(server, combo_id, third, 200).status_code == 200
    assert mock.hits(model) == hits + 1
