"""Users and tokens, kept in ``<data_dir>/auth/`` as two JSON files written atomically
(``USERS`` and ``TOKENS`` in ``capella.storage.catalog``).

Passwords are stored only as scrypt hashes and token secrets only as SHA-256 digests (a token
secret has 256 random bits, so a fast hash is enough). The files are mode 0600 in a 0700
directory. A running server holds an exclusive lock on ``auth/lock`` so that the offline
``capella user ... --data-dir`` commands cannot change the files under it.

Methods are synchronous (small files, rare writes, slow hashes): the server calls the ones
that hash or write in a thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from msgspec import UNSET
from msgspec.structs import replace as replace_field

from capella.auth.password import check_password, hash_password
from capella.auth.rule import AccessRule, Identity
from capella.errors import (
    AlreadyExists,
    Conflict,
    CorruptData,
    InvalidRequest,
    TokenNotFound,
    UserNotFound,
)
from capella.fsync import create_directories, open_private
from capella.storage.catalog import TOKENS, USERS
from capella.wire.auth import User, UserPut
from capella.wire.decode import decode
from capella.wire.records import StoredToken, StoredUser, TokenFile, UserFile

LOCK_FILE = "lock"
TOKEN_PREFIX = "cap_"
_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
_TOKEN = re.compile(r"cap_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")

# What one user may hold, so a definition cannot grow the users file without bound.
MAX_RULES = 1000


@dataclass(frozen=True, slots=True)
class Account:
    """A user as the store holds it: its record (``wire.records.StoredUser``) with its rules as
    the checks read them. The API shows it as ``wire.auth.User`` (``shown``)."""

    name: str
    password_hash: str = field(repr=False)
    admin: bool = False
    enabled: bool = True
    rules: tuple[AccessRule, ...] = ()
    created: float = 0.0
    updated: float = 0.0

    @classmethod
    def of_record(cls, name: str, record: StoredUser) -> Account:
        """The account of a stored user; the record's key is its name, whatever its copy says."""
        rules = tuple(AccessRule.parse(r, f"rules[{i}]") for i, r in enumerate(record.rules))
        return cls(
            name, record.password_hash, record.admin, record.enabled, rules, record.created, record.updated
        )

    def identity(self, via: str) -> Identity:
        return Identity(self.name, self.admin, self.rules, via)

    def shown(self) -> User:
        """What the API shows: never the hash."""
        rules = [r.to_wire() for r in self.rules]
        return User(self.name, self.admin, self.enabled, rules, self.created, self.updated)

    def record(self) -> StoredUser:
        return StoredUser(
            name=self.name,
            admin=self.admin,
            enabled=self.enabled,
            rules=[r.to_wire() for r in self.rules],
            created=self.created,
            updated=self.updated,
            password_hash=self.password_hash,
        )


def split_token(text: str) -> tuple[str, str] | None:
    """``(id, secret)`` from a token's text, or None when it is not shaped like one."""
    m = _TOKEN.fullmatch(text)
    return (m.group(1), m.group(2)) if m else None


def token_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_user_name(name: str) -> str:
    if not _USER_NAME.fullmatch(name):
        raise InvalidRequest(
            f"user name {name!r}: letters, digits, '_', '.', '@', '-'; at most 128; a letter or digit first",
            field="name",
        )
    return name


