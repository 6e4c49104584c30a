"""A stored provider whose `apiKeyEnv` the policy refuses is not used (issue #26, point 4).

The provider is stored while its variable is allowed; the server is then restarted with
`OCX_PROVIDER_ENV_DENY` naming it. The variable is never read nor sent: the target is treated
like a missing credential (503 without the variable's name), and `ocx doctor` fails it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, Mock, _stop, start_server

SECRET = "provider-secret-value-9f8e7d6c5b4a"


def test_stored_refused_provider_is_not_used(tmp_path: Path, mock: Mock) -> None:
    env = {"EXAMPLE_PROVIDER_KEY": SECRET}
    first, stop_first = start_server(tmp_path, extra_env=env)
    database_url = first.env.get("DATABASE_URL")
    try:
        first.put_provider(
            "envp",
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKeyEnv": "EXAMPLE_PROVIDER_KEY",
                "models": {"em": {"contextWindow": 1000}},
            },
        )
        key = first.create_key()
        body = {"model": "envp/em", "input": "hi"}
        r = first.http.post("/v1/responses", json=body, headers={"x-ocx-key": key})
        assert r.status_code == 200, r.text
        assert mock.log("em")[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    finally:
        _stop(first.proc)  # the same data (SQLite file or PostgreSQL database) serves again
    mock.reset()

    denied = {**env, "OCX_PROVIDER_ENV_DENY": "EXAMPLE_PROVIDER_KEY"}
    second, stop_second = start_server(tmp_path, extra_env=denied, database_url=database_url)
    try:
        r = second.http.post("/v1/responses", json=body, headers={"x-ocx-key": key})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "provider_unavailable"
        assert "EXAMPLE_PROVIDER_KEY" not in r.text and SECRET not in r.text
        assert mock.log() == []

        out = subprocess.run(
            [sys.executable, "-m", "ocxsite.cli", "doctor", "--json"],
            cwd=ROOT,
            env=second.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
        assert checks["provider envp"]["verdict"] == "fail"
        assert "refused and not used" in checks["provider envp"]["detail"]
        assert SECRET not in out.stdout + out.stderr
    finally:
        stop_second()
        stop_first()
