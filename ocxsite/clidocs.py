"""docs/cli.md from the commands themselves: each `ocx <command> --help` (and each subcommand's
own parser), as `ocx help` prints it. `python -m ocxsite.clidocs --write` regenerates the file;
tests/ocxsite/test_cli_docs.py fails when it and the commands differ."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

# The order of `ocx --help` (ocxsite/cli.py USAGE).
ORDER = (
    "serve",
    "mock-upstream",
    "combo",
    "provider",
    "key",
    "team",
    "token",
    "user",
    "doctor",
    "config",
    "catalog",
    "status",
    "usage",
)
WIDTH = "100"  # argparse wraps to the terminal: the file must not depend on who ran it
PATH = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
HEADER = """\
# CLI reference

<!-- Generated: do not edit by hand. How to regenerate after changing a command, a flag or a
help text: `python -m ocxsite.clidocs --write` (from the repository root; check with
`python -m ocxsite.clidocs --check`). tests/ocxsite/test_cli_docs.py fails while this file,
the commands' parsers and README.md's command list disagree. -->

Every `ocx` command as `ocx <command> --help` prints it (also `-h`, or `ocx help <command>`).
`ocx` alone lists the commands; [README.md](../README.md#cli) has the short list.
"""


def commands() -> list[str]:
    from ocxsite.cli import COMMANDS

    rest = sorted(COMMANDS - set(ORDER))  # a new command shows up even before it is ordered
    return [c for c in ORDER if c in COMMANDS or c == "mock-upstream"] + rest


def _help(command: str, sub: str | None = None) -> str:
    from ocxsite.cli import _print_help

    if command == "mock-upstream":
        from mockupstream import build_parser

        return build_parser().format_help()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_help(command, [sub] if sub else [])
    return out.getvalue()


def subcommands(command: str) -> list[str]:
    """The subcommands with a parser of their own (`ocx user create`); the others parse their
    arguments themselves and their `--help` names every form."""
    if command == "mock-upstream":
        return []
    from django.core.management import get_commands, load_command_class

    parser = load_command_class(get_commands()[command], command).create_parser("ocx", command)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(dict.fromkeys(action.choices))
    return []


def render() -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = [HEADER]
        for command in commands():
            parts.append(f"\n## ocx {command}\n\n```text\n{_help(command).rstrip()}\n```\n")
            for sub in subcommands(command):
                text = _help(command, sub).rstrip()
                parts.append(f"\n### ocx {command} {sub}\n\n```text\n{text}\n```\n")
        return "".join(parts)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    import django

    django.setup()
    text = render()
    if "--write" in argv:
        PATH.write_text(text)
    elif "--check" in argv:
        if PATH.read_text() != text:
            print("docs/cli.md is stale: python -m ocxsite.clidocs --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
