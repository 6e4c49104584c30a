"""`ocx key create --user U [--name N] [--models a,b] [--rpm N] | list | revoke ID`."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ocxsite import access
from ocxsite.models import ClientKey


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


USAGE = """\
ocx key create --user USER [--name NAME] [--models M1,M2] [--rpm N]
       ocx key list
       ocx key revoke ID
"""
EPILOG = """\
examples:
  ocx key create --user alice --name laptop          # the key is printed once
  ocx key create --user ci --models combo/main --rpm 60
  ocx key list
  ocx key revoke 3
Codex sends the key as its bearer token: export OCX_API_KEY=ocx_... (env_key in config.toml).
"""


class Command(BaseCommand):
    help = "Create, list and revoke client keys."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # `ocx key --help`: the usage and examples below (ocxsite/cli.py prints them).
        kwargs.setdefault("usage", USAGE)
        kwargs.setdefault("epilog", EPILOG)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args) or ["list"]
        sub, rest = argv[0], argv[1:]
        if sub == "create":
            p = _Parser(prog="ocx key create", add_help=False)
            p.add_argument("--user", required=True)
            p.add_argument("--name", default="")
            p.add_argument("--models", default="")
            p.add_argument("--rpm", type=int)
            ns = p.parse_args(rest)
            if ns.rpm is not None and ns.rpm < 1:
                raise CommandError("--rpm must be a positive integer")
            models = [m.strip() for m in ns.models.split(",") if m.strip()]
            key, secret = access.client_key_create(
                username=ns.user, name=ns.name, allowed_models=models, rpm_limit=ns.rpm
            )
            self.stdout.write(f"Created key {key.pk} for {ns.user}. It is shown only once:")
            self.stdout.write(secret)
        elif sub == "list":
            for k in ClientKey.objects.select_related("user"):
                state = f"revoked {k.revoked:%Y-%m-%d %H:%M}" if k.revoked else "active"
                self.stdout.write(
                    f"{k.pk}  {k.prefix}…  {k.user.get_username()}  {k.name}  {state}"
                )
        elif sub == "revoke":
            if len(rest) != 1 or not rest[0].isdigit():
                raise CommandError("usage: ocx key revoke ID")
            if not access.client_key_revoke(key_id=int(rest[0])):
                raise CommandError(f"no active key {rest[0]}")
            self.stdout.write(f"Revoked key {rest[0]}.")
        else:
            raise CommandError(f"unknown key command {sub}")
