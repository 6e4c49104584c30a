r"""Exact-value masking of credentials in what reaches a client or a log (issues #26, #43).

`classify.redact` masks by pattern (`sk-…`, `Bearer …`, `api_key=…`); a key of another shape
that an upstream echoes ("Incorrect API key provided: …") passed through it. A `Masker` knows
the exact credential values of one request (every stored key and `apiKeyEnv` value of the
config, the caller's forwarded token) and replaces each by `…last4`, whatever its spelling: raw,
or with the JSON escapes an upstream's encoder can produce (`\/`, `\uXXXX` for any character,
either case of hex digits; issue #43). Error texts always go through it; every other frame is
checked with `holds` (a cheap byte test: each value's raw bytes, one compiled alternation past
five values; only when the frame holds an escape a value could hide behind, its escapes decoded
and the same test again) and rewritten only when it holds a secret, so a pass-through frame
without one is forwarded as received.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

from routing.classify import redact

# Shorter values would mask ordinary words; no real credential is this short.
MIN_SECRET = 8


def last4(secret: str) -> str:
    return "…" + secret[-4:]


class Masker:
    """The values of one request: the config's (`source`, the same for every request of a
    snapshot) and the caller's own token (`extra`). The per-frame test of the config's values
    is one cached plan; the caller's token is tested on its own, so a new caller never costs a
    new compiled pattern (callers forward tokens of their own: one cache entry each would not
    stay cached)."""

    __slots__ = ("_extra", "_holds", "_plan", "_source", "_values")

    def __init__(
        self,
        source: Callable[[], Iterable[str | None]],
        extra: Callable[[], str | None] | None = None,
    ) -> None:
        self._source = source
        self._extra = extra
        self._values: tuple[str, ...] | None = None
        self._plan: _Plan | None = None
        self._holds: tuple[_Plan, ...] | None = None

    def values(self) -> tuple[str, ...]:
        if self._values is None:
            # Every frame is checked now (issue #43), so every request gathers its values:
            # the same values (one config, one caller) are sorted once.
            extra = (self._extra(),) if self._extra is not None else ()
            self._values = _sorted_values((*self._source(), *extra))
        return self._values

    def plan(self) -> _Plan:
        if self._plan is None:
            self._plan = _plan(self.values())
        return self._plan

    def holds(self, data: bytes) -> bool:
        """Whether `data` (a frame's bytes) spells a known value, raw or JSON-escaped."""
        plans = self._holds
        if plans is None:
            plans = self._holds = self._holds_plans()
        for plan in plans:
            if plan.holds(data):
                return True
        return False

    def _holds_plans(self) -> tuple[_Plan, ...]:
        base = _plan(_sorted_values(tuple(self._source())))
        token = self._extra() if self._extra is not None else None
        if not token or len(token) < MIN_SECRET or token in base.values:
            return (base,)
        return (base, _Plan((token,)))

    def text(self, text: str) -> str:
        """`text` with every known value as `…last4`, then the pattern redaction (no cap)."""
        plan = self.plan()
        if plan.values and "\\" in text:
            text = plan.escaped_text().sub(_masked_match, text)
        for value in plan.values:
            if value in text:
                text = text.replace(value, last4(value))
            # A text capped (500 characters) inside a value ends with its start (7+ characters
            # of it are taken as evidence): cut that too.
            cut = next((k for k in range(len(value) - 1, 6, -1) if text.endswith(value[:k])), 0)
            if cut:
                text = text[:-cut] + "…"
        return redact(text, limit=len(text))

    def frame(self, raw: bytes) -> bytes:
        """The same for the bytes of a stream frame (undecodable bytes kept as they were)."""
        return self.text(raw.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def secrets_only(self, raw: bytes) -> bytes:
        """`raw` with only the known values masked (no pattern redaction): for a success body
        or an output frame that holds one, whose other text is the model's."""
        plan = self.plan()
        text = raw.decode("utf-8", "surrogateescape")
        if "\\" in text:
            text = plan.escaped_text().sub(_masked_match, text)
        for value in plan.values:
            text = text.replace(value, last4(value))
        return text.encode("utf-8", "surrogateescape")


# JSON's short escapes, by the character they stand for.
_SHORT = {
    "/": "\\/",
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _hex_either_case(code: int) -> str:
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in f"{code:04x}")


def _char_pattern(char: str) -> str:
    """Every spelling of one character inside a JSON string (or raw), as a regex."""
    spellings = [re.escape(char)]
    code = ord(char)
    if code > 0xFFFF:  # a UTF-16 surrogate pair
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        spellings.append(f"\\\\u{_hex_either_case(high)}\\\\u{_hex_either_case(low)}")
    else:
        spellings.append(f"\\\\u{_hex_either_case(code)}")
    if char in _SHORT:
        spellings.append(re.escape(_SHORT[char]))
    return "(?:" + "|".join(spellings) + ")"


class _Plan:
    """The precomputed tests of one set of values (shared by the requests that know the same
    values: `_plan` is cached)."""

    __slots__ = ("_escaped_text", "_raw_pattern", "raw", "triggers", "values")

    # Past this many values one compiled alternation is cheaper than a search per value.
    PATTERN_FROM = 5

    def __init__(self, values: tuple[str, ...]) -> None:
        self.values = values
        self.raw = tuple(v.encode("utf-8", "surrogateescape") for v in values)
        # Compiled at the first frame test (text masking alone never needs it).
        self._raw_pattern: re.Pattern[bytes] | None = None
        # A value can only hide behind an escape the frame holds: `\u` always, a short escape
        # only for a character some value has.
        short = {_SHORT[c].encode() for v in values for c in v if c in _SHORT}
        self.triggers = (b"\\u", *sorted(short)) if values else ()
        self._escaped_text: re.Pattern[str] | None = None

    def escaped_text(self) -> re.Pattern[str]:
        if self._escaped_text is None:
            alternatives = ("".join(_char_pattern(c) for c in v) for v in self.values)
            self._escaped_text = re.compile("|".join(alternatives))
        return self._escaped_text

    def _raw_in(self, data: bytes) -> bool:
        if len(self.raw) >= self.PATTERN_FROM:
            if self._raw_pattern is None:
                self._raw_pattern = re.compile(b"|".join(re.escape(v) for v in self.raw))
            return self._raw_pattern.search(data) is not None
        for value in self.raw:
            if value in data:
                return True
        return False

    def holds(self, data: bytes) -> bool:
        if self._raw_in(data):
            return True
        for trigger in self.triggers:
            if trigger in data:
                # Rare (text with escapes): decode the escapes, then the same raw test.
                text = _decode_escapes(data.decode("utf-8", "surrogateescape"))
                return self._raw_in(text.encode("utf-8", "surrogateescape"))
        return False


def _masked_match(match: re.Match[str]) -> str:
    # The value as spelled, decoded only to name its last four characters.
    decoded = _decode_escapes(match.group(0))
    return last4(decoded)


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([/\"\\bfnrt]))")
_SHORT_DECODED = {
    "/": "/",
    '"': '"',
    "\\": "\\",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}


def _decode_escapes(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        return chr(int(m.group(1), 16)) if m.group(1) else _SHORT_DECODED[m.group(2)]

    decoded = _ESCAPE.sub(one, text)
    # Surrogate pairs spelled as two escapes come back as one character.
    return decoded.encode("utf-16", "surrogatepass").decode("utf-16")


@functools.lru_cache(maxsize=256)
def _sorted_values(source: tuple[str | None, ...]) -> tuple[str, ...]:
    found = {v for v in source if v and len(v) >= MIN_SECRET}
    # Longest first: a value that contains another is masked whole.
    return tuple(sorted(found, key=len, reverse=True))


@functools.lru_cache(maxsize=256)
def _plan(values: tuple[str, ...]) -> _Plan:
    return _Plan(values)


def bearer_value(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer …` header."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


NO_MASK = Masker(tuple)
