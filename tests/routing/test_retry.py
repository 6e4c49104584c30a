"""`retrySameTarget` (issue #29): the pure decision (`routing.retry`) row by row, its bounds
(attempts, maxWaitMs, deadline) as properties, and the attempt loop that acts on it (injected
clock, sleep and random source; nothing sleeps)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from routing.attempts import Outcome, RouteResult, route
from routing.classify import Failure, classify
from routing.retry import BACKOFF_MAX_MS, BACKOFF_MIN_MS, retry_wait, transient
from routing.state import ComboState, MemoryStateStore
from routing.types import ComboSpec, ProviderSpec, RetryPolicy, TargetSpec, Timeouts

NOW = 1_000_000
POLICY = RetryPolicy(attempts=2, max_wait_ms=2000)


def err(code: str, message: str = "x", type_: str = "server_error") -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": type_}}


def verdict(failure: Failure, policy: RetryPolicy | None = POLICY, **kw: Any) -> int | None:
    args: dict[str, Any] = {"retries_done": 0, "now": NOW, "deadline": None}
    args.update(kw)
    return retry_wait(failure, classify(failure), policy, rng=random.Random(7), **args).wait_ms


# ---------------------------------------------------------------------------------------------
# Each classification row: retried or not


RETRIED = {
    "429 Retry-After 2": Failure(status=429, headers={"retry-after": "2"}),
    "429 Retry-After 0.05": Failure(status=429, headers={"retry-after": "0.05"}),
    "500": Failure(status=500),
    "502": Failure(status=502),
    "503 overloaded": Failure(status=503, body=err("server_is_overloaded", "overloaded")),
    "504": Failure(status=504),
    "connection refused": Failure(transport="connect", message="connection failed"),
    "connection reset": Failure(transport="reset", message="connection reset"),
}
NOT_RETRIED = {
    "429 without Retry-After": Failure(status=429),
    "429 Retry-After over maxWaitMs": Failure(status=429, headers={"retry-after": "3"}),
    "429 quota": Failure(
        status=429, headers={"retry-after": "1"}, body=err("insufficient_quota", "quota")
    ),
    "429 usage limit": Failure(
        status=429,
        headers={"retry-after": "1"},
        body={"error": {"type": "usage_limit_reached", "message": "usage limit reached"}},
    ),
    "503 quota": Failure(status=503, body=err("insufficient_quota", "quota exhausted")),
    "500 billing": Failure(status=500, body=err("billing_error", "pay up")),
    "500 bad key": Failure(status=500, body=err("invalid_api_key", "invalid api key")),
    "401": Failure(status=401, body=err("invalid_api_key", "bad key", "authentication_error")),
    "402": Failure(status=402),
    "403": Failure(status=403),
    "400": Failure(status=400, body=err("invalid_request_error", "bad", "invalid_request_error")),
    "404 model": Failure(status=404, body=err("model_not_found", "no such model")),
    "408": Failure(status=408),
    "400 content filter": Failure(
        status=400, body=err("content_filter", "blocked", "invalid_request_error")
    ),
    "400 context overflow": Failure(
        status=400,
        body=err("context_length_exceeded", "maximum context length", "invalid_request_error"),
    ),
    "500 context overflow": Failure(
        status=500, message="This model's maximum context length is 8192 tokens"
    ),
    "501": Failure(status=501),
    "timeout first byte": Failure(transport="timeout_first_byte"),
    "timeout total": Failure(transport="timeout_total"),
    "timeout idle": Failure(transport="timeout_idle"),
    "stall after output (buffered)": Failure(
        status=502, error_code="upstream_stream_truncated", message="stalled", timed_out=True
    ),
    "malformed 502": Failure(status=502, transport="malformed", message="malformed"),
    "undeclared tool": Failure(transport="undeclared_tool"),
    "ocx overloaded": Failure(transport="local", error_code="pool_full"),
    "zero-output response.failed": Failure(
        stream_event="response.failed", body={"response": {"error": {"code": "server_error"}}}
    ),
}


@pytest.mark.parametrize("name", sorted(RETRIED))
def test_transient_failures_are_retried(name: str) -> None:
    failure = RETRIED[name]
    assert transient(failure, classify(failure))
    wait = verdict(failure)
    assert wait is not None and 0 < wait <= POLICY.max_wait_ms


@pytest.mark.parametrize("name", sorted(NOT_RETRIED))
def test_other_failures_hop_at_once(name: str) -> None:
    assert verdict(NOT_RETRIED[name]) is None


def test_off_means_never() -> None:
    assert all(verdict(f, None) is None for f in RETRIED.values())


# ---------------------------------------------------------------------------------------------
# Waits


def test_a_429_waits_exactly_its_retry_after() -> None:
    assert verdict(Failure(status=429, headers={"retry-after": "2"})) == 2000
    assert verdict(Failure(status=429, headers={"retry-after": "0.05"})) == 50
    # At the bound it still retries; one millisecond over, it hops.
    at = RetryPolicy(attempts=1, max_wait_ms=2000)
    assert verdict(Failure(status=429, headers={"retry-after": "2"}), at) == 2000
    under = RetryPolicy(attempts=1, max_wait_ms=1999)
    assert verdict(Failure(status=429, headers={"retry-after": "2"}), under) is None


def test_a_429_retry_after_http_date() -> None:
    # 1970-01-01 00:16:42 GMT is NOW (1 000 000 ms = 16:40) + 2 s.
    date = "Thu, 01 Jan 1970 00:16:42 GMT"
    assert verdict(Failure(status=429, headers={"retry-after": date})) == 2000


def test_a_5xx_with_retry_after_waits_it_or_hops_when_too_long() -> None:
    assert verdict(Failure(status=503, headers={"retry-after": "1"})) == 1000
    assert verdict(Failure(status=503, headers={"retry-after": "30"})) is None


def test_without_a_hint_the_wait_is_a_jittered_backoff_capped_by_max_wait() -> None:
    waits = {
        retry_wait(
            Failure(status=500),
            classify(Failure(status=500)),
            POLICY,
            retries_done=0,
            now=NOW,
            deadline=None,
            rng=random.Random(seed),
        ).wait_ms
        for seed in range(50)
    }
    assert all(w is not None and BACKOFF_MIN_MS <= w <= BACKOFF_MAX_MS for w in waits)
    assert len(waits) > 10  # jittered, not one fixed value
    assert verdict(Failure(status=500), RetryPolicy(attempts=1, max_wait_ms=0)) == 0
    assert verdict(Failure(status=500), RetryPolicy(attempts=1, max_wait_ms=120)) in range(100, 121)


# ---------------------------------------------------------------------------------------------
# Bounds, as properties


FAILURES = hs.sampled_from([*RETRIED.values(), *NOT_RETRIED.values()])
POLICIES = hs.builds(RetryPolicy, attempts=hs.integers(1, 3), max_wait_ms=hs.integers(0, 10_000))


@given(
    failure=FAILURES,
    policy=POLICIES,
    done=hs.integers(0, 5),
    deadline=hs.none() | hs.integers(NOW, NOW + 20_000),
    seed=hs.integers(0, 2**32),
)
def test_a_retry_never_exceeds_attempts_wait_or_deadline(
    failure: Failure, policy: RetryPolicy, done: int, deadline: int | None, seed: int
) -> None:
    found = retry_wait(
        failure,
        classify(failure),
        policy,
        retries_done=done,
        now=NOW,
        deadline=deadline,
        rng=random.Random(seed),
    )
    if found.wait_ms is None:
        return
    assert done < policy.attempts
    assert 0 <= found.wait_ms <= policy.max_wait_ms
    assert deadline is None or NOW + found.wait_ms <= deadline
    assert transient(failure, classify(failure))


def test_the_deadline_bounds_the_wait() -> None:
    failure = Failure(status=429, headers={"retry-after": "2"})
    assert verdict(failure, deadline=NOW + 2000) == 2000
    assert verdict(failure, deadline=NOW + 1999) is None


def test_retries_spent() -> None:
    failure = Failure(status=500)
    assert verdict(failure, retries_done=1) is not None
    assert verdict(failure, retries_done=2) is None


# ---------------------------------------------------------------------------------------------
# The attempt loop


A, B = TargetSpec("pa", "ma"), TargetSpec("pb", "mb")
PROVIDERS = {
    name: ProviderSpec(
        name=name,
        adapter="openai-chat",
        base_url=f"http://{name}.test/v1",
        timeouts=Timeouts(total_ms=10_000),
    )
    for name in ("pa", "pb")
}
OK = Outcome(committed=True)
RATE = Outcome(False, Failure(status=429, headers={"retry-after": "2"}), status=429)
CRASH = Outcome(False, Failure(status=500), status=500)
AUTH = Outcome(False, Failure(status=401), status=401)


class Clock:
    def __init__(self) -> None:
        self.t = NOW
        self.slept: list[int] = []

    def now(self) -> int:
        return self.t

    async def sleep(self, ms: int) -> None:
        self.slept.append(ms)
        self.t += ms


def run(
    outcomes: dict[str, list[Outcome]],
    retry: RetryPolicy | None = POLICY,
    *,
    store: MemoryStateStore | None = None,
    cost_ms: int = 0,
) -> tuple[RouteResult, list[str], Clock, MemoryStateStore]:
    """Route combo [A, B] over scripted outcomes; each dispatch takes `cost_ms` of the clock."""
    spec = ComboSpec(id="main", targets=(A, B), retry_same_target=retry)
    clock = Clock()
    store = store or MemoryStateStore()
    dispatched: list[str] = []

    async def dispatch(target: TargetSpec, _last: bool) -> Outcome:
        dispatched.append(target.key)
        clock.t += cost_ms
        return outcomes[target.key].pop(0)

    result = asyncio.run(
        route(
            spec,
            PROVIDERS,
            store,
            dispatch=dispatch,
            now=clock.now,
            sleep=clock.sleep,
            rng=random.Random(3),
        )
    )
    return result, dispatched, clock, store


def trace(result: RouteResult) -> list[tuple[str, str, int | None]]:
    return [(a.target, a.outcome, a.wait_ms) for a in result.attempts]


def test_a_429_once_is_retried_on_the_same_target_and_leaves_no_cooldown() -> None:
    result, dispatched, clock, store = run({A.key: [RATE, OK]})
    assert dispatched == [A.key, A.key] and result.served == A
    assert clock.slept == [2000]
    assert trace(result) == [(A.key, "retry", 2000), (A.key, "served", None)]
    assert result.attempts[0].status == 429 and result.attempts[0].reason == "rate_limited"
    assert result.attempts[0].cooled_until is None
    # No failure noted at all: the healthy failover pick leaves the state as it found it.
    assert asyncio.run(store.get("main")) == ComboState()


def test_a_500_once_is_retried_after_a_short_backoff() -> None:
    result, dispatched, clock, _ = run({A.key: [CRASH, OK]})
    assert dispatched == [A.key, A.key] and result.served == A
    assert len(clock.slept) == 1 and BACKOFF_MIN_MS <= clock.slept[0] <= BACKOFF_MAX_MS
    assert trace(result) == [(A.key, "retry", clock.slept[0]), (A.key, "served", None)]


def test_retry_off_hops_as_today() -> None:
    result, dispatched, clock, store = run({A.key: [RATE], B.key: [OK]}, retry=None)
    assert dispatched == [A.key, B.key] and result.served == B
    assert clock.slept == []
    assert [a.outcome for a in result.attempts] == ["hop", "served"]
    assert asyncio.run(store.get("main")).cooldowns == {A.key: NOW + 2000}


@pytest.mark.parametrize("outcome", [AUTH, Outcome(False, Failure(status=429), status=429)])
def test_no_retry_for_auth_or_a_429_without_hint(outcome: Outcome) -> None:
    result, dispatched, clock, store = run({A.key: [outcome], B.key: [OK]})
    assert dispatched == [A.key, B.key] and clock.slept == []
    assert result.attempts[0].outcome == "hop"
    assert A.key in asyncio.run(store.get("main")).cooldowns


def test_a_stop_is_not_retried() -> None:
    body = err("invalid_request_error", "bad", "invalid_request_error")
    bad = Outcome(False, Failure(status=400, body=body))
    result, dispatched, clock, _ = run({A.key: [bad], B.key: [OK]})
    assert dispatched == [A.key] and clock.slept == []
    assert [a.outcome for a in result.attempts] == ["stop"]


def test_retries_spent_cool_the_target_then_hop() -> None:
    result, dispatched, clock, store = run({A.key: [CRASH, CRASH, CRASH], B.key: [OK]})
    assert dispatched == [A.key, A.key, A.key, B.key] and result.served == B
    assert [a.outcome for a in result.attempts] == ["retry", "retry", "hop", "served"]
    assert len(clock.slept) == 2
    state = asyncio.run(store.get("main"))
    assert A.key in state.cooldowns and state.cooldowns[A.key] > clock.t


def test_a_failure_after_commit_is_never_retried() -> None:
    broken = Outcome(True, Failure(transport="reset", message="cut"), status=200)
    result, dispatched, clock, _ = run({A.key: [broken]})
    assert dispatched == [A.key] and clock.slept == []
    assert [a.outcome for a in result.attempts] == ["failed_after_commit"]


def test_ocx_overload_is_never_retried() -> None:
    local = Outcome(False, Failure(transport="local", error_code="pool_full"), cool=False)
    result, dispatched, clock, _ = run({A.key: [local], B.key: [OK]})
    assert dispatched == [A.key, B.key] and clock.slept == []
    assert [a.outcome for a in result.attempts] == ["local_overload", "served"]


def test_a_callers_own_credential_or_quota_is_never_retried() -> None:
    own = Outcome(False, Failure(status=500), status=500, callers_own=True)
    spent = Outcome(False, Failure(status=500), status=500, cool=False)
    for outcome in (own, spent):
        _, dispatched, clock, _ = run({A.key: [outcome], B.key: [OK]})
        assert dispatched == [A.key, B.key] and clock.slept == []


def test_the_deadline_stops_the_retries() -> None:
    # totalMs 10 s from the first try; each try takes 5 s: the wait after the second one would
    # end past the deadline, so the request hops instead of a third try.
    result, dispatched, _, _ = run({A.key: [CRASH, CRASH, OK], B.key: [OK]}, cost_ms=5000)
    assert dispatched == [A.key, A.key, B.key]
    assert [a.outcome for a in result.attempts] == ["retry", "hop", "served"]


def test_a_client_abort_during_the_wait_is_recorded() -> None:
    spec = ComboSpec(id="main", targets=(A, B), retry_same_target=POLICY)
    result = RouteResult()

    async def dispatch(target: TargetSpec, _last: bool) -> Outcome:
        return RATE

    async def sleep(ms: int) -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(
            route(
                spec,
                PROVIDERS,
                MemoryStateStore(),
                dispatch=dispatch,
                now=lambda: NOW,
                sleep=sleep,
                rng=random.Random(1),
                result=result,
            )
        )
    assert [a.outcome for a in result.attempts] == ["retry", "client_cancelled"]
