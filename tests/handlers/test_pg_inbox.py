"""The pg_inbox handler against a real PostgreSQL: each message exactly once in the table.

Every test has its own database on the session's throwaway cluster (tests/support/pg.py) and compares
the table's rows with the queue's messages, byte for byte.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import msgspec
import orjson
import pytest
from support.pg import PgServer
from support.servers import ServerProcess
from support.wait import eventually

from capella.cli import main
from capella.core.cluster import Cluster
from capella.core.message import Draft, LogMessage, SaveMode
from capella.handlers.pg_inbox import InboxHandler, inbox_ddl, inbox_params
from capella.handlers.pg_outbox import outbox_ddl
from capella.handlers.supervisor import Supervisor
from capella.links.reach import Reach
from capella.links.registry import Links
from capella.wire.params import decode_params
from capella.wire.postgres import PgInboxParams


@pytest.fixture
async def db(pg_server: PgServer) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A new database with the inbox table: its DSN and a connection."""
    dsn = pg_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    conn = await asyncpg.connect(dsn)
    await conn.execute(inbox_ddl())
    yield dsn, conn
    await conn.close()


@pytest.fixture
async def orders(cluster: Cluster) -> Cluster:
    queue, _ = await cluster.put_queue("orders", {})
    rng = random.Random(3)
    await queue.append(
        [
            Draft(
                os.urandom(rng.randint(0, 200)),
                source=f"svc-{i % 3}" if i % 2 else None,
                external_id=1000 + i if i % 2 else None,
                segment=i % 5,
                headers={"k": str(i)} if i % 4 == 0 else {},
            )
            for i in range(300)
        ],
        SaveMode.WAIT,
    )
    return cluster


def copier(cluster: Cluster, dsn: str, **params: Any) -> InboxHandler:
    return InboxHandler(
        cluster,
        ["orders"],
        *inbox_params(decode_params(PgInboxParams, {"dsn": dsn, **params}), Reach(Links(cluster))),
    )


async def table_rows(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT source, external_id, id, data, segment, headers, time FROM capella_inbox ORDER BY id"
    )
    return [(r[0], r[1], r[2], r[3], r[4], orjson.loads(r[5]), r[6].timestamp()) for r in rows]


def cursor(cluster: Cluster) -> int:
    """The inbox's cursor on orders (0 before its first commit)."""
    return next(
        (s.last_id for s in cluster.queue("orders").subscriptions() if s.name == "pg_inbox-capella_inbox"), 0
    )


def expected(queued: list[LogMessage]) -> list[tuple[Any, ...]]:
    return [(m.source, m.external_id, m.id, m.payload, m.segment, m.headers, m.time) for m in queued]


