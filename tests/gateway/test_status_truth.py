"""Status says what the router does (issue 12 part 2, PRODUCT §8.6/§8.7), end to end.

Real `ocx serve` and `ocx mock-upstream` processes: `/api/status` never names a target the
router skips (a missing credential), a healthy target without quota data is "available",
`ocx status --json` works with and without a combo, and `ocx status` in another process reads
the shared Redis state the server wrote (or, without Redis, says it cannot see it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Mock, Server
from tests.gateway.test_quota_failover import FALLBACK_KEY, PRIMARY_KEY, ask, provider, served, sync

REDIS = bool(os.environ.get("REDIS_URL"))


def status(server: Server, combo_id: str) -> dict[str, Any]:
    r = server.api.get("/api/status", params={"combo": combo_id})
    assert r.status_code == 200, r.text
    combos: list[dict[str, Any]] = r.json()["combos"]
    assert len(combos) == 1
    return combos[0]


def ocx_status(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    """`ocx status …` as its own process, on the server's database and Redis."""
    return subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "status", *args],
        cwd=ROOT,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


class Setup:
    def __init__(self, server: Server, mock: Mock, **primary: Any) -> None:
        tag = uuid.uuid4().hex[:6]
        self.id = f"st{tag}"
        self.primary, self.fallback = f"pri-{tag}", f"fb-{tag}"
        self.pm, self.fm = f"sa-{tag}", f"sb-{tag}"
        self.headers = {"Authorization": f"Bearer {server.create_key()}"}
        url = mock.url + "/v1"
        server.put_provider(
            self.primary, provider(url, self.pm, **(primary or {"apiKey": PRIMARY_KEY}))
        )
        server.put_provider(self.fallback, provider(url, self.fm, apiKey=FALLBACK_KEY))
        targets = [
            {"provider": self.primary, "model": self.pm},
            {"provider": self.fallback, "model": self.fm},
        ]
        server.put_combo(self.id, {"targets": targets, "cooldownMs": 60_000})
        sync(server)

    @property
    def primary_target(self) -> str:
        return f"{self.primary}/{self.pm}"

    @property
    def fallback_target(self) -> str:
        return f"{self.fallback}/{self.fm}"


def test_missing_credential_is_never_would_serve(server: Server, mock: Mock) -> None:
    env = f"PROVIDER_TEST_UNSET_{uuid.uuid4().hex[:8].upper()}"
    assert env not in server.env
    c = Setup(server, mock, apiKeyEnv=env)

    combo = status(server, c.id)
    assert combo["wouldServe"] == {"default": c.fallback_target}
    first, second = combo["targets"]
    assert (first["target"], first["state"], first["label"]) == (
        c.primary_target,
        "no_credential",
        "No credential",
    )
    assert first["skip"] == f"credential_missing: environment variable {env} is not set"
    assert env in first["detail"]
    assert (second["state"], second["label"], second["detail"]) == (
        "available",
        "Available",
        "no quota data yet",
    )

    # The router agrees: the request goes to the fallback, the primary is never called.
    r = ask(server, c)  # type: ignore[arg-type]
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "1"
    assert mock.hits(c.pm) == 0
    assert status(server, c.id)["wouldServe"] == {"default": c.fallback_target}

    # "Needs attention" names the same target for the same reason.
    notes = server.api.get("/api/catalog/attention").json()["notes"]
    why = f"environment variable {env} is not set"
    assert f"combo/{c.id}: {c.primary_target} has no credential ({why})" in notes


def test_ocx_status_json_with_and_without_a_combo(server: Server, mock: Mock) -> None:
    c = Setup(server, mock)
    every = ocx_status(server, "--json")
    assert every.returncode == 0, every.stderr
    report = json.loads(every.stdout)
    if REDIS:
        assert (report["liveState"], report["source"]) == ("redis", "redis")
    else:
        # Without Redis the answer is the running server's own (issue 28 item 7).
        own = server.api.get("/api/status").json()["liveState"]
        assert (report["liveState"], report["source"]) == (own, f"server at {server.url}")
    assert c.id in [x["id"] for x in report["combos"]]
    one = ocx_status(server, c.id, "--json")
    assert one.returncode == 0, one.stderr
    report = json.loads(one.stdout)
    assert [x["id"] for x in report["combos"]] == [c.id]
    assert report["combos"][0]["wouldServe"] == {"default": c.primary_target}
    assert [t["state"] for t in report["combos"][0]["targets"]] == ["available", "available"]
    # The flag may come first, too.
    first = ocx_status(server, "--json", c.id)
    assert first.returncode == 0, first.stderr
    assert [x["id"] for x in json.loads(first.stdout)["combos"]] == [c.id]

    unknown = ocx_status(server, "no-such-combo", "--json")
    assert unknown.returncode != 0
    assert "unknown combo no-such-combo" in unknown.stderr
    assert unknown.stdout == ""


def _cool_primary(server: Server, mock: Mock, c: Setup) -> None:
    mock.script(c.pm, [{"status": 503}])
    r = ask(server, c)  # type: ignore[arg-type]
    assert served(r) == c.fallback_target
    assert r.headers["x-ocx-attempts"] == "2"


