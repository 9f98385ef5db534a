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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from capella.auth.secret import Secrets
from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.core.message import SaveMode
from capella.core.queue import Queue
from capella.egress import Egress
from capella.errors import SubscriptionNotFound
from capella.handlers.base import HandlerParams, HandlerType, PassResult
from capella.handlers.params import Params, refuse_env_params, segment_ranges
from capella.handlers.postgres import (
    DSN_PARAMS,
    DSN_REPLACED,
    Database,
    Dsn,
    check_columns,
    check_table,
    quoted,
)
from capella.handlers.queues import QueueHandler, cursor_lag, selected
from capella.handlers.reach import Reach

# A pass with a long backlog ends after this long, so the status shows progress.
PASS_SECONDS = 5.0
DEFAULT_TABLE = "capella_inbox"
COLUMNS: dict[str, tuple[str, ...]] = {
    "source": ("text",),
    "external_id": ("bigint",),
    "id": ("bigint",),
    "data": ("bytea",),
    "segment": ("bigint",),
    "headers": ("jsonb",),
    "time": ("timestamp with time zone",),
}


@dataclass(frozen=True, slots=True)
class InboxParams(HandlerParams):
    dsn: Dsn
    subscription: str
    table: str = DEFAULT_TABLE
    batch: int = 1000
    segments: tuple[tuple[int, int], ...] | None = None
    interval: float = 1.0
    # A lost cursor commit only inserts a batch again, which the primary key absorbs.
    commit_save: SaveMode = SaveMode.MARK

    @classmethod
    def parse(cls, data: object, reach: Reach, name: str = "") -> InboxParams:
        refuse_env_params(data, DSN_REPLACED)
        params = Params(data, {"table", "batch", "segments", "subscription", "interval", *DSN_PARAMS})
        table = check_table(params.raw("table") or DEFAULT_TABLE)
        subscription = params.raw("subscription") or f"pg_inbox-{table}"
        check_name(str(subscription), "subscription")
        return cls(
            dsn=Dsn.parse(params, reach.links, name, reach.secrets, reach.by),
            subscription=str(subscription),
            table=table,
            batch=params.integer("batch", 1000) or 1000,
            segments=segment_ranges(params.raw("segments"), "params.segments"),
            interval=params.duration("interval", 1.0) or 1.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.dsn.public_dict(),
            "table": self.table,
            "subscription": self.subscription,
            "batch": self.batch,
            "segments": None if self.segments is None else [list(s) for s in self.segments],
            "interval": self.interval,
        }

    def stored_dict(self) -> dict[str, Any]:
        public = {k: v for k, v in self.to_dict().items() if k != "password"}
        return public | self.dsn.stored_dict()


class InboxHandler(QueueHandler[InboxParams]):
    """Insert every message of the selected queues into the inbox table, once each."""

    needs = "read"
    closes = True

    def __init__(
        self,
        cluster: Cluster,
        queues: list[str],
        params: InboxParams,
        secrets: Secrets | None = None,
        egress: Egress | None = None,
    ) -> None:
        super().__init__(cluster, queues, params)
        self._db = Database(params.dsn, secrets, egress)
        self._insert = (
            f"INSERT INTO {quoted(params.table)} (source, external_id, id, data, segment, headers, time) "
            "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bytea[], $5::bigint[], "
            "$6::jsonb[], $7::timestamptz[]) ON CONFLICT (source, external_id) DO NOTHING"
        )
        self._duplicates = 0

    def status(self) -> dict[str, Any]:
        """Extra status: messages each queue holds past the cursor, read now."""
        lag = cursor_lag(self._cluster, self._queues, self.params.subscription)
        return {
            "lag": sum(lag.values()),
            "lag_by_queue": lag,
            "duplicates": self._duplicates,
        }

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

    async def run_queue(self, queue: Queue) -> PassResult:
        params = self.params
        self.identity.check("subscription", "write", f"{queue.name}/{params.subscription}")
        try:
            cursor = queue.subscription(params.subscription).last_id
        except SubscriptionNotFound:
            cursor = 0
            await queue.commit(params.subscription, 0, save=params.commit_save)
        await self._db.connect(self.identity)
        # Checked every pass, not once per connection: a table can be created or altered.
        check_columns(params.table, await self._db.columns(params.table), COLUMNS, {})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PASS_SECONDS
        result = PassResult()
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
                result += PassResult(inserted, sum(len(m.payload) for m in messages))
            # Only now, with the rows committed, may the cursor move past them.
            moved = page.last_id > cursor
            if moved:
                await queue.commit(params.subscription, page.last_id, save=params.commit_save)
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


def build(
    cluster: Cluster, queues: list[str], raw: object, reach: Reach, name: str
) -> tuple[InboxParams, InboxHandler]:
    """The ``pg_inbox`` handler type."""
    params = InboxParams.parse(raw, reach, name)
    return params, InboxHandler(cluster, queues, params, reach.secrets, reach.egress)


HANDLER = HandlerType("pg_inbox", InboxParams, build)
