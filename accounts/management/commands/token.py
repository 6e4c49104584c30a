"""`ocx token create --user U`: a management API token (`ocxm_…`) for a staff user."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from accounts import access
from providers.management.base import ExamplesCommand

USAGE = """\
ocx token create --user USER
"""
EPILOG = """\
A management token (ocxm_...) authorises /api/* as that user; the user is made staff.

examples:
  ocx token create --user alice
  curl -H "Authorization: Bearer ocxm_..." http://127.0.0.1:8787/api/combos
"""


class Command(ExamplesCommand):
    help = "Create a management token for a staff user (the user is made staff)."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args)
        if len(argv) != 3 or argv[0] != "create" or argv[1] != "--user" or not argv[2]:
            raise CommandError("usage: ocx token create --user U")
        _, secret = access.mgmt_token_create(username=argv[2])
        self.stdout.write("Management token (shown only once):")
        self.stdout.write(secret)