@pytest.mark.skipif(not REDIS, reason="REDIS_URL is not set: the CLI reads the shared store")
def test_ocx_status_sees_the_cooldown_the_server_set(server: Server, mock: Mock) -> None:
    c = Setup(server, mock)
    _cool_primary(server, mock, c)
    served_view = status(server, c.id)
    assert served_view["targets"][0]["state"] == "cooling"

    out = ocx_status(server, c.id, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["liveState"] == "redis"
    combo = report["combos"][0]
    assert combo["wouldServe"] == {"default": c.fallback_target}
    cooling = combo["targets"][0]
    assert (cooling["state"], cooling["until"]) == ("cooling", served_view["targets"][0]["until"])
    shown = cooling["until"][:19].replace("T", " ")  # the label's whole seconds, in UTC
    assert cooling["label"] == f"Cooling until {shown} UTC"
    # The router really skips it: the next request goes straight to the fallback.
    r = ask(server, c)  # type: ignore[arg-type]
    assert served(r) == c.fallback_target and r.headers["x-ocx-attempts"] == "1"
    assert mock.hits(c.pm) == 1

    # The reason comes from the request log (written off the hot path).
    deadline = time.monotonic() + 6
    while status(server, c.id)["targets"][0]["reason"] is None:
        assert time.monotonic() < deadline, "the cooldown's reason never showed"
        time.sleep(0.1)
    text = ocx_status(server, c.id)
    assert text.returncode == 0, text.stderr
    assert f"next request → {c.fallback_target}" in text.stdout
    assert f"{c.primary_target}: Cooling until " in text.stdout
    assert "cannot see" not in text.stdout


@pytest.mark.skipif(REDIS, reason="the in-process state only exists without REDIS_URL")
def test_without_redis_the_cli_asks_the_running_server(server: Server, mock: Mock) -> None:
    c = Setup(server, mock)
    _cool_primary(server, mock, c)
    combo = status(server, c.id)
    assert combo["targets"][0]["state"] == "cooling"

    # Another process asks the server (server.json in the data directory) and says so.
    out = ocx_status(server, c.id)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"Live state from the server at {server.url}.\n")
    assert f"next request → {c.fallback_target}" in out.stdout
    assert f"{c.primary_target}: Cooling until " in out.stdout
    assert "Configured view" not in out.stdout
    report = json.loads(ocx_status(server, c.id, "--json").stdout)
    assert report["combos"][0]["wouldServe"] == {"default": c.fallback_target}

    # The token in server.json is good for GET /api/status only.
    found = json.loads((Path(server.env["OCX_DATA_DIR"]) / "server.json").read_text())
    assert found["url"] == server.url
    bearer = {"Authorization": f"Bearer {found['statusToken']}"}
    assert server.http.get("/api/status", headers=bearer).status_code == 200
    assert server.http.get("/api/keys", headers=bearer).status_code == 401
    assert server.http.get("/api/quota", headers=bearer).status_code == 401
    assert server.http.put("/api/status", headers=bearer).status_code in (401, 405)


@pytest.mark.skipif(REDIS, reason="the in-process state only exists without REDIS_URL")
def test_without_a_server_a_key_variable_is_unknown_from_here(server: Server, mock: Mock) -> None:
    env = f"PROVIDER_TEST_SERVER_ONLY_{uuid.uuid4().hex[:8].upper()}"
    c = Setup(server, mock, apiKeyEnv=env)
    # Nobody listens on port 9: the command falls back to its own configured view, and does
    # not call the server's key missing because its own environment lacks the variable.
    out = ocx_status(server, c.id, "--url", "http://127.0.0.1:9")
    assert out.returncode == 0, out.stderr
    assert "the server at http://127.0.0.1:9 did not answer (ConnectError)" in out.stdout
    assert "Configured view:" in out.stdout
    assert f"configured first choice → {c.primary_target}" in out.stdout
    assert "No credential" not in out.stdout
    assert (
        f"credential unknown from here: {env} is read from the server's environment" in out.stdout
    )
    report = json.loads(ocx_status(server, c.id, "--json", "--url", "http://127.0.0.1:9").stdout)
    assert report["source"] == "this command's configured view"
    assert report["combos"][0]["targets"][0]["state"] == "available"


def test_ocx_status_with_redis_unreachable_says_so(tmp_path: Any) -> None:
    env = {**os.environ, "OCX_DATA_DIR": str(tmp_path), "REDIS_URL": "redis://127.0.0.1:1/0"}
    env.pop("DATABASE_URL", None)
    run = [sys.executable, "-m", "ocxsite.cli"]
    for args in (
        [
            "provider",
            "set",
            "lo",
            "--adapter",
            "openai-chat",
            "--base-url",
            "http://127.0.0.1:9/v1",
        ],
        ["combo", "set", "main", "--targets", "lo/m1"],
    ):
        done = subprocess.run(run + args, cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    out = subprocess.run(
        run + ["status", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["liveState"] == "redis unreachable"
    assert "unreachable" in report["note"]
    assert report["combos"][0]["wouldServe"] == {"default": "lo/m1"}
