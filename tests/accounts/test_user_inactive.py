"""A deactivated user's key says so (issue 28 item 3): 401 `user_inactive`, not "invalid key",
through a real server, after `ocx user deactivate` in another process; `activate` undoes it."""

from __future__ import annotations

import time

import httpx

from tests.conftest import Server
from tests.ocxsite.test_security import ocx


def _models(server: Server, key: str) -> httpx.Response:
    return server.http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})


def _until(server: Server, key: str, status: int) -> httpx.Response:
    # Without Redis a CLI write reaches the server at its next poll (OCX_CONFIG_POLL_MS=100).
    deadline = time.monotonic() + 5
    while (r := _models(server, key)).status_code != status:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    return r


def test_a_deactivated_users_key_gets_user_inactive(server: Server) -> None:
    key = server.create_key(user="inactive-dan")
    assert _models(server, key).status_code == 200
    ocx(server, "user", "deactivate", "inactive-dan")
    r = _until(server, key, 401)
    assert r.json() == {
        "error": {
            "type": "invalid_request_error",
            "code": "user_inactive",
            "message": "The user of this ocx key (inactive-dan) is deactivated: ask an ocx "
            "administrator to reactivate it (ocx user activate)",
        }
    }
    # A wrong key still reads as a wrong key.
    wrong = _models(server, "ocx_" + "x" * 43)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    ocx(server, "user", "activate", "inactive-dan")
    _until(server, key, 200)
    # Removed for good: the key is revoked, so it is just an unknown key now.
    ocx(server, "user", "remove", "inactive-dan", "--yes")
    r = _until(server, key, 401)
    assert r.json()["error"]["code"] == "invalid_api_key"
