"""`ocx usage [--by user[,model]] [--since 7d] [--until T] [--json|--csv]`: token usage and
cost."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from providers.management.base import ExamplesCommand
from usage import selectors

EPILOG = """\
examples:
  ocx usage                                   # per user, the last 24 hours
  ocx usage --by user,model --since 7d
  ocx usage --by team --since 30d             # a request counts for each team of its user
  ocx usage --by combo --since 2026-11-01T00:00:00Z --until 2026-12-01T00:00:00Z --csv
  ocx usage --by key --since 30d --json
  ocx usage verify                            # request log, rollups and budget counters agree?
  ocx usage verify --since 2h
"""


class Command(ExamplesCommand):
    help = "Token usage and cost per user, team, key, combo, target or model over a time range."
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action",
            nargs="?",
            choices=["verify"],
            help="verify: compare the request log, the rollups and the budget counters "
            "(exit 1 when they disagree; --since defaults to today's start)",
        )
        parser.add_argument(
            "--by", default="user", help="one or two of user,team,key,combo,target,model,status"
        )
        parser.add_argument(
            "--since", default=None, help="ISO 8601 time or 1h, 24h, 7d, 30d (default 24h)"
        )
        parser.add_argument("--until", default=None)
        out = parser.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true")
        out.add_argument("--csv", action="store_true")

    def handle(self, *args: str, **options: Any) -> None:
        if options["action"] == "verify":
            self._verify(options["since"])
            return
        try:
            query = selectors.build_query(
                by=options["by"],
                since=options["since"] or "24h",
                until=options["until"],
                now=timezone.now(),
            )
        except selectors.UsageQueryError as exc:
            raise CommandError(str(exc)) from None
        report = selectors.usage_report(query)
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        elif options["csv"]:
            self.stdout.write(selectors.report_csv(report), ending="")
        else:
            self.stdout.write(_table(report))

    def _verify(self, since: str | None) -> None:
        from usage import verify

        now = timezone.now()
        try:
            start = verify.parse_since(since, now=now)
        except selectors.UsageQueryError as exc:
            raise CommandError(str(exc)) from None
        result = verify.verify_here(since=start, now=now)
        self.stdout.write(result.text())
        if not result.agrees:
            raise CommandError(
                f"the ledger disagrees: {len(result.differences)} difference(s) (above)"
            )


def _table(report: dict[str, Any]) -> str:
    # A key is shown by its current secret's prefix, its name and its owner (issue 42).
    dims = [c for d in report["by"] for c in (("key", "keyName", "owner") if d == "key" else (d,))]
    counters = list(selectors.REPORTED)
    names = {"keyName": "NAME", "owner": "OWNER"}
    headers = [names.get(d, d.upper()) for d in dims] + [
        "REQUESTS",
        "INPUT",
        "CACHED",
        "OUTPUT",
        "REASONING",
        "UNKNOWN",
        "COST",
        "API_VALUE",
        "UNPRICED",
        "ESTIMATED",
    ]
    lines = [
        [_cell(row.get(d)) for d in dims] + [_number(c, row[c]) for c in counters]
        for row in report["rows"]
    ]
    lines.append(
        ["TOTAL"] + [""] * (len(dims) - 1) + [_number(c, report["totals"][c]) for c in counters]
    )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    numeric = len(dims)

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i >= numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    title = f"usage {report['since']} .. {report['until']}"
    return "\n".join([title, fmt(headers), *(fmt(line) for line in lines)])


def _number(name: str, value: float) -> str:
    """Dollars with cents, counts with thousands separators."""
    return f"${value:,.2f}" if name in selectors.MONEY else f"{int(value):,}"


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)
