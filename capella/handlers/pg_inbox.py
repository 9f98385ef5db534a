"""The pg_inbox handler: a queue into a PostgreSQL table, each message exactly once.

Like ``copy``, the handler keeps a subscription on each queue as its cursor. A step reads
after the cursor, inserts the batch in one statement with ``ON CONFLICT (source, external_id)
DO NOTHING`` (one transaction), and commits the cursor only after the database has committed.
A crash between the two inserts the batch again and the primary key absorbs it, so the table
holds each message exactly once; an application that applies a row in the same transaction
as its own change (or deletes it when done) gets exactly-once processing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from capella.auth.rule import Identity
from capella.auth.secret import Secrets
from capella.core.base_queue import BaseQueue
from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.core.message import SaveMode
from capella.egress import Egress
from capella.errors import SubscriptionNotFound
from capella.file_access import FileAccess
from capella.handlers.base import Building, HandlerType, PassTally
from capella.handlers.per_queue import QueueHandler, cursor_lag, selected
from capella.handlers.postgres import ENCRYPTED, Database, Dsn, check_columns, check_table, quoted
from capella.links.reach import Reach
from capella.wire.postgres import PgInboxParams, PgInboxStatus

# A pass with a long backlog ends after this long, so the status shows progress.
PASS_SECONDS = 5.0
DEFAULT_TABLE = "capella_inbox"
# A lost cursor commit only inserts a batch again, which the primary key absorbs.
COMMIT_SAVE = SaveMode.MARK
COLUMNS: dict[str, tuple[str, ...]] = {
    "source": ("text",),
    "external_id": ("bigint",),
    "id": ("bigint",),
    "data": ("bytea",),
    "segment": ("bigint",),
    "headers": ("jsonb",),
    "time": ("timestamp with time zone",),
}


class InboxHandler(QueueHandler[PgInboxParams]):
    """Insert every message of the selected queues into the inbox table, once each."""

    needs = "read"
    closes = True

    def __init__(
        self,
        cluster: Cluster,
        queues: list[str],
        params: PgInboxParams,
        dsn: Dsn,
        secrets: Secrets | None = None,
        egress: Egress | None = None,
        files: FileAccess | None = None,
    ) -> None:
        super().__init__(cluster, queues, params)
        self._dsn = dsn
        self._db = Database(dsn, secrets, egress, files)
        self._insert = (
            f"INSERT INTO {quoted(params.table)} (source, external_id, id, data, segment, headers, time) "
            "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bytea[], $5::bigint[], "
            "$6::jsonb[], $7::timestamptz[]) ON CONFLICT (source, external_id) DO NOTHING"
        )
        self._duplicates = 0

    def status(self) -> PgInboxStatus:
        lag = cursor_lag(self._cluster, self._queues, self.params.subscription)
        return PgInboxStatus(sum(lag.values()), lag, self._duplicates)

    def stored_params(self) -> dict[str, Any]:
        return self._dsn.stored()

    async def pause(self, delay: float) -> None:
        """The supervisor's wait between passes: ends early when a selected queue gets a message."""
        waits = [
            asyncio.ensure_future(q.wait_for(q.last_id, delay)) for q in selected(self._cluster, self._queues)
        ]
        if not waits:
            await asyncio.sleep(delay)
            return
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            for wait in waits:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await wait

    async def close(self) -> None:
        await self._db.close()

    async def check(self, identity: Identity) -> None:
        await self._db.check(identity)

    async def run_queue(self, queue: BaseQueue) -> PassTally:
        params = self.params
        self.identity.check("subscription", "write", f"{queue.name}/{params.subscription}")
        try:
            cursor = queue.subscription(params.subscription).last_id
        except SubscriptionNotFound:
            cursor = 0
            await queue.commit(params.subscription, 0, save=COMMIT_SAVE)
        await self._db.connect(self.identity)
        # Checked every pass, not once per connection: a table can be created or altered.
        check_columns(params.table, await self._db.columns(params.table), COLUMNS, {})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PASS_SECONDS
        result = PassTally()
        while True:
            page = await queue.read_after(cursor, params.batch, params.segments)
            messages = page.messages
            if messages:
                tag = await self._db.execute(
                    self._insert,
                    [m.source for m in messages],
                    [m.external_id for m in messages],
                    [m.id for m in messages],
                    [m.payload for m in messages],
                    [m.segment for m in messages],
                    [orjson.dumps(m.headers).decode() for m in messages],
                    [datetime.fromtimestamp(m.time, UTC) for m in messages],
                )
                inserted = int(tag.rsplit(" ", 1)[-1])
                self._duplicates += len(messages) - inserted
                result += PassTally(inserted, sum(len(m.payload) for m in messages))
            # Only now, with the rows committed, may the cursor move past them.
            moved = page.last_id > cursor
            if moved:
                await queue.commit(params.subscription, page.last_id, save=COMMIT_SAVE)
                cursor = page.last_id
            if (not messages and not moved) or loop.time() >= deadline:
                break
        return result


def inbox_ddl(table: str = DEFAULT_TABLE) -> str:
    """The inbox table's CREATE TABLE."""
    check_table(table, "--table")
    return (
        "\n".join(
            [
                f"CREATE TABLE {quoted(table)} (",
                "    source       text NOT NULL,",
                "    external_id  bigint NOT NULL,",
                "    id           bigint NOT NULL,          -- the message's id in the queue",
                "    data         bytea NOT NULL,",
                "    segment      bigint NOT NULL,",
                "    headers      jsonb NOT NULL,",
                "    time         timestamptz NOT NULL,     -- when the queue received it",
                "    PRIMARY KEY (source, external_id)",
                ");",
            ]
        )
        + "\n"
    )


def inbox_params(
    params: PgInboxParams, reach: Reach, name: str = "", kept: Mapping[str, Any] | None = None
) -> tuple[PgInboxParams, Dsn]:
    """Handler ``name``'s params as shown and stored, and where it connects.

    A stored definition keeps the DSN's password encrypted beside them (``kept[ENCRYPTED]``).
    """
    encrypted = (kept or {}).get(ENCRYPTED)
    check_name(params.subscription, "subscription")
    dsn = Dsn.parse(params, encrypted, reach.sealer, name, reach.secrets, reach.by)
    return dsn.shown(params), dsn


def build(params: PgInboxParams, at: Building) -> tuple[PgInboxParams, InboxHandler]:
    """The ``pg_inbox`` handler type."""
    params, dsn = inbox_params(params, at.reach, at.name, at.kept)
    return params, InboxHandler(
        at.cluster, at.queues, params, dsn, at.reach.secrets, at.reach.egress, at.reach.files
    )


HANDLER = HandlerType("pg_inbox", PgInboxParams, build, status=PgInboxStatus)
