"""The base of every `ocx` management command whose `--help` shows examples.

It lives in the lowest app so that every app's commands (and ocxsite's) can share it without
importing from `ocxsite`.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class ExamplesCommand(BaseCommand):
    """`ocx <cmd> --help`: `usage_line` (if set) replaces argparse's usage and `examples` is the
    epilog, both printed as written (ocxsite/cli.py prints the help)."""

    usage_line: str | None = None
    examples: str = ""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        if self.usage_line is not None:
            kwargs.setdefault("usage", self.usage_line)
        kwargs.setdefault("epilog", self.examples)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)


def messages_text(messages: list[str]) -> str:
    """Validation messages as one sentence-like line: "A. B." rather than "A.; B."."""
    parts = [m.strip() for m in messages if m.strip()]
    if len(parts) == 1:
        return parts[0]
    return " ".join(p if p.endswith((".", "!", "?")) else p + "." for p in parts)
