"""PostgreSQL for the pg_outbox and pg_inbox handlers: the DSN, one connection, its errors.

asyncpg (the ``[postgres]`` extra) is imported only when a pg handler connects. Every asyncpg
and socket error becomes a Capella error here, with a message that says what is wrong (the
database cannot be reached, authentication failed, a table or column is missing or has the
wrong type): nothing above this module sees an asyncpg exception.

A DSN's password is never returned by the API, logged or stored in clear, as with cluster
links: the DSN is kept without it and the password is stored encrypted with the cluster's
key (``Links.encrypt``), or the whole DSN comes from an environment variable (``dsn_env``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from capella.errors import (
    CapellaError,
    DatabaseRefused,
    DatabaseUnavailable,
    InvalidConfig,
    InvalidRequest,
    TableMismatch,
)
from capella.handlers.links import Links
from capella.handlers.params import Params

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
COMMAND_TIMEOUT = 60.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Lower-case identifiers only, optionally schema-qualified: what PostgreSQL folds an unquoted
# name to, so the name in the params, in the DDL and in to_regclass is the same table.
_TABLE = re.compile(r"[a-z_][a-z0-9_]{0,62}(?:\.[a-z_][a-z0-9_]{0,62})?")
DSN_PARAMS = ("dsn", "dsn_env", "dsn_password_encrypted")


@dataclass(frozen=True, slots=True)
class Dsn:
    """Where to connect: a DSN without its password (or the variable that holds the DSN)."""

    url: str | None
    env: str | None
    password: str | None = field(default=None, repr=False)
    encrypted: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, params: Params, links: Links) -> Dsn:
        url, env = params.raw("dsn"), params.raw("dsn_env")
        if (url is None) == (env is None):
            raise InvalidRequest("params: give exactly one of dsn and dsn_env", field="params.dsn")
        if env is not None:
            if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
                raise InvalidRequest(
                    "params.dsn_env must name an environment variable", field="params.dsn_env"
                )
            return cls(None, env)
        if not isinstance(url, str):
            raise InvalidRequest("params.dsn must be a postgresql:// URL", field="params.dsn")
        bare, password = split_password(url, "params.dsn")
        encrypted = params.raw("dsn_password_encrypted")
        if password is not None:
            try:
                encrypted = links.encrypt(password)
            except InvalidRequest as exc:
                raise InvalidRequest(
                    f"params.dsn holds a password, which is stored only encrypted: {exc.message}; "
                    "or give params.dsn_env (a variable that holds the whole DSN)",
                    field="params.dsn",
                ) from None
        elif isinstance(encrypted, str):
            # A stored definition: the password comes back from the cluster's key.
            password = links.decrypt(encrypted)
        return cls(bare, None, password, encrypted if password is not None else None)

    def public_dict(self) -> dict[str, Any]:
        """What the API shows: the DSN without its password, and where the password is."""
        where = None if self.password is None else "stored encrypted"
        return {"dsn": self.url, "dsn_env": self.env, "password": where}

    def stored_dict(self) -> dict[str, Any]:
        """What the handler registry keeps: the password only encrypted."""
        return {"dsn": self.url, "dsn_env": self.env, "dsn_password_encrypted": self.encrypted}

    def resolve(self) -> tuple[str, str | None]:
        """(the DSN without password, the password) to connect with now."""
        if self.env is None:
            assert self.url is not None
            return self.url, self.password
        value = os.environ.get(self.env)
        if not value:
            raise InvalidConfig(f"environment variable {self.env} (params.dsn_env) is not set")
        return split_password(value, f"${self.env}", error=InvalidConfig)


def split_password(url: str, what: str, error: type[CapellaError] = InvalidRequest) -> tuple[str, str | None]:
    """(``url`` without its password, the password) for a ``postgresql://`` URL."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("postgres", "postgresql"):
        raise error(f"{what} must be a postgresql://user@host:port/database URL", field="params.dsn")
    query = parse_qsl(parts.query, keep_blank_values=True)
    password = None if parts.password is None else unquote(parts.password)
    for key, value in query:
        if key == "password":
            password = value
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 address
        netloc = f"[{netloc}]"
    if port is not None:
        netloc = f"{netloc}:{port}"
    if parts.username:
        netloc = f"{quote(unquote(parts.username), safe='')}@{netloc}"
    rest = urlencode([(k, v) for k, v in query if k != "password"])
    bare = urlunsplit((parts.scheme, netloc, parts.path, rest, ""))
    return bare, password


def check_table(value: object, field_name: str = "params.table") -> str:
    if not isinstance(value, str) or not _TABLE.fullmatch(value):
        raise InvalidRequest(
            f"{field_name} must be a lower-case table name, optionally schema.table", field=field_name
        )
    return value


def quoted(table: str) -> str:
    """The table as a quoted SQL identifier (``"app"."outbox"``)."""
    return ".".join(f'"{part}"' for part in table.split("."))


