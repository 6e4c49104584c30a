"""Quota tracking per (provider, credential fingerprint), shared through a JSON store.

One record per credential holds its `CredentialQuota` state and the latest windows seen.
The proxy asks `eligibility` before routing (one read per credential, skipped entirely while
nothing was ever limited), takes a probe lease atomically, and folds every response's windows
in after the attempt. Transitions are handed to `on_transition`, which the Django side turns
into stored events, logs and WebSocket pushes off the hot path. No Django here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

from quota import windows as qw

T = TypeVar("T")
Pair = tuple[str, str]  # (provider, credential fingerprint)
PROBE_LEASE_MS = 120_000

Update = Callable[[dict[str, Any] | None], tuple[dict[str, Any] | None, T]]


class JsonStore(Protocol):
    """An async key → JSON object store with atomic read-modify-write."""

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]: ...

    async def update(self, key: str, fn: Update[T]) -> T: ...

    async def keys(self) -> list[str]: ...


class MemoryJsonStore:
    """Per-process store: an update has no await inside, so it is atomic on one event loop."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, Any]] = {}

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        return [self.data.get(k) for k in keys]

    async def update(self, key: str, fn: Update[T]) -> T:
        new, result = fn(self.data.get(key))
        if new is None:
            self.data.pop(key, None)
        else:
            self.data[key] = new
        return result

    async def keys(self) -> list[str]:
        return list(self.data)


