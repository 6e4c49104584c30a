"""`ocx combo list|show|set|remove|mode` (combos-behaviour.md §8.4)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from combos import selectors, services
from combos.cli_parse import CliUsageError, build_set_request
from providers.errors import ConfigError
from providers.management.base import ExamplesCommand
from routing import validate
from routing.types import ComboSpec

ALIASES = {"create": "set", "update": "set", "delete": "remove"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


def _set_parser() -> _Parser:
    p = _Parser(prog="ocx combo set", add_help=False)
    p.add_argument("id", nargs="?")
    p.add_argument("--targets")
    p.add_argument("--strategy")
    p.add_argument("--sticky")
    p.add_argument("--effort")
    p.add_argument("--alias")
    p.add_argument("--native-alias", action="store_true")
    p.add_argument("--display-name")
    p.add_argument("--rename-from")
    p.add_argument("--retry-same-target")
    p.add_argument("--after-commit")
    p.add_argument("--max-continuations")
    p.add_argument("--buffer-max-bytes")
    p.add_argument("--json", action="store_true")
    return p


USAGE = """\
ocx combo list [--json]
       ocx combo show ID [--json]
       ocx combo set ID --targets PROVIDER/MODEL[:WEIGHT],... [--strategy S] [--sticky N]
                        [--effort E|-] [--alias A|-] [--native-alias] [--display-name D|-]
                        [--retry-same-target ATTEMPTS/MAX_WAIT_MS|-] [--rename-from OLD]
                        [--after-commit error|continue|buffer]
                        [--max-continuations 1-3] [--buffer-max-bytes N] [--json]
       ocx combo remove ID --yes
       ocx combo mode ID auto|pin PROVIDER/MODEL
       ocx combo reset ID [--target PROVIDER/MODEL]
       (create/update = set, delete = remove; the same under `ocx route combo`)
"""
EPILOG = """\
strategies: failover (default), round-robin (--sticky N requests per target), random,
least-used, reset-window. Efforts: none, minimal, low, medium, high, xhigh; `-` clears a value.

examples:
  ocx combo set main --targets openai/gpt-5.2,anthropic/claude-sonnet-4-5
  ocx combo set spread --targets a/m:3,b/m:1 --strategy round-robin --sticky 5
  ocx combo set main --alias gpt-5.6-team --native-alias --display-name "Team model"
  ocx combo set main --targets a/m,b/m --retry-same-target 2/2000   # retry a 429/5xx twice
  ocx combo set main --targets a/m,b/m --after-commit continue --max-continuations 2
  ocx combo show main --json
  ocx combo mode main pin anthropic/claude-sonnet-4-5     # ocx combo mode main auto to undo
  ocx combo remove old --yes
  ocx combo reset main                       # clear every cooldown, probe and rotation of main
  ocx combo reset main --target openai/gpt-5.5   # ... of that target only
