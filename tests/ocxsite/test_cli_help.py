"""`ocx <cmd> --help` shows the command's own usage and examples; a closed pipe is no traceback.

Issue #14 item 6 (CLI polish).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accounts.models import ClientKey
from ocxsite.cli import COMMANDS, main
from tests.conftest import ROOT

DJANGO_OPTIONS = ("--settings", "--pythonpath", "--traceback", "--no-color", "--verbosity")
# Commands whose help carries an examples epilog (issue #14 item 6).
WITH_EXAMPLES = {
    "catalog",
    "combo",
    "config",
    "doctor",
    "key",
    "provider",
    "serve",
    "status",
    "token",
    "usage",
    "user",
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_each_command_has_its_own_help(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ocx {command}"), out
    if command in WITH_EXAMPLES:
        assert "examples:" in out, out
        assert f"ocx {command}" in out.split("examples:", 1)[1]
    for option in DJANGO_OPTIONS:
        assert option not in out, (option, out)


def test_combo_help_names_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["combo", "--help"]) == 0
    out = capsys.readouterr().out
    for usage in ("ocx combo list", "ocx combo show ID", "ocx combo set ID --targets"):
        assert usage in out
    assert "ocx combo remove ID --yes" in out
    assert "ocx combo mode ID auto|pin PROVIDER/MODEL" in out


def test_help_after_a_subcommand_and_help_word(capsys: pytest.CaptureFixture[str]) -> None:
    # The commands' own sub-parsers have no --help: the command's help answers instead of
    # "unexpected argument --help" or a file named --help.
    assert main(["combo", "set", "x", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: ocx combo list")
    assert main(["config", "load", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: ocx config load FILE")
    assert main(["help", "catalog"]) == 0
    assert capsys.readouterr().out.startswith("usage: ocx catalog write PATH")
    assert main(["route", "combo", "-h"]) == 0
    assert capsys.readouterr().out.startswith("usage: ocx combo")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ocx <command>")
    assert "ocx <command> --help" in out


def test_serve_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--host HOST", "--port PORT", "--workers WORKERS", "--server", "--demo"):
        assert option in out
    assert "--mock-port" not in out  # internal


def test_subparser_help_of_a_command_with_real_subcommands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["user", "create", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ocx user create")
    assert "--staff" in out


@pytest.mark.django_db
def test_help_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["key", "create", "--user", "helpless", "--help"]) == 0
    assert "usage: ocx key create --user USER" in capsys.readouterr().out
    assert not ClientKey.objects.filter(user__username="helpless").exists()


# ---------------------------------------------------------------------------------------------
# A closed pipe: real `ocx` processes whose stdout reader is already gone.


def _cli_env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "OCX_DATA_DIR": str(tmp_path)}
    for name in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)  # its own SQLite file: never the test run's database
    return env


def _run_into_closed_pipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write the child makes gets EPIPE, deterministically
    try:
        return subprocess.run(
            [sys.executable, "-m", "ocxsite.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args", [["key", "list"], ["combo", "--help"], ["--help"], ["catalog", "show"]]
)
def test_closed_pipe_is_no_traceback(tmp_path: Path, args: list[str]) -> None:
    env = _cli_env(tmp_path)
    if args[0] in ("key", "catalog"):
        made = subprocess.run(
            [
                sys.executable,
                "-m",
                "ocxsite.cli",
                "key",
                "create",
                "--user",
                "piped",
                "--create-user",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
    run = _run_into_closed_pipe(args, env)
    assert "Traceback" not in run.stderr, run.stderr
    assert "BrokenPipeError" not in run.stderr, run.stderr
    if args == ["catalog", "show"]:
        # Nothing configured: the command's own error, not a pipe error.
        assert run.returncode == 1
        assert run.stderr.startswith("ocx: the generated catalog is invalid"), run.stderr
    elif args[0] == "key":
        assert run.returncode == 141  # 128 + SIGPIPE, what `yes | head` leaves in PIPESTATUS
    else:
        assert run.returncode in (0, 141)  # argparse itself ignores a failed help write
