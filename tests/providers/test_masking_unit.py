"""`providers.masking.Masker`: exact values as `…last4`, lazily, only where asked."""

from __future__ import annotations

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
