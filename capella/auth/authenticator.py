"""Credentials to an ``Identity``: HTTP Basic, bearer tokens, and TLS client certificates.

A slow hash on every Basic request would cripple an edge device, so a successful check is
remembered for ``cache_ttl`` under an HMAC of the name and password with a key that lives only
in this process's memory: the cache never holds a password, and an entry only counts while
the user's stored hash is the one it was checked against (a password change ends it at once).
Failures are never cached. Unknown users are checked against a dummy hash, and disabled users
after their hash, so unknown user, wrong password and disabled user cost the same time and get
the same answer.

Every login path a stranger can fill is bounded (docs/security.md, "Logins under attack"):

- At most ``HASHING_AT_ONCE`` hashes run at a time and ``LOGINS_WAITING`` checks wait for one;
  one more is answered ``429 too_many_logins`` at once instead of queueing.
- Checks of the same name and password while one is running wait for its result: a client
  that opens many connections at once costs one hash, not one each.
- Failed checks spend a budget per client address and one per user name (``throttle.py``);
  a spent budget is ``429 too_many_failed_logins`` with the seconds to wait, and
  no hash runs. The user's budget applies to any name, existing or not, so it tells nothing.
- The name's budget refuses only addresses that have been failing themselves (their own
  budget not yet earned back) and that have not signed in as that user within ``KNOWN_FOR``:
  guesses from many addresses spend the name's budget, but never refuse the right password
  from an address that has not been guessing, so a flood cannot lock the owner out (OWASP
  warns that lockout by name is a denial of service anyone can cause).
- Bearer tokens and TLS client certificates need no hash and no budget: no flood of Basic
  logins delays or refuses them.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import time
from collections.abc import Callable
from typing import TypeVar

from capella.auth.password import MAX_LENGTH, dummy_hash, verify_password
from capella.auth.rule import Identity
from capella.auth.store import Account, AuthStore
from capella.auth.throttle import Throttle, client_key
from capella.config import AuthSettings
from capella.errors import InvalidRequest, TooManyFailedLogins, TooManyLogins, Unauthorized

log = logging.getLogger(__name__)

# Entries of the verified cache and of the known (user, address) pairs.
CACHE_SIZE = 10_000
# scrypt takes ~16 MiB and a core for tens of milliseconds: a few at a time, the rest queue.
HASHING_AT_ONCE = 2
# Checks that may wait for a hash slot. At ~50 ms a hash, two at a time, the last one waits
# under a second; more would only make every login slower.
LOGINS_WAITING = 32
# How long an address that signed in as a user keeps its own budget for that user's name.
KNOWN_FOR = 7 * 86400.0

V = TypeVar("V")


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
        self._waiting = 0  # checks started and not yet hashing
        self._checking: dict[bytes, asyncio.Task[str | None]] = {}  # digest -> its running check
        window = settings.failed_login_window
        self._addresses = Throttle(settings.max_failed_logins_per_address, window)
        self._names = Throttle(settings.max_failed_logins_per_user, window)
        self._known: dict[bytes, float] = {}  # digest of (name, address) -> until
        dummy_hash()  # computed now, not on the first failed login

    async def basic(self, name: str, password: str, address: str = "") -> Identity:
        """The user for a name and password, or ``Unauthorized``; ``RateLimited`` when the
        password cannot be checked now. ``address`` is the client's, for its budget."""
        user = self.store.find_user(name)
        key = self._digest(name, password)
        cached = self._verified.get(key)
        if user is not None and cached is not None:
            checked, until = cached
            if checked == user.password_hash and self._clock() < until:
                if not user.enabled:
                    raise _invalid()
                return user.identity("basic")
            del self._verified[key]
        check = self._checking.get(key)
        if check is None:
            check = self._start_check(key, name, password, user, address)
        # Shielded: a client that goes away does not cancel a check others wait for.
        matched = await asyncio.shield(check)
        if user is None or matched is None or matched != user.password_hash or not user.enabled:
            raise _invalid()
        return user.identity("basic")

    def _start_check(
        self, key: bytes, name: str, password: str, user: Account | None, address: str
    ) -> asyncio.Task[str | None]:
        now = self._clock()
        client = client_key(address)
        account = self._digest(name)
        known = self._is_known(name, client, now)
        wait = self._addresses.wait(client, now)
        if not known and self._addresses.spent(client, now):
            wait = max(wait, self._names.wait(account, now))
        if wait > 0:
            raise TooManyFailedLogins(
                "too many failed logins from this address or for this user name; try again later",
                retry_after=max(1, math.ceil(wait)),
            )
        if self._waiting >= LOGINS_WAITING:
            raise TooManyLogins(
                f"{LOGINS_WAITING} logins are already waiting for a password check; try again later",
                retry_after=1,
            )
        if self._addresses.take(client, now) < 1:
            log.warning("failed logins over the limit address=%s", client)
        if not known and self._names.take(account, now) < 1:
            log.warning("failed logins over the limit user=%.64r", name)
        stored = user.password_hash if user is not None else dummy_hash()
        usable = user is not None and user.enabled
        self._waiting += 1
        check = asyncio.create_task(self._check(key, name, password, stored, usable, client, known))
        self._checking[key] = check
        check.add_done_callback(lambda _: self._checking.pop(key, None))
        return check

    async def _check(
        self, key: bytes, name: str, password: str, stored: str, usable: bool, client: str, known: bool
    ) -> str | None:
        """``stored`` when ``password`` matches it, else None; a success refunds the budgets."""
        try:
            await self._hashing.acquire()
        finally:
            self._waiting -= 1
        try:
            ok = len(password) <= MAX_LENGTH and await asyncio.to_thread(verify_password, password, stored)
        finally:
            self._hashing.release()
        if not (ok and usable):
            return None
        now = self._clock()
        self._addresses.give(client, now)
        if not known:
            self._names.give(self._digest(name), now)
        self._remember(self._known, self._digest(name, client), now + KNOWN_FOR)
        self._remember(self._verified, key, (stored, now + self._cache_ttl))
        return stored

    def _is_known(self, name: str, client: str, now: float) -> bool:
        until = self._known.get(self._digest(name, client))
        return until is not None and now < until

    def _digest(self, *parts: str) -> bytes:
        # Keyed: the tables hold no name, password or address an attacker could read back.
        return hmac.digest(self._key, "\0".join(parts).encode(), "sha256")

    @staticmethod
    def _remember(table: dict[bytes, V], key: bytes, value: V) -> None:
        table.pop(key, None)  # re-inserted last, so the oldest entry goes first
        if len(table) >= CACHE_SIZE:
            table.pop(next(iter(table)))
        table[key] = value

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
