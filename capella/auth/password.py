"""Password hashing with scrypt: salted, slow, never reversible.

A hash is stored as ``scrypt$N$r$p$salt$digest`` (salt and digest in URL-safe base64), so the
cost can be raised later without breaking stored hashes. ``maxmem`` is explicit: OpenSSL's
default (32 MiB) is just below what N=2**14, r=8 needs with its overhead on some builds.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from functools import cache

from capella.errors import InvalidRequest

N = 2**14
R = 8
P = 1
MAXMEM = 64 * 1024 * 1024
DKLEN = 32
MIN_LENGTH = 8
MAX_LENGTH = 1024


def hash_password(password: str, *, n: int = N) -> str:
    """A fresh salted hash of ``password``."""
    check_password(password)
    salt = os.urandom(16)
    digest = _scrypt(password.encode(), salt, n, R, P)
    return f"scrypt${n}${R}${P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches ``encoded``; compares in constant time."""
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.urlsafe_b64decode(digest)
        actual = _scrypt(password.encode(), base64.urlsafe_b64decode(salt), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


@cache
def dummy_hash() -> str:
    """A hash no password matches, to spend the same time on unknown users."""
    return hash_password(base64.urlsafe_b64encode(os.urandom(24)).decode())


def check_password(password: object) -> str:
    """``password`` if it is acceptable as a new password, else ``InvalidRequest``."""
    if not isinstance(password, str):
        raise InvalidRequest("password must be a string", field="password")
    if not MIN_LENGTH <= len(password) <= MAX_LENGTH:
        raise InvalidRequest(
            f"password must be {MIN_LENGTH} to {MAX_LENGTH} characters long", field="password"
        )
    return password


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=MAXMEM, dklen=DKLEN)


def _b64(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).decode()