class AuthStore:
    """The users and tokens of one data directory."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self._clock = clock
        self._users: dict[str, Account] = {}
        self._tokens: dict[str, StoredToken] = {}
        self._lock_fd: int | None = None
        # The server changes users in worker threads (hashing is slow): one change at a time.
        self._mutex = threading.RLock()
        self._load()

    # --- ownership -----------------------------------------------------------------------

    def lock(self) -> None:
        """Hold the directory for this process; ``Conflict`` when another process holds it."""
        self._mkdir()
        fd = open_private(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Conflict(
                f"{self.directory} is in use by a running server: change users through its API "
                "(`capella user ... --url URL`) or stop it first"
            ) from None
        self._lock_fd = fd
        self._load()  # what the previous holder wrote

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- users ---------------------------------------------------------------------------

    def users(self) -> list[Account]:
        return [self._users[name] for name in sorted(self._users)]

    def user(self, name: str) -> Account:
        try:
            return self._users[name]
        except KeyError:
            raise UserNotFound(f"no user {name!r}") from None

    def find_user(self, name: str) -> Account | None:
        return self._users.get(name)

    def act_on(self, by: Identity, name: str) -> Account | None:
        """User ``name`` for ``by`` to act on (its password, tokens, handlers, state), or None
        when there is no such user yet.

        Acting on yourself is yours to do. Acting on another user needs ``user admin`` on the
        name and, when the user exists, everything that user holds (``covers``): a grant to
        act on a user never lets its holder act *as* one who holds more (Kubernetes RBAC's
        escalation check; PostgreSQL lets only superusers alter superusers).
        """
        user = self._users.get(name)
        if name == by.name:
            return user
        by.check("user", "admin", name)
        if user is not None:
            by.check_acting_on(user.identity("none"))
        return user

    def put_user(self, name: str, data: object) -> tuple[Account, bool]:
        """Create (``password`` required) or update a user from an API-style object."""
        return self.apply(name, decode(data, UserPut))

    def apply(self, name: str, body: UserPut) -> tuple[Account, bool]:
        """Create (``password`` required) or update a user from a body; what it leaves out stays."""
        return self.change_user(
            name,
            password=None if body.password is UNSET else body.password,
            admin=None if body.admin is UNSET else body.admin,
            enabled=None if body.enabled is UNSET else body.enabled,
            rules=None if body.rules is UNSET else parse_rules(body.rules),
        )

    def change_user(
        self,
        name: str,
        *,
        password: str | None = None,
        admin: bool | None = None,
        enabled: bool | None = None,
        rules: tuple[AccessRule, ...] | None = None,
    ) -> tuple[Account, bool]:
        """Create (``password`` required) or update a user; None leaves a field as it is."""
        with self._mutex:
            check_user_name(name)
            old = self._users.get(name)
            now = self._clock()
            if old is None:
                if password is None:
                    raise InvalidRequest("password is required for a new user", field="password")
                old = Account(name, "", created=now)
            changes: dict[str, Any] = {"updated": now}
            if password is not None:
                changes["password_hash"] = hash_password(check_password(password))
            if admin is not None:
                changes["admin"] = admin
            if enabled is not None:
                changes["enabled"] = enabled
            if rules is not None:
                changes["rules"] = rules
            user = replace(old, **changes)
            created = name not in self._users
            if not created and not (user.admin and user.enabled):
                self._keep_an_admin(name)
            self._users[name] = user
            self._save_users()
            return user, created

    def add_user(
        self, name: str, password: str, *, admin: bool = False, rules: tuple[AccessRule, ...] = ()
    ) -> Account:
        with self._mutex:
            if name in self._users:
                raise AlreadyExists(f"user {name!r} already exists")
            return self.change_user(name, password=password, admin=admin, rules=rules)[0]

    def drop_user(self, name: str) -> None:
        """Delete the user and revoke its tokens."""
        with self._mutex:
            self.user(name)
            self._keep_an_admin(name)
            del self._users[name]
            self._tokens = {k: t for k, t in self._tokens.items() if t.user != name}
            self._save_users()
            self._save_tokens()

    def _keep_an_admin(self, name: str) -> None:
        # Losing the last enabled admin would lock everybody out of user management.
        old = self._users.get(name)
        others = [u for u in self._users.values() if u.admin and u.enabled and u.name != name]
        if old is not None and old.admin and old.enabled and not others:
            raise Conflict(f"{name!r} is the last enabled admin: make another user admin first")

    # --- tokens --------------------------------------------------------------------------

    def tokens(self, user: str | None = None) -> list[StoredToken]:
        now = self._clock()
        found = [t for t in self._tokens.values() if not t.expired(now) and user in (None, t.user)]
        return sorted(found, key=lambda t: (t.created, t.id))

    def token(self, token_id: str) -> StoredToken:
        token = self._tokens.get(token_id)
        if token is None or token.expired(self._clock()):
            raise TokenNotFound(f"no token {token_id!r}")
        return token

    def create_token(self, user: str, ttl: float | None, description: str = "") -> tuple[StoredToken, str]:
        """A new token for ``user``; the text (``cap_<id>_<secret>``) is shown only now."""
        with self._mutex:
            return self._create_token(user, ttl, description)

    def _create_token(self, user: str, ttl: float | None, description: str) -> tuple[StoredToken, str]:
        self.user(user)
        now = self._clock()
        self._tokens = {k: t for k, t in self._tokens.items() if not t.expired(now)}
        secret = secrets.token_urlsafe(32)
        token = StoredToken(
            id=secrets.token_hex(8),
            user=user,
            digest=token_digest(secret),
            created=now,
            expires=None if ttl is None else now + ttl,
            description=description,
        )
        self._tokens[token.id] = token
        self._save_tokens()
        return token, f"{TOKEN_PREFIX}{token.id}_{secret}"

    def revoke_token(self, token_id: str) -> StoredToken:
        with self._mutex:
            token = self.token(token_id)
            self._tokens = {k: t for k, t in self._tokens.items() if k != token_id}
            self._save_tokens()
            return token

    def check_token(self, text: str) -> Account | None:
        """The enabled user a valid, unexpired token belongs to; None otherwise."""
        parts = split_token(text)
        token = self._tokens.get(parts[0]) if parts else None
        digest = token_digest(parts[1]) if parts else ""
        # Compare even when the id is unknown, so both cases cost the same.
        matches = hmac.compare_digest(digest, token.digest if token is not None else "0" * 64)
        if token is None or not matches or token.expired(self._clock()):
            return None
        user = self._users.get(token.user)
        return user if user is not None and user.enabled else None

    # --- files ---------------------------------------------------------------------------

    def _load(self) -> None:
        users = USERS.read(self.directory).users
        tokens = TOKENS.read(self.directory).tokens
        try:
            self._users = {name: Account.of_record(name, u) for name, u in users.items()}
        except InvalidRequest as exc:
            raise CorruptData(f"auth files in {self.directory} are not valid: {exc}") from None
        # The record's key is the id, whatever its copy inside says.
        self._tokens = {tid: replace_field(t, id=tid) for tid, t in tokens.items()}

    def _save_users(self) -> None:
        USERS.write(self.directory, UserFile(users={u.name: u.record() for u in self.users()}))

    def _save_tokens(self) -> None:
        TOKENS.write(self.directory, TokenFile(tokens=dict(self._tokens)))

    def _mkdir(self) -> None:
        create_directories(self.directory, mode=0o700)


def parse_rules(raw: object) -> tuple[AccessRule, ...]:
    """A user's rules, each a line or an object (``wire.auth.Rule``); at most ``MAX_RULES``."""
    if not isinstance(raw, list):
        raise InvalidRequest("rules must be a list", field="rules")
    if len(raw) > MAX_RULES:
        raise InvalidRequest(f"rules: at most {MAX_RULES} rules per user", field="rules")
    return tuple(AccessRule.parse(r, f"rules[{i}]") for i, r in enumerate(raw))
