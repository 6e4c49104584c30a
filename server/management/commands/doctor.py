"""`ocx doctor [--probe] [--json] [--host H]`: check this setup, one verdict per line."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from providers.management.base import ExamplesCommand
from server import doctor

EPILOG = """\
checks: migrations applied, secret key source, Redis reachable (when REDIS_URL is set),
the bind address against OCX_ALLOWED_HOSTS, the open-files limit (at least 4 x
OCX_UPSTREAM_MAX_CONNECTIONS per worker), each provider's credential, each combo has an
eligible target, the Codex catalog validates, every model has a price (docs/usage.md).
Verdicts: ok, warn, fail; any fail exits 1.

examples:
  ocx doctor
  ocx doctor --host 0.0.0.0          # the address you pass to `ocx serve --host`
  ocx doctor --probe                 # also one tiny request per provider (costs a few tokens)
  ocx doctor --json | jq '.checks[] | select(.verdict != "ok")'

Run it with the same environment as `ocx serve` (OCX_DATA_DIR, DATABASE_URL, REDIS_URL,
OCX_ALLOWED_HOSTS and the providers' key variables).
"""


class Command(ExamplesCommand):
    help = "Check the setup: data directory, database, keys, hosts, providers, combos, catalog."

    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--probe", action="store_true", help="send one tiny request to every provider"
        )
        parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="the bind address to check against OCX_ALLOWED_HOSTS (default 127.0.0.1)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        checks = doctor.run_checks(host=options["host"])
        if options["probe"] and checks[0].verdict == doctor.OK:
            checks.extend(doctor.probe_providers())
        failed = [c for c in checks if c.verdict == doctor.FAIL]
        if options["json"]:
            out = {
                "dataDir": str(doctor.settings.OCX_DATA_DIR),
                "database": doctor.database_label(),
                "ok": not failed,
                "checks": [c.as_dict() for c in checks],
            }
            self.stdout.write(json.dumps(out, indent=2))
        else:
            self.stdout.write(f"data directory  {doctor.settings.OCX_DATA_DIR}")
            self.stdout.write(f"database        {doctor.database_label()}")
            width = max(len(c.name) for c in checks)
            for c in checks:
                self.stdout.write(f"{c.verdict:<4}  {c.name:<{width}}  {c.detail}")
        if failed:
            raise CommandError(f"{len(failed)} check(s) failed", returncode=1)
