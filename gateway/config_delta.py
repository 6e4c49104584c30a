"""Apply one config write to a worker's snapshot or key map without reloading the rest.

A `providers.services.Delta` names what a write touched. `read_*` run in a thread (ORM) and
fetch only those rows; `patched_*` run on the worker's loop and return a new map/snapshot that
shares every untouched entry with the old one. A new object each time: caches keyed by the
map's identity (`BudgetGate.window_providers`) see the change.

With 10,000 keys a full key reload costs a worker ~0.4 s of CPU; a key write read this way
costs one indexed query and a copy of the map (`KeyMap`: its indexes find the entries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from accounts import access
from accounts.access import KeyInfo
from combos import selectors
from combos.models import ComboTarget
from providers.models import Provider
from providers.services import Change
from routing.types import ComboSpec, ConfigSnapshot, ProviderSpec

V = TypeVar("V")


@dataclass(frozen=True)
class KeysPatch:
    key_ids: frozenset[int]
    user_ids: frozenset[int]
    # The current entries of those keys and of those users' keys (absent: revoked, deleted,
    # or the user is inactive).
    fresh: Mapping[str, KeyInfo]


@dataclass(frozen=True)
class ConfigPatch:
    base: ConfigSnapshot  # the snapshot the reads were made against
    providers: Mapping[str, ProviderSpec | None]  # None: deleted
    combos: Mapping[str, ComboSpec | None]


def _ids(changes: tuple[Change, ...], kind: str) -> frozenset[int]:
    out = set()
    for k, ident in changes:
        if k == kind and ident.isdigit():
            out.add(int(ident))
    return frozenset(out)


def read_keys(changes: tuple[Change, ...]) -> KeysPatch:
    key_ids, user_ids = _ids(changes, "key"), _ids(changes, "user")
    fresh = access.client_keys_active(
        key_ids=key_ids, user_ids=user_ids, every=False, inactive_users=True
    )
    return KeysPatch(key_ids, user_ids, fresh)


class KeyMap(dict[str, KeyInfo]):
    """The proxy's key map (digest → KeyInfo) with where each key and each user's keys are: a
    write replaces its entries without a pass over the 10,000 others (~2 ms of a worker's loop
    per key write; the copies are the dict's own, ~0.1 ms). The indexes of a map are never
    changed once it serves (a patch copies them), so a map handed out stays consistent."""

    __slots__ = ("by_id", "by_user")

    def __init__(self, entries: Mapping[str, KeyInfo] | None = None) -> None:
        super().__init__(entries or {})
        # A key id has two digests while a rotated key's previous secret is kept.
        by_id: dict[int, set[str]] = {}
        by_user: dict[int, set[str]] = {}
        for digest, info in self.items():
            by_id.setdefault(info.id, set()).add(digest)
            by_user.setdefault(info.user_id, set()).add(digest)
        self.by_id: dict[int, frozenset[str]] = {k: frozenset(d) for k, d in by_id.items()}
        self.by_user: dict[int, frozenset[str]] = {u: frozenset(d) for u, d in by_user.items()}


def _unlist(index: dict[int, frozenset[str]], ident: int, digest: str) -> None:
    left = index.get(ident, frozenset()) - {digest}
    if left:
        index[ident] = left
    else:
        index.pop(ident, None)


def patched_keys(keys: Mapping[str, KeyInfo], patch: KeysPatch) -> KeyMap:
    """`keys` without every entry of the touched keys and users, plus their current ones (a
    key's digest never changes, but this holds for a replaced row too)."""
    base = keys if isinstance(keys, KeyMap) else KeyMap(keys)
    out = KeyMap()
    out.update(base)
    by_id, by_user = dict(base.by_id), dict(base.by_user)

    def drop(digest: str) -> None:
        info = out.pop(digest, None)
        if info is not None:
            _unlist(by_id, info.id, digest)
            _unlist(by_user, info.user_id, digest)

    for key_id in patch.key_ids:
        # Every secret of the key: a revoked or rotated key keeps no stale previous one.
        for digest in by_id.get(key_id, frozenset()):
            drop(digest)
    for user_id in patch.user_ids:
        for digest in by_user.get(user_id, frozenset()):
            drop(digest)
    for digest, info in patch.fresh.items():
        drop(digest)
        out[digest] = info
        by_id[info.id] = by_id.get(info.id, frozenset()) | {digest}
        by_user[info.user_id] = by_user.get(info.user_id, frozenset()) | {digest}
    out.by_id, out.by_user = by_id, by_user
    return out


def read_config(base: ConfigSnapshot, changes: tuple[Change, ...]) -> ConfigPatch:
    """The written providers and combos as stored now. A provider write also re-reads every
    combo over it, in the snapshot served (a deleted provider's targets are gone from the
    database) and as stored (a renamed provider's new name)."""
    names = {ident for kind, ident in changes if kind == "provider"}
    combo_ids = {ident for kind, ident in changes if kind == "combo"}
    if names:
        combo_ids.update(
            c.id for c in base.combos.values() if any(t.provider in names for t in c.targets)
        )
    providers: dict[str, ProviderSpec | None] = dict.fromkeys(names)
    if names:
        for p in Provider.objects.filter(name__in=names).prefetch_related("models"):
            providers[p.name] = selectors.provider_spec(p)
        # A provider write: also the combos over it as stored now (a renamed provider's).
        combo_ids.update(
            ComboTarget.objects.filter(provider__name__in=names).values_list(
                "combo__combo_id", flat=True
            )
        )
    combos: dict[str, ComboSpec | None] = dict.fromkeys(combo_ids)
    for c, targets in selectors.combos_with_targets(combo_ids):
        combos[c.combo_id] = selectors.combo_spec(c, targets)
    return ConfigPatch(base, providers, combos)


def patched_snapshot(patch: ConfigPatch, version: int) -> ConfigSnapshot:
    """The base snapshot at `version` with the patch's entries replaced (in place: the order
    of the others is kept), added or removed."""
    base = patch.base
    return ConfigSnapshot(
        version=version,
        providers=MappingProxyType(_replaced(base.providers, patch.providers)),
        combos=MappingProxyType(_replaced(base.combos, patch.combos)),
        disabled_models=base.disabled_models,
    )


def _replaced(old: Mapping[str, V], new: Mapping[str, V | None]) -> dict[str, V]:
    out = dict(old)
    for name, value in new.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out
