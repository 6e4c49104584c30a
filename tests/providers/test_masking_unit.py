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


def test_a_callers_token_is_held_and_masked_without_a_plan_of_its_own() -> None:
    # Callers forward tokens of their own (a Codex user's ChatGPT token): each new token must
    # not cost a newly compiled plan of the config's values (the bench's twentieth run found
    # 221 µs a request once more than 256 tokens took turns).
    config = [f"sk-config-{i}-0123456789" for i in range(6)]
    bases = set()
    for i in range(300):
        token = f"caller-token-{i:04d}-abcdefgh"
        masker = Masker(lambda: config, lambda token=token: token)
        assert masker.holds(f'{{"delta":"{token}"}}'.encode())
        escaped = token.replace("-", "\\u002d")
        assert masker.holds(f'{{"delta":"{escaped}"}}'.encode())
        assert masker.holds(config[3].encode())
        assert not masker.holds(b'{"delta":"hello"}')
        assert masker.text(f"bad token {token}") == f"bad token {last4(token)}"
        base, own = masker._holds or ()
        bases.add(id(base))
        assert own.values == (token,) and own._raw_pattern is None  # nothing compiled
    # One plan of the config's values served every caller's frame tests.
    assert len(bases) == 1


def test_a_short_or_missing_caller_token_adds_nothing() -> None:
    config = ["sk-config-0123456789"]
    for extra in (None, "", "short"):
        masker = Masker(lambda: config, lambda extra=extra: extra)
        assert masker.holds(b"sk-config-0123456789")
        assert not masker.holds(b"short")