@dataclass(frozen=True)
class Record:
    state: qw.CredentialQuota
    windows: tuple[qw.Window, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.to_json(), "windows": [w.to_json() for w in self.windows]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        return cls(
            state=qw.CredentialQuota.from_json(data["state"]),
            windows=tuple(qw.Window.from_json(w) for w in data.get("windows") or ()),
        )


def _key(pair: Pair) -> str:
    return f"quota:{pair[0]}:{pair[1]}"


def _load(pair: Pair, raw: Mapping[str, Any] | None) -> Record:
    if raw is None:
        return Record(qw.CredentialQuota(provider=pair[0], credential=pair[1]))
    try:
        return Record.from_json(raw)
    except (KeyError, ValueError, TypeError):
        return Record(qw.CredentialQuota(provider=pair[0], credential=pair[1]))


Verdict = Literal["eligible", "ineligible", "probe"]
TransitionSink = Callable[[str, str, qw.Transition], Awaitable[None] | None]


@dataclass
class Gate:
    """The quota view of one request: verdict per credential and the probes it holds."""

    verdicts: dict[Pair, Verdict] = field(default_factory=dict)
    probes: set[Pair] = field(default_factory=set)
    resets: dict[Pair, int | None] = field(default_factory=dict)
    # When a limited credential may be tried again (a probing one: its lease end).
    recovery: dict[Pair, int | None] = field(default_factory=dict)
    # The raw values of the names read along (`gate(along=…)`), or None when not read.
    along: list[bytes | None] | None = None
    # A probe lease was taken after the read (a round trip later): a value read along is
    # older than a read at the pick would be.
    leased: bool = False

    def reason(self, pair: Pair | None) -> str | None:
        if pair is None:
            return None
        verdict = self.verdicts.get(pair, "eligible")
        if verdict == "eligible" or pair in self.probes:
            return None
        return "quota_exhausted" if verdict == "ineligible" else "quota_probing"


class QuotaTracker:
    def __init__(
        self,
        store: JsonStore,
        *,
        on_transition: TransitionSink | None = None,
        on_windows: Callable[[Pair, list[qw.Window]], None] | None = None,
    ) -> None:
        self.store = store
        self.on_transition = on_transition
        self.on_windows = on_windows
        # Credentials this process has seen with quota data; with none, the gate costs nothing.
        self.known: set[Pair] = set()

    async def gate(
        self, pairs: Iterable[Pair], *, now: int, shared: bool, along: Sequence[str] = ()
    ) -> Gate:
        """Read the credentials of one request's candidate targets and take probe leases.

        `shared` (a Redis store) always reads, since another worker may have seen the limit.
        `along`: Redis names other stores of the request read, fetched in the same round
        trip when the store can (`get_many_along`), even with no credential to read; their
        values land in `Gate.along`."""
        gate = Gate()
        wanted = sorted(set(pairs))
        if not shared:
            wanted = [p for p in wanted if p in self.known]
        read_along = getattr(self.store, "get_many_along", None) if along else None
        if not wanted and read_along is None:
            return gate
        keys = [_key(p) for p in wanted]
        if read_along is not None:
            raws, gate.along = await read_along(keys, along)
        else:
            raws = await self.store.get_many(keys)
        for pair, raw in zip(wanted, raws, strict=True):
            if raw is None:
                continue
            # Known from now on: this worker must fold the outcome in, even without windows.
            self.known.add(pair)
            record = _load(pair, raw)
            gate.resets[pair] = qw.soonest_reset(record.windows, now=now)
            gate.recovery[pair] = qw.next_change_at(record.state)
            verdict: Verdict = qw.eligibility(record.state, now=now)
            gate.verdicts[pair] = verdict
            if verdict == "probe":
                gate.leased = True
                if await self._acquire(pair, now=now):
                    gate.probes.add(pair)
        return gate

    async def _acquire(self, pair: Pair, *, now: int) -> bool:
        def step(raw: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
            record = _load(pair, raw)
            state, granted = qw.acquire_probe(record.state, now=now, lease_ms=PROBE_LEASE_MS)
            if not granted or state == record.state:
                return raw, granted and qw.eligibility(record.state, now=now) == "eligible"
            return Record(state, record.windows).to_json(), True

        return await self.store.update(_key(pair), step)

    async def release(self, pair: Pair, *, now: int) -> None:
        """Give back an unused probe lease (the request went elsewhere)."""

        def step(raw: dict[str, Any] | None) -> tuple[dict[str, Any] | None, None]:
            record = _load(pair, raw)
            if record.state.status != "probing":
                return raw, None
            state = qw.CredentialQuota(
                provider=record.state.provider,
                credential=record.state.credential,
                status="limited",
                exhausted=record.state.exhausted,
                hold_until_ms=record.state.hold_until_ms,
                probe_lease_until_ms=None,
                last_transition=record.state.last_transition,
            )
            return Record(state, record.windows).to_json(), None

        await self.store.update(_key(pair), step)

    async def ingest(
        self,
        pair: Pair,
        windows: list[qw.Window],
        *,
        outcome: Literal["success", "failure"],
        now: int,
    ) -> qw.Transition | None:
        """Fold one attempt's windows and outcome into the credential's state."""
        if not windows and pair not in self.known:
            return None

        def step(raw: dict[str, Any] | None) -> tuple[dict[str, Any] | None, qw.Transition | None]:
            record = _load(pair, raw)
            if outcome == "success":
                state, transition = qw.observe_success(record.state, windows, now=now)
            else:
                state, transition = qw.observe_failure(record.state, windows, now=now)
            kept = _merge_windows(record.windows, windows)
            new = Record(state, kept)
            if raw is not None and new == record:
                return raw, None
            return new.to_json(), transition

        transition = await self.store.update(_key(pair), step)
        self.known.add(pair)
        if windows and self.on_windows is not None:
            self.on_windows(pair, windows)
        if transition is not None and self.on_transition is not None:
            maybe = self.on_transition(pair[0], pair[1], transition)
            if maybe is not None:
                await maybe
        return transition

    async def records(self) -> dict[Pair, Record]:
        keys = [k for k in await self.store.keys() if k.startswith("quota:")]
        raws = await self.store.get_many(keys)
        out: dict[Pair, Record] = {}
        for key, raw in zip(keys, raws, strict=True):
            _, provider, credential = key.split(":", 2)
            if raw is not None:
                out[(provider, credential)] = _load((provider, credential), raw)
        return out


def merge_records(
    shared: Mapping[str, Any] | None, local: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Fold one worker's quota record, kept while the shared store was unreachable, into the
    shared one: the state whose last transition is later wins (a limit either side saw keeps
    holding until its reset; on a tie, the later `hold_until_ms`), and per window the latest
    observation. Probe leases are not carried over (they end with their requests)."""
    if local is None:
        return None if shared is None else dict(shared)
    try:
        mine = Record.from_json(local)
    except (KeyError, ValueError, TypeError):
        return None if shared is None else dict(shared)
    if shared is None:
        theirs = None
    else:
        try:
            theirs = Record.from_json(shared)
        except (KeyError, ValueError, TypeError):
            theirs = None
    if theirs is None:
        return Record(replace(mine.state, probe_lease_until_ms=None), mine.windows).to_json()

    def rank(record: Record) -> tuple[int, int]:
        at = record.state.last_transition.at_ms if record.state.last_transition else -1
        return at, record.state.hold_until_ms or -1

    state = mine.state if rank(mine) > rank(theirs) else theirs.state
    if state is mine.state:
        state = replace(state, probe_lease_until_ms=theirs.state.probe_lease_until_ms)
    latest: dict[tuple[str, str, str, str], qw.Window] = {}
    for w in (*theirs.windows, *mine.windows):
        key = (w.source, w.limit_id, w.name, w.scope)
        if key not in latest or w.observed_at_ms > latest[key].observed_at_ms:
            latest[key] = w
    return Record(state, tuple(latest.values())).to_json()


def _merge_windows(old: Iterable[qw.Window], new: Iterable[qw.Window]) -> tuple[qw.Window, ...]:
    """Latest window per (source, limit, name, scope)."""
    merged: dict[tuple[str, str, str, str], qw.Window] = {}
    for w in (*old, *new):
        merged[(w.source, w.limit_id, w.name, w.scope)] = w
    return tuple(merged.values())
