"""`ocx catalog write PATH` and `ocx catalog show` (the Codex model catalog)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from combos import selectors
from providers.management.base import ExamplesCommand
from routing.catalog import catalog_json, catalog_problems, validate_catalog

USAGE = """\
ocx catalog write PATH
       ocx catalog show
"""
EPILOG = """\
examples:
  ocx catalog write ~/.codex/ocx-catalog.json     # then model_catalog_json = "ocx-catalog.json"
  ocx catalog show | python -m json.tool
Codex reads the file once at start: restart it after writing.
"""


class Command(ExamplesCommand):
    help = "Write or show the Codex model catalog (model_catalog_json)."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args)
        result = selectors.catalog_result()
        data = catalog_json(result)
        problems = validate_catalog(data)
        if problems:
            # Say what to fix (which provider or model lacks what), not only the schema rule.
            hints = catalog_problems(selectors.config_snapshot(), result)
            raise CommandError(
                "the generated catalog is invalid: " + "; ".join((hints or problems)[:4])
            )
        for line in result.warnings:
            self.stderr.write(line)
        if argv == ["show"]:
            self.stdout.write(data.decode("utf-8"), ending="")
            return
        if len(argv) != 2 or argv[0] != "write":
            raise CommandError("usage: ocx catalog write PATH | ocx catalog show")
        path = Path(argv[1]).expanduser()
        if path.is_dir():
            raise CommandError(f"{path} is a directory")
        # Atomic replace: Codex may read the file while we write it.
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ocx-catalog-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        count = len(json.loads(data)["models"])
        self.stdout.write(f"Wrote {count} models to {path}.")
