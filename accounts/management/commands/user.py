"""`ocx user create NAME [--role admin|viewer|member] [--staff] [--password-stdin]
[--no-password] | set NAME --role R | list | deactivate NAME | activate NAME | remove NAME --yes`.
Roles: docs/people.md."""

from __future__ import annotations

import getpass
import sys
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from accounts import roles, users
from providers.management.base import ExamplesCommand, messages_text

EPILOG = """\
examples:
  ocx user create alice --role admin            # prompts twice for the password
  printf '%s\\n' "$PW" | ocx user create alice --staff --password-stdin   # --staff = admin
  ocx user create vic --role viewer             # reads every admin page and GET /api/...
  ocx user create bob --no-password             # a member without a login (keys only)
  ocx user set vic --role admin                 # change a role
  ocx team set infra --manager bob              # bob manages team infra's keys and members
  ocx user list
  ocx user deactivate bob                       # bob's keys and tokens stop working
  ocx user activate bob                         # ... and work again
  ocx user remove bob --yes                     # revokes bob's keys and tokens for good;
                                                # the request log and usage keep naming bob

Roles (docs/people.md): admin = everything; viewer = reads the admin and the API, writes
nothing; member = the portal at /me/ only. Client keys for a user: ocx key create --user NAME.
"""


class Command(ExamplesCommand):
    help = "Create, list, deactivate, activate and remove users and set their roles."

    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        subs = parser.add_subparsers(
            dest="sub", metavar="create|set|list|deactivate|activate|remove"
        )
        create = subs.add_parser("create", help="create a user (prompts for a password)")
        create.add_argument("name")
        who = create.add_mutually_exclusive_group()
        who.add_argument("--role", choices=roles.ROLES, help="admin, viewer or member (default)")
        who.add_argument("--staff", action="store_true", help="an admin (same as --role admin)")
        how = create.add_mutually_exclusive_group()
        how.add_argument(
            "--password-stdin", action="store_true", help="read the password from stdin"
        )
        how.add_argument(
            "--no-password", action="store_true", help="no login at all (a key-only user)"
        )
        set_role = subs.add_parser("set", help="change a user's role")
        set_role.add_argument("name")
        set_role.add_argument("--role", choices=roles.ROLES, required=True)
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
            elif sub == "set":
                user = users.user_set_role(username=options["name"], role=options["role"])
                self.stdout.write(f"{user.get_username()} is now {options['role']}.")
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
        user = users.user_create(
            username=name, password=password, is_staff=options["staff"], role=options["role"]
        )
        role = roles.role_of(user)
        where = {"admin": "admin login at /admin/", "viewer": "reads /admin/"}.get(role, "portal")
        self.stdout.write(f"Created {role} {user.get_username()} ({where}).")

    def _list(self) -> None:
        rows = users.users_list()
        if not rows:
            self.stdout.write("No users. Create one with: ocx user create NAME --role admin")
            return
        width = max(len(r.username) for r in rows)
        for r in rows:
            state = "active" if r.is_active else "inactive"
            login = "" if r.has_password else "  (no password)"
            self.stdout.write(
                f"{r.username:<{width}}  {r.role:<6}  {state:<8}  {r.active_keys} key(s){login}"
            )
