"""README "Running it for a team": every command of the section, run in order as a new user
would, against a fresh data directory (and a fresh PostgreSQL database + Redis in the
PostgreSQL pass), with the real `ocx serve`."""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, _server_database

# Runs the README's commands: `ocx serve` processes of its own (tests/conftest.py: slow).
pytestmark = pytest.mark.slow

PASSWORD = "team-admin-Passw0rd-1"


def section_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Running it for a team\n", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_with_prompts(cmd: str, env: dict[str, str], answers: list[str]) -> tuple[int, str]:
    """Run `cmd` on a pseudo-terminal and type one answer per password prompt."""
    master, slave = pty.openpty()

    def controlling_tty() -> None:
        os.setsid()
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        ["bash", "-c", cmd],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        preexec_fn=controlling_tty,
    )
    os.close(slave)
    seen = b""
    pending = list(answers)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 1024)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
            # Answer each prompt once, after it is shown (getpass flushes earlier input).
            prompts = seen.count(b"Password")
            if pending and prompts > len(answers) - len(pending) and seen.rstrip().endswith(b":"):
                os.write(master, pending.pop(0).encode() + b"\n")
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=30)
    os.close(master)
    return code, seen.decode(errors="replace")


def test_readme_team_section_runs(tmp_path: Path) -> None:
    commands = section_commands()
    assert commands[:3] == [
        "export OCX_DATA_DIR=/srv/ocx",
        "export OCX_ALLOWED_HOSTS=ocx.internal,localhost,127.0.0.1",
        "export OPENAI_API_KEY=sk-your-openai-key ANTHROPIC_API_KEY=sk-ant-your-anthropic-key",
    ]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ocx"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ocxsite.cli "$@"\n')
    shim.chmod(0o755)
    data = tmp_path / "srv-ocx"
    db_url, drop = _server_database(fresh=True)  # the README starts from nothing
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=str(ROOT))
    env["OCX_STATE_KEY_PREFIX"] = f"ocx-readme-{uuid.uuid4().hex[:8]}"
    if db_url:
        env["DATABASE_URL"] = db_url
        env["OCX_SECRET_KEY"] = "readme-team-secret-key-0123456789abcdef"
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]
    port = free_port()
    servers: list[subprocess.Popen[str]] = []
    keys: list[str] = []
    ran: list[str] = []

    def substitute(cmd: str) -> str:
        return cmd.replace("/srv/ocx", str(data)).replace("--port 8787", f"--port {port}")

    try:
        for original in commands:
            cmd = substitute(original)
            if cmd.startswith("export "):
                for item in shlex.split(cmd)[1:]:
                    name, _, value = item.partition("=")
                    env[name] = value
            elif cmd.startswith("DATABASE_URL="):
                # The PostgreSQL + Redis line: run with this test run's own services.
                if not (db_url and env.get("REDIS_URL")):
                    continue
                prefix = shlex.split(cmd)
                assert prefix[0].startswith("DATABASE_URL=postgres://")
                assert prefix[1].startswith("REDIS_URL=redis://")
                start_serve(" ".join(prefix[2:]), env, servers)
                check_server(port, keys)
            elif " serve " in f" {cmd} ":
                start_serve(cmd, env, servers)
                check_server(port, keys)
            elif cmd == "ocx user create alice --role admin":
                code, out = run_with_prompts(cmd, env, [PASSWORD, PASSWORD])
                assert code == 0, out
                assert "Password for alice:" in out and "Password (again):" in out
            else:
                done = subprocess.run(
                    ["bash", "-c", cmd], env=env, cwd=tmp_path, capture_output=True, text=True
                )
                assert done.returncode == 0, f"{original}\n{done.stdout}\n{done.stderr}"
                if cmd.startswith("ocx key create"):
                    keys.append(done.stdout.split()[-1])
                if cmd.startswith("ocx doctor"):
                    assert "fail" not in done.stdout.split(), done.stdout
                    assert done.stdout.startswith(f"data directory  {data}")
            ran.append(original)
    finally:
        for proc in servers:
            stop(proc)
        drop()
    assert "ocx doctor --host 0.0.0.0" in ran
    assert len(keys) == 2 and all(k.startswith("ocx_") for k in keys)
    if db_url and os.environ.get("REDIS_URL"):
        assert any(c.startswith("DATABASE_URL=") for c in ran)


def start_serve(cmd: str, env: dict[str, str], servers: list[subprocess.Popen[str]]) -> None:
    for proc in servers:
        stop(proc)
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {cmd}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    servers.append(proc)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "ocx listening on" in line:
            assert any(x.startswith("ocx database: ") for x in lines), lines
            return
    raise AssertionError("ocx serve did not start:\n" + "".join(lines))


def check_server(port: int, keys: list[str]) -> None:
    """The team server answers each person's key, for the allowed host name only."""
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "no /healthz"
        time.sleep(0.05)
    for key in keys:
        r = httpx.get(
            f"{base}/v1/models",
            headers={"Authorization": f"Bearer {key}", "Host": "ocx.internal"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        assert "combo/team" in [m["id"] for m in r.json()["data"]]
    r = httpx.get(f"{base}/admin/login/", headers={"Host": "evil.example"}, timeout=10)
    assert r.status_code == 400
    r = httpx.get(f"{base}/admin/login/", headers={"Host": "ocx.internal"}, timeout=10)
    assert r.status_code == 200


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
