"""PostgreSQL for the pg_outbox and pg_inbox handlers: the DSN, one connection, its errors.

asyncpg (the ``[postgres]`` extra) is imported only when a pg handler connects. Every asyncpg
and socket error becomes a Capella error here, with a message that says what is wrong (the
database cannot be reached, authentication failed, a table or column is missing or has the
wrong type): nothing above this module sees an asyncpg exception.

A handler connects only with what its definition gives, never with the broker's own
credentials: the DSN (``dsn``, or ``dsn_secret``, a declared secret that holds it) names the
host, port, database and user, and the password is the DSN's own (stored only encrypted,
bound to the handler and the DSN: ``capella/auth/sealed.py``) or a declared secret's
(``password_secret``). asyncpg is given every value explicitly (host, port, user, database,
password, TLS context), so it never reads ``PG*`` variables, a pass file, a service file or
``~/.postgresql``. DSN parameters are an allow-list; anything else is refused by name.

The host is resolved here and every address checked by the egress policy; the connection
goes to the address that was checked (a DNS answer that changes between the check and the
connect cannot slip past), and TLS still verifies the certificate for the DSN's host name.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import msgspec

from capella.auth.rule import UNRESTRICTED, Identity
from capella.auth.sealed import Sealer, bound
from capella.auth.secret import Secrets
from capella.egress import Egress
from capella.errors import (
    CapellaError,
    DatabaseRefused,
    DatabaseUnavailable,
    EgressRefused,
    InvalidConfig,
    InvalidRequest,
    TableMismatch,
)
from capella.file_access import FileAccess, ca_data
from capella.wire.postgres import TABLE_PATTERN, PgConnection

log = logging.getLogger(__name__)
P = TypeVar("P", bound=PgConnection)

CONNECT_TIMEOUT = 10.0
COMMAND_TIMEOUT = 60.0
_TABLE = re.compile(TABLE_PATTERN)
# Where the registry keeps a DSN's password, encrypted; never taken from the API.
ENCRYPTED = "dsn_password_encrypted"
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# The query parameters a DSN may carry; host, port, user and database are the URL's own
# parts. sslrootcert names trust anchors on the server: a file under [files] allow unless an
# admin's handler names it (capella/file_access.py, which reads every one of them); sslcert
# and sslkey name a client certificate on the server, which is the broker's own credential,
# so only an admin's handler may name them.
_QUERY = ("sslmode", "sslrootcert", "sslcert", "sslkey")
_CLIENT_CERT = ("sslcert", "sslkey")


@dataclass(frozen=True, slots=True)
class Target:
    """Everything a connection needs, explicitly: nothing is left for the driver to look up."""

    host: str
    port: int
    user: str
    database: str
    password: str | None = field(default=None, repr=False)
    sslmode: str = "prefer"
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None
    sslpassword: str | None = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        """``user@host:port/database`` for messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}:{self.port}/{self.database}"


@dataclass(frozen=True, slots=True)
class Dsn:
    """Where to connect: a DSN without its password, or the secret that holds the DSN."""

    url: str | None
    secret: str | None = None  # dsn_secret: a declared secret with the whole DSN
    password_secret: str | None = None
    sslpassword_secret: str | None = None
    password: str | None = field(default=None, repr=False)
    encrypted: str | None = field(default=None, repr=False)

    @classmethod
    def parse(
        cls,
        params: PgConnection,
        encrypted: object,
        sealer: Sealer,
        handler: str,
        secrets: Secrets,
        by: Identity,
    ) -> Dsn:
        """The DSN params of handler ``handler``; every secret named must be one ``by`` may use.

        ``encrypted`` is the password the registry kept (``ENCRYPTED``), or None.
        """
        dsn = cls(None, params.dsn_secret, params.password_secret, params.sslpassword_secret)
        if params.dsn is not None:
            bare, password = split_password(params.dsn, "params.dsn")
            if password is not None and dsn.password_secret is not None:
                raise InvalidRequest(
                    "params.dsn holds a password and params.password_secret names one: give one",
                    field="params.password_secret",
                )
            context = ("pg handler", handler, bare, "password")
            if password is not None:
                try:
                    encrypted = sealer.encrypt(password, context)
                except InvalidRequest as exc:
                    raise InvalidRequest(
                        f"params.dsn holds a password, which is stored only encrypted: {exc.message}; "
                        "or give params.password_secret (a declared secret)",
                        field="params.dsn",
                    ) from None
            elif isinstance(encrypted, str):
                # A stored definition (the API refuses *_encrypted): only this handler's
                # ciphertext for this very DSN decrypts.
                password = sealer.decrypt(encrypted, context)
                if not bound(encrypted):
                    encrypted = sealer.encrypt(password, context)
            dsn = replace(
                dsn,
                url=bare,
                password=password,
                encrypted=encrypted if password is not None and isinstance(encrypted, str) else None,
            )
        # Resolved now as the definer: an unusable secret or DSN refuses the definition.
        dsn.target(secrets, by, InvalidRequest)
        return dsn

    def shown(self, params: P) -> P:
        """``params`` as the API shows them: the DSN without its password, and where it is."""
        where = None
        if self.password is not None:
            where = "stored encrypted"
        elif self.password_secret is not None:
            where = f"secret:{self.password_secret}"
        return msgspec.structs.replace(params, dsn=self.url, password=where)

    def stored(self) -> dict[str, Any]:
        """What the handler registry keeps beside the params: the password, only encrypted."""
        return {ENCRYPTED: self.encrypted}

    def target(
        self, secrets: Secrets, identity: Identity, error: type[CapellaError] = InvalidConfig
    ) -> Target:
        """Where and as whom to connect now, with the secrets ``identity`` may use."""
        if self.secret is not None:
            url = secrets.use(self.secret, identity, "params.dsn_secret", to=None)
            # The whole DSN is the secret: its password is allowed, and errors never show it.
            bare, password = split_password(
                url, f"the DSN in secret {self.secret!r}", error, "params.dsn_secret"
            )
            where = "params.dsn_secret"
        else:
            assert self.url is not None
            bare, password, where = self.url, self.password, "params.dsn"
        found = parse_target(bare, where, error)
        # A bound secret ([secrets.NAME] hosts) goes only to its hosts: the DSN's host, as named.
        if self.secret is not None:
            secrets.check_host(self.secret, found.host, "params.dsn_secret")
        if self.password_secret is not None:
            password = secrets.use(self.password_secret, identity, "params.password_secret", to=found.host)
        sslpassword = None
        if self.sslpassword_secret is not None:
            sslpassword = secrets.use(
                self.sslpassword_secret, identity, "params.sslpassword_secret", to=found.host
            )
        if (found.sslcert or found.sslkey) and not identity.admin:
            raise error(
                f"{where}: sslcert and sslkey name a client certificate on the server, which is the "
                "broker's own credential: only a handler that runs as an admin may use them",
                field=where,
            )
        return replace(found, password=password, sslpassword=sslpassword)


