"""Encryption at rest for provider API keys (Fernet, key derived from OCX_SECRET_KEY)."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"ocx-provider-keys:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode()


def unseal(token: str) -> str | None:
    """The plaintext, or None when the key changed since it was sealed."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        return None


def mask(secret: str | None) -> str:
    """At most `sk-…abcd`: a prefix and the last four characters."""
    if not secret:
        return ""
    head = secret.split("-", 1)[0] + "-" if "-" in secret[:8] else ""
    return f"{head}…{secret[-4:]}" if len(secret) > 12 else "…"
