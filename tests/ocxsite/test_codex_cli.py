"""The real Codex CLI (`@openai/codex`, pinned in `.ci/run`) against `ocx serve` + the mock.

Issue #14 item 7: `codex debug models` parses the catalog from `ocx catalog write`; `codex exec`
runs a plain turn, a turn whose first target is rate-limited, and a full agent turn with a
tool call through `openai-responses`, `openai-chat` and `anthropic` targets. Codex runs with an
isolated CODEX_HOME and a dead proxy for everything but loopback, so it cannot reach the
internet. The binary comes from OCX_CODEX_BIN or the project-local npm prefix `.codex-cli/`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Mock, Server

# Runs the real Codex CLI against `ocx serve` (tests/conftest.py: slow).
pytestmark = pytest.mark.slow

CODEX_VERSION = "0.171.0"  # keep in step with .ci/run
TIMEOUT = 90  # seconds for one codex run (under pytest-timeout's 120 s per test)


def _codex_bin() -> str | None:
    explicit = os.environ.get("OCX_CODEX_BIN")
    if explicit:
        return explicit
    local = ROOT / ".codex-cli" / "node_modules" / ".bin" / "codex"
    return str(local) if local.exists() else None


CODEX = _codex_bin()
if CODEX is None or (shutil.which("node") is None and not os.environ.get("OCX_CODEX_BIN")):
    reason = (
        "the Codex CLI is not installed here: `.ci/run` installs it with "
        f"`npm install --prefix .codex-cli @openai/codex@{CODEX_VERSION}`, "
        "or point OCX_CODEX_BIN at a codex binary"
    )
    if os.environ.get("OCX_CODEX_REQUIRED"):  # set by .ci/run: CI must never skip this
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)

KEYS = {
    "up-resp": "sk-test-codex-resp-aaaaaaaaaaaaaaaaaa",
    "up-chat": "sk-test-codex-chat-bbbbbbbbbbbbbbbbbb",
    "up-anth": "sk-test-codex-anth-cccccccccccccccccc",
}
ADAPTERS = {"up-resp": "openai-responses", "up-chat": "openai-chat", "up-anth": "anthropic"}
# One combo per upstream protocol, and one whose first target is rate-limited.
COMBOS = {
    "cx-responses": [("up-resp", "resp-m")],
    "cx-chat": [("up-chat", "chat-m")],
    "cx-anthropic": [("up-anth", "anth-m")],
    "cx-failover": [("up-resp", "first-m"), ("up-chat", "second-m")],
}


@dataclass
class Codex:
    server: Server
    home: Path
    catalog: Path
    env: dict[str, str]

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        assert CODEX is not None
        return subprocess.run(
            [CODEX, *args],
            env=self.env,
            cwd=cwd or self.home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    def exec(self, model: str, prompt: str, workdir: Path) -> subprocess.CompletedProcess[str]:
        return self.run(
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "danger-full-access",
            "-c",
            'approval_policy="never"',
            "-m",
            model,
            "-C",
            str(workdir),
            prompt,
            cwd=workdir,
        )


def write_catalog(server: Server, home: Path) -> Path:
    """The model catalog `ocx catalog write` makes, in `home`."""
    catalog = home / "ocx-catalog.json"
    written = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", "catalog", "write", str(catalog)],
        cwd=ROOT,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert written.returncode == 0, written.stderr
    return catalog


def write_config(home: Path, catalog: Path, server: Server, *, retries: bool) -> None:
    """Codex's `config.toml` with ocx as its provider; `retries`: Codex's own defaults (else
    none at all)."""
    no_retries = "request_max_retries = 0\nstream_max_retries = 0\n"
    (home / "config.toml").write_text(
        f"""\
model = "combo/cx-responses"
model_provider = "ocx"
model_catalog_json = "{catalog}"
approval_policy = "never"
check_for_update_on_startup = false
# Nothing may leave the machine: ChatGPT-backend calls go to a dead loopback port.
chatgpt_base_url = "http://127.0.0.1:9/"

[analytics]
enabled = false

