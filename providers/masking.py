"""Exact-value masking of credentials in upstream error text (issue #26, point 6).

`classify.redact` masks by pattern (`sk-…`, `Bearer …`, `api_key=…`); a key of another shape
that an upstream echoes ("Incorrect API key provided: …") passed through it. A `Masker` knows
the exact credential values of one request (every stored key and `apiKeyEnv` value of the
config, the caller's forwarded token) and replaces each by `…last4`. It is only applied to
error texts and error frames, never to normal streamed content, and gathers its values on first
use, so a request that meets no error pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from routing.classify import redact

# Shorter values would mask ordinary words; no real credential is this short.
MIN_SECRET = 8


def last4(secret: str) -> str:
    return "…" + secret[-4:]


class Masker:
    __slots__ = ("_source", "_values")

    def __init__(self, source: Callable[[], Iterable[str | None]]) -> None:
        self._source = source
        self._values: tuple[str, ...] | None = None

    def values(self) -> tuple[str, ...]:
        if self._values is None:
            found = {v for v in self._source() if v and len(v) >= MIN_SECRET}
            # Longest first: a value that contains another is masked whole.
            self._values = tuple(sorted(found, key=len, reverse=True))
        return self._values

    def text(self, text: str) -> str:
        """`text` with every known value as `…last4`, then the pattern redaction (no cap)."""
        for value in self.values():
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


def bearer_value(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer …` header."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


NO_MASK = Masker(tuple)
