"""ocx's usage estimate and the checks of reported figures (issue 42, `usage.estimate`), and
the request-log writer's last line: a row is never lost to a bad number."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from providers.wire.usage import extract_usage
from usage import estimate, services
from usage.models import RequestLog, UsageRollup
from usage.requestlog import RequestEntry, clean_entry, write_entries


def _entry(**usage: Any) -> RequestEntry:
    return RequestEntry(
        request_id="r1",
        # Recent: an older row would be the request log's retention's to delete.
        at=(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).timestamp(),
        target="p/m",
        status=200,
        outcome="ok",
        **usage,
    )


def test_input_estimate_counts_the_text_of_the_body_at_four_characters_a_token() -> None:
    body = {
        "model": "a-very-long-model-name-that-is-not-text",
        "stream": True,
        "instructions": "x" * 10,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "y" * 21}]}],
        "metadata": {"note": "z" * 1000},
    }
    # 10 + "user" + "input_text" + 21 = 45 characters → 12 tokens (rounded up).
    assert estimate.input_estimate(body) == 12
    assert estimate.input_estimate({}) == 1
    assert estimate.input_estimate({"model": "m"}) == 1


def test_output_estimate_is_a_token_a_frame_or_the_text_beyond_the_framing() -> None:
    relayed = estimate.Relayed()
    assert estimate.output_estimate(relayed) == 0
    relayed.count(b'data: {"delta":"a"}\n\n' * 3)
    assert (relayed.frames, estimate.output_estimate(relayed)) == (3, 3)
    long = estimate.Relayed()
    long.count(b"data: " + b"x" * 500 + b"\n\n")  # one frame, 508 bytes: (508 - 100) / 4
    assert estimate.output_estimate(long) == 102


@pytest.mark.parametrize(
    ("usage", "cap", "trusted"),
    [
        ({"input_tokens": 10, "output_tokens": 5}, None, True),
        ({"input_tokens": 0, "output_tokens": 0}, None, True),
        ({"input_tokens": -1, "output_tokens": 5}, None, False),
        ({"input_tokens": 10, "output_tokens": 5, "cached_tokens": -3}, None, False),
        ({"input_tokens": 10_000_001, "output_tokens": 5}, None, False),
        ({"input_tokens": 10_000_000, "output_tokens": 5}, None, True),
        ({"input_tokens": 1001, "output_tokens": 5}, 1000, False),
        ({"input_tokens": 10, "output_tokens": 5, "reasoning_tokens": 2000}, 1000, False),
        ({"input_tokens": 10, "output_tokens": 5}, 10**9, True),
        ({"input_tokens": 10**8, "output_tokens": 5}, 10**9, False),  # the cap still holds
    ],
)
def test_figures_are_checked_against_the_context_window_and_the_cap(
    usage: dict[str, int], cap: int | None, trusted: bool
) -> None:
    assert estimate.checked(_entry(**usage), cap=cap) is trusted


@pytest.mark.parametrize(
    "raw",
    [
        {"input_tokens": "lots", "output_tokens": 5},
        {"input_tokens": 5, "output_tokens": 2.5},
        {"prompt_tokens": True, "completion_tokens": 5},
        {"input_tokens": 5, "output_tokens": [1]},
    ],
)
def test_a_non_integer_figure_marks_the_usage_bad(raw: dict[str, Any]) -> None:
    usage = extract_usage({"usage": raw})
    assert usage is not None and usage.bad
    assert not extract_usage({"usage": {"input_tokens": 5, "output_tokens": None}}).bad  # type: ignore[union-attr]


def test_settle_replaces_bad_figures_as_a_whole_and_fills_a_cut_short_answer() -> None:
    body = {"input": "x" * 40}
    relayed = estimate.Relayed()
    relayed.count(b"data: {}\n\n" * 7)
    bad = _entry(input_tokens=-(10**9), output_tokens=50, cached_tokens=3, reasoning_tokens=1)
    estimate.settle(bad, request=body, relayed=relayed, cut_short=False, cap=None)
    assert (bad.input_tokens, bad.output_tokens, bad.cached_tokens, bad.usage_estimated) == (
        10,
        7,
        None,
        True,
    )
    fine = _entry(input_tokens=30, output_tokens=50)
    estimate.settle(fine, request=body, relayed=relayed, cut_short=True, cap=None)
    assert (fine.input_tokens, fine.output_tokens, fine.usage_estimated) == (30, 50, False)
    # Anthropic reports the input first: a stream left before its end keeps it.
    partial = _entry(input_tokens=30)
    estimate.settle(partial, request=body, relayed=relayed, cut_short=True, cap=None)
    assert (partial.input_tokens, partial.output_tokens, partial.usage_estimated) == (30, 7, True)
    # A complete answer without any usage stays unknown usage (not estimated).
    unknown = _entry()
    estimate.settle(unknown, request=body, relayed=relayed, cut_short=False, cap=None)
    assert (unknown.input_tokens, unknown.usage_estimated) == (None, False)
    flagged = _entry(input_tokens=3, output_tokens=4)
    estimate.settle(flagged, request=body, relayed=relayed, cut_short=False, cap=None, bad=True)
    assert (flagged.input_tokens, flagged.output_tokens, flagged.usage_estimated) == (10, 7, True)


def test_the_writer_keeps_a_row_whose_figures_are_out_of_range() -> None:
    entry = clean_entry(_entry(input_tokens=-5, output_tokens=3, cached_tokens=1))
    assert (entry.input_tokens, entry.output_tokens, entry.usage_estimated) == (None, None, True)
    huge = clean_entry(_entry(input_tokens=2**40, output_tokens=3))
    assert (huge.input_tokens, huge.usage_estimated) == (None, True)


@pytest.mark.django_db(transaction=True)
def test_a_batch_with_a_negative_figure_is_written_whole_and_counted() -> None:
    good = _entry(input_tokens=10, output_tokens=2)
    good.request_id = "good"
    bad = _entry(input_tokens=-1_000_000_000, output_tokens=2)
    bad.request_id = "bad"
    estimated = _entry(input_tokens=7, output_tokens=1, usage_estimated=True)
    estimated.request_id = "est"
    write_entries([good, bad, estimated])
    rows = {r.request_id: r for r in RequestLog.objects.all()}
    assert set(rows) == {"good", "bad", "est"}
    assert (rows["bad"].input_tokens, rows["bad"].usage_estimated) == (None, True)
    assert (rows["est"].input_tokens, rows["est"].usage_estimated) == (7, True)
    assert rows["good"].usage_estimated is False
    (rollup,) = UsageRollup.objects.all()
    assert (rollup.requests, rollup.estimated_requests, rollup.input_tokens) == (3, 2, 17)
    assert services.aggregate([good])  # the record type still has every field it reads
