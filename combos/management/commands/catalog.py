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
       ocx catalog show [--json]
"""
EPILOG = """\
examples:
  ocx catalog write ~/.codex/ocx-catalog.json     # then model_catalog_json = "ocx-catalog.json"
  ocx catalog show                  # a table: model, name, context window, input, efforts
  ocx catalog show --json           # the document Codex reads
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
        if argv == ["show", "--json"]:
            self.stdout.write(data.decode("utf-8"), ending="")
            return
        if argv == ["show"]:
            self.stdout.write(_table(json.loads(data)["models"]))
            return
        if len(argv) != 2 or argv[0] != "write":
            raise CommandError("usage: ocx catalog write PATH | ocx catalog show [--json]")
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


def _table(rows: list[dict[str, Any]]) -> str:
    """One line per catalog row, columns aligned; the document itself is `--json`."""
    head = ("MODEL", "NAME", "CONTEXT", "INPUT", "EFFORTS")
    lines = [head] + [
        (
            str(r.get("slug", "")),
            str(r.get("display_name", "")),
            f"{r['context_window']:,}" if isinstance(r.get("context_window"), int) else "-",
            ",".join(r.get("input_modalities") or []) or "-",
            ",".join(lvl["effort"] for lvl in r.get("supported_reasoning_levels") or []) or "-",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )
