"""The `ocx` console script: a thin front over Django management commands."""

from __future__ import annotations

import os
import sys

COMMANDS = {
    "combo",
    "provider",
    "key",
    "config",
    "catalog",
    "status",
    "serve",
    "token",
    "usage",
    "user",
    "doctor",
}
USAGE = """usage: ocx <command> [...]

commands:
  serve [--host H] [--port P] [--workers N] [--server daphne|uvicorn] [--demo] [--no-migrate]
  mock-upstream [--host H] [--port P]
  combo list|show|set|remove|mode ...   (also: ocx route combo ...)
  provider list|show|add|set|remove ...   (add NAME --preset openai|anthropic|chatgpt|...)
  key create --user U|list|revoke ID
  token create --user U                 (management token for a staff user)
  user create NAME [--staff] [--password-stdin]|list|deactivate NAME
  doctor [--probe] [--json] [--host H]  (checks the setup; non-zero exit on a failure)
  config load FILE [--replace]|dump
  catalog write PATH|show
  status [combo]
  usage [--by user|key|combo|target|model[,…]] [--since 7d] [--until T] [--json|--csv]
"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["route"]:
        args = args[1:]
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    command, rest = args[0], args[1:]
    if command == "mock-upstream":
        from providers.mock_upstream import main as mock_main

        return mock_main(rest)
    if command not in COMMANDS:
        print(f"ocx: unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    import django
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import CommandError, call_command

    try:
        if not apps.ready:  # already set up when called in-process (tests)
            django.setup()
    except ImproperlyConfigured as exc:
        print(f"ocx: configuration error: {exc}", file=sys.stderr)
        return 2
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


def _ensure_migrated() -> None:
    # The CLI works on a fresh data dir without `ocx serve` having run first, and says so when
    # that created a database (e.g. run from another directory with OCX_DATA_DIR unset).
    from ocxsite.doctor import created_message, migrate_if_needed

    if migrate_if_needed():
        print(created_message(), file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
