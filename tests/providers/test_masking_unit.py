"""`providers.masking.Masker`: exact values as `…last4`, lazily, only where asked."""

from __future__ import annotations

import json

import pytest

from providers.masking import Masker, bearer_value, last4

KEY = "prov-key-ABCDEFGH12345678"


def test_exact_values_are_masked_then_patterns() -> None:
    calls: list[int] = []

    def source() -> list[str | None]:
        calls.append(1)
        return [KEY, None, "", "short", "sk-other-0123456789"]

    masker = Masker(source)
    assert calls == []  # nothing gathered until an error text is masked
    text = f"Incorrect API key provided: {KEY}; also sk-zzzzzzzzzzzz and short"
    assert masker.text(text) == ("Incorrect API key provided: …5678; also sk-[redacted] and short")
    masker.text("again")
    assert calls == [1]  # gathered once per request


def test_a_value_cut_by_the_500_character_cap_is_masked_too() -> None:
    masker = Masker(lambda: [KEY])
    assert masker.text("x" * 10 + KEY[:12]) == "x" * 10 + "…"
    assert masker.text("ends with prov-k") == "ends with prov-k"  # 6 characters: no evidence


def test_frames_keep_undecodable_bytes() -> None:
    masker = Masker(lambda: [KEY])
    raw = b'data: {"error":{"message":"' + KEY.encode() + b'"}}\xff\n\n'
    assert masker.frame(raw) == b'data: {"error":{"message":"' + "…5678".encode() + b'"}}\xff\n\n'


def test_helpers() -> None:
    assert last4(KEY) == "…5678"
    assert bearer_value("Bearer  tok-123 ") == "tok-123"
    assert bearer_value("Basic abc") is None
    assert bearer_value(None) is None


# ---------------------------------------------------------------------------------------------
# Escaped spellings (issue #43, point 1)

ESC = "sk-esc/SECRET-value-ABCD1234wxyz"


def _all_u(text: str, fmt: str = "\\u%04x") -> str:
    return "".join(fmt % ord(c) for c in text)


ESCAPED = [
    ESC.replace("/", "\\/"),
    "sk-esc\\/\\u0053ECRET-value-ABCD1234wxyz",
    _all_u(ESC),
    _all_u(ESC, "\\u%04X"),
    "sk-" + _all_u("esc/SEC") + "RET-value-\\u004" + "1BCD1234w\\u0078yz",
    "sk-esc/SECRET-value-ABCD1234wxy\\u007A",  # one capital hex letter only
]


@pytest.mark.parametrize("spelling", ESCAPED)
def test_escaped_spellings_are_held_and_masked(spelling: str) -> None:
    masker = Masker(lambda: [ESC])
    raw = ('data: {"type":"error","message":"bad key ' + spelling + '"}\n\n').encode()
    assert masker.holds(raw)
    masked = masker.frame(raw)
    assert json.loads(masked[6:])["message"] == "bad key …wxyz"
    assert masker.text("bad key " + spelling + ".") == "bad key …wxyz."
    assert masker.secrets_only(raw).count("…wxyz".encode()) == 1


def test_a_frame_without_a_secret_is_not_held() -> None:
    masker = Masker(lambda: [ESC])
    for raw in (
        b'data: {"type":"response.output_text.delta","delta":"caf\\u00e9 \\/ sk-esc"}\n\n',
        b'data: {"delta":"SECRET-value-ABCD1234wxyz without its start"}\n\n',
        b"data: [DONE]\n\n",
    ):
        assert not masker.holds(raw), raw


def test_a_non_bmp_character_escaped_as_a_surrogate_pair() -> None:
    secret = "key-\U0001f600-ABCDEFGH"
    masker = Masker(lambda: [secret])
    spelled = json.dumps({"m": secret})  # ensure_ascii: `\ud83d\ude00`
    assert "\\ud83d" in spelled
    assert masker.holds(spelled.encode())
    assert json.loads(masker.secrets_only(spelled.encode())) == {"m": "…EFGH"}
