"""Durations in words, as the admin renders them before localtime.js takes over (and as
localtime.js's `inWords` renders them in the browser)."""

from __future__ import annotations

import pytest

from combos.times import in_words


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (-3, "0 s"),
        (42.4, "42 s"),
        (60, "1 min"),
        (185, "3 min 5 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h 0 min"),
        (7440, "2 h 4 min"),
        (86399, "23 h 59 min"),
        (86400, "1 d 0 h"),
        (300_000, "3 d 11 h"),
        (604_800, "7 d 0 h"),
    ],
)
def test_in_words(seconds: float, words: str) -> None:
    assert in_words(seconds) == words
