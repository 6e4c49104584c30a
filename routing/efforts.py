"""Reasoning-effort rules shared by the Codex catalog and per-target request shaping.

Implements combos-behaviour.md §5.2 and the ladder part of §6.3. A *ladder* is the list of
efforts a route supports and has three distinct states: ``None`` (unknown), ``()`` (explicitly
no effort control) and a known non-empty tuple. The same at-or-below resolver is used by the
catalog (advertised default) and at dispatch (injected/forced effort), so the two never disagree
(upstream issue #3108).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from routing.types import EFFORTS, ComboSpec

# Top-level request keys that carry effort/thinking controls besides `reasoning.effort`.
_CONTROL_KEYS: tuple[str, ...] = ("reasoning_effort", "thinking_budget", "thinking")
_RANK: dict[str, int] = {effort: index for index, effort in enumerate(EFFORTS)}

LadderMode = Literal["strict", "adaptive"]
Wire = Literal["responses", "chat"]


def effort_rank(effort: str) -> int | None:
    """Position of `effort` in ``low < medium < high < xhigh < max < ultra``; None if unranked.

    `none`, `minimal` and custom strings are outside the order and therefore unranked.
    """
    return _RANK.get(effort)


def resolve_effort(requested: str, ladder: Sequence[str]) -> str | None:
    """Resolve `requested` to a rung of `ladder` ("resolveAtOrBelow", behaviour §5.2).

    An exact member is kept; otherwise the highest ranked rung at or below `requested`;
    otherwise the lowest ranked rung. Returns None when the ladder is empty or has no ranked
    rungs, or when `requested` is unranked and not on the ladder (e.g. `none`, which is never
    silently changed). Examples: `max` on [low, medium, high] → `high`; `high` on [low, medium]
    → `medium`; `max` on [high, max] → `max`; `low` on [high, max] → `high`.
    """
    if requested in ladder:
        return requested
    wanted = effort_rank(requested)
    ranked = sorted(
        ((rank, rung) for rung in ladder if (rank := effort_rank(rung)) is not None),
    )
    if wanted is None or not ranked:
        return None
    at_or_below = [rung for rank, rung in ranked if rank <= wanted]
    return at_or_below[-1] if at_or_below else ranked[0][1]


def combo_ladder(
    member_ladders: Sequence[tuple[str, ...] | None], *, mode: LadderMode | str = "strict"
) -> tuple[str, ...]:
    """The effort ladder a combo advertises: the intersection of its members' ladders (§6.3).

    Unknown (None) ladders are wildcards in both modes. Explicitly empty ladders take part in
    the intersection in `strict` mode (one no-effort member empties the picker) and are left
    out in `adaptive` mode. With no known ladder left the result is ``()``. The order is the
    first counted ladder's order; duplicates are dropped.
    """
    known = [ladder for ladder in member_ladders if ladder is not None]
    if mode == "adaptive":
        known = [ladder for ladder in known if ladder]
    if not known:
        return ()
    result: list[str] = []
    for rung in known[0]:
        if rung not in result and all(rung in other for other in known[1:]):
            result.append(rung)
    return tuple(result)


def default_effort_for(default_effort: str | None, ladder: Sequence[str] | None) -> str | None:
    """The combo's `defaultEffort` resolved on `ladder`, or None.

    None when there is no default, or the ladder is unknown, empty or has no ranked rungs —
    such ladders never receive an injected/advertised default.
    """
    if default_effort is None or not ladder:
        return None
    return resolve_effort(default_effort, ladder)


def picker_default(ladder: Sequence[str], derived: str | None = None) -> str | None:
    """`default_reasoning_level` for a catalog row: `derived` if set, else `medium`, `high`,
    then the first real rung (not `none`) of the ladder; None for an empty ladder."""
    if derived is not None and derived in ladder:
        return derived
    for preferred in ("medium", "high"):
        if preferred in ladder:
            return preferred
    for rung in ladder:
        if rung != "none":
            return rung
    return ladder[0] if ladder else None


@dataclass(frozen=True)
class ShapedReasoning:
    """Outcome of `shape_reasoning`.

    `body`: a new top-level dict (the input is never mutated; nested values other than
    `reasoning` are shared). `effort`: the effort the target will receive (None if none or
    unreadable). `action`: ``kept`` (caller effort sent as is), ``injected`` (default added),
    ``forced`` (caller effort replaced), ``stripped`` (controls removed), ``passthrough``
    (strict unknown ladder, untouched) or ``none`` (no effort either way).
    `skipped_default`: ``"unknown"``/``"unsupported"`` when a configured default could not be
    injected because the ladder is unknown/empty — for a once-per (target, effort) debug log.
    """

    body: dict[str, Any]
    effort: str | None
    action: str
    skipped_default: str | None = None


_ABSENT: Any = object()


def shape_reasoning(
    body: Mapping[str, Any],
    *,
    target_ladder: Sequence[str] | None,
    combo: ComboSpec,
    wire: Wire | str = "responses",
) -> ShapedReasoning:
    """Apply §5.2 effort rules of `combo` to one child request `body` for one target.

    `target_ladder` is the target route's supported ladder (None unknown, () unsupported).
    Empty ladder (any mode) or unknown ladder in adaptive mode: remove `reasoning.effort` and
    the top-level `reasoning_effort`, `thinking_budget`, `thinking`, keep other `reasoning`
    keys such as `summary` (`reasoning: null` stays null; a `reasoning` left empty is removed).
    Unknown ladder in strict mode: untouched. Known ladder: an explicit caller effort is kept
    (fallback) or, if it is one of the six valid efforts, replaced by the default resolved at or
    below on this ladder (force); with no caller effort the resolved default is injected —
    absent/null `reasoning` becomes ``{"effort": rung, "summary": "auto"}``, an existing
    object gets `effort` merged in. `wire="chat"` reads and injects top-level
    `reasoning_effort` instead. Raises ValueError for force mode without a valid default.
    """
    force = combo.default_effort_mode == "force"
    default = combo.default_effort if combo.default_effort in _RANK else None
    if force and default is None:
        raise ValueError("force combo default effort requires a valid defaultEffort")
    out: dict[str, Any] = dict(body)
    reasoning = out.get("reasoning", _ABSENT)
    caller = _caller_effort(out, reasoning, wire)

    unknown = target_ladder is None
    empty = target_ladder is not None and len(target_ladder) == 0
    if empty or (unknown and combo.reasoning_effort_mode == "adaptive"):
        for key in _CONTROL_KEYS:
            out.pop(key, None)
        if isinstance(reasoning, Mapping):
            kept = {k: v for k, v in reasoning.items() if k != "effort"}
            if kept:
                out["reasoning"] = kept
            else:
                del out["reasoning"]
        skipped = _skipped(default, caller, force, "unknown" if unknown else "unsupported")
        return ShapedReasoning(out, None, "stripped", skipped)
    if target_ladder is None:
        skipped = _skipped(default, caller, force, "unknown")
        return ShapedReasoning(out, caller, "passthrough", skipped)

    if caller is not None and not (force and caller in _RANK):
        return ShapedReasoning(out, caller, "kept")
    rung = default_effort_for(default, target_ladder)
    if rung is None:
        return ShapedReasoning(out, caller, "kept" if caller is not None else "none")
    _set_effort(out, reasoning, rung, wire)
    return ShapedReasoning(out, rung, "forced" if caller is not None else "injected")


def _caller_effort(body: Mapping[str, Any], reasoning: Any, wire: str) -> str | None:
    if wire == "chat":
        value = body.get("reasoning_effort")
    else:
        value = reasoning.get("effort") if isinstance(reasoning, Mapping) else None
    return value if isinstance(value, str) else None


def _set_effort(out: dict[str, Any], reasoning: Any, rung: str, wire: str) -> None:
    if wire == "chat":
        out["reasoning_effort"] = rung
    elif isinstance(reasoning, Mapping):
        out["reasoning"] = {**reasoning, "effort": rung}
    else:
        out["reasoning"] = {"effort": rung, "summary": "auto"}


def _skipped(default: str | None, caller: str | None, force: bool, capability: str) -> str | None:
    # A default would have applied (no caller effort, or force) but the ladder prevents it.
    if default is None or (caller is not None and not force):
        return None
    return capability
