"""Issue #29's "done when": with `afterCommit: "buffer"` and `retrySameTarget` both on, a
transient error before the answer and a break during it end with one complete answer — never a
truncated one — on Chat, Responses and Anthropic upstreams (real `ocx serve` and mock)."""

from __future__ import annotations

import pytest

from tests.conftest import Mock, Server
from tests.gateway.test_rescue import (
    BEFORE_THIRD,
    DELTAS,
    OTHER,
    TEXT,
    UPSTREAMS,
    ask,
    setup,
    whole_answer,
)

RETRY = {"attempts": 2, "maxWaitMs": 1000}


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_a_500_then_a_cut_end_with_one_whole_answer(
    server: Server, mock: Mock, upstream: str
) -> None:
    model, key, (a, b) = setup(server, mock, upstream, afterCommit="buffer", retrySameTarget=RETRY)
    cut = {"text": TEXT, "deltas": DELTAS, "cut_after_events": BEFORE_THIRD[upstream]}
    mock.script(a, [{"status": 500}, cut], {"text": TEXT, "deltas": DELTAS})
    mock.script(b, [], {"text": OTHER, "deltas": DELTAS})

    r = ask(server, "responses", model, key)

    # The 500 is retried on the same target (1 of 2 retries); the cut answer is never shown
    # and restarts, before anything reached the client, as a retry of the same target again.
    assert whole_answer("responses", r) == TEXT
    assert (mock.hits(a), mock.hits(b)) == (3, 0)


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_with_the_retries_spent_the_buffered_restart_hops(
    server: Server, mock: Mock, upstream: str
) -> None:
    model, key, (a, b) = setup(
        server, mock, upstream, afterCommit="buffer", retrySameTarget={**RETRY, "attempts": 1}
    )
    cut = {"text": TEXT, "deltas": DELTAS, "cut_after_events": BEFORE_THIRD[upstream]}
    mock.script(a, [{"status": 500}, cut], {"text": TEXT, "deltas": DELTAS})
    mock.script(b, [], {"text": OTHER, "deltas": DELTAS})

    r = ask(server, "responses", model, key)

    assert whole_answer("responses", r) == OTHER  # the second target's whole answer only
    assert (mock.hits(a), mock.hits(b)) == (2, 1)


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_a_429_with_retry_after_then_a_stall_hop_to_one_whole_answer(
    server: Server, mock: Mock, upstream: str
) -> None:
    model, key, (a, b) = setup(
        server, mock, upstream, afterCommit="buffer", retrySameTarget=RETRY, idle_ms=300
    )
    stall = {
        "text": TEXT,
        "deltas": DELTAS,
        "stall_after_events": BEFORE_THIRD[upstream],
        "stall_ms": 3000,
        "stall_close": True,
    }
    mock.script(a, [{"status": 429, "headers": {"Retry-After": "0.2"}}, stall], {"text": TEXT})
    mock.script(b, [], {"text": OTHER, "deltas": DELTAS})

    r = ask(server, "chat", model, key)

    # The 429 is retried on the same target; the stall is a timeout, never retried (issue
    # #43): the buffered answer restarts on the next target.
    assert whole_answer("chat", r) == OTHER
    assert (mock.hits(a), mock.hits(b)) == (2, 1)
