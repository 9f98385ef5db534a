"""The pg_outbox handler against a real PostgreSQL: each committed row exactly once, in order.

Every test has its own database on the session's throwaway cluster (tests/support/pg.py) and compares
the queue's messages with the rows that were committed, byte for byte.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from support.pg import PASSWORD, PASSWORD_ROLE, PgServer, fresh_database
from support.supervisor import launched, started
from support.wait import eventually

from capella.core.cluster import Cluster
from capella.core.message import LogMessage
from capella.errors import InvalidRequest, TableMismatch
from capella.handlers.pg_outbox import OutboxHandler, outbox_ddl, outbox_params
from capella.handlers.supervisor import Supervisor
from capella.links.reach import Reach
from capella.links.registry import Links
from capella.wire.params import decode_params
from capella.wire.postgres import PgOutboxParams

Row = tuple[int, bytes]


@pytest.fixture
async def db(pg_server: PgServer) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A new database with the outbox table (and its NOTIFY trigger): its DSN and a connection."""
    name = f"t{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(name)
    conn = await asyncpg.connect(dsn)
    await conn.execute(outbox_ddl(notify=True))
    yield dsn, conn
    await conn.close()


@pytest.fixture
async def orders(cluster: Cluster) -> Cluster:
    await cluster.put_queue("orders", {})
    return cluster


def relay(cluster: Cluster, dsn: str, **params: Any) -> OutboxHandler:
    return OutboxHandler(
        cluster,
        *outbox_params(
            decode_params(PgOutboxParams, {"to": "orders", "dsn": dsn, **params}), Reach(Links(cluster))
        ),
    )


async def messages(cluster: Cluster, queue: str = "orders") -> list[LogMessage]:
    return (await cluster.queue(queue).read_after(0, 100_000)).messages


async def insert(conn: asyncpg.Connection, payloads: list[bytes]) -> list[Row]:
    ids = await conn.fetch(
        "INSERT INTO capella_outbox (data) SELECT unnest($1::bytea[]) RETURNING id", payloads
    )
    return [(r["id"], p) for r, p in zip(ids, payloads, strict=True)]


def assert_exactly_once(queued: list[LogMessage], committed: list[Row]) -> None:
    got = [(m.external_id, m.payload) for m in queued]
    assert len(got) == len({i for i, _ in got}), "a row is in the queue twice"
    assert sorted(got) == sorted(committed)


