"""`providers.sealing`: provider keys at rest are Fernet tokens, the same as
`cryptography.fernet` makes and opens (earlier versions sealed with it)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from Cryptodome.Cipher import AES
from cryptography.fernet import Fernet
from django.conf import settings
from django.test import override_settings

from providers.sealing import seal, unseal

SECRET = "sk-live-0123456789abcdef-ünïcode"


def fernet() -> Fernet:
    digest = hashlib.sha256(b"ocx-provider-keys:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def test_a_sealed_key_opens_and_is_not_in_the_token() -> None:
    token = seal(SECRET)
    assert unseal(token) == SECRET
    assert SECRET.encode() not in base64.urlsafe_b64decode(token)
    assert seal(SECRET) != token  # a fresh IV each time


def test_tokens_are_cryptography_fernet_tokens_both_ways() -> None:
    assert unseal(fernet().encrypt(SECRET.encode()).decode()) == SECRET
    assert fernet().decrypt(seal(SECRET).encode()).decode() == SECRET
    for secret in ("", "x", "a" * 15, "a" * 16, "a" * 17, "k" * 300):
        assert unseal(fernet().encrypt(secret.encode()).decode()) == secret
        assert fernet().decrypt(seal(secret).encode()).decode() == secret


def test_another_secret_key_opens_nothing() -> None:
    token = seal(SECRET)
    with override_settings(SECRET_KEY="another-secret-key-0123456789"):
        assert unseal(token) is None


@pytest.mark.parametrize(
    ("at", "what"), [(0, "version"), (3, "timestamp"), (12, "iv"), (30, "ciphertext"), (-1, "mac")]
)
def test_a_changed_byte_anywhere_opens_nothing(at: int, what: str) -> None:
    data = bytearray(base64.urlsafe_b64decode(seal(SECRET)))
    data[at] ^= 0x01
    assert unseal(base64.urlsafe_b64encode(bytes(data)).decode()) is None


@pytest.mark.parametrize(
    "token", ["", "not base64!", "gAAAAA==", base64.urlsafe_b64encode(b"\x80" * 72).decode()]
)
def test_what_is_not_a_token_opens_nothing(token: str) -> None:
    assert unseal(token) is None


def test_a_signed_token_with_bad_padding_opens_nothing() -> None:
    # A correct signature over a ciphertext whose last block does not unpad.
    key = hashlib.sha256(b"ocx-provider-keys:" + settings.SECRET_KEY.encode()).digest()
    iv = b"\x00" * 16
    body = b"\x80" + b"\x00" * 8 + iv + AES.new(key[16:], AES.MODE_CBC, iv=iv).encrypt(b"\x00" * 16)
    mac = hmac.new(key[:16], body, hashlib.sha256).digest()
    assert unseal(base64.urlsafe_b64encode(body + mac).decode()) is None
    truncated = base64.urlsafe_b64decode(seal(SECRET))
    assert unseal(base64.urlsafe_b64encode(truncated[:-33] + truncated[-32:]).decode()) is None


def test_sealing_loads_neither_cryptography_nor_cffi_and_cffi_still_imports() -> None:
    # cryptography's bindings cost a worker 8-9 MB, pycryptodomex's cffi binding 2 MB more
    # than its ctypes one (cffi parses C declarations with pycparser at import).
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, sys, django; django.setup(); "
        "from providers.sealing import seal, unseal; assert unseal(seal('sk-x')) == 'sk-x'; "
        "import Cryptodome.Util._raw_api as raw; "
        "lean = ('pycparser', 'cffi', 'cryptography.hazmat.bindings._rust'); "
        "loaded = sorted(m for m in lean if m in sys.modules); import cffi; "
        "print(json.dumps([raw.backend, loaded]))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ocxsite.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["ctypes", []]
