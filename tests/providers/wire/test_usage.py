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
