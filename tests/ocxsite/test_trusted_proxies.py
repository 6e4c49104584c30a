"""`OCX_TRUSTED_PROXIES` against real workers (issue #43, point 4): by default no peer's
`X-Forwarded-For` is honoured, so a client that rotates the header cannot sidestep the
per-address login lockout, with Daphne and uvicorn alike."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import pytest

from tests.conftest import start_server
from tests.ocxsite.test_http_security import Browser


@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
def test_rotating_x_forwarded_for_does_not_sidestep_the_address_lockout(
    server_kind: str, tmp_path: Path
) -> None:
    if server_kind == "uvicorn" and importlib.util.find_spec("uvicorn") is None:
        pytest.skip("uvicorn is not installed")
    server, stop = start_server(
        tmp_path,
        server_args=["--server", server_kind],
        extra_env={"OCX_LOGIN_FAILURE_LIMIT": "3"},
    )
    try:
        for i in range(3):
            # Another made-up address and user name each time: only the peer is the same.
            r = Browser(server, f"10.77.0.{i + 1}").login(f"nobody-{uuid.uuid4().hex[:6]}", "x")
        assert r.status_code == 429, r.text[:300]
        r = Browser(server, "10.77.9.9").login(f"nobody-{uuid.uuid4().hex[:6]}", "x")
        assert r.status_code == 429
        assert "Too many failed logins" in r.text
    finally:
        stop()
