"""Argument parsing for `ocx combo …` (combos-behaviour.md §8.4), framework-free.

The management command does the argv plumbing (argparse); these functions turn flag values into
the `PUT /api/combos` body and raise `CliUsageError` with the reference's exact messages. The
server-side rules (grammar, ranges, providers) stay in `routing.validate`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from routing.types import AFTER_COMMIT_MODES, EFFORTS, STRATEGIES

CLEAR = "-"
MSG_ID_REQUIRED = "combo id is required"
MSG_TARGETS_REQUIRED = "--targets is required"
MSG_TARGETS_EMPTY = "--targets requires at least one provider/model"
MSG_STICKY_MAX = "--sticky must be <= 100"
MSG_STICKY_MIN = "--sticky must be an integer >= 1"
MSG_STRATEGY = "--strategy must be one of: " + ", ".join(STRATEGIES)
MSG_EFFORT = "--effort must be one of: " + ", ".join(EFFORTS) + ", or -"
MSG_REMOVE_YES = "remove requires --yes"
MSG_MODE = "mode must be auto or pin <provider/model>"
MSG_RETRY = "--retry-same-target must be ATTEMPTS/MAX_WAIT_MS (e.g. 2/2000) or - (off)"
MSG_AFTER_COMMIT = "--after-commit must be one of: " + ", ".join(AFTER_COMMIT_MODES)
MSG_MAX_CONTINUATIONS = "--max-continuations must be an integer from 1 to 3"
MSG_BUFFER_MAX_BYTES = "--buffer-max-bytes must be an integer (bytes)"

_INT_RE = re.compile(r"-?[0-9]+")
_RETRY_RE = re.compile(r"([0-9]{1,9})/([0-9]{1,9})")
_SUBCOMMANDS = {
    "list": "list",
    "show": "show",
    "set": "set",
    "create": "set",
    "update": "set",
    "remove": "remove",
    "delete": "remove",
    "mode": "mode",
}


class CliUsageError(Exception):
    """A usage error: print `message` as one line and exit non-zero."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def msg_invalid_target(part: str) -> str:
    return f'invalid target "{part}"; use provider/model[:weight]'


def msg_weight(part: str) -> str:
    return f"target weight must be 1-10000: {part}"


def resolve_subcommand(name: str | None) -> str:
    """Canonical subcommand: none -> `list`, `create`/`update` -> `set`, `delete` -> `remove`."""
    if name is None:
        return "list"
    try:
        return _SUBCOMMANDS[name]
    except KeyError:
        raise CliUsageError(f"unknown combo command {name}") from None


def parse_target(part: str) -> dict[str, object]:
    """One `provider/model[:weight]` item (already trimmed); `weight` only when given.

    The weight is split off at the last `:` only when that colon follows the first `/` and the
    suffix is an integer, so `ollama/qwen3:4b` keeps its colon in the model.
    """
    slash = part.find("/")
    if slash < 0:
        raise CliUsageError(msg_invalid_target(part))
    rest = part
    weight: int | None = None
    colon = part.rfind(":")
    if colon > slash and _INT_RE.fullmatch(part[colon + 1 :]):
        weight = int(part[colon + 1 :])
        rest = part[:colon]
    provider = rest[:slash].strip()
    model = rest[slash + 1 :].strip()
    if not provider or not model:
        raise CliUsageError(msg_invalid_target(part))
    if weight is not None and not 1 <= weight <= 10_000:
        raise CliUsageError(msg_weight(part))
    target: dict[str, object] = {"provider": provider, "model": model}
    if weight is not None:
        target["weight"] = weight
    return target


def parse_targets(arg: str | None) -> list[dict[str, object]]:
    """`--targets p/m[:w],…`: split on commas, trim, skip empty items, parse each in order."""
    if arg is None:
        raise CliUsageError(MSG_TARGETS_REQUIRED)
    targets = [parse_target(part.strip()) for part in arg.split(",") if part.strip()]
    if not targets:
        raise CliUsageError(MSG_TARGETS_EMPTY)
    return targets


def parse_sticky(value: str) -> int:
    """`--sticky`: an integer from 1 to 100."""
    text = value.strip()
    if not _INT_RE.fullmatch(text) or int(text) < 1:
        raise CliUsageError(MSG_STICKY_MIN)
    if int(text) > 100:
        raise CliUsageError(MSG_STICKY_MAX)
    return int(text)


def parse_strategy(value: str | None) -> str:
    """`--strategy`, defaulting to `failover`."""
    if value is None:
        return "failover"
    if value not in STRATEGIES:
        raise CliUsageError(MSG_STRATEGY)
    return value


def parse_effort(value: str) -> str | None:
    """`--effort`: a valid effort, or `-` for null (which also clears force mode)."""
    if value == CLEAR:
        return None
    if value not in EFFORTS:
        raise CliUsageError(MSG_EFFORT)
    return value


