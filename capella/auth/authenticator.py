"""Credentials to an ``Identity``: HTTP Basic, bearer tokens, and TLS client certificates.

A slow hash on every Basic request would cripple an edge device, so a successful check is
remembered for ``cache_ttl`` under an HMAC of the name and password with a key that lives only
in this process's memory: the cache never holds a password, and an entry only counts while
the user's stored hash is the one it was checked against (a password change ends it at once).
Failures are never cached. Unknown users are checked against a dummy hash, and disabled users
after their hash, so unknown user, wrong password and disabled user cost the same time and get
the same answer.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from collections.abc import Callable

from capella.auth.password import MAX_LENGTH, dummy_hash, verify_password
from capella.auth.rule import Identity
from capella.auth.store import AuthStore
from capella.config import AuthSettings
from capella.errors import InvalidRequest, Unauthorized

CACHE_SIZE = 10_000
# scrypt takes ~16 MiB and a core for tens of milliseconds: a few at a time, the rest queue.
HASHING_AT_ONCE = 2


class Authenticator:
    def __init__(
        self,
        store: AuthStore,
        settings: AuthSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings
        self._cache_ttl = settings.cache_ttl
        self._clock = clock
        self._key = os.urandom(32)
        self._verified: dict[bytes, tuple[str, float]] = {}  # digest -> (hash checked, until)
        self._hashing = asyncio.Semaphore(HASHING_AT_ONCE)
        dummy_hash()  # computed now, not on the first failed login

    async def basic(self, name: str, password: str) -> Identity:
        """The user for a name and password, or ``Unauthorized``."""
        user = self.store.find_user(name)
        key = hmac.digest(self._key, f"{name}\0{password}".encode(), "sha256")
        cached = self._verified.get(key)
        if user is not None and cached is not None:
            checked, until = cached
            if checked == user.password_hash and self._clock() < until:
                if not user.enabled:
                    raise _invalid()
                return user.identity("basic")
            del self._verified[key]
        stored = user.password_hash if user is not None else dummy_hash()
        async with self._hashing:
            ok = len(password) <= MAX_LENGTH and await asyncio.to_thread(verify_password, password, stored)
        if not ok or user is None or not user.enabled:
            raise _invalid()
        if len(self._verified) >= CACHE_SIZE:
            self._verified.pop(next(iter(self._verified)))
        self._verified[key] = (stored, self._clock() + self._cache_ttl)
        return user.identity("basic")

    def token(self, text: str) -> Identity:
        """The user a bearer token belongs to, or ``Unauthorized``."""
        user = self.store.check_token(text)
        if user is None:
            raise Unauthorized("the token is not valid (unknown, revoked or expired)")
        return user.identity("token")

    def certificate(self, common_name: str) -> Identity:
        """The user named by a verified TLS client certificate's common name."""
        user = self.store.find_user(common_name)
        if user is None or not user.enabled:
            raise Unauthorized("the client certificate does not name an enabled user")
        return user.identity("tls")

    def token_ttl(self, requested: float | None) -> float:
        """The lifetime of a new token: the default, or ``requested`` up to the maximum."""
        ttl = self.settings.token_ttl if requested is None else requested
        if not 0 < ttl <= self.settings.token_max_ttl:
            raise InvalidRequest(
                f"ttl: must be greater than 0 and at most {self.settings.token_max_ttl:g} s", field="ttl"
            )
        return ttl


def _invalid() -> Unauthorized:
    return Unauthorized("invalid user name or password")
