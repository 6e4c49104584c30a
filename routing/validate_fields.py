"""Field rules every config entity shares: the id grammar, JavaScript's trim, JSON integers,
control characters, unknown fields, and the `Issue` every validator returns (routing.validate)."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PathPart = str | int
Path = tuple[PathPart, ...]
DISPLAY_NAME_MAX = 128

# --- messages (tests assert these verbatim) -------------------------------------------------------
# Combo ids and provider names share one namespace (a provider's models are `name/model`).
MSG_COMBO_ID = (
    "combo id must start with a letter/number and use letters, numbers, dot, underscore, "
    "or hyphen (max 64)"
)
MSG_PROVIDER_NAME = (
    "provider name must start with a letter/number and use letters, numbers, dot, underscore, "
    "or hyphen (max 64)"
)
MSG_PROVIDER_COMBO_RESERVED = (
    'provider name "combo" collides with the reserved "combo/" namespace while combos are '
    "configured"
)


def msg_unknown_field(name: str) -> str:
    return f'unknown field "{name}"'


def msg_id_collides(combo_id: str) -> str:
    return f'combo id "{combo_id}" collides with configured provider name "{combo_id}"'


@dataclass(frozen=True)
class Issue:
    """One validation problem: `path` locates it in the JSON document, `message` is user-facing."""

    path: Path
    message: str

    def __str__(self) -> str:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path)
        return f"{where.lstrip('.')}: {self.message}" if where else self.message


_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# JavaScript's String.prototype.trim set; Python's str.strip() also eats \x1c-\x1f.
_JS_WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
_JS_WHITESPACE += "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def js_trim(value: str) -> str:
    """Trim like JavaScript's `String.prototype.trim` (the reference's trimming)."""
    return value.strip(_JS_WHITESPACE)


def as_int(value: object) -> int | None:
    """A JSON integer (an integral finite float counts, as in JavaScript); never a bool/string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def int_in(value: object, low: int, high: int | None) -> int | None:
    n = as_int(value)
    if n is None or n < low or (high is not None and n > high):
        return None
    return n


def has_control(value: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)


def trimmed_str(value: object) -> str:
    return js_trim(value) if isinstance(value, str) else ""


def unknown_fields(raw: Mapping[Any, object], known: Collection[str], prefix: Path) -> list[Issue]:
    return [
        Issue((*prefix, str(key)), msg_unknown_field(str(key))) for key in raw if key not in known
    ]


def prefixed(prefix: Path, issues: Iterable[Issue]) -> list[Issue]:
    return [Issue((*prefix, *i.path), i.message) for i in issues]


# --- ids and aliases ------------------------------------------------------------------------------


def is_valid_id(value: object) -> bool:
    """The id grammar shared by combo ids, provider names and alias segments (§1.2)."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None