async def test_every_message_lands_once_byte_exact_and_the_cursor_follows(
    orders: Cluster, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    handler = copier(orders, dsn, batch=64)
    try:
        assert (await handler.run_once()).items == 300
        queue = orders.queue("orders")
        assert cursor(orders) == queue.last_id
        assert handler.status().lag == 0
        rows = await table_rows(conn)
        queued = (await queue.read_after(0, 1000)).messages
        assert [r[:6] for r in rows] == [e[:6] for e in expected(queued)]
        assert [r[6] for r in rows] == pytest.approx([e[6] for e in expected(queued)], abs=1e-6)
        # As after a crash between the insert and the cursor commit: the batch comes again.
        await queue.commit("pg_inbox-capella_inbox", 100, reset=True)
        assert (await handler.run_once()).items == 0
        assert handler.status().duplicates == 200
        assert len(await table_rows(conn)) == 300
    finally:
        await handler.close()


async def test_a_segment_filter_copies_only_its_segments(
    orders: Cluster, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    handler = copier(orders, dsn, segments=[[1, 2]])
    try:
        await handler.run_once()
    finally:
        await handler.close()
    queued = (await orders.queue("orders").read_after(0, 1000)).messages
    assert [r[:6] for r in await table_rows(conn)] == [e[:6] for e in expected(queued) if e[4] in (1, 2)]


async def test_the_cursor_stays_until_the_database_has_the_rows(
    orders: Cluster, supervisor: Supervisor, pg_server: PgServer
) -> None:
    database = f"t{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(database)
    await supervisor.put(
        "inbox", {"type": "pg_inbox", "queue": "orders", "params": {"dsn": dsn}, "started": False}
    )
    status = msgspec.to_builtins((await supervisor.run_now("inbox")).info())["status"]
    assert "table capella_inbox does not exist" in status["last_error"]["message"]
    assert status["lag"] == 300
    queue = orders.queue("orders")
    assert cursor(orders) == 0
    pg_server.psql(database, inbox_ddl())
    status = msgspec.to_builtins((await supervisor.run_now("inbox")).info())["status"]
    assert status["last_error"] is None and status["items"] == 300
    assert cursor(orders) == queue.last_id


@pytest.mark.parametrize(
    ("ddl", "expected"),
    [
        (
            inbox_ddl().replace("data         bytea", "data         text"),
            "column data is text, expected bytea",
        ),
        (inbox_ddl().replace("    headers      jsonb NOT NULL,\n", ""), "has no column headers"),
        (
            inbox_ddl().replace("PRIMARY KEY (source, external_id)", "CHECK (true)"),
            "the table needs PRIMARY KEY (source, external_id)",
        ),
    ],
)
async def test_a_wrong_table_shows_in_the_status(
    orders: Cluster, supervisor: Supervisor, pg_server: PgServer, ddl: str, expected: str
) -> None:
    database = f"t{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(database)
    pg_server.psql(database, ddl)
    await supervisor.put(
        "inbox", {"type": "pg_inbox", "queue": "orders", "params": {"dsn": dsn}, "started": False}
    )
    status = msgspec.to_builtins((await supervisor.run_now("inbox")).info())["status"]
    assert expected in status["last_error"]["message"]
    assert cursor(orders) == 0


async def test_an_unreachable_database_shows_in_the_status(orders: Cluster, supervisor: Supervisor) -> None:
    await supervisor.put(
        "inbox",
        {
            "type": "pg_inbox",
            "queue": "orders",
            "params": {"dsn": "postgresql://postgres@127.0.0.1:1/x"},
            "started": False,
        },
    )
    status = msgspec.to_builtins((await supervisor.run_now("inbox")).info())["status"]
    assert "postgres postgres@127.0.0.1:1/x: cannot connect" in status["last_error"]["message"]


async def test_a_new_message_wakes_the_inbox_long_before_its_interval(
    orders: Cluster, supervisor: Supervisor, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    state, _ = await supervisor.put(
        "inbox", {"type": "pg_inbox", "queue": "orders", "params": {"dsn": dsn, "interval": "60s"}}
    )

    async def ran() -> bool:
        return state.runs > 0

    assert await eventually(ran, 10)
    started = time.monotonic()
    await orders.queue("orders").append([Draft(b"wake up", source="late", external_id=1)], SaveMode.WAIT)

    async def landed() -> bool:
        return bool(await conn.fetchval("SELECT count(*) FROM capella_inbox WHERE source = 'late'"))

    await eventually(landed, 10)
    assert time.monotonic() - started < 5
    assert await conn.fetchval("SELECT data FROM capella_inbox WHERE source = 'late'") == b"wake up"
    assert await conn.fetchval("SELECT count(*) FROM capella_inbox") == 301


async def test_the_cli_prints_a_table_the_handler_accepts(
    orders: Cluster, pg_server: PgServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pg", "inbox-ddl", "--table", "app_inbox"]) == 0
    dsn = pg_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    conn = await asyncpg.connect(dsn)
    handler = copier(orders, dsn, table="app_inbox")
    try:
        await conn.execute(capsys.readouterr().out)
        assert (await handler.run_once()).items == 300
        assert await conn.fetchval("SELECT count(*) FROM app_inbox") == 300
    finally:
        await handler.close()
        await conn.close()
    assert main(["pg", "inbox-ddl", "--table", "Robert'); DROP TABLE x"]) == 1


def test_the_cli_defines_runs_and_shows_both_handlers(
    server_process: ServerProcess, pg_server: PgServer, capsys: pytest.CaptureFixture[str]
) -> None:
    database = f"t{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(database)
    pg_server.psql(database, outbox_ddl() + inbox_ddl())
    pg_server.psql(database, "INSERT INTO capella_outbox (data) VALUES ('one'), ('two')")

    def cli(*argv: str) -> tuple[int, str]:
        code = main(["--url", server_process.url, *argv])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    assert cli("queue", "create", "pgcli")[0] == 0
    outbox = ["--type", "pg_outbox", "--param", "to=pgcli", "--param", f"dsn={dsn}", "--stopped"]
    assert cli("handler", "create", "pgcli-out", *outbox)[0] == 0
    assert cli("handler", "run", "pgcli-out") == (0, "handler pgcli-out pass ok: 2 items, 6 bytes\n")
    code, shown = cli("handler", "show", "pgcli-out")
    assert code == 0 and "waiting        0 rows" in shown
    inbox = ["--type", "pg_inbox", "--queue", "pgcli", "--param", f"dsn={dsn}", "--stopped"]
    assert cli("handler", "create", "pgcli-in", *inbox)[0] == 0
    assert cli("handler", "run", "pgcli-in")[0] == 0
    assert (
        pg_server.psql(
            database, "SELECT string_agg(convert_from(data, 'UTF8'), ',' ORDER BY id) FROM capella_inbox"
        )
        == "one,two\n"
    )
    code, shown = cli("handler", "show", "pgcli-in")
    assert code == 0 and "lag            0 messages" in shown
    # A pass that fails exits 1 with the reason.
    pg_server.psql(database, "DROP TABLE capella_outbox")
    code, out = cli("handler", "run", "pgcli-out")
    assert code == 1 and "table capella_outbox does not exist" in out
    for name in ("pgcli-out", "pgcli-in"):
        assert cli("handler", "drop", name, "--yes")[0] == 0
