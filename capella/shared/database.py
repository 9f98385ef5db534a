"""The shared queues' PostgreSQL: where it is (``[shared]`` dsn or dsn_secret), a pool, LISTEN.

Connections are made exactly as the pg handlers make theirs (``capella/handlers/postgres.py``:
host, port, user, database, password or "", no pass file, a TLS context or False), so asyncpg
reads no ``PG*`` variable, pass file or ``~/.postgresql``. The DSN is the operator's, so no
egress check applies. The pool drops a broken connection and opens a new one on the next use:
after PostgreSQL restarts, the first statement fails (``StorageUnavailable``) and makes the
pool replace all its idle connections, so the next one works. Every driver, socket and timeout
error becomes ``StorageUnavailable`` ("shared: postgres user@host:port/db: connection lost:
..."), or ``DatabaseRefused`` for a refusal (authentication, permission, a statement PostgreSQL
rejected); never with the password.

asyncpg (the ``[postgres]`` extra) is imported here only when a pool opens.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from capella.auth.rule import UNRESTRICTED
from capella.auth.secret import Secrets
from capella.config import SharedSettings
from capella.errors import CapellaError, DatabaseRefused, InvalidConfig, StorageUnavailable
from capella.file_access import FileAccess
from capella.handlers.postgres import Target, open_connection, parse_target, split_password, tls_context

log = logging.getLogger(__name__)

COMMAND_TIMEOUT = 10.0


@functools.cache
def driver_errors() -> tuple[type[Exception], ...]:
    """What the driver and the socket raise, translated here; anything else is a bug of ours
    and goes up as it is. (Evaluated only once an exception is being handled: asyncpg is
    installed by then.)"""
    import asyncpg

    return (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


def target_of(settings: SharedSettings, secrets: Secrets) -> Target:
    """Where ``[shared]`` says the database is: ``dsn`` (its password in the URL, if any) or the
    declared secret ``dsn_secret`` holding the whole DSN."""
    if (settings.dsn is None) == (settings.dsn_secret is None):
        raise InvalidConfig("[shared]: give dsn or dsn_secret (one of them)", field="shared.dsn")
    if settings.dsn_secret is not None:
        url = secrets.use(settings.dsn_secret, UNRESTRICTED, "shared.dsn_secret", to=None)
        where = "shared.dsn_secret"
        what = f"the DSN in secret {settings.dsn_secret!r}"
    else:
        assert settings.dsn is not None
        url, where, what = settings.dsn, "shared.dsn", "shared.dsn"
    bare, password = split_password(url, what, InvalidConfig, where)
    found = parse_target(bare, where, InvalidConfig)
    if settings.dsn_secret is not None:
        secrets.check_host(settings.dsn_secret, found.host, where)
    return replace(found, password=password)


async def open_pool(
    target: Target,
    *,
    size: int = 4,
    command_timeout: float = COMMAND_TIMEOUT,
    files: FileAccess | None = None,
) -> Pool:
    """A pool of up to ``size`` connections; it connects on first use, so PostgreSQL may be down
    now (the first statement then answers ``StorageUnavailable``)."""
    try:
        import asyncpg
    except ImportError:  # optional: only shared queues need it here
        raise InvalidConfig(
            "[shared] needs asyncpg: pip install 'capella[shared]'", field="shared.dsn"
        ) from None
    tls = await tls_context(target, UNRESTRICTED, files or FileAccess())

    shown = f"shared: postgres {target.shown}"

    async def connect(*_: Any, **extra: Any) -> Any:
        extra.pop("loop", None)
        try:
            return await open_connection(
                asyncpg, target, target.host, tls, command_timeout=command_timeout, **extra
            )
        except driver_errors() as exc:
            raise translate(exc, shown, target.password, "connect") from None

    pool = asyncpg.create_pool(
        min_size=0, max_size=size, connect=connect, max_inactive_connection_lifetime=60.0
    )
    async with _guard(shown, target.password, "connect"):
        await pool  # with min_size 0 this makes no connection
    return Pool(pool, target, command_timeout, connect)


class Pool:
    """Statements on pooled connections, each translated into Capella's errors."""

    def __init__(
        self, pool: Any, target: Target, command_timeout: float, connect: Callable[..., Any]
    ) -> None:
        self._pool = pool
        self._target = target
        self._timeout = command_timeout
        self._connect = connect
        self._where = f"shared: postgres {target.shown}"

    @property
    def shown(self) -> str:
        """``user@host:port/database`` for messages."""
        return self._target.shown

    @property
    def command_timeout(self) -> float:
        return self._timeout

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        async with self.connection() as conn:
            rows: list[Any] = await conn.fetch(sql, *args)
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        async with self.connection() as conn:
            return await conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        async with self.connection() as conn:
            return await conn.fetchval(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        """One statement in its own transaction; answers its command tag (``DELETE 3``)."""
        async with self.connection() as conn:
            status: str = await conn.execute(sql, *args)
        return status

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled asyncpg connection for the block; errors inside are translated."""
        try:
            async with self._pool.acquire(timeout=self._timeout) as conn:
                try:
                    yield conn
                except (asyncio.CancelledError, TimeoutError):
                    # Interrupted mid-statement: its state is unknown, never reuse it.
                    conn.terminate()
                    raise
        except CapellaError:
            raise
        except driver_errors() as exc:
            error = translate(exc, self._where, self._target.password, "query")
            if not isinstance(error, DatabaseRefused):
                # PostgreSQL restarted or the network broke: the pool's other idle connections
                # are as dead as this one, so replace them all instead of failing once each.
                await self._pool.expire_connections()
            raise error from None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """A pooled connection inside one transaction, committed when the block ends."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def listen(self, channel: str, callback: Callable[[str], None]) -> Listener:
        """LISTEN ``channel`` on a connection of its own (a pooled one would be reused);
        ``callback`` gets each payload. ``Listener.lost`` is set when the connection ends."""
        async with _guard(self._where, self._target.password, "connect"):
            conn = await self._connect()
        listener = Listener(conn, channel, self._where)
        async with _guard(self._where, self._target.password, "listen"):
            try:
                await conn.add_listener(channel, lambda _c, _pid, _ch, payload: callback(payload))
            except BaseException:
                conn.terminate()
                raise
        return listener

    async def close(self) -> None:
        try:
            async with asyncio.timeout(5.0):
                await self._pool.close()
        except Exception:  # closing lost connections: nothing left to save
            self._pool.terminate()

    def terminate(self) -> None:
        """Drop every connection without a goodbye (PostgreSQL does not answer)."""
        self._pool.terminate()


class Listener:
    """One LISTEN connection; ``lost`` is set once it ended (PostgreSQL restarted, the
    connection was cut, or ``close``): listen again on a new one, and poll meanwhile."""

    def __init__(self, conn: Any, channel: str, where: str) -> None:
        self._conn = conn
        self.channel = channel
        self._where = where
        self.lost = asyncio.Event()
        conn.add_termination_listener(lambda _c: self.lost.set())
        if conn.is_closed():
            self.lost.set()

    def terminate(self) -> None:
        self.lost.set()
        if not self._conn.is_closed():
            self._conn.terminate()

    async def close(self) -> None:
        self.lost.set()
        if self._conn.is_closed():
            return
        try:
            async with asyncio.timeout(5.0):
                await self._conn.close()
        except Exception:  # a lost connection: nothing to say goodbye to
            self._conn.terminate()


@asynccontextmanager
async def _guard(where: str, secret: str | None, what: str) -> AsyncIterator[None]:
    try:
        yield
    except CapellaError:
        raise
    except driver_errors() as exc:
        raise translate(exc, where, secret, what) from None


def translate(exc: Exception, where: str, secret: str | None = None, what: str = "query") -> CapellaError:
    """The Capella error for what asyncpg or the socket raised."""
    import asyncpg

    text = str(exc) or type(exc).__name__
    if secret:
        text = text.replace(secret, "***")
    if isinstance(exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError):
        return DatabaseRefused(f"{where}: authentication failed: {text}")
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return DatabaseRefused(f"{where}: {text}")
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return DatabaseRefused(f"{where}: permission denied: {text}")
    if isinstance(exc, TimeoutError):
        return StorageUnavailable(f"{where}: {what} timed out")
    if isinstance(
        exc,
        OSError
        | asyncpg.PostgresConnectionError
        | asyncpg.CannotConnectNowError
        | asyncpg.AdminShutdownError
        | asyncpg.CrashShutdownError
        | asyncpg.ConnectionDoesNotExistError
        | asyncpg.InterfaceError,
    ):
        verb = "cannot connect" if what == "connect" else "connection lost"
        return StorageUnavailable(f"{where}: {verb}: {text}")
    if isinstance(exc, asyncpg.PostgresError):
        return DatabaseRefused(f"{where}: {what} failed: {text}")
    log.error("unexpected database error %s", where, exc_info=exc)
    return StorageUnavailable(f"{where}: {what} failed: {type(exc).__name__}: {text}")
