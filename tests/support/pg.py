"""A throwaway PostgreSQL cluster for tests: initdb in a temp dir, 127.0.0.1 on a free port.

initdb refuses to run as root, so as root the server runs as the ``postgres`` user (Debian's
package creates it), in a temp dir that user owns. Authentication is ``trust`` on loopback,
except for the role ``capella_pw``, which must give its password (scram-sha-256).
``fresh_database`` makes a database of its own for one test and connects to it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

PASSWORD_ROLE = "capella_pw"
PASSWORD = "s3cret-Pw_9!"
START_TIMEOUT = 30.0


def available() -> str | None:
    """None when Debian's PostgreSQL server binaries are here; otherwise why not (a skip reason)."""
    try:
        for name in ("initdb", "pg_ctl", "psql"):
            _bin(name)
    except RuntimeError as exc:
        return str(exc)
    return None


def _bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    if found is None:
        raise RuntimeError(f"{name} not found: run `make tools` (installs Debian's postgresql)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster; ``dsn(database)`` reaches it as the superuser ``postgres``.

    Fast and forgetful by default (``fsync = off``, ``synchronous_commit = off``): a crash of the
    machine could lose commits, which no test causes. ``durable=True`` turns both on, with
    full-page writes, for tests that kill or restart PostgreSQL and count what survived.
    """

    def __init__(self, durable: bool = False, max_connections: int = 50) -> None:
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="capella-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        hba = (
            f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
            "host all all 127.0.0.1/32 trust\n"
            "local all all trust\n"
        )
        # Existing files, rewritten in place: they keep their owner.
        (self.data / "pg_hba.conf").write_text(hba)
        safety = "on" if durable else "off"
        (self.data / "postgresql.auto.conf").write_text(
            f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.root}'\nfsync = {safety}\nsynchronous_commit = {safety}\n"
            f"full_page_writes = {safety}\nmax_connections = {max_connections}\n",
        )
        self.start()
        self.psql("postgres", f"CREATE ROLE {PASSWORD_ROLE} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")

    def dsn(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self._run(
            _bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w",
            "-t", str(int(START_TIMEOUT)), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def psql(self, database: str, sql: str) -> str:
        return self._run(
            _bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database,
            "-v", "ON_ERROR_STOP=1", "-qAtc", sql,
        )  # fmt: skip

    def create_database(self, name: str) -> str:
        self.psql("postgres", f"CREATE DATABASE {name}")
        return self.dsn(name)

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, *command: str) -> str:
        deadline = time.monotonic() + START_TIMEOUT + 30
        done = subprocess.run(
            [*self._as_user, *command],
            capture_output=True,
            text=True,
            timeout=max(1.0, deadline - time.monotonic()),
            cwd=self.root,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr}{done.stdout}")
        return done.stdout


@contextlib.asynccontextmanager
async def fresh_database(
    server: PgServer, name: str | None = None
) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A new database on ``server`` (``name``, or a random one) and its DSN, with a connection
    to it that is closed after the block."""
    dsn = server.create_database(name or f"t{uuid.uuid4().hex[:12]}")
    conn = await asyncpg.connect(dsn)
    try:
        yield dsn, conn
    finally:
        await conn.close()