def check_columns(
    table: str,
    found: dict[str, str],
    required: dict[str, tuple[str, ...]],
    optional: dict[str, tuple[str, ...]],
) -> None:
    """``TableMismatch`` naming the first missing column or the first of a wrong type."""
    if not found:
        raise TableMismatch(f"table {table} does not exist (capella pg prints its CREATE TABLE)")
    for name, types in required.items():
        if name not in found:
            raise TableMismatch(f"table {table} has no column {name} ({' or '.join(types)})")
    for name, types in {**required, **optional}.items():
        if name in found and found[name] not in types:
            raise TableMismatch(
                f"table {table}: column {name} is {found[name]}, expected {' or '.join(types)}"
            )


class Database:
    """One connection to PostgreSQL, opened on first use and again after it was lost."""

    def __init__(self, dsn: Dsn) -> None:
        self._dsn = dsn
        self._conn: Any = None
        self._where = "postgres"
        self._secret: str | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def connect(self) -> bool:
        """Connect unless connected; ``True`` when a new connection was opened."""
        if self.connected:
            return False
        url, password = self._dsn.resolve()
        self._secret = password
        self._where = f"postgres {_display(url)}"
        try:
            import asyncpg
        except ImportError:  # optional: only pg handlers need it
            raise InvalidConfig(
                "the pg_outbox and pg_inbox handlers need asyncpg: pip install 'capella[postgres]'"
            ) from None
        async with self.guard("connect"):
            self._conn = await asyncpg.connect(
                url, password=password, timeout=CONNECT_TIMEOUT, command_timeout=COMMAND_TIMEOUT
            )
        log.info("database connected %s", self._where)
        return True

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                async with asyncio.timeout(5.0):
                    await conn.close()
            except Exception:  # closing a lost connection: nothing left to save
                conn.terminate()

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        async with self.guard("query"):
            rows: list[Any] = await self._conn.fetch(sql, *args)
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        async with self.guard("query"):
            return await self._conn.fetchrow(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        """Run one statement (its own transaction); answers the command tag (``DELETE 3``)."""
        async with self.guard("statement"):
            status: str = await self._conn.execute(sql, *args)
        return status

    async def listen(self, channel: str, wake: Callable[[], None]) -> None:
        async with self.guard("listen"):
            await self._conn.add_listener(channel, lambda *_: wake())

    async def columns(self, table: str) -> dict[str, str]:
        """Column name → type (``bigint``, ``jsonb``...); empty when the table does not exist."""
        rows = await self.fetch(
            "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
            table,
        )
        return {r[0]: r[1] for r in rows}

    @asynccontextmanager
    async def guard(self, what: str) -> AsyncIterator[None]:
        """Translate what the driver raises; a lost or interrupted connection is dropped."""
        if what != "connect" and not self.connected:
            raise DatabaseUnavailable(f"{self._where}: not connected")
        try:
            yield
        except asyncio.CancelledError:
            # Interrupted mid-statement: the connection's state is unknown, never reuse it.
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None
            raise
        except CapellaError:
            raise
        except Exception as exc:
            error = self._translate(exc, what)
            if isinstance(error, DatabaseUnavailable) and self._conn is not None:
                self._conn.terminate()
                self._conn = None
            raise error from None

    def _translate(self, exc: Exception, what: str) -> CapellaError:
        import asyncpg

        text = str(exc) or type(exc).__name__
        if self._secret:
            text = text.replace(self._secret, "***")
        where = self._where
        if isinstance(exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError):
            return DatabaseRefused(f"{where}: authentication failed: {text}")
        if isinstance(exc, asyncpg.InvalidCatalogNameError):
            return DatabaseRefused(f"{where}: {text}")
        if isinstance(exc, asyncpg.InsufficientPrivilegeError):
            return DatabaseRefused(f"{where}: permission denied: {text}")
        if isinstance(exc, asyncpg.UndefinedTableError | asyncpg.UndefinedColumnError):
            return TableMismatch(f"{where}: {text}")
        if isinstance(exc, asyncpg.InvalidColumnReferenceError) and "ON CONFLICT" in text:
            return TableMismatch(f"{where}: {text} (the table needs PRIMARY KEY (source, external_id))")
        if isinstance(exc, asyncpg.DataError | asyncpg.DatatypeMismatchError):
            return TableMismatch(f"{where}: a value does not fit its column: {text}")
        lost = self._conn is None or self._conn.is_closed()
        if lost or isinstance(
            exc,
            OSError
            | TimeoutError
            | asyncpg.PostgresConnectionError
            | asyncpg.CannotConnectNowError
            | asyncpg.AdminShutdownError
            | asyncpg.ConnectionDoesNotExistError,
        ):
            verb = "cannot connect" if what == "connect" else "connection lost"
            return DatabaseUnavailable(f"{where}: {verb}: {text}")
        if isinstance(exc, asyncpg.PostgresError):
            return DatabaseRefused(f"{where}: {what} failed: {text}")
        log.error("unexpected database error %s", where, exc_info=exc)
        return DatabaseUnavailable(f"{where}: {what} failed: {type(exc).__name__}: {text}")


def _display(url: str) -> str:
    """``user@host:port/database`` for messages (the URL has no password by now)."""
    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path}"
