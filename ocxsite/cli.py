"""The `ocx` console script: a thin front over Django management commands."""

from __future__ import annotations

import os
import sys

COMMANDS = {
    "combo",
    "provider",
    "key",
    "team",
    "config",
    "catalog",
    "status",
    "usage",
    "serve",
    "token",
    "user",
    "doctor",
    "alert",
}
USAGE = """usage: ocx <command> [...]

commands:
  serve [--host H] [--port P] [--workers N] [--server daphne|uvicorn] [--demo] [--no-migrate]
  mock-upstream [--host H] [--port P]
  combo list|show|set|remove|mode ...   (also: ocx route combo ...)
  provider list|show|add|set|remove ...   (add NAME --preset openai|anthropic|chatgpt|...)
  key create --user U|list|revoke ID
  team set NAME [--member U]... [--budget SPEC]... [--allowed-model M]...|list|show NAME|remove NAME
  token create --user U [--name N]|list|revoke ID   (act with their user's role)
  user create NAME [--role admin|viewer|member] [--password-stdin]|set NAME --role R|list|...
  doctor [--probe] [--json] [--host H]  (checks the setup; non-zero exit on a failure)
  config load FILE [--replace]|dump
  catalog write PATH|show
  status [combo]
  usage [--by user|team|key|combo|target|model[,…]] [--since 7d] [--until T] [--json|--csv]
  alert set NAME --kind slack|webhook|email --url U|--to A --event E...|list|remove NAME|test NAME

Run `ocx <command> --help` (or `ocx help <command>`) for its options and examples.
"""


def main(argv: list[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows up here when the output was buffered
    except BrokenPipeError:
        # `ocx key list | head`: the reader left. No traceback; later flushes (at exit) go to
        # /dev/null, and the exit code is the shell's for SIGPIPE, like standard tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    return code


def _run(argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["route"]:
        args = args[1:]
    if args[:1] == ["help"] and len(args) > 1:
        args = [args[1], "--help"]  # `ocx help combo` = `ocx combo --help`
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    command, rest = args[0], args[1:]
    if command == "mock-upstream":
        from mockupstream.server import main as mock_main

        return mock_main(rest)
    if command not in COMMANDS:
        print(f"ocx: unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    from django.apps import apps

    # (Already set up when called in-process, as in the tests: the database is the test's.)
    if not apps.ready and not _wants_help(rest) and _reads_only(command, rest):
        from server.paths import data_dir_path, missing_sqlite_database

        missing = missing_sqlite_database()
        if missing is not None:
            how = (
                f"OCX_DATA_DIR={os.environ['OCX_DATA_DIR']}"
                if os.environ.get("OCX_DATA_DIR")
                else f"OCX_DATA_DIR not set: ./var of the current directory, {data_dir_path()}"
            )
            print(
                f"ocx: no database at {missing} ({how}); set OCX_DATA_DIR to the server's data "
                "directory (or DATABASE_URL), or create one with `ocx serve`",
                file=sys.stderr,
            )
            return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    import django
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import CommandError, call_command

    try:
        if not apps.ready:  # already set up when called in-process (tests)
            django.setup()
    except ImproperlyConfigured as exc:
        print(f"ocx: configuration error: {exc}", file=sys.stderr)
        return 2
    if _wants_help(rest):
        _print_help(command, rest)
        return 0
    if command not in ("serve", "doctor"):  # serve migrates itself; doctor only looks
        _ensure_migrated()
    try:
        call_command(command, *rest)
    except CommandError as exc:
        print(f"ocx: {exc}", file=sys.stderr)
        return exc.returncode or 1
    except KeyboardInterrupt:
        return 130
    return 0


# Django's generic management options mean nothing to an `ocx` user: left out of `--help`.
_DJANGO_OPTIONS = {
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


# Commands that only read the database: run in the wrong directory they must not leave a new
# empty database behind and print nothing (as if the server had no keys, users or combos).
_READ_ONLY = {
    "status": None,
    "usage": None,
    "key": {"list"},
    "user": {"list"},
    "team": {"list", "show"},
    "combo": {"list", "show"},
    "provider": {"list", "show"},
    "catalog": {"show", "write"},
    "config": {"dump"},
    "token": {"list"},
    "alert": {"list"},
}


def _reads_only(command: str, rest: list[str]) -> bool:
    if command not in _READ_ONLY:
        return False
    subs = _READ_ONLY[command]
    if subs is None:
        return True
    sub = next((a for a in rest if not a.startswith("-")), None)
    # `ocx key`, `ocx user`, `ocx team`, `ocx combo` and `ocx provider` alone list.
    return sub in subs or (sub is None and command in ("key", "user", "team", "combo", "provider"))


def _wants_help(rest: list[str]) -> bool:
    # Any -h/--help before `--`; the commands' own argument parsers run without add_help.
    options = rest[: rest.index("--")] if "--" in rest else rest
    return "-h" in options or "--help" in options


def _print_help(command: str, rest: list[str]) -> None:
    """The command's own parser (usage, options, examples epilog) with prog `ocx <cmd>`."""
    import argparse

    from django.core.management import get_commands, load_command_class

    cmd = load_command_class(get_commands()[command], command)
    parser = cmd.create_parser("ocx", command)
    for action in parser._actions:
        if set(action.option_strings) & _DJANGO_OPTIONS or action.nargs == argparse.REMAINDER:
            action.help = argparse.SUPPRESS
        elif isinstance(action, argparse._SubParsersAction) and rest and rest[0] in action.choices:
            # `ocx user create --help`: the subcommand's own parser.
            parser = action.choices[rest[0]]
            parser.prog = f"ocx {command} {rest[0]}"
            break
    parser.print_help()


def _ensure_migrated() -> None:
    # The CLI works on a fresh data dir without `ocx serve` having run first, and says so when
    # that created a database (e.g. run from another directory with OCX_DATA_DIR unset).
    from server.doctor import created_message, migrate_if_needed

    if migrate_if_needed():
        print(created_message(), file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
