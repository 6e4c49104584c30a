"""The smaller hardening items of issue #26 (point 10): private data files, malformed bearers,
deeply nested JSON, `ocx token list|revoke`, and a 503 that does not name the server's
environment variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.test import Client

from accounts import access
from accounts.models import ManagementToken
from ocxsite.cli import main
from tests.conftest import ROOT, Mock, Server

DEEP = "[" * 100_000
DB_ON_SQLITE = not os.environ.get("DATABASE_URL", "").startswith("postgres")


# --- ocx token list|revoke ---------------------------------------------------------------------


@pytest.mark.django_db
def test_token_list_and_revoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "--user", "ops", "--name", "laptop"]) == 0
    out = capsys.readouterr().out.splitlines()
    secret = out[-1]
    token = ManagementToken.objects.get()
    assert out[0] == f"Created management token {token.pk} for ops."
    assert access.mgmt_user_for(secret) is not None

    assert main(["token", "list"]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith(f"{token.pk}  {token.prefix}…  ops  laptop  created ")
    assert listing.rstrip().endswith("active")
    assert secret not in listing

    assert main(["token", "revoke", str(token.pk)]) == 0
    assert capsys.readouterr().out == f"Revoked management token {token.pk}.\n"
    assert access.mgmt_user_for(secret) is None
    assert main(["token", "list"]) == 0
    assert " revoked " in capsys.readouterr().out

    # Revoking again, or an unknown id, fails and says so.
    assert main(["token", "revoke", str(token.pk)]) == 1
    assert capsys.readouterr().err == f"ocx: no active management token {token.pk}\n"
    assert main(["token", "revoke", "x"]) == 1
    assert capsys.readouterr().err == "ocx: usage: ocx token revoke ID\n"


# --- malformed bearer, nested JSON on /api -------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("token", ["ocxm_\u00e9\u00e9\u00e9", "\u00ff" * 40, "caf\u00e9 x"])
def test_non_ascii_bearer_on_api_is_401(token: str, settings: object) -> None:
    settings.OCX_ADMIN_TOKEN = "bootstrap-admin-token-0123456789"  # type: ignore[attr-defined]
    r = Client().get("/api/combos", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401
    assert r.json() == {"error": "unauthorized"}


@pytest.mark.django_db
def test_deeply_nested_json_on_api_is_400(settings: object) -> None:
    settings.OCX_ADMIN_TOKEN = "bootstrap-admin-token-0123456789"  # type: ignore[attr-defined]
    r = Client().post(
        "/api/keys",
        DEEP,
        content_type="application/json",
        headers={"Authorization": "Bearer bootstrap-admin-token-0123456789"},
    )
    assert r.status_code == 400
    # ninja's parser refuses it (RecursionError included) before any view runs.
    assert r.json() == {"error": "Cannot parse request body"}


# --- against a real server ----------------------------------------------------------------------


def test_deeply_nested_json_on_v1_is_400(server: Server, mock: Mock) -> None:
    server.put_provider(
        "deep",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": "sk-test-deep-aaaaaaaaaaaaaaaaaaaa",
            "models": {"dm": {"contextWindow": 100000}},
        },
    )
    server.put_combo("deepc", {"targets": [{"provider": "deep", "model": "dm"}]})
    server.wait_synced()
    key = server.create_key()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    # Deeper than the parser goes (100k), and shallow enough to parse but not to walk (900).
    nested = "[" * 900 + "]" * 900
    bodies = [
        ("/v1/responses", DEEP),
        ("/v1/responses", f'{{"model": "combo/deepc", "input": {nested}}}'),
        ("/v1/responses", f'{{"model": "combo/deepc", "input": "hi", "metadata": {nested}}}'),
        ("/v1/chat/completions", f'{{"model": "combo/deepc", "messages": {nested}}}'),
    ]
    for path, body in bodies:
        r = server.http.post(path, content=body, headers=headers)
        assert r.status_code == 400, (path, body[:60], r.text)
        assert r.json()["error"] == {
            "type": "invalid_request_error",
            "code": "invalid_json",
            "message": "Request body is nested too deeply",
        }
    assert mock.log() == []
    assert not any("Traceback" in line for line in server.output)


def test_503_names_the_provider_not_the_environment_variable(server: Server, mock: Mock) -> None:
    env = f"PROVIDER_TEST_UNSET_{uuid.uuid4().hex[:8].upper()}"
    server.put_provider(
        "envless",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKeyEnv": env,
            "models": {"m": {"contextWindow": 1000}},
        },
    )
    server.put_combo("nocred", {"targets": [{"provider": "envless", "model": "m"}]})
    server.wait_synced()
    key = server.create_key()
    r = server.http.post(
        "/v1/responses",
        json={"model": "combo/nocred", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 503
    assert r.json()["error"]["message"] == (
        "No available targets for combo: nocred: envless/m: credential_missing: "
        "the credential of provider envless is not configured"
    )
    assert env not in r.text
    assert mock.hits("m") == 0
    # Staff still see which variable is missing.
    status = server.api.get("/api/status", params={"combo": "nocred"})
    assert status.status_code == 200, status.text
    assert env in status.text


@pytest.mark.skipif(not DB_ON_SQLITE, reason="the SQLite database file")
def test_data_directory_and_database_are_private(tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "data"
    env = {**os.environ, "OCX_DATA_DIR": str(data), "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def ocx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ocxsite.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )

    # A write creates and migrates the database (a read-only command would refuse).
    assert ocx("user", "create", "ann", "--no-password").returncode == 0
    assert data.stat().st_mode & 0o777 == 0o700
    db = data / "ocx.sqlite3"
    assert db.stat().st_mode & 0o777 == 0o600
    assert (data / "secret.key").stat().st_mode & 0o777 == 0o600

    def permissions() -> dict[str, str]:
        report = json.loads(ocx("doctor", "--json").stdout)
        return next(c for c in report["checks"] if c["name"] == "permissions")

    assert permissions()["verdict"] == "ok"
    db.chmod(0o644)
    check = permissions()
    assert check["verdict"] == "warn"
    assert f"{db} (644)" in check["detail"]