def split_password(
    url: str, what: str, error: type[CapellaError] = InvalidRequest, where: str = "params.dsn"
) -> tuple[str, str | None]:
    """(``url`` without its password, the password) for a ``postgresql://`` URL."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        parts, port, query = None, None, []
    if parts is None or parts.scheme not in ("postgres", "postgresql"):
        raise error(f"{what} must be a postgresql://user@host:port/database URL", field=where)
    password = None if parts.password is None else unquote(parts.password)
    for key, value in query:
        if key == "password":
            password = value
        elif key == "sslpassword":
            raise error(
                f"{what}: sslpassword is a secret and is never taken from a DSN: give "
                "params.sslpassword_secret (a declared secret)",
                field=where,
            )
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


def parse_target(url: str, where: str, error: type[CapellaError]) -> Target:
    """The allowed parts of a DSN without password; anything else is refused by name."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key in query:
        if key not in _QUERY:
            raise error(
                f"{where}: the DSN parameter {key!r} is not accepted (only host, port, dbname and "
                f"user in the URL, and {', '.join(_QUERY)})",
                field=where,
            )
    host = parts.hostname
    if not host or host.startswith("/") or "," in parts.netloc or "%2f" in parts.netloc.lower():
        raise error(
            f"{where}: the DSN must name one host (user@host:port/database); Unix sockets and "
            "host lists are not accepted",
            field=where,
        )
    user = unquote(parts.username or "")
    if not user:
        raise error(f"{where}: the DSN must name its user (postgresql://user@host/database)", field=where)
    database = unquote(parts.path.lstrip("/")) or user
    sslmode = query.get("sslmode", "prefer")
    if sslmode not in SSLMODES:
        raise error(f"{where}: sslmode must be one of {', '.join(SSLMODES)}", field=where)
    return Target(
        host=host,
        port=parts.port or 5432,
        user=user,
        database=database,
        sslmode=sslmode,
        sslrootcert=query.get("sslrootcert") or None,
        sslcert=query.get("sslcert") or None,
        sslkey=query.get("sslkey") or None,
    )


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

    def __init__(
        self,
        dsn: Dsn,
        secrets: Secrets | None = None,
        egress: Egress | None = None,
        files: FileAccess | None = None,
    ) -> None:
        self._dsn = dsn
        self._secrets = secrets or Secrets()
        self._egress = egress or Egress.open()
        self._files = files or FileAccess()
        self._conn: Any = None
        self._where = "postgres"
        self._secret: str | None = None
        self._target: Target | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def check(self, identity: Identity) -> None:
        """What ``connect`` would refuse before connecting, as a definition's error: a secret
        or a TLS file ``identity`` may not use."""
        await tls_context(self._dsn.target(self._secrets, identity, InvalidRequest), identity, self._files)

    async def connect(self, identity: Identity = UNRESTRICTED) -> bool:
        """Connect unless connected, as ``identity`` (whose secrets); ``True`` when newly connected."""
        try:
            # Every pass, also when connected: a revoked grant closes the connection, and a
            # rotated secret opens a new one with the new value.
            target = self._dsn.target(self._secrets, identity)
        except CapellaError:
            await self.close()
            raise
        if self.connected and target == self._target:
            return False
        await self.close()
        self._target = target
        self._secret = target.password
        self._where = f"postgres {target.shown}"
        try:
            import asyncpg
        except ImportError:  # optional: only pg handlers need it
            raise InvalidConfig(
                "the pg_outbox and pg_inbox handlers need asyncpg: pip install 'capella[postgres]'"
            ) from None
        # Read for each new connection, as its user may read them: a file can change.
        tls = await tls_context(target, identity, self._files)
        addresses = await self._addresses(target)
        async with self.guard("connect"):
            last: BaseException | None = None
            for address in addresses:
                try:
                    self._conn = await open_connection(asyncpg, target, address, tls)
                    break
                except (OSError, TimeoutError, asyncpg.PostgresConnectionError) as exc:
                    last = exc
            if self._conn is None:
                assert last is not None
                raise last
        log.info("database connected %s", self._where)
        return True

    async def _addresses(self, target: Target) -> list[str]:
        """The host's addresses that the egress policy allows (checked here, connected to as is)."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except OSError as exc:
            raise DatabaseUnavailable(f"{self._where}: cannot resolve {target.host}: {exc}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        allowed, refused = [], None
        for address in addresses:
            try:
                self._egress.check(address, target.host)
                allowed.append(address)
            except EgressRefused as exc:
                refused = exc
        if not allowed:
            assert refused is not None
            raise EgressRefused(f"{self._where} (params.dsn): {refused.message}", **refused.details)
        return allowed

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


async def open_connection(
    asyncpg: Any,
    target: Target,
    address: str,
    tls: ssl.SSLContext | None,
    *,
    command_timeout: float = COMMAND_TIMEOUT,
    **extra: Any,
) -> Any:
    """A connection to ``address``, every setting explicit so asyncpg consults nothing else.

    With a password (even empty) asyncpg reads neither PGPASSWORD nor a pass file; with no DSN
    it reads no service file; with an SSL context (or False) neither PGSSLMODE nor the
    ``~/.postgresql`` files; host, port, user and database given leave no PG* variable to read.
    ``extra`` goes to ``asyncpg.connect`` as is (a pool's ``connection_class``, ``record_class``).
    """
    options: dict[str, Any] = {
        **extra,
        "host": address,
        "port": target.port,
        "user": target.user,
        "database": target.database,
        "password": target.password or "",
        "passfile": None,
        "target_session_attrs": "any",
        "krbsrvname": "postgres",
        "gsslib": "gssapi",
        "timeout": CONNECT_TIMEOUT,
        "command_timeout": command_timeout,
    }
    if tls is None:
        return await asyncpg.connect(ssl=False, **options)
    try:
        return await asyncpg.connect(ssl=tls, **options)
    except ConnectionError as exc:
        # allow and prefer take a server without TLS as it is, as libpq does.
        if target.sslmode not in ("allow", "prefer") or "rejected SSL upgrade" not in str(exc):
            raise
    return await asyncpg.connect(ssl=False, **options)


class _Pinned(ssl.SSLContext):
    """A TLS context that checks the certificate for the DSN's host name.

    The connection goes to an address resolved and checked here, so asyncpg is given the
    address and would verify the certificate for it; every TLS session this context starts
    names ``server_name`` instead (asyncio's and uvloop's TLS both go through ``wrap_bio``).
    """

    server_name: str | None = None

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(incoming, outgoing, server_side, self.server_name or server_hostname, session)


async def tls_context(target: Target, identity: Identity, files: FileAccess) -> ssl.SSLContext | None:
    """The TLS context for ``target.sslmode``; ``None`` for disable. Only files the DSN names.

    Each file is read by ``files`` (off the event loop, a regular file only, as ``identity``
    may name it); the trust anchors are given to ``ssl`` as bytes, never as a path.
    """
    if target.sslmode == "disable":
        return None
    verify = target.sslmode in ("verify-ca", "verify-full") or (
        target.sslmode == "require" and target.sslrootcert is not None
    )
    cadata = None
    if verify and target.sslrootcert is not None:
        cadata = ca_data(await files.read(target.sslrootcert, admin=identity.admin, field="params.dsn"))
    for path in (target.sslcert, target.sslkey):
        if path is not None:  # an admin's only (Dsn.target): checked to be a regular file
            await files.read(path, admin=True, field="params.dsn")
    # The system's trust store and the client certificate are files too: read in a thread.
    return await asyncio.to_thread(_context, target, verify, cadata)


def _context(target: Target, verify: bool, cadata: str | bytes | None) -> ssl.SSLContext:
    context = _Pinned(ssl.PROTOCOL_TLS_CLIENT)
    context.server_name = target.host
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if verify:
            if cadata is not None:
                context.load_verify_locations(cadata=cadata)
            else:
                context.load_default_certs()
            context.check_hostname = target.sslmode == "verify-full"
            context.verify_mode = ssl.CERT_REQUIRED
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if target.sslcert is not None:
            password = target.sslpassword or ""
            context.load_cert_chain(target.sslcert, target.sslkey, password=lambda: password)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise InvalidConfig(f"params.dsn: a TLS file cannot be used: {exc}", field="params.dsn") from None
    return context
