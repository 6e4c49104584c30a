"""The attempt loop on its own: which targets are dispatched, what the state store is asked to
write, and what a request leaves behind (pure core; injected clock, sleep and store)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from routing.attempts import Outcome, RouteResult, route
from routing.classify import Failure
from routing.state import ComboState, MemoryStateStore
from routing.types import ComboSpec, ProviderSpec, TargetSpec

T = TypeVar("T")
A, B, C = TargetSpec("pa", "ma"), TargetSpec("pb", "mb"), TargetSpec("pc", "mc")
PROVIDERS = {
    name: ProviderSpec(name=name, adapter="openai-chat", base_url=f"http://{name}.test/v1")
    for name in ("pa", "pb", "pc")
}
NOW = 1_000_000


class CountingStore(MemoryStateStore):
    """The in-process store, counting the read-modify-writes the loop asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.updates = 0

    async def update(self, combo_id: str, fn: Callable[[ComboState], tuple[ComboState, T]]) -> T:
        self.updates += 1
        return await super().update(combo_id, fn)


def combo(strategy: str = "failover", **kw: Any) -> ComboSpec:
    return ComboSpec(id="main", targets=(A, B), strategy=strategy, **kw)


def run(
    spec: ComboSpec,
    store: CountingStore,
    outcomes: dict[str, list[Outcome | type[BaseException]]],
    *,
    now: int = NOW,
    revision: int = 0,
) -> tuple[RouteResult, list[str]]:
    dispatched: list[str] = []

    async def dispatch(target: TargetSpec, _last: bool) -> Outcome:
        dispatched.append(target.key)
        step = outcomes[target.key].pop(0)
        if isinstance(step, type):
            raise step()
        return step

    async def sleep(ms: int) -> None:
        raise AssertionError(f"no wait expected, asked for {ms} ms")

    result = asyncio.run(
        route(
            spec,
            PROVIDERS,
            store,
            dispatch=dispatch,
            now=lambda: now,
            sleep=sleep,
            rng=random.Random(1),
            revision=revision,
        )
    )
    return result, dispatched


OK = Outcome(committed=True)
FAIL_500 = Outcome(committed=False, failure=Failure(status=500), status=500)


def test_a_healthy_failover_target_costs_one_state_round_trip() -> None:
    store = CountingStore()
    result, dispatched = run(combo(), store, {A.key: [OK]})
    assert result.served == A and dispatched == [A.key]
    # The pick reads the state; the success changes nothing in it, so nothing is written.
    assert store.updates == 1
    assert asyncio.run(store.get("main")) == ComboState()


def test_a_success_that_changes_the_state_is_written() -> None:
    store = CountingStore()
    run(combo("least-used"), store, {A.key: [OK]})
    assert store.updates == 2
    assert asyncio.run(store.get("main")).success_counts == {A.key: 1}

    sticky = CountingStore()
    run(combo("round-robin", sticky_limit=2), sticky, {A.key: [OK]})
    state = asyncio.run(sticky.get("main"))
    assert (state.active_key, state.successes) == (A.key, 1)


def test_a_half_open_probe_that_succeeds_heals_the_target() -> None:
    store = CountingStore()
    asyncio.run(
        store.update("main", lambda s: (ComboState(cooldowns={A.key: NOW}), None))
    )  # the cooldown ends exactly now: A is half-open
    result, dispatched = run(combo(), store, {A.key: [OK]})
    assert result.served == A and dispatched == [A.key]
    state = asyncio.run(store.get("main"))
    assert state.cooldowns == {} and state.probes == {}


def test_a_failure_hops_and_cools_only_the_failed_target() -> None:
    store = CountingStore()
    result, dispatched = run(combo(cooldown_ms=60_000), store, {A.key: [FAIL_500], B.key: [OK]})
    assert dispatched == [A.key, B.key] and result.served == B
    assert [a.outcome for a in result.attempts] == ["hop", "served"]
    assert asyncio.run(store.get("main")).cooldowns == {A.key: NOW + 60_000}


def test_a_client_abort_counts_nothing_and_cools_nothing() -> None:
    store = CountingStore()
    with pytest.raises(asyncio.CancelledError):
        run(combo("least-used"), store, {A.key: [asyncio.CancelledError]})
    assert asyncio.run(store.get("main")) == ComboState()


def test_a_request_still_running_on_the_old_definition_leaves_the_new_state_alone() -> None:
    store = CountingStore()
    old = combo(cooldown_ms=60_000)  # A, B, loaded at config version 1
    new = ComboSpec(id="main", targets=(A, C), strategy="round-robin", cooldown_ms=60_000)
    # The new definition (version 2) has run: the rotation has started, C is cooling.
    run(new, store, {A.key: [OK]}, revision=2)
    assert run(new, store, {C.key: [FAIL_500], A.key: [OK]}, revision=2)[1] == [C.key, A.key]
    before = asyncio.run(store.get("main"))
    assert before.cooldowns == {C.key: NOW + 60_000} and before.revision == 2
    # A request that started on version 1 finishes now: A fails, B serves it.
    result, dispatched = run(old, store, {A.key: [FAIL_500], B.key: [OK]}, revision=1)
    assert dispatched == [A.key, B.key] and result.served == B
    # Its cooldown of A and the old targets' bookkeeping are not written over the new state.
    assert asyncio.run(store.get("main")) == before


