from __future__ import annotations

import pytest

from providers.wire.usage import Usage, extract_usage


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            {
                "type": "response.completed",
                "response": {
                    "usage": {
                        "input_tokens": 10,
                        "output_tokens": 3,
                        "input_tokens_details": {"cached_tokens": 4},
                    }
                },
            },
            Usage(10, 3, 4),
        ),
        (
            {
                "object": "chat.completion.chunk",
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 1},
                },
            },
            Usage(7, 2, 1),
        ),
        (
            {
                "type": "message_start",
                "message": {
                    "usage": {
                        "input_tokens": 5,
                        "cache_read_input_tokens": 100,
                        "cache_creation_input_tokens": 20,
                        "output_tokens": 1,
                    }
                },
            },
            Usage(125, 1, 100),
        ),
        ({"type": "message_delta", "usage": {"output_tokens": 42}}, Usage(None, 42, None)),
        ({"type": "response.output_text.delta", "delta": "x"}, None),
    ],
)
def test_extract_usage_shapes(payload: dict[str, object], expected: Usage | None) -> None:
    assert extract_usage(payload) == expected


def test_merge_keeps_earlier_fields_and_takes_later_ones() -> None:
    start = Usage(125, 1, 100)
    assert start.merge(Usage(None, 42, None)) == Usage(125, 42, 100)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            {
                "type": "response.completed",
                "response": {
                    "usage": {
                        "input_tokens": 10,
                        "output_tokens": 30,
                        "output_tokens_details": {"reasoning_tokens": 24},
                    }
                },
            },
            Usage(10, 30, None, 24),
        ),
        (
            {
                "choices": [],
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": 20,
                    "completion_tokens_details": {"reasoning_tokens": 16},
                },
            },
            Usage(7, 20, None, 16),
        ),
        # A detail that is not a count is ignored, never taken as a number.
        (
            {"usage": {"prompt_tokens": 1, "completion_tokens_details": {"reasoning_tokens": "9"}}},
            Usage(1, None, None, None),
        ),
    ],
)
def test_reasoning_tokens(payload: dict[str, object], expected: Usage) -> None:
    assert extract_usage(payload) == expected


def test_merge_keeps_reasoning() -> None:
    assert Usage(5, 1, 0, 3).merge(Usage(None, 9, None, None)) == Usage(5, 9, 0, 3)
