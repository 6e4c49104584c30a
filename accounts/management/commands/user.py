"""`ocx user create NAME [--staff] [--password-stdin] [--no-password] | list | deactivate NAME
| activate NAME | remove NAME --yes`."""

from __future__ import annotations

import getpass
import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from accounts import users
from providers.management.base import ExamplesCommand, messages_text

EPILOG = """\
examples:
  ocx user create alice --staff                 # prompts twice for the password
  printf '%s\\n' "$PW" | ocx user create alice --staff --password-stdin
  ocx user create bob --no-password             # a key-only user (no admin login)
  ocx user list
  ocx user deactivate bob                       # bob's keys and tokens stop working
  ocx user activate bob                         # ... and work again
  ocx user remove bob --yes                     # revokes bob's keys and tokens for good;
                                                # the request log and usage keep naming bob

Staff users log in to the admin at /admin/. Client keys for a user: ocx key create --user NAME.
"""


class Command(ExamplesCommand):
    help = "Create, list, deactivate, activate and remove users (staff log in to /admin/)."

    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        subs = parser.add_subparsers(dest="sub", metavar="create|list|deactivate|activate|remove")
        create = subs.add_parser("create", help="create a user (prompts for a password)")
        create.add_argument("name")
        create.add_argument(
            "--staff", action="store_true", help="an administrator: /admin/ and the management API"
        )
        how = create.add_mutually_exclusive_group()
        how.add_argument(
            "--password-stdin", action="store_true", help="read the password from stdin"
        )
        how.add_argument(
            "--no-password", action="store_true", help="no login at all (a key-only user)"
        )
        subs.add_parser("list", help="list users, their role, state and active keys")
        deactivate = subs.add_parser(
            "deactivate", help="deactivate a user: no login, keys and tokens stop working"
        )
        deactivate.add_argument("name")
        activate = subs.add_parser(
            "activate", help="reactivate a user: their unrevoked keys and tokens work again"
        )
        activate.add_argument("name")
        remove = subs.add_parser(
            "remove", help="revoke a user's keys and tokens and deactivate them (history stays)"
        )
        remove.add_argument("name")
        remove.add_argument("--yes", action="store_true", help="confirm")

    def handle(self, *args: Any, **options: Any) -> None:
        sub = options.get("sub") or "list"
        try:
            if sub == "create":
                self._create(options)
            elif sub == "deactivate":
                count = users.user_deactivate(username=options["name"])
                self.stdout.write(
                    f"Deactivated {options['name']}; {count} active key(s) no longer work."
                )
            elif sub == "activate":
                count = users.user_activate(username=options["name"])
                self.stdout.write(f"Activated {options['name']}; {count} key(s) work again.")
            elif sub == "remove":
                if not options["yes"]:
                    raise CommandError(
                        f"this revokes every key and token of {options['name']} for good; "
                        "add --yes to confirm"
                    )
                count = users.user_remove(username=options["name"])
                self.stdout.write(
                    f"Removed {options['name']}: {count} key(s) revoked, login disabled; "
                    "their usage history stays."
                )
            else:
                self._list()
        except ValidationError as exc:
            raise CommandError(messages_text(exc.messages)) from None

    def _create(self, options: dict[str, Any]) -> None:
        name: str = options["name"]
        password: str | None = None
        if options["password_stdin"]:
            password = sys.stdin.readline().rstrip("\r\n")
            if not password:
                raise CommandError("no password on stdin")
        elif not options["no_password"]:
            if not sys.stdin.isatty():
                raise CommandError(
                    "no terminal to prompt for a password: use --password-stdin "
                    "(or --no-password for a key-only user)"
                )
            password = getpass.getpass(f"Password for {name}: ")
            if password != getpass.getpass("Password (again): "):
                raise CommandError("the passwords do not match")
        user = users.user_create(username=name, password=password, is_staff=options["staff"])
        role = "staff user (admin login at /admin/)" if options["staff"] else "user"
        self.stdout.write(f"Created {role} {user.get_username()}.")

    def _list(self) -> None:
        rows = users.users_list()
        if not rows:
            self.stdout.write("No users. Create one with: ocx user create NAME --staff")
            return
        width = max(len(r.username) for r in rows)
        for r in rows:
            role = "staff" if r.is_staff else "user"
            state = "active" if r.is_active else "inactive"
            login = "" if r.has_password else "  (no password)"
            self.stdout.write(
                f"{r.username:<{width}}  {role:<5}  {state:<8}  {r.active_keys} key(s){login}"
            )
