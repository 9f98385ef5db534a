"""The pg_outbox handler: committed rows of a PostgreSQL outbox table into a queue, once each.

A service inserts its events into the outbox table in the same transaction as its change. A
relay step reads the committed rows in id order, appends them to the queue as a dedup insert
with identity (``source``, ``id``), and deletes them (or sets ``relayed_at``) only after the
append is answered. A crash anywhere repeats a batch, which dedup absorbs: each committed row
is in the queue exactly once, and rows of rolled-back transactions never appear.

There is no high-water mark: every step reads what is still in the table from its lowest id,
so a row whose transaction commits after a higher id's (sequence ids commit out of order) is
relayed when it becomes visible, after the rows that were visible before it.

The handler LISTENs on a channel named like the table; with the NOTIFY trigger that
``capella pg outbox-ddl --notify`` prints, a commit wakes it at once instead of after
``interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import msgspec
import orjson

from capella.auth.rule import Identity
from capella.auth.secret import Secrets
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.egress import Egress
from capella.errors import InvalidMessage, InvalidRequest, QueueNotFound
from capella.file_access import FileAccess
from capella.handlers.base import Building, Handler, HandlerType, PassTally
from capella.handlers.postgres import ENCRYPTED, Database, Dsn, check_columns, check_table, quoted
from capella.links.reach import Reach
from capella.wire.handlers import Definition
from capella.wire.postgres import PgOutboxParams, PgOutboxStatus

# A pass with a long backlog ends after this long, so the status shows progress.
PASS_SECONDS = 5.0
DEFAULT_TABLE = "capella_outbox"
INTEGER = ("bigint", "integer")
REQUIRED = {"id": INTEGER, "data": ("bytea", "text", "jsonb", "json")}
OPTIONAL = {
    "segment": INTEGER,
    "headers": ("jsonb", "json"),
    "created_at": ("timestamp with time zone",),
    "deliver_at": ("timestamp with time zone",),
    "relayed_at": ("timestamp with time zone",),
}


class OutboxHandler(Handler):
    """Relay the outbox table's committed rows into ``params.to``, then delete them."""

    closes = True

    def __init__(
        self,
        cluster: Cluster,
        params: PgOutboxParams,
        dsn: Dsn,
        secrets: Secrets | None = None,
        egress: Egress | None = None,
        files: FileAccess | None = None,
    ) -> None:
        self._cluster = cluster
        self.params = params
        self.interval = params.interval
        self._dsn = dsn
        self._save = SaveMode.parse(params.save)
        self._db = Database(dsn, secrets, egress, files)
        self._wake = asyncio.Event()
        self._select = ""
        self._done = ""
        self._lag = ""
        self._listening = False
        self._source: str | None = params.source
        self._waiting: int | None = None
        self._oldest_age: float | None = None
        # The table is counted at the end of each pass (a query per status read would let
        # anyone who can read the status load the database); this is when it last was.
        self._observed: float | None = None
        self._duplicates = 0

    def status(self) -> PgOutboxStatus:
        return PgOutboxStatus(
            lag=self._waiting,
            lag_observed=self._observed,
            oldest_age=self._oldest_age,
            source=self._source,
            duplicates=self._duplicates,
        )

    def stored_params(self) -> dict[str, Any]:
        return self._dsn.stored()

    async def pause(self, delay: float) -> None:
        """The supervisor's wait between passes: ends early when a commit NOTIFYs the table."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._wake.wait()

    async def close(self) -> None:
        await self._db.close()

    async def check(self, identity: Identity) -> None:
        await self._db.check(identity)

    async def run_once(self) -> PassTally:
        params = self.params
        self.identity.check("queue", "write", params.to)
        queue = self._cluster.queue(params.to)
        # Cleared before reading: a commit notified during this pass wakes the next one at once.
        self._wake.clear()
        if await self._db.connect(self.identity):
            self._listening = False
        # Checked every pass, not once per connection: a table can be created or altered.
        await self._prepare()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PASS_SECONDS
        result = PassTally()
        while True:
            rows = await self._db.fetch(self._select, params.batch)
            if rows:
                drafts = [self._draft(row) for row in rows]
                try:
                    answers = await queue.append(drafts, self._save)
                except InvalidMessage as exc:
                    index = exc.details.get("index")
                    row = rows[index]["id"] if isinstance(index, int) else "?"
                    raise InvalidMessage(f"outbox {params.table} row {row}: {exc.message}") from None
                # Only now, with the append answered, may the rows go.
                await self._db.execute(self._done, [row["id"] for row in rows])
                self._duplicates += sum(1 for a in answers if a.duplicate)
                result += PassTally(len(rows), sum(len(d.payload) for d in drafts))
            if len(rows) < params.batch or loop.time() >= deadline:
                break
        await self._measure_lag()
        return result

    async def _prepare(self) -> None:
        """Check the columns and build the statements; LISTEN once per connection."""
        params = self.params
        columns = await self._db.columns(params.table)
        required = dict(REQUIRED) | ({} if params.delete else {"relayed_at": OPTIONAL["relayed_at"]})
        check_columns(params.table, columns, required, OPTIONAL)
        table = quoted(params.table)
        wanted = [c for c in ("id", "data", "segment", "headers", "created_at", "deliver_at") if c in columns]
        pending = "" if params.delete else " WHERE relayed_at IS NULL"
        self._select = f"SELECT {', '.join(wanted)} FROM {table}{pending} ORDER BY id LIMIT $1"
        if params.delete:
            self._done = f"DELETE FROM {table} WHERE id = ANY($1::bigint[])"
        else:
            self._done = f"UPDATE {table} SET relayed_at = now() WHERE id = ANY($1::bigint[])"
        oldest = "min(created_at)" if "created_at" in columns else "NULL::timestamptz"
        self._lag = f"SELECT count(*), {oldest}, now() FROM {table}{pending}"
        if self._source is None:
            database = (await self._db.fetchrow("SELECT current_database()"))[0]
            self._source = f"pg:{database}.{params.table}"
        if not self._listening:
            await self._db.listen(params.table.rpartition(".")[2], self._wake.set)
            self._listening = True

    def _draft(self, row: Any) -> Draft:
        data = row["data"]
        if data is None:
            raise InvalidMessage(f"outbox {self.params.table} row {row['id']}: data is NULL")
        created = row.get("created_at")
        deliver = row.get("deliver_at")
        return Draft(
            payload=data if isinstance(data, bytes) else data.encode(),
            source=self._source,
            external_id=row["id"],
            external_time=None if created is None else created.timestamp(),
            segment=row.get("segment") or 0,
            headers=self._headers(row),
            deliver_at=None if deliver is None else deliver.timestamp(),
        )

    def _headers(self, row: Any) -> dict[str, str]:
        raw = row.get("headers")
        if raw is None:
            return {}
        value = orjson.loads(raw)
        if not isinstance(value, dict):
            raise InvalidMessage(f"outbox {self.params.table} row {row['id']}: headers must be a JSON object")
        # A string map: other JSON values keep their JSON text.
        return {k: v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in value.items()}

    async def _measure_lag(self) -> None:
        waiting, oldest, now = await self._db.fetchrow(self._lag)
        self._waiting = waiting
        self._oldest_age = None if oldest is None else max(0.0, (now - oldest).total_seconds())
        self._observed = now.timestamp()


def outbox_ddl(table: str = DEFAULT_TABLE, *, notify: bool = False, keep: bool = False) -> str:
    """The outbox table's CREATE TABLE, and with ``notify`` the trigger that wakes the relay."""
    check_table(table, "--table")
    name = quoted(table)
    channel = table.rpartition(".")[2]
    lines = [
        f"CREATE TABLE {name} (",
        "    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,",
        "    data        bytea NOT NULL,          -- or text, or jsonb",
        "    segment     bigint NOT NULL DEFAULT 0,",
        "    headers     jsonb,                   -- a JSON object of strings",
        "    created_at  timestamptz NOT NULL DEFAULT now(),",
        "    deliver_at  timestamptz" + ("," if keep else ""),
    ]
    if keep:
        lines.append("    relayed_at  timestamptz              -- set by the relay (delete: false)")
    lines.append(");")
    if keep:
        lines.append(f'CREATE INDEX "{channel}_pending" ON {name} (id) WHERE relayed_at IS NULL;')
    if notify:
        function = quoted(f"{table}_notify")
        lines += [
            "",
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$",
            "BEGIN",
            f"    PERFORM pg_notify('{channel}', '');",
            "    RETURN NULL;",
            "END $$;",
            f'CREATE TRIGGER "{channel}_notify" AFTER INSERT ON {name}',
            f"    FOR EACH STATEMENT EXECUTE FUNCTION {function}();",
        ]
    return "\n".join(lines) + "\n"


