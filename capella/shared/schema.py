"""The shared queues' schema in PostgreSQL: numbered SQL files in the package, applied in order.

``capella/shared/sql/NNN_name.sql`` is version NNN. ``migrate`` applies the missing ones in one
transaction under an advisory transaction lock, recording each in ``capella_schema``: nodes
starting at once wait for each other, and every file is applied exactly once. A database whose
version is newer than this package's is refused (an older node must not write to a schema it
does not know).
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from typing import Any, NamedTuple

from capella.errors import DatabaseRefused
from capella.shared.database import Pool

log = logging.getLogger(__name__)

# pg_advisory_xact_lock's key for migrations: any constant no other lock of ours uses
# (hashtext('capella:migrate') happened to be this once; a constant needs no round trip).
MIGRATE_LOCK = 0x43415045_4C4C4131  # "CAPELLA1"
_FILE = re.compile(r"(\d{3})_[a-z0-9_]+\.sql")


class Migration(NamedTuple):
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """The package's SQL files, by version."""
    found = []
    for entry in resources.files("capella.shared").joinpath("sql").iterdir():
        match = _FILE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [m.version for m in found]
    assert versions == list(range(1, len(found) + 1)), f"shared/sql: versions {versions} are not 1..n"
    return found


def latest() -> int:
    return len(migrations())


async def migrate(pool: Pool) -> int:
    """Apply the missing migrations; answers the database's version afterwards."""
    wanted = migrations()
    async with pool.transaction() as conn:
        await conn.execute("select pg_advisory_xact_lock($1)", MIGRATE_LOCK)
        await conn.execute(
            "create table if not exists capella_schema "
            "(version int primary key, applied timestamptz not null default now())"
        )
        current: int = await conn.fetchval("select coalesce(max(version), 0) from capella_schema")
        if current > len(wanted):
            raise DatabaseRefused(
                f"shared: postgres {pool.shown}: the schema is at version {current}, newer than this "
                f"node's {len(wanted)}: upgrade this node"
            )
        for migration in wanted[current:]:
            await _apply(conn, migration)
            log.info("shared schema migrated version=%d file=%s", migration.version, migration.name)
        return max(current, len(wanted))


async def _apply(conn: Any, migration: Migration) -> None:
    await conn.execute(migration.sql)
    await conn.execute("insert into capella_schema (version) values ($1)", migration.version)
