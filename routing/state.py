"""Per-combo routing state and its pure transitions (combos-behaviour.md §2.1, PRODUCT.md §5.3).

`ComboState` is an immutable, JSON-serialisable value holding everything a pick of one combo sees:
target cooldowns, half-open probe leases, smooth-WRR weights and stickiness, and least-used
counts. Transitions (`note_success`, `note_failure`, `note_abort`, `clear`) return new values and
ignore target keys that the combo no longer has; `stamped` keeps the writes of requests that
started before a reconfiguration out of the new definition's state. `StateStore` is the
read-modify-write seam (async); `MemoryStateStore` is the in-process implementation and
`state.redis_state.RedisStateStore` the shared one for many workers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol, TypeVar

from routing.types import ComboSpec

T = TypeVar("T")
Update = Callable[["ComboState"], tuple["ComboState", T]]


_EMPTY: Mapping[str, int] = MappingProxyType({})


def _frozen(values: Mapping[str, int] | None = None) -> Mapping[str, int]:
    # Read-only, so every empty mapping can be the same one (built per request otherwise).
    return MappingProxyType(dict(values)) if values else _EMPTY


@dataclass(frozen=True)
class ComboState:
    """Routing state of one combo. All times are epoch milliseconds.

    `cooldowns[key]` is the cooldown end; an entry with `until <= now` marks the target half-open
    (it must be probed before it counts as healthy again) and is removed by a success.
    `probes[key]` is the lease end of the single in-flight half-open probe.
    `current_weights`, `active_key` and `successes` are the round-robin state;
    `success_counts` feeds least-used.
    `spec` and `revision` say which combo definition wrote the state (`ComboSpec.fingerprint`)
    and from which config version (see `stamped`); None / 0 while nothing is recorded.
    """

    cooldowns: Mapping[str, int] = field(default_factory=_frozen)
    probes: Mapping[str, int] = field(default_factory=_frozen)
    current_weights: Mapping[str, int] = field(default_factory=_frozen)
    active_key: str | None = None
    successes: int = 0
    success_counts: Mapping[str, int] = field(default_factory=_frozen)
    spec: str | None = None
    revision: int = 0

    def blank(self) -> bool:
        """True when nothing but `spec` and `revision` is recorded (an empty state)."""
        return not (
            self.cooldowns
            or self.probes
            or self.current_weights
            or self.success_counts
            or self.successes
            or self.active_key is not None
        )

    def cooling_until(self, key: str, now: int) -> int | None:
        """The cooldown end of `key` if it is still cooling at `now`, else None."""
        until = self.cooldowns.get(key)
        return until if until is not None and until > now else None

    def is_half_open(self, key: str, now: int) -> bool:
        """True when `key` had a cooldown that has expired but no probe has succeeded yet."""
        until = self.cooldowns.get(key)
        return until is not None and until <= now

    def probe_held(self, key: str, now: int) -> bool:
        """True when another request holds an unexpired probe lease on `key`."""
        lease = self.probes.get(key)
        return lease is not None and lease > now

    def to_json(self) -> str:
        """Serialise to a compact JSON object (stable key order)."""
        out: dict[str, object] = {
            "cooldowns": dict(self.cooldowns),
            "probes": dict(self.probes),
            "current_weights": dict(self.current_weights),
            "active_key": self.active_key,
            "successes": self.successes,
            "success_counts": dict(self.success_counts),
        }
        if self.spec is not None:
            out["spec"], out["revision"] = self.spec, self.revision
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ComboState:
        """Parse `to_json` output; raises ValueError on anything malformed."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("combo state must be a JSON object")
        active = raw.get("active_key")
        successes = raw.get("successes", 0)
        if active is not None and not isinstance(active, str):
            raise ValueError("active_key must be a string or null")
        if not _is_int(successes):
            raise ValueError("successes must be an integer")
        spec, revision = raw.get("spec"), raw.get("revision", 0)
        if spec is not None and not isinstance(spec, str):
            raise ValueError("spec must be a string or null")
        if not _is_int(revision):
            raise ValueError("revision must be an integer")
        return cls(
            cooldowns=_int_map(raw, "cooldowns"),
            probes=_int_map(raw, "probes"),
            current_weights=_int_map(raw, "current_weights"),
            active_key=active,
            successes=successes,
            success_counts=_int_map(raw, "success_counts"),
            spec=spec,
            revision=revision,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_map(raw: Mapping[str, object], name: str) -> Mapping[str, int]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object")
    out: dict[str, int] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _is_int(item):
            raise ValueError(f"{name} must map strings to integers")
        out[key] = item
    return _frozen(out)


def _keys(combo: ComboSpec) -> frozenset[str]:
    return frozenset(t.key for t in combo.targets)


def _without(values: Mapping[str, int], key: str) -> Mapping[str, int]:
    if key not in values:
        return values
    return _frozen({k: v for k, v in values.items() if k != key})


def _with(values: Mapping[str, int], key: str, value: int) -> Mapping[str, int]:
    out = dict(values)
    out[key] = value
    return _frozen(out)


def reset_target(state: ComboState, key: str) -> ComboState:
    """An operator cleared one target (`ocx combo reset --target`): its cooldown, probe lease,
    round-robin weight and stickiness go; the other targets' state stays."""
    active = None if state.active_key == key else state.active_key
    new = replace(
        state,
        cooldowns=_without(state.cooldowns, key),
        probes=_without(state.probes, key),
        current_weights=_without(state.current_weights, key),
        active_key=active,
        successes=state.successes if active is not None else 0,
    )
    return state if new == state else new


def retain(state: ComboState, combo: ComboSpec) -> ComboState:
    """Drop every entry for target keys the combo no longer has (reconfiguration)."""
    keys = _keys(combo)

    def keep(values: Mapping[str, int]) -> Mapping[str, int]:
        if all(k in keys for k in values):
            return values
        return _frozen({k: v for k, v in values.items() if k in keys})

    active = state.active_key if state.active_key in keys else None
    cooldowns, probes = keep(state.cooldowns), keep(state.probes)
    weights, counts = keep(state.current_weights), keep(state.success_counts)
    successes = state.successes if active is not None else 0
    if (
        # Every request's pick and success retains: nothing dropped is the usual case, and
        # `keep` hands back the very mapping then.
        cooldowns is state.cooldowns
        and probes is state.probes
        and weights is state.current_weights
        and counts is state.success_counts
        and active == state.active_key
        and successes == state.successes
    ):
        return state
    return replace(
        state,
        cooldowns=cooldowns,
        probes=probes,
        current_weights=weights,
        active_key=active,
        successes=successes,
        success_counts=counts,
    )


def stamped(combo: ComboSpec, revision: int, fn: Update[T]) -> Update[T]:
    """`fn` as written by a request routed on `combo`, loaded at config version `revision`.

    A combo change clears its state, but requests still running on the old definition finish
    afterwards. Their writes would apply the old definition to the new state (`retain` with
    the old targets drops the new targets' cooldowns and rotation). So the state records the
    definition and config version that wrote it: a writer whose definition differs from the
    recorded one and whose version is older decides on the state but writes nothing; a
    writer with a newer version starts the state afresh; the same definition, or the same
    version (no version known, as in the reference's own reconfiguration rules, where `retain`
    carries the state over), just applies. An empty state records nothing (and so costs no
    storage)."""
    spec = combo.fingerprint

    def step(state: ComboState) -> tuple[ComboState, T]:
        if state.spec is not None and state.spec != spec:
            if state.revision > revision:
                return state, fn(state)[1]
            if state.revision < revision:
                state = ComboState()
        new, result = fn(state)
        if new.blank():
            return ComboState(), result
        mark = max(state.revision, revision) if state.spec == spec else revision
        if new.spec == spec and new.revision == mark:
            return new, result
        return replace(new, spec=spec, revision=mark), result

    return step


def note_success(state: ComboState, combo: ComboSpec, key: str) -> ComboState:
    """A target served a request: it is healthy again, stickiness counts it, and so does
    least-used (only least-used reads the counts; a strategy change resets the state anyway)."""
    if key not in _keys(combo):
        return state
    state = retain(state, combo)
    active, successes = state.active_key, state.successes
    if active == key:
        successes += 1
        if successes >= combo.sticky_limit:
            active, successes = None, 0
    return replace(
        state,
        cooldowns=_without(state.cooldowns, key),
        probes=_without(state.probes, key),
        active_key=active,
        successes=successes,
        success_counts=(
            _with(state.success_counts, key, state.success_counts.get(key, 0) + 1)
            if combo.strategy == "least-used"
            else state.success_counts
        ),
    )


def note_failure(
    state: ComboState, combo: ComboSpec, key: str, cooldown_until: int | None, now: int
) -> ComboState:
    """A target failed: release stickiness, release its probe lease, and cool it.

    `cooldown_until` None means "no cooldown" (request-local or non-health outcomes); a half-open
    target then stays half-open for the next prober. An existing longer cooldown is never
    shortened. No success is counted.
    """
    if key not in _keys(combo):
        return state
    state = retain(state, combo)
    cooldowns = state.cooldowns
    if cooldown_until is not None:
        current = cooldowns.get(key)
        cooldowns = _with(cooldowns, key, max(cooldown_until, current or cooldown_until))
    # Expired leases of other targets are dropped here too: their probes were lost.
    probes = _frozen({k: v for k, v in state.probes.items() if k != key and v > now})
    released = state.active_key == key
    return replace(
        state,
        cooldowns=cooldowns,
        probes=probes,
        active_key=None if released else state.active_key,
        successes=0 if released else state.successes,
    )


def note_abort(state: ComboState, combo: ComboSpec, key: str, *, probe: bool = False) -> ComboState:
    """A client abort advances nothing: no success, no cooldown, stickiness untouched.

    With `probe=True` (the aborted request held the half-open lease, `Selection.probe`) the lease
    is released so the next request may probe without waiting for the lease to lapse.
    """
    if not probe or key not in _keys(combo):
        return state
    return replace(state, probes=_without(state.probes, key))


def merge(shared: ComboState, local: ComboState) -> ComboState:
    """Fold one worker's state, kept while the shared store was unreachable, into the shared one
    (PRODUCT §2.2): per target the later cooldown end wins, so a cooldown either side set keeps
    holding. The rotation stays the shared one (other workers went on with it) unless the
    shared state is empty (lost, or nothing was ever written). Probe leases stay the shared
    ones: a local lease ends with its request, whose outcome the worker writes itself.
    States of different definitions are not mixed: the newer config version wins whole."""
    if shared.spec != local.spec and shared.spec is not None and local.spec is not None:
        return local if local.revision > shared.revision else shared
    if shared == ComboState():
        return replace(local, probes=_EMPTY)
    cooldowns = dict(shared.cooldowns)
    for key, until in local.cooldowns.items():
        cooldowns[key] = max(until, cooldowns.get(key, until))
    return replace(
        shared,
        cooldowns=_frozen(cooldowns),
        spec=shared.spec if shared.spec is not None else local.spec,
        revision=max(shared.revision, local.revision),
    )


def clear(state: ComboState | None = None) -> ComboState:
    """Forget everything (after a PUT/DELETE of the combo): the empty state."""
    return ComboState()


class StateStore(Protocol):
    """Per-combo state storage with atomic read-modify-write (`MemoryStateStore` in one process,
    `state.redis_state.RedisStateStore` shared by every worker).

    All methods are coroutines so an implementation may do network I/O without blocking the
    event loop. `update(combo_id, fn)` applies the pure `fn(state) -> (new_state, result)`
    atomically and returns `result`; `fn` may be called more than once (optimistic retries), so
    it must not have side effects. Storing the empty `ComboState()` may drop the entry.
    """

    async def get(self, combo_id: str) -> ComboState: ...

    async def update(
        self, combo_id: str, fn: Callable[[ComboState], tuple[ComboState, T]]
    ) -> T: ...

    async def clear(self, combo_id: str) -> None: ...


class MemoryStateStore:
    """Process-local `StateStore` for a single worker.

    No method awaits anything, so each read-modify-write runs to completion without yielding
    to the event loop and is atomic for every task of that loop. It must only be used from one
    event loop (the worker's); it is not shared across threads or processes.
    """

    def __init__(self) -> None:
        self._states: dict[str, ComboState] = {}

    async def get(self, combo_id: str) -> ComboState:
        return self._states.get(combo_id, ComboState())

    async def update(self, combo_id: str, fn: Callable[[ComboState], tuple[ComboState, T]]) -> T:
        new, result = fn(self._states.get(combo_id, ComboState()))
        if new == ComboState():
            self._states.pop(combo_id, None)
        else:
            self._states[combo_id] = new
        return result

    async def clear(self, combo_id: str) -> None:
        self._states.pop(combo_id, None)

    def seed(self, combo_id: str, state: ComboState) -> None:
        """Remember `state` as this combo's (the last shared state a worker saw)."""
        if state == ComboState():
            self._states.pop(combo_id, None)
        else:
            self._states[combo_id] = state

    def peek(self, combo_id: str) -> ComboState:
        """Synchronous `get`, for readers outside the event loop (metrics, status)."""
        return self._states.get(combo_id, ComboState())

    def combo_ids(self) -> list[str]:
        return list(self._states)

    def forget(self, combo_id: str) -> None:
        """Synchronous `clear`, for the runtime swapping in a new config snapshot."""
        self._states.pop(combo_id, None)

    def forget_target(self, combo_id: str, key: str) -> None:
        """Synchronous `reset_target` of one target (an operator's reset)."""
        self.seed(combo_id, reset_target(self.peek(combo_id), key))