async def test_committed_rows_become_messages_with_their_identity_and_columns(
    orders: Cluster, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    created = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    rows = [(os.urandom(random.randint(0, 300)), i % 4, f'{{"n": "{i}"}}') for i in range(250)]
    await conn.executemany(
        "INSERT INTO capella_outbox (data, segment, headers, created_at) VALUES ($1, $2, $3::jsonb, $4)",
        [(*r, created) for r in rows],
    )
    later = datetime.now(UTC) + timedelta(hours=1)
    await conn.execute("INSERT INTO capella_outbox (data, deliver_at) VALUES ('later', $1)", later)
    handler = relay(orders, dsn, batch=100)
    try:
        result = await handler.run_once()
    finally:
        await handler.close()
    assert result.items == 251
    database = dsn.rsplit("/", 1)[1]
    queued = await messages(orders)
    assert [(m.source, m.external_id, m.payload, m.segment, m.headers, m.external_time) for m in queued] == [
        (f"pg:{database}.capella_outbox", i + 1, data, seg, {"n": str(i)}, created.timestamp())
        for i, (data, seg, _) in enumerate(rows)
    ]
    # The delayed row waits in the schedule with its identity; the table is empty.
    scheduled = orders.queue("orders").schedule
    assert scheduled.count == 1
    assert (await scheduled.find((f"pg:{database}.capella_outbox", 251))) is not None
    assert await conn.fetchval("SELECT count(*) FROM capella_outbox") == 0
    assert handler.status().lag == 0


async def test_text_and_jsonb_data_and_relayed_at_instead_of_delete(
    orders: Cluster, pg_server: PgServer
) -> None:
    async with fresh_database(pg_server) as (dsn, conn):
        await conn.execute(
            "CREATE TABLE events (id bigserial PRIMARY KEY, data text NOT NULL, relayed_at timestamptz)"
        )
        await conn.execute("CREATE TABLE docs (id bigserial PRIMARY KEY, data jsonb NOT NULL)")
        texts = ["plain", "ünïcødé ✓", "", "line\nbreak"]
        await conn.executemany("INSERT INTO events (data) VALUES ($1)", [(t,) for t in texts])
        await conn.execute("""INSERT INTO docs (data) VALUES ('{"b": 1, "a": [true, null]}')""")
        keep = relay(orders, dsn, table="events", delete=False, source="svc-events")
        docs = relay(orders, dsn, table="docs")
        try:
            assert (await keep.run_once()).items == 4
            assert (await keep.run_once()).items == 0  # marked rows are not relayed again
            assert (await docs.run_once()).items == 1
        finally:
            await keep.close()
            await docs.close()
        queued = await messages(orders)
        assert [(m.source, m.external_id, m.payload) for m in queued[:4]] == [
            ("svc-events", i + 1, t.encode()) for i, t in enumerate(texts)
        ]
        # jsonb comes as PostgreSQL prints it.
        assert queued[4].payload == b'{"a": [true, null], "b": 1}'
        assert await conn.fetchval("SELECT count(*) FROM events WHERE relayed_at IS NOT NULL") == 4


async def test_rows_that_commit_out_of_id_order_are_never_skipped(
    orders: Cluster, db: tuple[str, asyncpg.Connection], pg_server: PgServer
) -> None:
    dsn, conn = db
    slow = await asyncpg.connect(dsn)
    handler = relay(orders, dsn)
    try:
        # Row 1 is taken by a transaction that commits only after row 2 was relayed.
        txn = slow.transaction()
        await txn.start()
        [(first, _)] = await insert(slow, [b"first"])
        [(second, _)] = await insert(conn, [b"second"])
        assert first < second
        await handler.run_once()
        assert [m.external_id for m in await messages(orders)] == [second]
        await txn.commit()
        await handler.run_once()
        assert [m.external_id for m in await messages(orders)] == [second, first]
    finally:
        await handler.close()
        await slow.close()


async def test_concurrent_writers_with_rollbacks_each_committed_row_exactly_once(
    orders: Cluster, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, _ = db
    rng = random.Random(7)
    committed: list[Row] = []
    rolled_back: list[int] = []

    async def writer(number: int) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for txn_number in range(40):
                txn = conn.transaction()
                await txn.start()
                payloads = [
                    f"w{number}-{txn_number}-{k}".encode() + os.urandom(8) for k in range(rng.randint(1, 3))
                ]
                rows = await insert(conn, payloads)
                await asyncio.sleep(rng.random() * 0.004)  # commits overtake each other
                if rng.random() < 0.2:
                    await txn.rollback()
                    rolled_back.extend(i for i, _ in rows)
                else:
                    await txn.commit()
                    committed.extend(rows)
        finally:
            await conn.close()

    handler = relay(orders, dsn, batch=7)
    writers = asyncio.gather(*(writer(n) for n in range(4)))
    try:

        async def relayed_while_writing() -> bool:
            await handler.run_once()
            return writers.done()

        await eventually(relayed_while_writing, 30, every=0)
        await writers
        await handler.run_once()
    finally:
        await handler.close()
    queued = await messages(orders)
    assert_exactly_once(queued, committed)
    assert rolled_back and not {m.external_id for m in queued} & set(rolled_back)


async def test_a_batch_repeated_after_a_lost_delete_is_absorbed(
    orders: Cluster, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    rows = await insert(conn, [os.urandom(16) for _ in range(30)])
    handler = relay(orders, dsn)
    try:
        await handler.run_once()
        # As if the relay died between the append and the DELETE: the same rows again.
        await conn.executemany(
            "INSERT INTO capella_outbox (id, data) OVERRIDING SYSTEM VALUE VALUES ($1, $2)", rows
        )
        assert (await handler.run_once()).items == 30
        assert handler.status().duplicates == 30
    finally:
        await handler.close()
    assert_exactly_once(await messages(orders), rows)
    assert await conn.fetchval("SELECT count(*) FROM capella_outbox") == 0


async def test_a_notify_wakes_the_relay_long_before_its_interval(
    orders: Cluster, supervisor: Supervisor, db: tuple[str, asyncpg.Connection]
) -> None:
    dsn, conn = db
    state, _ = await supervisor.put(
        "relay", {"type": "pg_outbox", "params": {"to": "orders", "dsn": dsn, "interval": "60s"}}
    )

    async def ran() -> bool:
        return state.runs > 0

    assert await eventually(ran, 10)
    started = time.monotonic()
    rows = await insert(conn, [b"wake up"])

    async def relayed() -> bool:
        return bool(await messages(orders))

    await eventually(relayed, 10)
    assert time.monotonic() - started < 5
    assert_exactly_once(await messages(orders), rows)


async def test_a_table_created_after_the_first_pass_still_wakes_the_relay(
    orders: Cluster, pg_server: PgServer
) -> None:
    database = f"t{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(database)
    handler = relay(orders, dsn)
    try:
        with pytest.raises(TableMismatch):
            await handler.run_once()
        pg_server.psql(database, outbox_ddl(notify=True))
        await handler.run_once()
        # The connection of the failed pass is the one that now LISTENs.
        waiting = asyncio.create_task(handler.pause(30))
        pg_server.psql(database, "INSERT INTO capella_outbox (data) VALUES ('late')")
        await asyncio.wait_for(waiting, 5)
        assert (await handler.run_once()).items == 1
    finally:
        await handler.close()


async def test_a_database_restart_while_relaying_loses_and_repeats_nothing(
    orders: Cluster, supervisor: Supervisor, db: tuple[str, asyncpg.Connection], pg_server: PgServer
) -> None:
    dsn, conn = db
    rows = await insert(conn, [os.urandom(24) for _ in range(4000)])
    await conn.close()
    await supervisor.put(
        "relay", {"type": "pg_outbox", "params": {"to": "orders", "dsn": dsn, "batch": 5, "interval": "0.1s"}}
    )

    async def relayed(count: int) -> bool:
        return len(await messages(orders)) >= count

    await eventually(lambda: relayed(50), 30)
    assert len(await messages(orders)) < len(rows), "the relay must still be busy at the restart"
    await asyncio.to_thread(pg_server.stop, "fast")
    await asyncio.to_thread(pg_server.start)
    await eventually(lambda: relayed(len(rows)), 30)
    assert_exactly_once(await messages(orders), rows)
    # The restart broke a pass (its connection), and a later pass reconnected and finished.
    assert orders.task_failures.counts.get("handler:relay", 0) >= 1
    check = await asyncpg.connect(dsn)
    try:
        # Relayed rows go only after the append: the last batch's DELETE may still be due.
        async def emptied() -> bool:
            return await check.fetchval("SELECT count(*) FROM capella_outbox") == 0

        assert await eventually(emptied, 10)
    finally:
        await check.close()


async def _status_after_a_pass(supervisor: Supervisor, params: dict[str, Any]) -> dict[str, Any]:
    await supervisor.put(
        "relay", {"type": "pg_outbox", "params": {"to": "orders", **params}, "started": False}
    )
    return msgspec.to_builtins((await supervisor.run_now("relay")).info())["status"]


@pytest.mark.parametrize(
    ("ddl", "expected"),
    [
        (None, "table capella_outbox does not exist"),
        ("CREATE TABLE capella_outbox (id bigint)", "table capella_outbox has no column data"),
        (
            "CREATE TABLE capella_outbox (id bigint, data integer)",
            "column data is integer, expected bytea or text or jsonb or json",
        ),
        (
            "CREATE TABLE capella_outbox (id bigint, data text, headers text)",
            "column headers is text, expected jsonb or json",
        ),
    ],
)
async def test_a_missing_table_or_column_or_a_wrong_type_shows_in_the_status(
    orders: Cluster, supervisor: Supervisor, pg_server: PgServer, ddl: str | None, expected: str
) -> None:
    dsn = pg_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    if ddl is not None:
        pg_server.psql(dsn.rsplit("/", 1)[1], ddl)
    status = await _status_after_a_pass(supervisor, {"dsn": dsn})
    assert expected in status["last_error"]["message"]


async def test_an_unreachable_database_an_unknown_one_and_a_bad_password_show_in_the_status(
    orders: Cluster, tmp_path: Path, pg_server: PgServer
) -> None:
    supervisor = await launched(orders, links=Links(orders, key_file=tmp_path / "links.key"))
    try:
        closed = await _status_after_a_pass(supervisor, {"dsn": "postgresql://postgres@127.0.0.1:1/x"})
        assert "postgres postgres@127.0.0.1:1/x: cannot connect" in closed["last_error"]["message"]
        unknown = await _status_after_a_pass(supervisor, {"dsn": pg_server.dsn("nosuchdb")})
        assert 'database "nosuchdb" does not exist' in unknown["last_error"]["message"]
        wrong = f"postgresql://{PASSWORD_ROLE}:not-{PASSWORD}@127.0.0.1:{pg_server.port}/postgres"
        refused = await _status_after_a_pass(supervisor, {"dsn": wrong})
        assert "authentication failed" in refused["last_error"]["message"]
        assert PASSWORD not in str(refused)
        os.environ.pop("CAPELLA_TEST_NO_DSN", None)
        with pytest.raises(InvalidRequest, match="dsn_secret"):
            await _status_after_a_pass(supervisor, {"dsn_env": "CAPELLA_TEST_NO_DSN"})
    finally:
        await supervisor.close()


async def test_a_dsn_password_is_never_shown_logged_or_stored_in_clear(
    orders: Cluster, tmp_path: Path, pg_server: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    database = f"t{uuid.uuid4().hex[:12]}"
    pg_server.create_database(database)
    pg_server.psql(database, outbox_ddl())
    pg_server.psql(database, "INSERT INTO capella_outbox (data) VALUES ('one'), ('two')")
    dsn = f"postgresql://{PASSWORD_ROLE}:{PASSWORD}@127.0.0.1:{pg_server.port}/{database}"
    links = Links(orders, key_file=tmp_path / "links.key")
    async with started(orders, links=links) as supervisor:
        await supervisor.put(
            "relay", {"type": "pg_outbox", "params": {"to": "orders", "dsn": dsn}, "started": False}
        )
        shown = msgspec.to_builtins((await supervisor.run_now("relay")).info())
    assert shown["status"]["last_error"] is None and shown["status"]["items"] == 2
    assert shown["params"]["dsn"] == f"postgresql://{PASSWORD_ROLE}@127.0.0.1:{pg_server.port}/{database}"
    assert shown["params"]["password"] == "stored encrypted"
    stored = await orders.home.get(".capella/handlers.json")
    assert PASSWORD.encode() not in stored and b"dsn_password_encrypted" in stored
    assert PASSWORD not in caplog.text
    # The stored definition comes back with its password, decrypted with the cluster's key.
    pg_server.psql(database, "INSERT INTO capella_outbox (data) VALUES ('three')")
    again = await launched(orders, links=Links(orders, key_file=tmp_path / "links.key"))
    try:
        assert msgspec.to_builtins((await again.run_now("relay")).info())["status"]["items"] == 1
    finally:
        await again.close()
    assert [m.payload for m in await messages(orders)] == [b"one", b"two", b"three"]
    # Without its key the definition cannot be loaded: it says so, shows no secret, and is kept.
    (tmp_path / "links.key").rename(tmp_path / "lost.key")
    keyless = await launched(orders, links=Links(orders, key_file=tmp_path / "links.key"))
    try:
        failed = msgspec.to_builtins((await keyless.run_now("relay")).info())
        assert "cannot be decrypted" in failed["status"]["last_error"]["message"]
        assert "dsn_password_encrypted" not in failed["params"]
        await keyless.put("other", {"type": "flush", "queue": "orders"})
    finally:
        await keyless.close()
    assert b"dsn_password_encrypted" in await orders.home.get(".capella/handlers.json")


async def test_bad_definitions_are_refused_with_the_field(orders: Cluster, supervisor: Supervisor) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"to": "orders"}, "params.dsn"),
        ({"to": "orders", "dsn": "mysql://x@h/db"}, "params.dsn"),
        ({"to": "orders", "dsn": "postgresql://u@h/db", "dsn_secret": "x"}, "params.dsn"),
        ({"to": "nosuch", "dsn": "postgresql://u@h/db"}, "params.to"),
        ({"to": "orders", "dsn": "postgresql://u@h/db", "table": "Robert'); DROP"}, "params.table"),
        ({"to": "orders", "dsn": "postgresql://u@h/db", "delete": "no"}, "params.delete"),
        ({"to": "orders", "dsn_env": "X"}, "params.dsn_env"),
        ({"to": "orders", "dsn_secret": "not a name"}, "params.dsn_secret"),
        ({"to": "orders", "dsn_secret": "undeclared"}, "params.dsn_secret"),
        ({"to": "orders", "dsn": "postgresql://h/db"}, "params.dsn"),  # no user: none is assumed
        ({"to": "orders", "dsn": "postgresql://u@h/db?passfile=/x"}, "params.dsn"),
        ({"to": "orders", "dsn": "postgresql://u@h/db?service=s"}, "params.dsn"),
        ({"to": "orders", "dsn": "postgresql://u@h/db?host=/tmp"}, "params.dsn"),
        ({"to": "orders", "dsn": "postgresql://u@h/db?sslpassword=p"}, "params.dsn"),
        ({"to": "orders", "dsn": "postgresql://u@%2Ftmp/db"}, "params.dsn"),
        # A password is stored only encrypted, and this supervisor has no key file.
        ({"to": "orders", "dsn": "postgresql://u:pw@h/db"}, "params.dsn"),
    ]
    for params, field in cases:
        with pytest.raises(InvalidRequest) as caught:
            await supervisor.put("relay", {"type": "pg_outbox", "params": params})
        assert caught.value.details.get("field") == field, params
    with pytest.raises(InvalidRequest):
        await supervisor.put("relay", {"type": "pg_outbox", "queue": "orders", "params": {"to": "orders"}})


def test_the_ddl_names_the_table_and_the_channel() -> None:
    text = outbox_ddl("app.events", notify=True, keep=True)
    assert 'CREATE TABLE "app"."events"' in text and "pg_notify('events', '')" in text
    assert "relayed_at" in text and 'ON "app"."events"' in text


def test_asyncpg_is_imported_only_when_a_pg_handler_connects(tmp_path: Path) -> None:
    code = """
import asyncio, sys
import capella.cli, capella.server
from capella.errors import DatabaseUnavailable
from capella.handlers.postgres import Database, Dsn

assert not [name for name in sys.modules if name.startswith("asyncpg")]
async def connect():
    try:
        await Database(Dsn("postgresql://u@127.0.0.1:1/x", None)).connect()
    except DatabaseUnavailable:
        pass
asyncio.run(connect())
assert "asyncpg" in sys.modules
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
