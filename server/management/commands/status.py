"""`ocx status [combo]`: mode, the target a request would get now, quota windows, transitions."""

from __future__ import annotations

import json
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from combos.status import status_report
from providers.management.base import ExamplesCommand
from server.paths import server_file_read

USAGE = """\
ocx status [COMBO] [--json] [--url URL]
"""
EPILOG = """\
examples:
  ocx status
  ocx status main --json
  ocx status --url http://127.0.0.1:8787      # another port mapping of the same server
With REDIS_URL the live state is read from Redis. Without it, it lives in the server's memory:
ocx status asks the running server (found through server.json in OCX_DATA_DIR, which
`ocx serve` writes; --url names another address) and says where its answer came from.
"""
ASK_TIMEOUT_S = 5.0


class Command(ExamplesCommand):
    help = "Show what each combo would do now and why."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("combo", nargs="?", help="one combo id (default: every combo)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--url", help="the server to ask when there is no REDIS_URL")

    def handle(self, *args: str, **options: Any) -> None:
        combo_id: str | None = options.get("combo")
        if settings.OCX_REDIS_URL:
            # Another process's memory is not the server's: read the shared store.
            report = status_report(combo_id, local=False)
            report["source"] = "redis"
        else:
            report = self._ask_server(combo_id, options.get("url"))
        if combo_id is not None and not report["combos"]:
            raise CommandError(f"unknown combo {combo_id}")
        if options.get("json"):
            self.stdout.write(json.dumps(report, indent=2))
            return
        if report["source"].startswith("server "):
            self.stdout.write(f"Live state from the {report['source']}.")
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

    def _ask_server(self, combo_id: str | None, url: str | None) -> dict[str, Any]:
        """The running server's own `/api/status`; when none answers, this process's
        configured view, with each key variable it lacks called unknown (not missing)."""
        found = server_file_read(settings.OCX_DATA_DIR) or {}
        base = url or found.get("url")
        token = found.get("statusToken") or settings.OCX_ADMIN_TOKEN
        why = "no running server found (no server.json in OCX_DATA_DIR; --url names one)"
        if isinstance(base, str) and base:
            try:
                answer = httpx.get(
                    base.rstrip("/") + "/api/status",
                    params={} if combo_id is None else {"combo": combo_id},
                    headers={"Authorization": f"Bearer {token}", "Host": _host(base)},
                    timeout=ASK_TIMEOUT_S,
                )
            except httpx.HTTPError as exc:
                why = f"the server at {base} did not answer ({type(exc).__name__})"
            else:
                if answer.status_code == 404 and combo_id is not None:
                    raise CommandError(f"unknown combo {combo_id}")
                if answer.status_code == 200:
                    report: dict[str, Any] = answer.json()
                    report["source"] = f"server at {base}"
                    return report
                why = f"the server at {base} answered {answer.status_code}"
        report = status_report(combo_id, local=False, env_visible=False)
        report["source"] = "this command's configured view"
        report["note"] = f"{why}. {report.get('note', '')}".strip()
        return report


def _host(base: str) -> str:
    """The Host header: the URL's own when the server allows it, else a name it allows (the
    server answers only OCX_ALLOWED_HOSTS; this command shares its settings)."""
    host = httpx.URL(base).host
    allowed = [h for h in settings.ALLOWED_HOSTS if h != "*" and not h.startswith(".")]
    if host in settings.ALLOWED_HOSTS or "*" in settings.ALLOWED_HOSTS or not allowed:
        return httpx.URL(base).netloc.decode()
    return allowed[0]
