"""`ocx alert set NAME ... | list | remove NAME | test NAME`: alert destinations."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from alerts import selectors, services
from alerts.models import EVENTS
from providers.management.base import ExamplesCommand, messages_text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


USAGE = """\
ocx alert set NAME [--kind slack|webhook|email] [--url URL] [--to ADDRESS]...
                   [--event EVENT]... [--secret-stdin|--no-secret] [--team T]... [--combo C]...
       ocx alert list
       ocx alert remove NAME
       ocx alert test NAME
"""
EPILOG = f"""\
examples:
  ocx alert set leads --kind slack --url https://hooks.slack.com/services/T/B/X \\
      --event budget --event target_cooled --event key_expiring
  printf '%s\\n' "$SECRET" | ocx alert set ops --kind webhook --url https://ops.example/hook \\
      --event combo_unavailable --secret-stdin
  ocx alert set infra-mail --kind email --to lead@example.com --event budget --team infra
  ocx alert test leads                # sends a test message now and says whether it arrived
  ocx alert list
  ocx alert remove leads
events: {", ".join(EVENTS)}
Options left out of `set` keep their stored values; --team none / --combo none remove a filter.
The secret is read from stdin (never an argument) and never shown again.
"""


class Command(ExamplesCommand):
    help = "Create, change, list, test and remove alert destinations (Slack, webhook, e-mail)."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args) or ["list"]
        sub, rest = argv[0], argv[1:]
        if sub == "set":
            self._set(rest)
        elif sub == "list":
            if rest:
                raise CommandError("usage: ocx alert list")
            rows = selectors.destination_list()
            if not rows:
                self.stdout.write("No alert destinations.")
            for row in rows:
                where = ", ".join(row.get("to") or []) or row.get("url")  # type: ignore[arg-type]
                filters = "".join(
                    f"  {f}: {', '.join(row[f])}"  # type: ignore[arg-type]
                    for f in ("teams", "combos")
                    if row[f]
                )
                self.stdout.write(
                    f"{row['name']}  {row['kind']} {where}  events: "
                    f"{', '.join(row['events'])}{filters}  "  # type: ignore[arg-type]
                    f"pending: {row['pending']}  failed: {row['failed']}"
                )
        elif sub == "remove":
            if len(rest) != 1:
                raise CommandError("usage: ocx alert remove NAME")
            if not services.destination_delete(name=rest[0]):
                raise CommandError(f"no alert destination {rest[0]}")
            self.stdout.write(f"Removed alert destination {rest[0]}.")
        elif sub == "test":
            if len(rest) != 1:
                raise CommandError("usage: ocx alert test NAME")
            if not selectors.exists(rest[0]):
                raise CommandError(f"no alert destination {rest[0]}")
            error = services.send_test(name=rest[0])
            if error is not None:
                raise CommandError(f"the test message to {rest[0]} failed: {error}")
            self.stdout.write(f"Test message sent to {rest[0]}.")
        else:
            raise CommandError(f"unknown alert command {sub}")

    def _set(self, rest: list[str]) -> None:
        if not rest or rest[0].startswith("-"):
            raise CommandError("usage: ocx alert set NAME [--kind K] [--url U] [--event E]...")
        p = _Parser(prog="ocx alert set", add_help=False)
        p.add_argument("--kind")
        p.add_argument("--url")
        p.add_argument("--to", action="append")
        p.add_argument("--event", action="append")
        p.add_argument("--secret-stdin", action="store_true")
        p.add_argument("--no-secret", action="store_true")
        p.add_argument("--team", action="append")
        p.add_argument("--combo", action="append")
        ns = p.parse_args(rest[1:])
        changes: dict[str, Any] = {}
        for arg, key in (
            ("kind", "kind"),
            ("url", "url"),
            ("to", "to"),
            ("event", "events_wanted"),
        ):
            if getattr(ns, arg) is not None:
                changes[key] = getattr(ns, arg)
        for arg, key in (("team", "teams"), ("combo", "combos")):
            values = getattr(ns, arg)
            if values is not None:
                changes[key] = [] if values == ["none"] else values
        if ns.secret_stdin and ns.no_secret:
            raise CommandError("give --secret-stdin or --no-secret, not both")
        if ns.secret_stdin:
            secret = sys.stdin.readline().rstrip("\r\n")
            if not secret:
                raise CommandError("no secret on stdin")
            changes["secret"] = secret
        elif ns.no_secret:
            changes["secret"] = ""
        try:
            row = services.destination_set(name=rest[0], **changes)
        except ValidationError as exc:
            if hasattr(exc, "error_dict"):
                field, errors = next(iter(exc.message_dict.items()))
                raise CommandError(f"{field}: {messages_text(errors)}") from None
            raise CommandError(messages_text(exc.messages)) from None
        self.stdout.write(f"Saved alert destination {row.name} ({row.kind}).")
