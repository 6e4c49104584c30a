"""Encryption at rest for provider API keys: Fernet tokens, key derived from OCX_SECRET_KEY.

A token is Fernet's (https://github.com/fernet/spec): version 0x80, a timestamp, an IV,
AES-128-CBC of the PKCS#7-padded secret, and an HMAC-SHA256 over all of it, base64url. It is
built here from pycryptodomex's AES and the standard library's HMAC instead of
`cryptography.fernet`: importing `cryptography` loads its Rust bindings and the OpenSSL they
carry, 7 MB of every worker's memory for one cipher (bench/README.md, seventh run). The
tokens are the same both ways: keys sealed by earlier versions open, and the other way round
(tests/providers/test_sealing.py checks against `cryptography.fernet`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import sys
import time
from typing import Any

from django.conf import settings


def _import_aes() -> tuple[Any, Any, Any]:
    """pycryptodomex binds its C code with cffi when cffi is installed (Twisted brings it), and
    cffi then parses C declarations with pycparser at import: 2 MB more in every worker than
    its ctypes binding, which it uses wherever cffi is missing and which calls the same C code
    (ctypes is loaded in a worker anyway). So cffi is hidden for this one import."""
    hidden = "cffi" not in sys.modules
    if hidden:
        sys.modules["cffi"] = None  # type: ignore[assignment]
    try:
        from Cryptodome.Cipher import AES
        from Cryptodome.Util.Padding import pad, unpad
    finally:
        if hidden and "cffi" in sys.modules and sys.modules["cffi"] is None:
            del sys.modules["cffi"]
    return AES, pad, unpad


AES, pad, unpad = _import_aes()

VERSION = 0x80
_HEAD = 1 + 8 + 16  # version, timestamp, IV
_MAC = 32
BLOCK = 16


def _keys() -> tuple[bytes, bytes]:
    """Fernet's key is 32 bytes: the first half signs, the second encrypts."""
    key = hashlib.sha256(b"ocx-provider-keys:" + settings.SECRET_KEY.encode()).digest()
    return key[:16], key[16:]


def seal(secret: str) -> str:
    signing, encryption = _keys()
    iv = os.urandom(BLOCK)
    stamp = int(time.time()).to_bytes(8, "big")
    cipher = AES.new(encryption, AES.MODE_CBC, iv=iv)
    body = bytes([VERSION]) + stamp + iv + cipher.encrypt(pad(secret.encode(), BLOCK))
    mac = hmac.new(signing, body, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(body + mac).decode()


def unseal(token: str) -> str | None:
    """The plaintext, or None when the key changed since it was sealed (or the token is not
    one: a wrong version, a bad signature, a bad length or padding)."""
    try:
        data = base64.urlsafe_b64decode(token.encode())
    except (binascii.Error, ValueError):
        return None
    sealed = data[_HEAD:-_MAC]
    if len(data) < _HEAD + BLOCK + _MAC or data[0] != VERSION or len(sealed) % BLOCK:
        return None
    signing, encryption = _keys()
    expected = hmac.new(signing, data[:-_MAC], hashlib.sha256).digest()
    if not hmac.compare_digest(expected, data[-_MAC:]):
        return None
    cipher = AES.new(encryption, AES.MODE_CBC, iv=data[9:_HEAD])
    try:
        return unpad(cipher.decrypt(sealed), BLOCK).decode()
    except ValueError:  # padding (or UTF-8) that no sealed secret has
        return None


def mask(secret: str | None) -> str:
    """At most `sk-…abcd`: a prefix and the last four characters."""
    if not secret:
        return ""
    head = secret.split("-", 1)[0] + "-" if "-" in secret[:8] else ""
    return f"{head}…{secret[-4:]}" if len(secret) > 12 else "…"
