"""`ocx status [combo]`: mode, the target a request would get now, quota windows, transitions."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ocxsite.status import status_report


class Command(BaseCommand):
    help = "Show what each combo would do now and why."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = [a for a in args if a != "--json"]
        if len(argv) > 1:
            raise CommandError("usage: ocx status [combo] [--json]")
        report = status_report(argv[0] if argv else None)
        if argv and not report["combos"]:
            raise CommandError(f"unknown combo {argv[0]}")
        if "--json" in args:
            self.stdout.write(json.dumps(report, indent=2))
            return
        if report["liveState"] != "redis":
            self.stdout.write(
                "Live routing state is kept in the server process (no REDIS_URL): cooldowns "
                "below are this process's only; ask GET /api/status for the server's view."
            )
        for combo in report["combos"]:
            self.stdout.write(f"{combo['model']}  mode {combo['mode']}  ({combo['strategy']})")
            for credential, target in combo["wouldServe"].items():
                who = "" if credential == "default" else f" for credential {credential}"
                self.stdout.write(f"  next request{who} → {target or 'nothing available'}")
            for t in combo["targets"]:
                until = f" until {t['until']}" if t.get("until") else ""
                self.stdout.write(f"  {t['target']}: {t['badge'].replace('_', ' ')}{until}")
            for w in combo["exhaustedWindows"]:
                self.stdout.write(
                    f"  exhausted: {w['provider']} {w['window']} resets {w['resetsAt']}"
                )
            if combo["lastTransition"]:
                lt = combo["lastTransition"]
                self.stdout.write(
                    f"  last transition: {lt['from']} → {lt['to']} ({lt['reason']}) at {lt['at']}"
                )
            if combo["nextChangeAt"]:
                self.stdout.write(f"  next probe/reset: {combo['nextChangeAt']}")
        for t in report["recentTransitions"][:5]:
            self.stdout.write(f"{t['at']}  {t['provider']}: {t['message'] or t['reason']}")
