"""`ocx key create --user U [--create-user] [--name N] [--models a,b] [--rpm N]
[--budget SPEC]... [--expires WHEN] | list | set ID ... | rotate ID [--grace 1h]
| user-budget USER [--budget SPEC]... | revoke ID`.

A budget SPEC is `tokens=N/day|week|month` (N may end in k or M), `usd=D/day|week|month` or
`window=P%/PROVIDER`;
`--budget none` removes every budget (usage.budgets)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from accounts import access, expiry, key_services
from accounts.models import ClientKey
from providers.management.base import ExamplesCommand, messages_text
from usage.budgets import BudgetError, parse_cli_budget, stored_budgets


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


USAGE = """\
ocx key create --user USER [--create-user] [--name NAME] [--models M1,M2] [--rpm N]
                      [--budget SPEC]... [--expires 30d|2027-01-31T00:00Z]
       ocx key set ID [--name NAME] [--models M1,M2|none] [--rpm N|none] [--budget SPEC|none]...
                      [--expires 30d|2027-01-31T00:00Z|none]
       ocx key rotate ID [--grace 1h]
       ocx key user-budget USER [--budget SPEC|none]...
       ocx key list
       ocx key revoke ID
"""
EPILOG = """\
examples:
  ocx key create --user alice --name laptop          # the key is printed once
  ocx key create --user ci --create-user --models combo/main --rpm 60   # a new key-only user
  ocx key create --user bob --budget tokens=2M/week --budget window=30%/chatgpt
  ocx key set 3 --budget tokens=100k/day         # replaces key 3's budgets
  ocx key set 3 --budget none --rpm none         # removes them and the rpm limit
  ocx key create --user contractor --expires 30d # refused (401 key_expired) after 30 days
  ocx key set 3 --expires 2027-01-31T00:00Z      # or --expires none: never expires
  ocx key rotate 3 --grace 1h                    # a new secret; the old one works 1 more hour
  ocx key user-budget alice --budget tokens=5M/month   # shared by all of alice's keys
  ocx key set 4 --budget usd=50/month            # at most $50 of cost per month
  ocx key list
  ocx key revoke 3
