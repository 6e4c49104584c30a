"""`ocx status [combo]`: mode, the target a request would get now, quota windows, transitions."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from combos.status import status_report
from providers.management.base import ExamplesCommand

USAGE = """\
ocx status [COMBO] [--json]
"""
EPILOG = """\
examples:
  ocx status
  ocx status main --json
Without REDIS_URL live state lives in the server process: ask GET /api/status for its view.
"""


class Command(ExamplesCommand):
    help = "Show what each combo would do now and why."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("combo", nargs="?", help="one combo id (default: every combo)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: str, **options: Any) -> None:
        combo_id: str | None = options.get("combo")
        # Another process's memory is not the server's: read only the shared store, if any.
        report = status_report(combo_id, local=False)
        if combo_id is not None and not report["combos"]:
            raise CommandError(f"unknown combo {combo_id}")
        if options.get("json"):
            self.stdout.write(json.dumps(report, indent=2))
            return
        configured = report["liveState"] in ("none", "redis unreachable")
        if configured:
            self.stdout.write(report["note"])
            self.stdout.write("Configured view:")
        for combo in report["combos"]:
            self.stdout.write(f"{combo['model']}  mode {combo['mode']}  ({combo['strategy']})")
            for credential, target in combo["wouldServe"].items():
                who = "" if credential == "default" else f" for credential {credential}"
                wait = combo["waitFor"].get(credential)
                after = f" (after waiting {wait['ms']} ms for {wait['target']})" if wait else ""
                if configured:
                    # No live state: the first choice by configuration alone, not a prediction.
                    self.stdout.write(f"  configured first choice{who} → {target or 'none'}")
                else:
                    nxt = target or "nothing available"
                    self.stdout.write(f"  next request{who} → {nxt}{after}")
            for t in combo["targets"]:
                why = f" ({t['reason']})" if t.get("reason") else ""
                detail = f" — {t['detail']}" if t.get("detail") else ""
                self.stdout.write(f"  {t['target']}: {t['label']}{why}{detail}")
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
