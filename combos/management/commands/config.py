"""`ocx config load FILE [--replace]` and `ocx config dump`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from combos import selectors, services
from providers.errors import ConfigError
from providers.management.base import ExamplesCommand

USAGE = """\
ocx config load FILE [--replace]
       ocx config dump
"""
EPILOG = """\
`load` applies the whole document or nothing; --replace also removes providers and combos
that the file does not name.

examples:
  ocx config dump > ocx-config.json
  ocx config load ocx-config.json
  ocx config load ocx-config.json --replace
"""


class Command(ExamplesCommand):
    help = "Load (atomically) or dump the configuration document."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args)
        if argv == ["dump"]:
            self.stdout.write(json.dumps(selectors.config_dump(), indent=2))
            return
        if not argv or argv[0] != "load" or len(argv) not in (2, 3):
            raise CommandError("usage: ocx config load FILE [--replace] | ocx config dump")
        replace = argv[2:] == ["--replace"]
        if len(argv) == 3 and not replace:
            raise CommandError(f"unexpected argument {argv[2]}")
        path = Path(argv[1])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise CommandError(f"{path} is not valid JSON: {exc}") from None
        try:
            counts = services.config_load(doc=doc, replace=replace)
        except ConfigError as exc:
            lines = "\n".join(f"  - {issue}" for issue in exc.issues)
            raise CommandError(f"{path} was not loaded; nothing changed:\n{lines}") from None
        self.stdout.write(
            f"Loaded {counts['providers']} providers and {counts['combos']} combos from {path}."
        )