def test_the_first_request_on_a_new_definition_starts_from_a_clean_state() -> None:
    store = CountingStore()
    old = combo(cooldown_ms=60_000)
    run(old, store, {A.key: [FAIL_500], B.key: [OK]}, revision=1)
    assert asyncio.run(store.get("main")).cooldowns == {A.key: NOW + 60_000}
    new = ComboSpec(id="main", targets=(A, C), cooldown_ms=60_000)
    # A worker on version 2 whose state was not cleared yet (it is, by the config write path):
    # the old definition's cooldown does not apply to the new one.
    result, dispatched = run(new, store, {A.key: [OK]}, revision=2)
    assert dispatched == [A.key] and result.served == A


LOCAL = Outcome(
    committed=False,
    failure=Failure(transport="local", error_code="pool_full", message="no free connection"),
    cool=False,
)


def test_a_local_overload_writes_nothing_about_the_target_and_tries_the_next() -> None:
    # ocx's own pool was full: the target is not at fault. The request goes on to a target
    # with its own pool; nothing is cooled or noted against the first.
    store = CountingStore()
    result, dispatched = run(combo("least-used"), store, {A.key: [LOCAL], B.key: [OK]})
    assert dispatched == [A.key, B.key] and result.served == B
    assert [(a.target, a.outcome, a.reason, a.cooled_until) for a in result.attempts] == [
        (A.key, "local_overload", "local: pool_full", None),
        (B.key, "served", "", None),
    ]
    state = asyncio.run(store.get("main"))
    assert state.cooldowns == {} and state.success_counts == {B.key: 1}


def test_a_local_overload_on_every_target_returns_it_and_leaves_them_eligible() -> None:
    store = CountingStore()
    result, dispatched = run(combo(), store, {A.key: [LOCAL], B.key: [LOCAL]})
    assert dispatched == [A.key, B.key] and result.served is None and not result.unavailable
    assert result.failure == LOCAL.failure
    assert result.decision is not None and result.decision.code == "ocx_overloaded"
    assert asyncio.run(store.get("main")) == ComboState()
    # The next request starts from the first target again.
    result, dispatched = run(combo(), store, {A.key: [OK]})
    assert dispatched == [A.key] and result.served == A


def test_a_local_overload_hands_back_a_half_open_probe_lease() -> None:
    store = CountingStore()
    asyncio.run(store.update("main", lambda s: (ComboState(cooldowns={A.key: NOW}), None)))
    result, dispatched = run(combo(), store, {A.key: [LOCAL], B.key: [OK]})
    assert dispatched == [A.key, B.key] and result.served == B
    state = asyncio.run(store.get("main"))
    # Still half-open, not cooled again, and no lease left to block the next prober.
    assert state.cooldowns == {A.key: NOW} and state.probes == {}


# A caller-forward provider refused the caller's own token (issue #26): the caller's failure.
CALLERS_401 = Outcome(
    committed=False,
    failure=Failure(status=401, error_code="invalid_api_key", message="Incorrect API key"),
    status=401,
    callers_own=True,
)


def test_a_refused_caller_credential_writes_nothing_and_is_not_retried() -> None:
    store = CountingStore()
    single = ComboSpec(id="main", targets=(A,), cooldown_ms=60_000)
    result, dispatched = run(single, store, {A.key: [CALLERS_401]})
    assert dispatched == [A.key]  # no single-target retry with the same token
    assert result.served is None and result.failure is not None
    assert result.failure.status == 401
    assert [(a.outcome, a.reason, a.cooled_until) for a in result.attempts] == [
        ("hop", "caller_credential", None)
    ]
    assert asyncio.run(store.get("main")) == ComboState()


def test_a_refused_caller_credential_hops_without_cooling() -> None:
    store = CountingStore()
    result, dispatched = run(combo(cooldown_ms=60_000), store, {A.key: [CALLERS_401], B.key: [OK]})
    assert dispatched == [A.key, B.key] and result.served == B
    assert asyncio.run(store.get("main")).cooldowns == {}
    # The same 401 from a provider with a stored key cools it (for everyone).
    store = CountingStore()
    shared = Outcome(committed=False, failure=Failure(status=401), status=401)
    run(combo(cooldown_ms=60_000), store, {A.key: [shared], B.key: [OK]})
    assert A.key in asyncio.run(store.get("main")).cooldowns


def test_a_refused_caller_credential_gives_back_a_probe_lease_only() -> None:
    store = CountingStore()
    asyncio.run(store.update("main", lambda s: (ComboState(cooldowns={A.key: NOW}), None)))
    single = ComboSpec(id="main", targets=(A,), cooldown_ms=60_000)
    run(single, store, {A.key: [CALLERS_401]})
    state = asyncio.run(store.get("main"))
    assert state.cooldowns == {A.key: NOW} and state.probes == {}


class Overflow(Exception):
    """A dispatch that stops for a reason of its own (the buffered rescue's size bound)."""


def test_a_dispatch_that_stops_with_its_own_error_hands_back_the_probe_lease() -> None:
    store = CountingStore()
    asyncio.run(store.update("main", lambda s: (ComboState(cooldowns={A.key: NOW}), None)))
    with pytest.raises(Overflow):
        run(combo(), store, {A.key: [Overflow]})
    state = asyncio.run(store.get("main"))
    # Not cooled again, nothing noted, and no lease left to block the next prober.
    assert state.cooldowns == {A.key: NOW} and state.probes == {}
