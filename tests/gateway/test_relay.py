"""The attempt relay without a server (#41): one attempt's state table (`AttemptState`), and
`AttemptRelay`'s steps around a stubbed `providers.upstream.attempt`: the first byte, the
commit, how the attempt ended, the usage it saw, the lessons the gateway takes from it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from gateway import relay as relay_module
from gateway.exchange import Exchange
from gateway.relay import AttemptRelay, AttemptState, Phase, RelayError
from providers.masking import Masker
from providers.upstream import Caller
from providers.wire.usage import Usage
from quota.tracker import Gate
from routing.attempts import Outcome
from routing.classify import Failure
from routing.types import ComboSpec, ConfigSnapshot, ProviderSpec, TargetSpec

USAGE = Usage(3, 7, 0)
OK = Outcome(True, status=200, usage=USAGE)
BROKE = Outcome(True, Failure(status=500, message="boom"), status=200, usage=USAGE)
FAILED = Outcome(False, Failure(status=503, message="busy"))
LOCAL = Outcome(False, Failure(transport="local", error_code="pool_full", message="full"))


@pytest.mark.parametrize(
    ("outcome", "end", "committed", "usage"),
    [
        (OK, "complete", True, USAGE),
        (BROKE, "upstream_broke", True, USAGE),
        (FAILED, "failed", False, None),
        (LOCAL, "local", False, None),
    ],
)
def test_an_attempt_ends_as_its_outcome_says(
    outcome: Outcome, end: str, committed: bool, usage: Any
) -> None:
    state = AttemptState()
    assert state.phase is Phase.OPENING
    state.answered(200)
    assert (state.phase, state.status) == (Phase.ANSWERED, 200)
    assert state.ended(outcome) == end
    assert (state.phase, state.end, state.committed, state.usage) == (
        Phase.ENDED,
        end,
        committed,
        usage,
    )


def test_an_attempt_that_never_answered_can_still_end() -> None:
    state = AttemptState()
    assert state.ended(FAILED) == "failed"
    assert state.status is None


@pytest.mark.parametrize("answered", [False, True])
def test_a_client_that_leaves_ends_the_attempt_as_client_left(answered: bool) -> None:
    state = AttemptState()
    if answered:
        state.answered(200)
    state.client_gone()
    assert (state.phase, state.end, state.committed) == (Phase.ENDED, "client_left", False)


@pytest.mark.parametrize(
    ("before", "event"),
    [
        (["answered"], "answered"),
        (["ended"], "ended"),
        (["ended"], "answered"),
        (["ended"], "client_gone"),
        (["client_gone"], "ended"),
        (["client_gone"], "client_gone"),
    ],
)
def test_an_event_the_table_does_not_allow_is_refused(before: list[str], event: str) -> None:
    state = AttemptState()

    def fire(name: str) -> None:
        if name == "answered":
            state.answered(200)
        elif name == "ended":
            state.ended(OK)
        else:
            state.client_gone()

    for name in before:
        fire(name)
    phase = state.phase
    with pytest.raises(RelayError):
        fire(event)
    assert state.phase is phase  # a refused event changes nothing


# --- AttemptRelay's steps, with `attempt` stubbed (no server, no socket) ---------------------

PROVIDER = ProviderSpec("p", "openai-chat", "http://127.0.0.1:9", api_key="sk-stored")
FORWARD = ProviderSpec("g", "chatgpt", "http://127.0.0.1:9")
TARGET = TargetSpec("p", "m")
FORWARD_TARGET = TargetSpec("g", "m")
COMBO = ComboSpec(id="c", targets=(TARGET, FORWARD_TARGET))
SNAPSHOT = ConfigSnapshot(1, {"p": PROVIDER, "g": FORWARD}, {"c": COMBO})


class Tracker:
    def __init__(self) -> None:
        self.ingested: list[tuple[tuple[str, str], str]] = []

    async def ingest(self, pair: tuple[str, str], windows: Any, *, outcome: str, now: int) -> None:
        self.ingested.append((pair, outcome))


class Runtime:
    def __init__(self) -> None:
        self.tracker = Tracker()
        self.caller_limits = None
        self.emitted: list[dict[str, Any]] = []

    def client(self, provider: ProviderSpec) -> str:
        return f"client of {provider.name}"

    def emit(self, event: dict[str, Any]) -> None:
        self.emitted.append(event)


async def _sent(message: dict[str, Any]) -> None:
    pass


def make(
    pairs: Mapping[str, tuple[str, str] | None] | None = None,
    **kwargs: Any,
) -> tuple[AttemptRelay, Runtime, Exchange]:
    runtime = Runtime()
    exchange = Exchange(_sent, "req-1")
    caller = Caller({}, "req-1", Masker(lambda: ["sk-stored"]))
    relay = AttemptRelay(
        runtime,  # type: ignore[arg-type]
        SNAPSHOT,
        "chat",
        {"model": "c", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        True,
        COMBO,
        caller,
        pairs if pairs is not None else {TARGET.key: ("p", "fp"), FORWARD_TARGET.key: None},
        Gate(),
        exchange,
        **kwargs,
    )
    return relay, runtime, exchange


def stub_attempt(
    monkeypatch: pytest.MonkeyPatch,
    outcome: Outcome | BaseException,
    headers: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    async def attempt(**kwargs: Any) -> Outcome:
        calls.append(kwargs)
        if headers is not None:
            kwargs["observe"](200, headers)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(relay_module, "attempt", attempt)
    return calls


def test_a_served_attempt_marks_the_upstream_done_and_notes_its_quota(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = stub_attempt(monkeypatch, OK, {"x-codex-primary-used-percent": "12"})
    relay, runtime, exchange = make()
    outcome = asyncio.run(relay.dispatch(TARGET, False))
    assert outcome is OK
    assert exchange.attempts == 1 and exchange.upstream_done is True
    assert runtime.tracker.ingested == [(("p", "fp"), "success")]
    assert exchange.served_quota == (("p", "fp"), {"x-codex-primary-used-percent": "12"})
    assert exchange.codex_headers == [(b"x-codex-primary-used-percent", b"12")]
    assert relay.used == {("p", "fp")}
    (call,) = calls
    assert call["client"] == "client of p" and call["credential"] == "sk-stored"
    assert call["responder"] is exchange and call["stream"] is True
    assert call["body"]["model"] == "m"


def test_a_failure_message_is_masked_before_anyone_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stub_attempt(monkeypatch, Outcome(False, Failure(status=400, message="bad key sk-stored")))
    relay, runtime, exchange = make()
    outcome = asyncio.run(relay.dispatch(TARGET, False))
    assert outcome.failure is not None
    assert "sk-stored" not in outcome.failure.message
    assert exchange.upstream_done is False and exchange.served_quota is None
    assert runtime.tracker.ingested == [(("p", "fp"), "failure")]


def test_a_local_overload_teaches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stub_attempt(monkeypatch, LOCAL)
    relay, runtime, exchange = make()
    assert asyncio.run(relay.dispatch(TARGET, False)) == LOCAL
    assert runtime.tracker.ingested == [] and relay.used == set()
    assert exchange.upstream_done is False


def test_a_refused_caller_credential_skips_the_other_forwarding_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stub_attempt(monkeypatch, Outcome(False, Failure(status=401, message="bad token")))
    relay, _, _ = make()
    assert relay.predicate(FORWARD_TARGET) is None
    outcome = asyncio.run(relay.dispatch(FORWARD_TARGET, False))
    assert outcome.callers_own is True
    assert relay.refused == [FORWARD_TARGET.key]
    assert relay.predicate(FORWARD_TARGET) == "caller credential refused"
    assert relay.predicate(TARGET) is None  # a stored key is still fine


def test_a_client_that_leaves_propagates_and_the_time_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stub_attempt(monkeypatch, asyncio.CancelledError())
    relay, runtime, exchange = make()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(relay.dispatch(TARGET, False))
    assert exchange.attempts == 1 and exchange.upstream_s >= 0.0
    assert runtime.tracker.ingested == [] and exchange.upstream_done is False


def test_the_request_local_predicate(monkeypatch: pytest.MonkeyPatch) -> None:
    relay, _, _ = make(unpriced=frozenset({TARGET.key}), held={FORWARD_TARGET.key})
    assert relay.predicate(TARGET) == "unpriced"
    assert relay.predicate(FORWARD_TARGET) == "caller rate-limited"
    only, _, _ = make(encrypted_only=lambda t: "no encrypted tasks")
    assert only.predicate(TARGET) == "no encrypted tasks"


def test_a_cooldown_is_counted_and_emitted() -> None:
    relay, runtime, _ = make()
    relay.on_cooldown(TARGET.key, 123, "server_error")
    assert runtime.emitted == [
        {"kind": "cooldown", "combo": "c", "target": "p/m", "until": 123, "reason": "server_error"}
    ]
