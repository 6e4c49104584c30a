"""Compaction recall: which combo a bare model name meant on a conversation lane.

Implements combos-behaviour.md §7 and PRODUCT §5.7. A client that switched to a combo and then
compacts with a *bare* model name (usually the upstream model the last response reported) is
routed back to the combo that last completed on that lane. Entries are keyed by (client key,
lane) so two API keys never share state, and the whole store is bounded: 256 lanes, 30 minutes,
1 KiB per name, 64 KiB of names in total. The class is pure: time is always passed in.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from routing.types import ConfigSnapshot

MAX_LANES = 256
TTL_MS = 30 * 60_000
MAX_NAME_BYTES = 1024
MAX_TOTAL_BYTES = 64 * 1024

# Session identity headers in precedence order (names compared lower-case, `_` as `-`).
LANE_HEADERS: tuple[str, ...] = ("session-id", "thread-id", "x-session-id", "conversation-id")
_LANE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

# (combo id, target key or None) -> still routable? Used to drop entries gone stale by config.
Liveness = Callable[[str, str | None], bool]


@dataclass(frozen=True)
class RecallEntry:
    combo_id: str
    name: str
    size: int  # UTF-8 bytes of `name`
    at: int  # epoch ms of the completed response
    target: str | None = None


def lane_of(headers: Mapping[str, str], body: Mapping[str, Any] | None = None) -> str | None:
    """The session lane of a request, or None when there is no usable one (recall unused).

    The first usable value of the `session_id` / `session-id`, `thread-id`, `x-session-id`,
    `conversation_id` headers (Codex sends `session_id`; older builds `conversation_id`), else
    the body's `prompt_cache_key` (Codex sets it equal to `session_id`). A value is trimmed and
    must be 1..128 characters: a letter or digit, then `[A-Za-z0-9._:-]`. Header names are
    matched case-insensitively with `_` and `-` treated alike (Django folds them anyway).
    """
    normalized = {name.lower().replace("_", "-"): value for name, value in headers.items()}
    candidates: list[object] = [normalized.get(name) for name in LANE_HEADERS]
    if body is not None:
        candidates.append(body.get("prompt_cache_key"))
    for value in candidates:
        if isinstance(value, str) and _LANE_RE.fullmatch(value.strip()):
            return value.strip()
    return None


def name_size(name: str, limit: int = MAX_NAME_BYTES) -> int | None:
    """UTF-8 size of `name`, or None when it exceeds `limit` bytes (length checked first)."""
    if len(name) > limit:
        return None
    size = len(name.encode("utf-8"))
    return size if size <= limit else None


def snapshot_liveness(snapshot: ConfigSnapshot) -> Liveness:
    """A `Liveness` for `recall`: the combo exists and, when a target was remembered, still
    lists it and its provider exists and is enabled."""

    def live(combo_id: str, target: str | None) -> bool:
        combo = snapshot.combos.get(combo_id)
        if combo is None:
            return False
        if target is None:
            return True
        match = next((t for t in combo.targets if t.key == target), None)
        if match is None:
            return False
        provider = snapshot.providers.get(match.provider)
        return provider is not None and not provider.disabled

    return live


class RecallStore:
    """Bounded in-process recall store keyed by (client key id, lane).

    Not thread-safe; use it from one event loop or wrap it in a lock. State is lost on restart
    and holds no credentials. Insertion order is recency: a `remember` moves the lane to the
    newest position and eviction drops the oldest first.
    """

    def __init__(
        self,
        *,
        max_lanes: int = MAX_LANES,
        ttl_ms: int = TTL_MS,
        max_name_bytes: int = MAX_NAME_BYTES,
        max_total_bytes: int = MAX_TOTAL_BYTES,
    ) -> None:
        self.max_lanes = max_lanes
        self.ttl_ms = ttl_ms
        self.max_name_bytes = max_name_bytes
        self.max_total_bytes = max_total_bytes
        self._entries: OrderedDict[tuple[str, str], RecallEntry] = OrderedDict()
        self._total = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        """UTF-8 bytes of all retained names."""
        return self._total

    def remember(
        self,
        key_id: str,
        lane: str | None,
        name: str,
        combo_id: str,
        *,
        now: int,
        target: str | None = None,
    ) -> bool:
        """Record that `name` meant `combo_id` on this lane; True when stored.

        Call only after a **successfully completed** combo response (never for failed,
        incomplete or cancelled ones, nor when the config changed since the request started),
        with `name` = the model the response reported and `target` = the served
        "provider/model". Skipped (False, previous entry untouched): no lane, no combo id, a
        whitespace-only name, or a name over 1 KiB of UTF-8 (PRODUCT §5.7: an oversized name
        leaves the previous selection untouched). Otherwise the lane's entry is replaced and
        becomes newest, then the oldest entries are evicted until at most 256 lanes and 64 KiB
        of names remain.
        """
        if not lane or not combo_id or not name.strip():
            return False
        size = name_size(name, self.max_name_bytes)
        if size is None:
            return False
        key = (key_id, lane)
        self._drop(key)
        self._entries[key] = RecallEntry(combo_id, name, size, now, target)
        self._total += size
        while self._entries and (
            len(self._entries) > self.max_lanes or self._total > self.max_total_bytes
        ):
            self._drop(next(iter(self._entries)))
        return True

    def recall(
        self,
        key_id: str,
        lane: str | None,
        name: str,
        *,
        now: int,
        live: Liveness | None = None,
    ) -> str | None:
        """The combo id a bare `name` meant on this lane, or None.

        Call only when `name` did not resolve through explicit selectors or aliases (those
        always win) and before bare-native/default routing; the result goes through normal
        combo selection, not a pin. None for no lane, an empty name or one containing `/`.
        An entry aged 30 minutes or more, or one that `live` (see `snapshot_liveness`) rejects,
        is deleted. Returns the combo id only when the remembered name equals `name` exactly.
        """
        if not lane or not name or "/" in name:
            return None
        key = (key_id, lane)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now - entry.at >= self.ttl_ms or (
            live is not None and not live(entry.combo_id, entry.target)
        ):
            self._drop(key)
            return None
        return entry.combo_id if entry.name == name else None

    def sweep(self, *, now: int) -> int:
        """Delete every entry aged `ttl_ms` or more; returns how many were removed."""
        expired = [k for k, e in self._entries.items() if now - e.at >= self.ttl_ms]
        for key in expired:
            self._drop(key)
        return len(expired)

    def forget(self, key_id: str, lane: str) -> None:
        """Delete the entry of one lane, if any."""
        self._drop((key_id, lane))

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._total -= entry.size
