"""`ocx token create --user U | list | revoke ID`: management API tokens (`ocxm_…`)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from accounts import access
from accounts.models import ManagementToken
from providers.management.base import ExamplesCommand

USAGE = """\
ocx token create --user USER [--name NAME]
       ocx token list
       ocx token revoke ID
"""
EPILOG = """\
A management token (ocxm_...) authorises /api/* with that user's role (docs/people.md):
an admin's writes anything, a viewer's reads, a team manager's manages their teams.
`list` shows each token's id, prefix, user, name, creation and state (never the token);
`revoke` refuses the token from the next request on.

examples:
  ocx token create --user alice --name laptop
  curl -H "Authorization: Bearer ocxm_..." http://127.0.0.1:8787/api/combos
  ocx token list
  ocx token revoke 2
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


class Command(ExamplesCommand):
    help = "Create, list and revoke management tokens (a token acts with its user's role)."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args)
        sub, rest = (argv[0], argv[1:]) if argv else ("", [])
        if sub == "create":
            p = _Parser(prog="ocx token create", add_help=False)
            p.add_argument("--user", required=True)
            p.add_argument("--name", default="")
            ns = p.parse_args(rest)
            if not ns.user:
                raise CommandError("usage: ocx token create --user U")
            token, secret = access.mgmt_token_create(username=ns.user, name=ns.name)
            self.stdout.write(f"Created management token {token.pk} for {ns.user}.")
            self.stdout.write("Management token (shown only once):")
            self.stdout.write(secret)
        elif sub == "list":
            if rest:
                raise CommandError("usage: ocx token list")
            for t in ManagementToken.objects.select_related("user"):
                state = f"revoked {t.revoked:%Y-%m-%d %H:%M}" if t.revoked else "active"
                self.stdout.write(
                    f"{t.pk}  {t.prefix}…  {t.user.get_username()}  {t.name}  "
                    f"created {t.created:%Y-%m-%d %H:%M}  {state}"
                )
        elif sub == "revoke":
            if len(rest) != 1 or not rest[0].isdigit():
                raise CommandError("usage: ocx token revoke ID")
            if not access.mgmt_token_revoke(token_id=int(rest[0])):
                raise CommandError(f"no active management token {rest[0]}")
            self.stdout.write(f"Revoked management token {rest[0]}.")
        else:
            raise CommandError("usage: ocx token create --user U | list | revoke ID")