def parse_clearable(value: str) -> str:
    """`--alias` / `--display-name`: `-` sends an empty string, which clears the field."""
    return "" if value == CLEAR else value


def parse_retry_same_target(value: str) -> dict[str, int] | None:
    """`--retry-same-target ATTEMPTS/MAX_WAIT_MS` -> `retrySameTarget`; `-` turns it off (null).
    The ranges (1-3, 0-10000) are the server's check (`routing.validate`)."""
    text = value.strip()
    if text == CLEAR:
        return None
    match = _RETRY_RE.fullmatch(text)
    if match is None:
        raise CliUsageError(MSG_RETRY)
    return {"attempts": int(match[1]), "maxWaitMs": int(match[2])}


def parse_after_commit(value: str) -> str:
    """`--after-commit`: error, continue or buffer."""
    if value not in AFTER_COMMIT_MODES:
        raise CliUsageError(MSG_AFTER_COMMIT)
    return value


def parse_max_continuations(value: str) -> int:
    """`--max-continuations`: an integer from 1 to 3."""
    text = value.strip()
    if not _INT_RE.fullmatch(text) or not 1 <= int(text) <= 3:
        raise CliUsageError(MSG_MAX_CONTINUATIONS)
    return int(text)


def parse_buffer_max_bytes(value: str) -> int:
    """`--buffer-max-bytes`: an integer; its range is the server's rule (`routing.validate`)."""
    text = value.strip()
    if not _INT_RE.fullmatch(text):
        raise CliUsageError(MSG_BUFFER_MAX_BYTES)
    return int(text)


def require_yes(yes: bool) -> None:
    """`remove` refuses to run without `--yes`."""
    if not yes:
        raise CliUsageError(MSG_REMOVE_YES)


def parse_mode(mode: str, target: str | None = None) -> dict[str, object]:
    """`ocx combo mode <id> auto|pin <provider/model>` -> the `{"override": …}` combo fragment."""
    if mode == "auto" and target is None:
        return {"override": None}
    if mode == "pin" and target:
        parsed = parse_target(target.strip())
        if "weight" in parsed:
            raise CliUsageError(MSG_MODE)
        return {"override": {"target": f"{parsed['provider']}/{parsed['model']}"}}
    raise CliUsageError(MSG_MODE)


def build_set_request(
    combo_id: str | None,
    *,
    targets: str | None,
    strategy: str | None = None,
    sticky: str | None = None,
    effort: str | None = None,
    alias: str | None = None,
    native_alias: bool = False,
    display_name: str | None = None,
    rename_from: str | None = None,
    current: Mapping[str, object] | None = None,
    retry_same_target: str | None = None,
    after_commit: str | None = None,
    max_continuations: str | None = None,
    buffer_max_bytes: str | None = None,
) -> dict[str, object]:
    """The `PUT /api/combos` body `{id, combo, renameFrom?}` of `ocx combo set` (§8.4).

    Flag values are the raw strings (None = flag absent). `--sticky` is sent only for
    round-robin; `--effort -` sends `defaultEffort: null`; `--alias -`/`--display-name -` send
    `""`. `current` is the stored combo read first: its `imageInput: "disabled"` is kept. Other
    omitted fields are left to the server's preserve-on-omit merge (`--retry-same-target`
    left out keeps the stored policy; `-` sends null, off).
    """
    if combo_id is None or not combo_id.strip():
        raise CliUsageError(MSG_ID_REQUIRED)
    combo: dict[str, object] = {"targets": parse_targets(targets)}
    chosen = parse_strategy(strategy)
    combo["strategy"] = chosen
    if sticky is not None:
        limit = parse_sticky(sticky)
        if chosen == "round-robin":
            combo["stickyLimit"] = limit
    if effort is not None:
        combo["defaultEffort"] = parse_effort(effort)
    if alias is not None:
        combo["alias"] = parse_clearable(alias)
    if native_alias:
        combo["nativeAlias"] = True
    if display_name is not None:
        combo["displayName"] = parse_clearable(display_name)
    if retry_same_target is not None:
        combo["retrySameTarget"] = parse_retry_same_target(retry_same_target)
    if current is not None and current.get("imageInput") == "disabled":
        combo["imageInput"] = "disabled"
    # Omitted, these keep the stored value (the server's preserve-on-omit merge).
    if after_commit is not None:
        combo["afterCommit"] = parse_after_commit(after_commit)
    if max_continuations is not None:
        combo["maxContinuations"] = parse_max_continuations(max_continuations)
    if buffer_max_bytes is not None:
        combo["bufferMaxBytes"] = parse_buffer_max_bytes(buffer_max_bytes)
    body: dict[str, object] = {"id": combo_id.strip(), "combo": combo}
    if rename_from is not None:
        body["renameFrom"] = rename_from
    return body
