"""The live routing state as status, badges and `ocx status` read it (PRODUCT §8.6).

A `LiveSnapshot` holds the combo states (cooldowns, probe leases, rotation) and the quota
records, read once from the stores the server itself routes with: with `REDIS_URL` the shared
`RedisStateStore` and quota `RedisJsonStore`, otherwise the serving process's own memory
stores. The composition root (`ocxsite`) registers the loader, since only it knows the
runtime; an app reads through `load`.

A process that is not the server (the CLI) without `REDIS_URL` cannot see a server's
in-process state: `load(..., local=False)` then returns `NO_LIVE_STATE` (source "none"), and
callers say so instead of showing this process's own empty state as the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from quota.tracker import JsonStore, Record
from routing.state import ComboState, StateStore

Pair = tuple[str, str]  # (provider, credential fingerprint)
Source = Literal["redis", "this process", "this worker", "none", "redis unreachable"]
_QUOTA_PREFIX = "quota:"


def _empty() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True)
class LiveSnapshot:
    """`states[combo_id]`, `records[(provider, credential)]`, and `reasons[combo_id][target]`:
    the classification of the target's current cooldown when the request log knows it."""

    source: Source
    states: Mapping[str, ComboState] = field(default_factory=_empty)  # type: ignore[arg-type]
    records: Mapping[Pair, Record] = field(default_factory=_empty)  # type: ignore[arg-type]
    reasons: Mapping[str, Mapping[str, str]] = field(default_factory=_empty)  # type: ignore[arg-type]

    def combo_state(self, combo_id: str) -> ComboState:
        return self.states.get(combo_id) or ComboState()


NO_LIVE_STATE = LiveSnapshot("none")
REDIS_UNREACHABLE = LiveSnapshot("redis unreachable")


async def read(
    store: StateStore, quota: JsonStore, combo_ids: Collection[str], *, source: Source
) -> LiveSnapshot:
    """Read the states of `combo_ids` and every quota record through the store interfaces."""
    states = {combo_id: await store.get(combo_id) for combo_id in combo_ids}
    keys = sorted(k for k in await quota.keys() if k.startswith(_QUOTA_PREFIX))
    records: dict[Pair, Record] = {}
    for key, raw in zip(keys, await quota.get_many(keys), strict=True):
        if raw is None:
            continue
        provider, _, credential = key[len(_QUOTA_PREFIX) :].partition(":")
        try:
            records[(provider, credential)] = Record.from_json(raw)
        except (KeyError, ValueError, TypeError):
            continue
    return LiveSnapshot(source, MappingProxyType(states), MappingProxyType(records))


# (combo ids, local, reasons) -> snapshot; `local` False: never this process's own memory
# stores; `reasons` False: skip looking up the cooldowns' classifications.
Loader = Callable[[Collection[str], bool, bool], LiveSnapshot]
_loader: Loader | None = None


def register(loader: Loader) -> None:
    """Set by the composition root at startup (`ocxsite.apps`)."""
    global _loader
    _loader = loader


def load(combo_ids: Collection[str], *, local: bool = True, reasons: bool = True) -> LiveSnapshot:
    """The live state of `combo_ids` and all quota records (see the module doc)."""
    if _loader is None:
        return NO_LIVE_STATE
    return _loader(combo_ids, local, reasons)