[model_providers.ocx]
name = "ocx"
base_url = "{server.url}/v1"
wire_api = "responses"
env_key = "OCX_API_KEY"
{"" if retries else no_retries}"""
    )


def isolated_env(home: Path, key: str) -> dict[str, str]:
    dead = "http://127.0.0.1:9"
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "OCX_API_KEY": key,
        "TERM": "dumb",
        "NO_COLOR": "1",
        # Any non-loopback request goes to a dead proxy (belt and braces on top of the config).
        "HTTP_PROXY": dead,
        "HTTPS_PROXY": dead,
        "ALL_PROXY": dead,
        "http_proxy": dead,
        "https_proxy": dead,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


@pytest.fixture(scope="module")
def codex(
    ocx_server: Server, mock_upstream: Mock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Codex]:
    server = ocx_server
    by_provider: dict[str, list[str]] = {}
    for targets in COMBOS.values():
        for provider, model in targets:
            by_provider.setdefault(provider, []).append(model)
    for provider, models in by_provider.items():
        server.put_provider(
            provider,
            {
                "adapter": ADAPTERS[provider],
                "baseUrl": mock_upstream.url + "/v1",
                "apiKey": KEYS[provider],
                "timeouts": {"firstByteMs": 5000, "idleMs": 5000},
                "models": {
                    m: {"contextWindow": 100000, "inputModalities": ["text"]} for m in models
                },
            },
        )
    for combo_id, targets in COMBOS.items():
        server.put_combo(combo_id, {"targets": [{"provider": p, "model": m} for p, m in targets]})
    key = server.create_key(user="codex-cli")
    server.wait_synced()

    home = tmp_path_factory.mktemp("codex-home")
    catalog = write_catalog(server, home)
    # ocx does the failover; Codex must not hide it by re-sending.
    write_config(home, catalog, server, retries=False)
    env = isolated_env(home, key)
    yield Codex(server, home, catalog, env)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def test_codex_version_is_the_pinned_one(codex: Codex) -> None:
    if os.environ.get("OCX_CODEX_BIN"):
        pytest.skip("OCX_CODEX_BIN points at another codex build")
    run = codex.run("--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"codex-cli {CODEX_VERSION}"


def test_debug_models_parses_the_catalog(codex: Codex) -> None:
    run = codex.run("debug", "models")
    assert run.returncode == 0, run.stderr
    parsed = json.loads(run.stdout)
    slugs = [m["slug"] for m in parsed["models"]]
    written = [m["slug"] for m in json.loads(codex.catalog.read_text())["models"]]
    # Codex lists exactly the catalog ocx wrote (a static catalog replaces the built-in one).
    assert sorted(slugs) == sorted(written)
    assert {f"combo/{c}" for c in COMBOS} <= set(slugs)
    row = next(m for m in parsed["models"] if m["slug"] == "combo/cx-anthropic")
    assert row["context_window"] == 100000
    assert row["input_modalities"] == ["text"]


def test_debug_models_reports_a_broken_catalog(codex: Codex, tmp_path: Path) -> None:
    # The check above could fail: Codex does reject a catalog it cannot parse.
    broken = tmp_path / "broken.json"
    broken.write_text('{"models": []}')
    run = codex.run("debug", "models", "-c", f'model_catalog_json="{broken}"')
    assert run.returncode != 0
    assert "at least one model" in run.stderr


@pytest.mark.parametrize("combo", ["cx-responses", "cx-chat", "cx-anthropic"])
def test_plain_turn(codex: Codex, mock: Mock, workdir: Path, combo: str) -> None:
    (provider, model) = COMBOS[combo][0]
    text = f"plain answer {uuid.uuid4().hex[:8]} via {ADAPTERS[provider]}"
    mock.script(model, [{"text": text}])
    run = codex.exec(f"combo/{combo}", "Say something.", workdir)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == text
    log = mock.log(model)
    assert len(log) == 1
    entry = log[0]
    assert (
        entry["path"]
        == {
            "openai-responses": "/v1/responses",
            "openai-chat": "/v1/chat/completions",
            "anthropic": "/v1/messages",
        }[ADAPTERS[provider]]
    )
    # The provider's own credential reached the upstream, never the ocx key.
    sent = entry["headers"].get("authorization", "") + entry["headers"].get("x-api-key", "")
    assert KEYS[provider] in sent
    assert codex.env["OCX_API_KEY"] not in json.dumps(entry)
    assert "Say something." in json.dumps(entry["body"])


def test_turn_whose_first_target_is_rate_limited(codex: Codex, mock: Mock, workdir: Path) -> None:
    (_, first), (_, second) = COMBOS["cx-failover"]
    mock.script(first, [], then={"status": 429, "headers": {"Retry-After": "30"}})
    mock.script(second, [{"text": "served by the second target"}])
    run = codex.exec("combo/cx-failover", "Say something.", workdir)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "served by the second target"
    assert mock.hits(first) == 1  # one attempt, then the target cools down
    assert mock.hits(second) == 1
    assert mock.log(first)[0]["behaviour"] == {"status": 429, "headers": {"Retry-After": "30"}}


def _tool_output_in(entry: dict[str, Any], adapter: str) -> str:
    """The tool result a follow-up request carries, in the upstream's own wire shape."""
    body = entry["body"]
    if adapter == "openai-responses":
        outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
        assert [o["call_id"] for o in outputs] == ["call_mock_1"], outputs
        out = outputs[0]["output"]
        return out if isinstance(out, str) else json.dumps(out)
    if adapter == "openai-chat":
        tools = [m for m in body["messages"] if m.get("role") == "tool"]
        assert [m["tool_call_id"] for m in tools] == ["call_mock_1"], tools
        content = tools[0]["content"]
        return content if isinstance(content, str) else json.dumps(content)
    results = [
        block
        for message in body["messages"]
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert [b["tool_use_id"] for b in results] == ["toolu_mock_1"], results
    return json.dumps(results[0]["content"])


def _offered_tools(entry: dict[str, Any], adapter: str) -> list[str]:
    tools = entry["body"].get("tools", [])
    if adapter == "openai-chat":
        return [t["function"]["name"] for t in tools if "function" in t]
    return [t["name"] for t in tools if "name" in t]


@pytest.mark.parametrize("combo", ["cx-responses", "cx-chat", "cx-anthropic"])
def test_agent_turn_with_a_shell_tool_call(
    codex: Codex, mock: Mock, workdir: Path, combo: str
) -> None:
    provider, model = COMBOS[combo][0]
    adapter = ADAPTERS[provider]
    marker = f"ocx-tool-{uuid.uuid4().hex[:10]}"
    # Codex 0.171 offers its shell as `exec_command` (unified exec, `cmd` string argument).
    command = f"echo {marker} > marker.txt && echo {marker}-stdout"
    mock.script(
        model,
        [
            {"tool_call": {"name": "exec_command", "arguments": {"cmd": command}}, "deltas": 4},
            {"text": "the command ran"},
        ],
    )
    run = codex.exec(f"combo/{combo}", "Run the marker command.", workdir)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "the command ran"
    # The CLI really ran the command the mock asked for, in the turn's working directory.
    assert (workdir / "marker.txt").read_text().strip() == marker
    log = mock.log(model)
    assert len(log) == 2, [e["behaviour"] for e in log]
    assert "exec_command" in _offered_tools(log[0], adapter)
    # The second request carries the command's output back to the upstream.
    assert f"{marker}-stdout" in _tool_output_in(log[1], adapter)
