"""Shared queues and what the Kafka listener keeps in PostgreSQL (migration 002): producer ids
from one sequence, never answered twice by any node nor after PostgreSQL crashes, and a
cursor's group and metadata, committed on one node and seen on another.

Catalog tests have a database of their own on the session's PostgreSQL; the node tests run
two ``SharedNode``s in this process (tests/support/upkeep.py) on the rig's PostgreSQL and moto.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from support.pg import PgServer, fresh_database
from support.shared import SharedRig
from support.upkeep import create, shared_node
from support.wait import until

from capella.auth.secret import Secrets
from capella.config import SharedSettings
from capella.core.producer_ids import SharedProducerIds
from capella.errors import InvalidSubscriptionGroup, SubscriptionMetadataTooLarge
from capella.shared.catalog import Catalog, SubRow
from capella.shared.database import Pool, open_pool, target_of
from capella.shared.schema import migrate, migrations


async def pool_on(server: PgServer, dsn: str) -> Pool:
    database = dsn.rsplit("/", 1)[1]
    settings = SharedSettings(node="n", mount="s3", dsn=server.dsn(database) + "?sslmode=disable")
    return await open_pool(target_of(settings, Secrets()))


@pytest.fixture
async def catalog(pg_server: PgServer) -> AsyncIterator[tuple[Catalog, Pool]]:
    """A migrated database of its own with queue ``q``: a catalog and a pool on it."""
    async with fresh_database(pg_server) as (dsn, _):
        pool = await pool_on(pg_server, dsn)
        try:
            await migrate(pool)
            found = Catalog(pool)
            assert await found.create_queue("q", {"storage": "shared"})
            yield found, pool
        finally:
            await pool.close()


# --- producer ids -----------------------------------------------------------------------------


async def test_producer_ids_from_two_pools_at_once_never_repeat(
    pg_server: PgServer, catalog: tuple[Catalog, Pool]
) -> None:
    first, pool = catalog
    database = await pool.fetchval("select current_database()")
    second_pool = await pool_on(pg_server, pg_server.dsn(database))
    try:
        second = Catalog(second_pool)
        taken = await asyncio.gather(*(c.take_producer_id() for c in [first, second] * 100))
    finally:
        await second_pool.close()
    assert sorted(taken) == list(range(200))  # from 0, each once


@pytest.mark.slow
async def test_producer_ids_taken_before_postgres_crashes_are_not_answered_again() -> None:
    # Fsync and synchronous_commit on; ``pg_ctl stop -m immediate`` is a crash: no checkpoint,
    # recovery from the WAL at the next start.
    server = PgServer(durable=True)
    try:
        dsn = server.create_database("ids")
        pool = await pool_on(server, dsn)
        seen: list[int] = []
        try:
            await migrate(pool)
            catalog = Catalog(pool)
            for _ in range(3):
                seen += [await catalog.take_producer_id() for _ in range(5)]
                await asyncio.to_thread(server.stop, "immediate")
                await asyncio.to_thread(server.start)
                # The pool's connections died with the server: its next calls open new ones.
                for _ in range(50):
                    try:
                        await pool.fetchval("select 1")
                        break
                    except Exception:
                        await asyncio.sleep(0.1)
        finally:
            await pool.close()
    finally:
        server.close()
    assert len(set(seen)) == len(seen) == 15
    assert seen == sorted(seen)


# --- a cursor's group and metadata -------------------------------------------------------------

KEEP: dict[str, Any] = {"replica": None, "reset": False}


async def test_a_cursor_keeps_its_group_and_metadata_and_none_keeps_them(
    catalog: tuple[Catalog, Pool],
) -> None:
    cat, _ = catalog
    row, created = await cat.commit_cursor(
        "q", "kafka.g", 5, replica=None, reset=False, group="g", metadata="m"
    )
    assert created and (row.last_id, row.group, row.metadata) == (5, "g", "m")
    # Nothing changes: no update (the time stays).
    again, created = await cat.commit_cursor(
        "q", "kafka.g", 5, replica=None, reset=False, group="g", metadata="m"
    )
    assert not created and again == row
    row, _ = await cat.commit_cursor("q", "kafka.g", 7, replica=None, reset=False)
    assert (row.last_id, row.group, row.metadata) == (7, "g", "m")
    row, _ = await cat.commit_cursor("q", "kafka.g", None, replica=None, reset=False, metadata="")
    assert (row.last_id, row.metadata) == (7, "")
    # Only the metadata changed: still a change.
    row, _ = await cat.commit_cursor("q", "kafka.g", 2, replica=None, reset=True, metadata="back")
    assert (row.last_id, row.group, row.metadata) == (2, "g", "back")
    assert await cat.subscription("q", "kafka.g") == row
    plain, _ = await cat.commit_cursor("q", "plain", 1, replica=True, reset=False)
    assert (plain.group, plain.metadata) == (None, None)
    assert [r.name for r in await cat.subscriptions("q")] == ["kafka.g", "plain"]


async def test_a_group_or_metadata_over_its_limit_is_refused_before_postgres(
    catalog: tuple[Catalog, Pool],
) -> None:
    cat, _ = catalog
    with pytest.raises(SubscriptionMetadataTooLarge):
        await cat.commit_cursor("q", "kafka.g", 1, replica=None, reset=False, metadata="m" * 4097)
    with pytest.raises(InvalidSubscriptionGroup):
        await cat.commit_cursor("q", "kafka.g", 1, replica=None, reset=False, group="nul\x00")
    assert await cat.subscription("q", "kafka.g") is None


async def test_cursors_of_a_version_1_database_keep_working_after_migration_2(pg_server: PgServer) -> None:
    async with fresh_database(pg_server) as (dsn, conn):
        # A database as version 1 left it, with a cursor.
        await conn.execute(
            "create table capella_schema (version int primary key, applied timestamptz default now())"
        )
        await conn.execute(migrations()[0].sql)
        await conn.execute("insert into capella_schema (version) values (1)")
        await conn.execute("insert into capella_queues (name, definition) values ('q', '{}')")
        await conn.execute("insert into capella_subscriptions (queue, name, last_id) values ('q', 'old', 4)")
        with pytest.raises(asyncpg.UndefinedTableError):
            await conn.fetchval("select nextval('capella_producer_ids')")
        pool = await pool_on(pg_server, dsn)
        try:
            assert await migrate(pool) == len(migrations())
            cat = Catalog(pool)
            old = await cat.subscription("q", "old")
            assert old is not None and (old.last_id, old.group, old.metadata) == (4, None, None)
            row, _ = await cat.commit_cursor("q", "old", 5, replica=None, reset=False, group="g")
            assert (row.last_id, row.group) == (5, "g")
            assert await cat.take_producer_id() == 0
        finally:
            await pool.close()


# --- two nodes ------------------------------------------------------------------------------------


async def test_two_nodes_share_one_producer_id_space_and_see_each_others_group_commits(
    shared_rig: SharedRig,
) -> None:
    async with shared_node(shared_rig, 0) as (one, _), shared_node(shared_rig, 1) as (two, _):
        ids = [SharedProducerIds(one), SharedProducerIds(two)]
        taken = await asyncio.gather(*(ids[i % 2].take() for i in range(60)))
        assert len(set(taken)) == 60
        assert set(taken[0::2]).isdisjoint(taken[1::2])

        here = await create(one, "orders")
        await until(lambda: "orders" in two.queues(), 5.0, "orders on node 1")
        there = two.queues()["orders"]
        sub, created = await here.commit("kafka.3f2a", 41, group="a group id", metadata="gen 3", reset=True)
        assert created and (sub.group, sub.metadata) == ("a group id", "gen 3")

        def seen() -> bool:
            try:
                found = there.subscription("kafka.3f2a")
            except Exception:
                return False
            return (found.last_id, found.group, found.metadata) == (41, "a group id", "gen 3")

        # The other node hears of the commit (NOTIFY, or its poll behind it).
        await until(seen, 5.0, "node 1 to see node 0's group commit")
        # And a commit there without them (an HTTP commit) keeps them for both.
        sub, _ = await there.commit("kafka.3f2a", 50)
        assert (sub.last_id, sub.group, sub.metadata) == (50, "a group id", "gen 3")
        current = await here.current_subscription("kafka.3f2a")
        assert (current.last_id, current.group, current.metadata) == (50, "a group id", "gen 3")
        assert isinstance(await one.take_producer_id(), int)
        row = await two.subscription_row("orders", "kafka.3f2a")
        assert isinstance(row, SubRow) and row.metadata == "gen 3"