Clients use the combo as the model `combo/ID` (or its alias).
"""


class Command(ExamplesCommand):
    help = "List, show, create/update, remove combos, and set their override mode."

    usage_line = USAGE
    examples = EPILOG

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        argv = list(args)
        sub = ALIASES.get(argv[0], argv[0]) if argv else "list"
        rest = argv[1:]
        try:
            if sub == "list":
                self._list(rest)
            elif sub == "show":
                self._show(rest)
            elif sub == "set":
                self._set(rest)
            elif sub == "remove":
                self._remove(rest)
            elif sub == "mode":
                self._mode(rest)
            elif sub == "reset":
                self._reset(rest)
            else:
                raise CommandError(f"unknown combo command {sub}")
        except ConfigError as exc:
            raise CommandError(exc.message) from None
        except CliUsageError as exc:
            raise CommandError(str(exc)) from None

    def _print_json(self, obj: object) -> None:
        self.stdout.write(json.dumps(obj, indent=2, sort_keys=False))

    def _list(self, rest: list[str]) -> None:
        as_json = rest == ["--json"]
        if rest and not as_json:
            raise CommandError(f"unexpected argument {rest[0]}")
        combos = selectors.combo_list()
        if as_json:
            self._print_json(
                {
                    "combos": [
                        {"id": c.id, "model": c.public_id, **validate.combo_to_api(c)}
                        for c in combos
                    ]
                }
            )
        elif not combos:
            self.stdout.write("No combos configured.")
        else:
            for c in combos:
                self.stdout.write(f"{c.id}  {c.public_id}")

    def _show(self, rest: list[str]) -> None:
        as_json = "--json" in rest
        ids = [a for a in rest if a != "--json"]
        if len(ids) != 1:
            raise CommandError(
                "combo id is required" if not ids else f"unexpected argument {ids[1]}"
            )
        spec = selectors.combo_get(ids[0])
        if spec is None:
            raise CommandError(f"unknown combo {ids[0]}")
        if as_json:
            self._print_json(
                {"id": spec.id, "model": spec.public_id, **validate.combo_to_api(spec)}
            )
            return
        self.stdout.write(_describe(spec))

    def _set(self, rest: list[str]) -> None:
        ns, extra = _set_parser().parse_known_args(rest)
        if extra:
            raise CommandError(f"unexpected argument {extra[0]}")
        current = selectors.combo_get(ns.rename_from or ns.id) if ns.id else None
        body = build_set_request(
            ns.id,
            targets=ns.targets,
            strategy=ns.strategy,
            sticky=ns.sticky,
            effort=ns.effort,
            alias=ns.alias,
            native_alias=ns.native_alias,
            display_name=ns.display_name,
            rename_from=ns.rename_from,
            current=None if current is None else validate.combo_to_api(current),
            retry_same_target=ns.retry_same_target,
            after_commit=ns.after_commit,
            max_continuations=ns.max_continuations,
            buffer_max_bytes=ns.buffer_max_bytes,
        )
        combo = body["combo"]
        assert isinstance(combo, dict)
        if current is not None:
            # A flag left out keeps the stored value (`-` is how the CLI clears one).
            kept = {
                "defaultEffort": current.default_effort,
                "alias": current.alias,
                "displayName": current.display_name,
                "nativeAlias": current.native_alias or None,
            }
            for field, value in kept.items():
                if field not in combo and value is not None:
                    combo[field] = value
        spec = services.combo_set(
            combo_id=body["id"], raw=combo, rename_from=body.get("renameFrom")
        )
        warnings = selectors.combo_warnings(spec.id)
        if ns.json:
            self._print_json(
                {
                    "success": True,
                    "id": spec.id,
                    "model": spec.public_id,
                    "combo": validate.combo_to_sparse(spec),
                    "warnings": warnings,
                }
            )
        else:
            self.stdout.write(f"Saved combo {spec.id}.")
        for note in warnings:
            self.stderr.write(f"warning: {note}")

    def _remove(self, rest: list[str]) -> None:
        as_json = "--json" in rest
        yes = "--yes" in rest
        ids = [a for a in rest if a not in ("--json", "--yes")]
        if not ids:
            raise CommandError("combo id is required")
        if len(ids) > 1 or any(a.startswith("--") for a in ids):
            raise CommandError(f"unexpected argument {ids[-1]}")
        if not yes:
            raise CommandError("remove requires --yes")
        services.combo_delete(combo_id=ids[0])
        if as_json:
            self._print_json({"success": True, "id": ids[0]})
        else:
            self.stdout.write(f"Removed combo {ids[0]}.")

    def _reset(self, rest: list[str]) -> None:
        p = _Parser(prog="ocx combo reset", add_help=False)
        p.add_argument("id")
        p.add_argument("--target")
        ns = p.parse_args(rest)
        spec = services.combo_reset(combo_id=ns.id, target=ns.target)
        what = f"target {ns.target} of combo {spec.id}" if ns.target else f"combo {spec.id}"
        self.stdout.write(f"Cleared the routing state (cooldowns, probes, rotation) of {what}.")
        if not settings.OCX_REDIS_URL:
            self.stdout.write("The running server applies it at its next config poll.")

    def _mode(self, rest: list[str]) -> None:
        if len(rest) == 2 and rest[1] == "auto":
            spec = services.combo_set_override(combo_id=rest[0], target=None)
            self.stdout.write(f"Combo {spec.id} is automatic.")
        elif len(rest) == 3 and rest[1] == "pin":
            spec = services.combo_set_override(combo_id=rest[0], target=rest[2].strip())
            self.stdout.write(f"Combo {spec.id} is pinned to {spec.override}.")
        else:
            raise CommandError("usage: ocx combo mode <id> auto|pin <provider/model>")


def _describe(spec: ComboSpec) -> str:
    lines = [
        f"{spec.id}  {spec.public_id}",
        f"  strategy: {spec.strategy}"
        + (f" (sticky {spec.sticky_limit})" if spec.strategy == "round-robin" else ""),
        f"  mode: {'pin ' + spec.override if spec.override else 'auto'}",
    ]
    if spec.display_name:
        lines.append(f"  display name: {spec.display_name}")
    if spec.default_effort:
        lines.append(f"  default effort: {spec.default_effort} ({spec.default_effort_mode})")
    retry = spec.retry_same_target
    lines.append(
        "  retry same target: "
        + (
            f"up to {retry.attempts} time(s), waiting at most {retry.max_wait_ms} ms"
            if retry is not None
            else "off"
        )
    )
    lines.append(f"  after commit: {_after_commit(spec)}")
    for i, t in enumerate(spec.targets, 1):
        flags = " last-resort" if t.last_resort else ""
        lines.append(f"  {i}. {t.key} weight {t.weight}{flags}")
    return "\n".join(lines)


def _after_commit(spec: ComboSpec) -> str:
    """What a stream that breaks after its first output gets (`routing.rescue`)."""
    if spec.after_commit == "continue":
        return f"continue (up to {spec.max_continuations} continuation(s) on prefill targets)"
    if spec.after_commit == "buffer":
        return f"buffer (answers up to {spec.buffer_max_bytes} bytes held until complete)"
    return "error (an explicit error ends the stream)"
