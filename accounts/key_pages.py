"""Paging of `GET /api/keys`: the limit and the opaque cursor (issue #24).

The cursor encodes the last key id of a page (keys are listed newest first, by id, so a key
created while paging never shifts a page and each key is listed once). It is opaque to
clients: a version prefix lets its format change without misreading an old one.
"""

from __future__ import annotations

import base64
import binascii

from ninja.errors import HttpError

LIMIT_DEFAULT = 500
LIMIT_MAX = 1000
_PREFIX = "k1:"


def limit_value(raw: str | None) -> int:
    if raw is None:
        return LIMIT_DEFAULT
    if not raw.isdigit() or not 1 <= int(raw) <= LIMIT_MAX:
        raise HttpError(400, f"limit must be an integer from 1 to {LIMIT_MAX}")
    return int(raw)


def cursor_after(key_id: int) -> str:
    return base64.urlsafe_b64encode(f"{_PREFIX}{key_id}".encode()).decode().rstrip("=")


def cursor_value(raw: str) -> int:
    """The key id a cursor points after; 400 for anything this API did not hand out."""
    try:
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    ident = text.removeprefix(_PREFIX)
    if not text.startswith(_PREFIX) or not ident.isdigit() or len(ident) > 18:
        raise HttpError(400, "cursor is not one this API returned (use nextCursor as given)")
    return int(ident)