def outbox_params(
    params: PgOutboxParams, reach: Reach, name: str = "", kept: Mapping[str, Any] | None = None
) -> tuple[PgOutboxParams, Dsn]:
    """Handler ``name``'s params as shown and stored, and where it connects.

    A stored definition keeps the DSN's password encrypted beside them (``kept[ENCRYPTED]``).
    """
    encrypted = (kept or {}).get(ENCRYPTED)
    dsn = Dsn.parse(params, encrypted, reach.sealer, name, reach.secrets, reach.by)
    save = SaveMode.parse(params.save).name.lower()
    return dsn.shown(msgspec.structs.replace(params, save=save)), dsn


def build(params: PgOutboxParams, at: Building) -> tuple[PgOutboxParams, OutboxHandler]:
    """The ``pg_outbox`` handler type; its target queue must exist."""
    params, dsn = outbox_params(params, at.reach, at.name, at.kept)
    try:
        at.cluster.queue(params.to)
    except QueueNotFound as exc:
        raise InvalidRequest(f"params.to: {exc.message}", field="params.to") from None
    return params, OutboxHandler(at.cluster, params, dsn, at.reach.secrets, at.reach.egress, at.reach.files)


def selects(definition: Definition, cluster: Cluster) -> list[str]:
    """Its one queue is the destination, ``params.to``; it takes no ``queues``."""
    if definition.named_queues() is not None:
        raise InvalidRequest("pg_outbox names its queue in params.to, not queues", field="queues")
    return [definition.params.to] if isinstance(definition.params, PgOutboxParams) else []


HANDLER = HandlerType("pg_outbox", PgOutboxParams, build, status=PgOutboxStatus, queues=selects)
