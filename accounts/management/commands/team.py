"""`ocx team set NAME [--member U]... [--budget SPEC|none]... [--allowed-model M|none]... |
list | show NAME | remove NAME`: teams (Django groups) with members, budgets and allowed models."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from accounts import team_selectors, team_services
from providers.management.base import ExamplesCommand, messages_text
from usage.budgets import BudgetError, parse_cli_budget


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


USAGE = """\
ocx team set NAME [--member USER]... [--add-member USER]... [--remove-member USER]...
                     [--no-members] [--budget SPEC|none]... [--allowed-model MODEL|none]...
                     [--manager USER|none]...
       ocx team list
       ocx team show NAME
       ocx team remove NAME
"""
EPILOG = """\
examples:
  ocx team set infra --member ann --member ben --budget tokens=2M/month --allowed-model combo/team
  ocx team set infra --add-member carl         # adds carl; what is not given stays as it is
  ocx team set infra --budget none             # removes the team's budgets
  ocx team set infra --allowed-model none      # no narrowing of models
  ocx team set infra --manager ann             # ann manages infra's keys and members
  ocx team set infra --manager none            # no managers
  ocx team list
  ocx team show infra
  ocx team remove infra                        # the members stay users
budget SPEC: as `ocx key` (tokens=N/day|week|month, window=P%/PROVIDER); every team of a user
applies to every key of that user. A team's allowed models narrow what its members' keys may
use (a request's model must be allowed by the key and by each of the user's teams).
"""


class Command(ExamplesCommand):
    help = "Create, change, list, show and remove teams (members, budgets, allowed models)."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args) or ["list"]
        sub, rest = argv[0], argv[1:]
        if sub == "set":
            self._set(rest)
        elif sub == "list":
            if rest:
                raise CommandError("usage: ocx team list")
            rows = team_selectors.team_list()
            if not rows:
                self.stdout.write("No teams.")
            for row in rows:
                self.stdout.write(
                    f"{row.name}  members: {', '.join(row.members) or 'none'}  "
                    f"budgets: {row.describe_budgets()}  "
                    f"models: {', '.join(row.allowed_models) or 'any'}"
                )
        elif sub == "show":
            if len(rest) != 1:
                raise CommandError("usage: ocx team show NAME")
            self._show(rest[0])
        elif sub == "remove":
            if len(rest) != 1:
                raise CommandError("usage: ocx team remove NAME")
            if not team_services.team_delete(name=rest[0]):
                raise CommandError(f"no team {rest[0]}")
            self.stdout.write(f"Removed team {rest[0]}.")
        else:
            raise CommandError(f"unknown team command {sub}")

    def _set(self, rest: list[str]) -> None:
        if not rest or rest[0].startswith("-"):
            raise CommandError("usage: ocx team set NAME [--member USER]... [--budget SPEC]...")
        p = _Parser(prog="ocx team set", add_help=False)
        p.add_argument("--member", action="append")
        p.add_argument("--add-member", action="append", default=[])
        p.add_argument("--remove-member", action="append", default=[])
        p.add_argument("--no-members", action="store_true")
        p.add_argument("--budget", action="append")
        p.add_argument("--allowed-model", action="append")
        p.add_argument("--manager", action="append")
        ns = p.parse_args(rest[1:])
        name = rest[0]
        changes: dict[str, Any] = {}
        if ns.no_members and ns.member:
            raise CommandError("give --member or --no-members, not both")
        members: list[str] | None = [] if ns.no_members else ns.member
        if ns.add_member or ns.remove_member:
            if members is None:
                current = team_selectors.team_get(name)
                members = list(current.members) if current else []
            members = [m for m in members + ns.add_member if m not in ns.remove_member]
        if members is not None:
            changes["members"] = members
        if ns.budget is not None:
            changes["budgets"] = _budgets(ns.budget)
        if ns.allowed_model is not None:
            models = [m.strip() for m in ns.allowed_model if m.strip()]
            changes["allowed_models"] = [] if models == ["none"] else models
        if ns.manager is not None:
            managers = [m.strip() for m in ns.manager if m.strip()]
            changes["managers"] = [] if managers == ["none"] else managers
        try:
            team_services.team_set(name=name, **changes)
        except ValidationError as exc:
            raise CommandError(messages_text(exc.messages)) from None
        self._show(name)

    def _show(self, name: str) -> None:
        row = team_selectors.team_get(name)
        if row is None:
            raise CommandError(f"no team {name}")
        self.stdout.write(f"Team {row.name}")
        self.stdout.write(f"  members: {', '.join(row.members) or 'none'}")
        self.stdout.write(f"  budgets: {row.describe_budgets()}")
        self.stdout.write(f"  allowed models: {', '.join(row.allowed_models) or 'any'}")
        self.stdout.write(f"  managers: {', '.join(row.managers) or 'none'}")


def _budgets(specs: list[str]) -> list[dict[str, object]]:
    """`--budget` values → budget JSON; `none` alone means no budget."""
    if specs == ["none"]:
        return []
    try:
        return [parse_cli_budget(s) for s in specs]
    except BudgetError as exc:
        raise CommandError(str(exc)) from None