budget SPEC: tokens=N/day|week|month (N may end in k or M; calendar periods in OCX_TIME_ZONE)
             usd=D/day|week|month (US dollars of cost at the served target's price)
             window=P%/PROVIDER (at most P points of each quota window of that provider)
--expires: a duration from now (90m, 12h, 30d, 2w) or an ISO-8601 date-time with a zone
Codex sends the key as its bearer token: export OCX_API_KEY=ocx_... (env_key in config.toml).
"""


class Command(ExamplesCommand):
    help = "Create, list, change and revoke client keys; set key and user budgets."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args) or ["list"]
        sub, rest = argv[0], argv[1:]
        if sub == "create":
            p = _Parser(prog="ocx key create", add_help=False)
            p.add_argument("--user", required=True)
            p.add_argument("--create-user", action="store_true")
            p.add_argument("--name", default="")
            p.add_argument("--models", default="")
            p.add_argument("--rpm", type=int)
            p.add_argument("--budget", action="append", default=[])
            p.add_argument("--expires")
            ns = p.parse_args(rest)
            if ns.rpm is not None and ns.rpm < 1:
                raise CommandError("--rpm must be a positive integer")
            expires = None
            if ns.expires is not None:
                now = timezone.now()
                try:
                    expires = expiry.cli_expiry(ns.expires, now=now)
                    expiry.future_expiry(expires, now=now, field="--expires")
                except expiry.ExpiryError as exc:
                    raise CommandError(str(exc)) from None
            models = [m.strip() for m in ns.models.split(",") if m.strip()]
            problem = key_services.allowed_models_problem(models)
            if problem is not None:
                raise CommandError(problem)
            budgets = _budgets(ns.budget)
            try:
                key, secret = access.client_key_create(
                    username=ns.user,
                    name=ns.name,
                    allowed_models=models,
                    rpm_limit=ns.rpm,
                    budgets=key_services.budgets_value(budgets),
                    create_user=ns.create_user,
                    expires=expires,
                )
            except ValidationError as exc:
                raise CommandError(messages_text(exc.messages)) from None
            except access.KeyOwnerError as exc:
                raise CommandError(exc.message) from None
            self.stdout.write(
                f"Created key {key.pk} for {ns.user}{_expiry_text(key.expires)}. "
                "It is shown only once:"
            )
            self.stdout.write(secret)
        elif sub == "list":
            for k in ClientKey.objects.select_related("user"):
                state = f"revoked {k.revoked:%Y-%m-%d %H:%M}" if k.revoked else "active"
                if not k.revoked and k.expires is not None:
                    past = k.expires <= timezone.now()
                    state = f"{'expired' if past else 'expires'} {expiry.iso(k.expires)}"
                shown = ", ".join(b.describe() for b in stored_budgets(k.budgets))
                self.stdout.write(
                    f"{k.pk}  {k.prefix}…  {k.user.get_username()}  {k.name}  {state}"
                    + (f"  budgets: {shown}" if shown else "")
                )
        elif sub == "set":
            self._set(rest)
        elif sub == "rotate":
            self._rotate(rest)
        elif sub == "user-budget":
            self._user_budget(rest)
        elif sub == "revoke":
            if len(rest) != 1 or not rest[0].isdigit():
                raise CommandError("usage: ocx key revoke ID")
            if not access.client_key_revoke(key_id=int(rest[0])):
                raise CommandError(f"no active key {rest[0]}")
            self.stdout.write(f"Revoked key {rest[0]}.")
        else:
            raise CommandError(f"unknown key command {sub}")

    def _set(self, rest: list[str]) -> None:
        if not rest or not rest[0].isdigit():
            raise CommandError("usage: ocx key set ID [--name N] [--models ...] [--rpm N|none] ...")
        p = _Parser(prog="ocx key set", add_help=False)
        p.add_argument("--name")
        p.add_argument("--models")
        p.add_argument("--rpm")
        p.add_argument("--budget", action="append")
        p.add_argument("--expires")
        ns = p.parse_args(rest[1:])
        changes: dict[str, Any] = {}
        if ns.expires is not None:
            try:
                changes["expires"] = (
                    None
                    if ns.expires == "none"
                    else expiry.cli_expiry(ns.expires, now=timezone.now())
                )
            except expiry.ExpiryError as exc:
                raise CommandError(str(exc)) from None
        if ns.name is not None:
            changes["name"] = ns.name
        if ns.models is not None:
            models = [m.strip() for m in ns.models.split(",") if m.strip()]
            changes["allowed_models"] = [] if models == ["none"] else models
        if ns.rpm is not None:
            if ns.rpm == "none":
                changes["rpm_limit"] = None
            elif not ns.rpm.isdigit() or int(ns.rpm) < 1:
                raise CommandError("--rpm must be a positive integer or none")
            else:
                changes["rpm_limit"] = int(ns.rpm)
        if ns.budget is not None:
            changes["budgets"] = _budgets(ns.budget)
        if not changes:
            raise CommandError(
                "nothing to change: give --name, --models, --rpm, --budget or --expires"
            )
        try:
            key = key_services.client_key_update(key_id=int(rest[0]), **changes)
        except ClientKey.DoesNotExist:
            raise CommandError(f"no active key {rest[0]}") from None
        except ValidationError as exc:
            raise CommandError(messages_text(exc.messages)) from None
        budgets = ", ".join(b.describe() for b in stored_budgets(key.budgets)) or "none"
        self.stdout.write(
            f"Updated key {key.pk} ({key.prefix}…). Budgets: {budgets}."
            + (f" Expires {expiry.iso(key.expires)}." if key.expires else "")
        )

    def _rotate(self, rest: list[str]) -> None:
        if not rest or not rest[0].isdigit():
            raise CommandError("usage: ocx key rotate ID [--grace 1h]")
        p = _Parser(prog="ocx key rotate", add_help=False)
        p.add_argument("--grace", default="0")
        ns = p.parse_args(rest[1:])
        try:
            grace = expiry.cli_grace(ns.grace)
        except expiry.ExpiryError as exc:
            raise CommandError(str(exc)) from None
        try:
            key, secret = access.client_key_rotate(key_id=int(rest[0]), grace=grace)
        except ClientKey.DoesNotExist:
            raise CommandError(f"no active key {rest[0]}") from None
        if grace:
            old = f"The old secret works until {expiry.iso(key.previous_until)}."  # type: ignore[arg-type]
        else:
            old = "The old secret no longer works."
        self.stdout.write(f"Rotated key {key.pk} of {key.user.get_username()}. {old}")
        self.stdout.write("The new secret is shown only once:")
        self.stdout.write(secret)

    def _user_budget(self, rest: list[str]) -> None:
        if not rest or rest[0].startswith("-"):
            raise CommandError("usage: ocx key user-budget USER [--budget SPEC|none]...")
        p = _Parser(prog="ocx key user-budget", add_help=False)
        p.add_argument("--budget", action="append")
        ns = p.parse_args(rest[1:])
        username = rest[0]
        if ns.budget is None:
            from accounts.models import UserBudget

            row = UserBudget.objects.filter(user__username=username).first()
            shown = ", ".join(b.describe() for b in stored_budgets(row and row.budgets))
            self.stdout.write(f"Budgets of user {username}: {shown or 'none'}.")
            return
        try:
            row = key_services.user_budgets_set(username=username, budgets=_budgets(ns.budget))
        except ValidationError as exc:
            raise CommandError(messages_text(exc.messages)) from None
        shown = ", ".join(b.describe() for b in stored_budgets(row and row.budgets))
        self.stdout.write(f"Budgets of user {username}: {shown or 'none'}.")


def _expiry_text(value: dt.datetime | None) -> str:
    return f" (expires {expiry.iso(value)})" if value is not None else ""


def _budgets(specs: list[str]) -> list[dict[str, object]]:
    """`--budget` values → budget JSON; `none` alone means no budget."""
    if specs == ["none"]:
        return []
    try:
        return [parse_cli_budget(s) for s in specs]
    except BudgetError as exc:
        raise CommandError(str(exc)) from None
