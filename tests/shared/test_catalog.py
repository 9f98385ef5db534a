"""The shared queues' catalog against a real PostgreSQL (tests/support/pg.py): the schema and its
migrations, the commit function (ids, dedup by runs, idempotence, concurrency), cursors,
definitions, node claims, retention, compaction and garbage.

Every test has a database of its own on the session's throwaway cluster (fsync off: nothing here
is about durability); the restart test starts a cluster of its own.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import AsyncIterator

import pytest
from support.pg import PASSWORD, PASSWORD_ROLE, PgServer, fresh_database

from capella.auth.secret import Secrets
from capella.config import SecretSettings, SharedSettings
from capella.errors import (
    Conflict,
    DatabaseRefused,
    InvalidConfig,
    InvalidRequest,
    QueueNotFound,
    SecretNotForHost,
    StorageUnavailable,
)
from capella.handlers.postgres import Target
from capella.shared.catalog import (
    MISSING_QUEUE,
    NOTIFY_CHANNEL,
    BatchEntry,
    Catalog,
    Committed,
    Run,
)
from capella.shared.database import Pool, open_pool, target_of
from capella.shared.schema import latest, migrate, migrations

OWN = "cl"


def target(server: PgServer, database: str) -> Target:
    return target_of(
        SharedSettings(node="n", mount="s3", dsn=server.dsn(database) + "?sslmode=disable"), Secrets()
    )


@pytest.fixture
async def db(pg_server: PgServer) -> AsyncIterator[tuple[str, Pool, Catalog]]:
    """A fresh migrated database: its name, a pool and a catalog on it; queues q1..q8 exist."""
    async with fresh_database(pg_server) as (dsn, _conn):
        database = dsn.rsplit("/", 1)[1]
        pool = await open_pool(target(pg_server, database))
        try:
            await migrate(pool)
            catalog = Catalog(pool)
            for n in range(1, 9):
                assert await catalog.create_queue(f"q{n}", {"storage": "shared"})
            yield database, pool, catalog
        finally:
            await pool.close()


async def counts(pool: Pool) -> dict[str, int]:
    tables = ("objects", "segments", "identity_runs", "sources", "queues")
    return {t: await pool.fetchval(f"select count(*) from capella_{t}") for t in tables}


def batch(queue: str, count: int, *runs: Run, offset: int = 0, size: int = 100) -> BatchEntry:
    return BatchEntry(queue, offset, size, count, list(runs))


async def assert_gapless(pool: Pool, queue: str) -> None:
    """The queue's segments cover first_id..next_id-1 exactly, in order."""
    rows = await pool.fetch(
        "select first_id, last_id from capella_segments where queue = $1 order by first_id", queue
    )
    first, next_id = await pool.fetchrow(
        "select first_id, next_id from capella_queues where name = $1", queue
    )
    expected = first
    for lo, hi in rows:
        assert lo == expected and hi >= lo
        expected = hi + 1
    assert expected == next_id


async def assert_runs_disjoint(pool: Pool) -> None:
    """No identity stored twice: the runs of one (queue, source) never overlap."""
    overlaps = await pool.fetchval(
        "select count(*) from capella_identity_runs a join capella_identity_runs b "
        "on a.queue = b.queue and a.source = b.source and a.first_ext < b.first_ext "
        "and a.last_ext >= b.first_ext"
    )
    assert overlaps == 0


class Heard:
    """The payloads a listener got."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self._more = asyncio.Event()

    def __call__(self, payload: str) -> None:
        self.payloads.append(payload)
        self._more.set()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.payloads) < count:
                self._more.clear()
                await self._more.wait()


# --- schema --------------------------------------------------------------------------------


async def test_migrate_twice_at_once_applies_every_file_once(pg_server: PgServer) -> None:
    async with fresh_database(pg_server) as (dsn, conn):
        database = dsn.rsplit("/", 1)[1]
        a, b = await open_pool(target(pg_server, database)), await open_pool(target(pg_server, database))
        try:
            assert await asyncio.gather(migrate(a), migrate(b)) == [latest(), latest()]
            assert await migrate(a) == latest()
            rows = await conn.fetch("select version from capella_schema order by version")
            assert [r[0] for r in rows] == [m.version for m in migrations()] == list(range(1, latest() + 1))
            tables = await conn.fetch("select tablename from pg_tables where schemaname = 'public'")
            assert all(r[0].startswith("capella_") for r in tables)
            assert len(tables) == 8
        finally:
            await a.close()
            await b.close()


async def test_a_schema_newer_than_the_node_is_refused(db: tuple[str, Pool, Catalog]) -> None:
    _, pool, _ = db
    await pool.execute("insert into capella_schema (version) values ($1)", latest() + 1)
    with pytest.raises(DatabaseRefused, match="newer than this node"):
        await migrate(pool)


# --- commit --------------------------------------------------------------------------------


async def test_ids_are_gapless_and_increasing_across_batches_objects_and_queues(
    db: tuple[str, Pool, Catalog],
) -> None:
    _, pool, catalog = db
    seen: dict[str, list[int]] = {}
    for n in range(5):
        entries = [batch("q1", 3), batch("q2", 2, offset=100), batch("q1", 4, offset=200)]
        answers = await catalog.commit_object(f"o{n}", "n", 300, OWN, entries)
        if n == 0:
            answers_of_first = answers
        assert [a.duplicates for a in answers] == [{}, {}, {}]
        assert len({a.time for a in answers}) == 1  # one clock read per commit
        for entry, answer in zip(entries, answers, strict=True):
            seen.setdefault(entry.queue, []).extend(range(answer.first_id, answer.first_id + entry.count))
    assert seen["q1"] == list(range(1, 36))
    assert seen["q2"] == list(range(1, 11))
    assert await catalog.heads(["q1", "q2", "nope"]) == {"q1": (1, 36), "q2": (1, 11)}
    await assert_gapless(pool, "q1")
    await assert_gapless(pool, "q2")
    segments = await catalog.segments_after("q1", 0, limit=100)
    assert [(s.first_id, s.last_id, s.byte_offset, s.key) for s in segments[:2]] == [
        (1, 3, 0, "o0"),
        (4, 7, 200, "o0"),
    ]
    assert [s.first_id for s in await catalog.segments_after("q1", 5, limit=3)] == [4, 8, 11]
    assert await catalog.segments_after("q1", 35) == []
    times = [s.time for s in segments]
    assert times == sorted(times)
    assert segments[0].time == answers_of_first[0].time  # the answer's time is the stored one, exactly
    # live bytes are the object's kept batches; nothing is dead
    assert await pool.fetchval("select sum(live_bytes) from capella_objects") == 5 * 300
    assert await pool.fetchval("select count(*) from capella_objects where state = 'dead'") == 0


async def test_a_retried_commit_answers_the_same_and_changes_nothing(db: tuple[str, Pool, Catalog]) -> None:
    _, pool, catalog = db
    entries = [batch("q1", 5, Run("s", 1, 3, 1)), batch("q2", 2, Run("s", 1, 2, 0))]
    first = await catalog.commit_object("obj", "n", 200, OWN, entries)
    before = await counts(pool)
    heads = await catalog.heads()
    again = await catalog.commit_object("obj", "n", 200, OWN, entries)
    assert again == first
    assert await counts(pool) == before
    assert await catalog.heads() == heads
    # the retry is answered even with other batches given: the key decides
    assert await catalog.commit_object("obj", "other", 1, OWN, []) == first


async def test_an_identity_stored_before_is_a_duplicate_answered_with_its_id(
    db: tuple[str, Pool, Catalog],
) -> None:
    _, pool, catalog = db
    [a] = await catalog.commit_object("o1", "n", 100, OWN, [batch("q1", 10, Run("src", 100, 109, 0))])
    assert a.first_id == 1
    # the same identities from another node's object: all duplicates, no segment, dead bytes
    [b] = await catalog.commit_object("o2", "m", 100, OWN, [batch("q1", 10, Run("src", 100, 109, 0))])
    assert b.first_id == 0
    assert b.duplicates == {p: p + 1 for p in range(10)}
    assert await catalog.heads(["q1"]) == {"q1": (1, 11)}
    assert await pool.fetchval("select state from capella_objects where key = 'o2'") == "dead"
    assert await pool.fetchval("select count(*) from capella_segments where queue = 'q1'") == 1
    # another queue is another identity space
    [c] = await catalog.commit_object("o3", "m", 100, OWN, [batch("q2", 10, Run("src", 100, 109, 0))])
    assert (c.first_id, c.duplicates) == (1, {})


async def test_mixed_batches_give_duplicates_and_skip_positions(db: tuple[str, Pool, Catalog]) -> None:
    _, pool, catalog = db
    await catalog.commit_object("o1", "n", 100, OWN, [batch("q1", 3, Run("s", 10, 12, 0))])  # ids 1..3
    # batch A: s:9 new, s:10..11 stored (ids 1,2), s:13 new; batch B (same object): s:13 again
    # (stored by A, an earlier batch of this object), an implicit one, then s:14 new
    answers = await catalog.commit_object(
        "o2", "n", 200, OWN,
        [
            batch("q1", 4, Run("s", 9, 11, 0), Run("s", 13, 13, 3)),
            batch("q1", 3, Run("s", 13, 13, 0), Run("s", 14, 14, 2), offset=100),
        ],
    )  # fmt: skip
    assert answers[0] == Committed(4, answers[0].time, {1: 1, 2: 2})  # kept: s:9 → 4, s:13 → 5
    assert answers[1] == Committed(6, answers[1].time, {0: 5})  # kept: implicit → 6, s:14 → 7
    segments = await catalog.segments_after("q1", 3)
    assert [(s.first_id, s.last_id, s.count, s.skip) for s in segments] == [
        (4, 5, 4, (1, 2)),
        (6, 7, 3, (0,)),
    ]
    await assert_gapless(pool, "q1")
    await assert_runs_disjoint(pool)
    # every identity now answers its one id
    [again] = await catalog.commit_object("o3", "n", 100, OWN, [batch("q1", 6, Run("s", 9, 14, 0))])
    assert again.duplicates == {0: 4, 1: 1, 2: 2, 3: 3, 4: 5, 5: 7} and again.first_id == 0
    assert (
        await pool.fetchval("select highest_ext from capella_sources where queue = 'q1' and source = 's'")
        == 14
    )
    # one batch naming an identity twice keeps the first
    [within] = await catalog.commit_object(
        "o4", "n", 100, OWN, [batch("q1", 4, Run("t", 1, 2, 0), Run("t", 2, 3, 2))]
    )
    assert (within.first_id, within.duplicates) == (8, {2: 9})
    await assert_runs_disjoint(pool)


async def test_messages_without_an_identity_get_the_clusters_and_their_id(
    db: tuple[str, Pool, Catalog],
) -> None:
    _, pool, catalog = db
    await catalog.commit_object("o1", "n", 100, OWN, [batch("q1", 4)])
    await catalog.commit_object("o2", "n", 100, OWN, [batch("q1", 2, Run("s", 1, 1, 1))])  # ids 5, 6
    # consecutive implicit ids are one run: (cl, 1..5), s:1 at id 6
    runs = await pool.fetch(
        "select source, first_ext, last_ext, first_id from capella_identity_runs "
        "where queue = 'q1' order by source"
    )
    assert [tuple(r) for r in runs] == [(OWN, 1, 5, 1), ("s", 1, 1, 6)]
    # a copy back from another cluster names (cl, 3): it is message 3
    [copy] = await catalog.commit_object("o3", "n", 100, OWN, [batch("q1", 2, Run(OWN, 3, 4, 0))])
    assert copy.duplicates == {0: 3, 1: 4} and copy.first_id == 0
    # (cl, 100) given explicitly keeps that identity; message 100, when it comes, gets no second
    await catalog.commit_object("o4", "n", 100, OWN, [batch("q1", 1, Run(OWN, 100, 100, 0))])  # id 7
    await catalog.commit_object("o5", "n", 100, OWN, [batch("q1", 100)])  # ids 8..107
    await assert_runs_disjoint(pool)
    [dup] = await catalog.commit_object("o6", "n", 100, OWN, [batch("q1", 1, Run(OWN, 100, 100, 0))])
    assert dup.duplicates == {0: 7}


async def test_a_batch_of_a_queue_that_is_gone_answers_the_marker(db: tuple[str, Pool, Catalog]) -> None:
    _, pool, catalog = db
    answers = await catalog.commit_object(
        "o1",
        "n",
        200,
        OWN,
        [batch("gone", 3, Run("s", 1, 3, 0)), batch("q1", 2, Run("s", 1, 2, 0), offset=100)],
    )
    assert answers[0].first_id == MISSING_QUEUE and answers[0].duplicates == {}
    assert answers[1] == Committed(1, answers[1].time, {})
    assert await pool.fetchval("select live_bytes from capella_objects where key = 'o1'") == 100


async def test_runs_that_overlap_in_a_batch_are_refused(db: tuple[str, Pool, Catalog]) -> None:
    _, _, catalog = db
    with pytest.raises(InvalidRequest, match="overlap"):
        await catalog.commit_object("o", "n", 1, OWN, [batch("q1", 4, Run("s", 1, 3, 0), Run("t", 1, 1, 2))])
    with pytest.raises(InvalidRequest, match="past its messages"):
        await catalog.commit_object("o", "n", 1, OWN, [batch("q1", 2, Run("s", 1, 3, 0))])


async def test_three_committers_on_overlapping_queues(
    pg_server: PgServer, db: tuple[str, Pool, Catalog]
) -> None:
    """Separate pools (connections), overlapping queue sets given in different orders, each
    producer with its own source, and one identity space all three send into: no deadlock, no
    gap, no identity twice, and every answer for a shared identity carries the one id."""
    database, pool, _ = db
    pools = [await open_pool(target(pg_server, database), size=1) for _ in range(3)]
    queue_sets = [["q1", "q2", "q3"], ["q3", "q2", "q4"], ["q4", "q1", "q3"]]
    answers: dict[tuple[str, int], set[int]] = {}

    async def committer(n: int) -> None:
        catalog = Catalog(pools[n])
        for k in range(40):
            entries = [
                batch(q, 6, Run(f"p{n}", 5 * k, 5 * k + 4, 0), Run("all", k, k, 5), offset=100 * i)
                for i, q in enumerate(queue_sets[n])
            ]
            for entry, answer in zip(
                entries, await catalog.commit_object(f"{n}-{k}", f"n{n}", 300, OWN, entries), strict=True
            ):
                assert answer.first_id > 0
                kept = [p for p in range(6) if p not in answer.duplicates]
                ids = {p: answer.first_id + i for i, p in enumerate(kept)} | answer.duplicates
                answers.setdefault((entry.queue, k), set()).add(ids[5])

    try:
        async with asyncio.timeout(60):
            await asyncio.gather(*(committer(n) for n in range(3)))
    finally:
        for p in pools:
            await p.close()
    for q in ("q1", "q2", "q3", "q4"):
        await assert_gapless(pool, q)
    await assert_runs_disjoint(pool)
    assert all(len(ids) == 1 for ids in answers.values())
    # q3 is in all three sets: 3 x 40 batches of 5 own + 1 shared identity, the shared once each
    assert await pool.fetchval("select next_id from capella_queues where name = 'q3'") == 1 + 3 * 40 * 5 + 40


# --- cursors -------------------------------------------------------------------------------


async def test_cursors_never_move_backwards_unless_reset(db: tuple[str, Pool, Catalog]) -> None:
    _, _, catalog = db
    sub, created = await catalog.commit_cursor("q1", "c", None, replica=None, reset=False)
    assert (sub.name, sub.last_id, sub.replica, created) == ("c", 0, False, True)
    sub, created = await catalog.commit_cursor("q1", "c", 10, replica=None, reset=False)
    assert (sub.last_id, created) == (10, False) and sub.updated >= sub.created
    sub, _ = await catalog.commit_cursor("q1", "c", 4, replica=None, reset=False)
    assert sub.last_id == 10
    before = sub
    assert await catalog.commit_cursor("q1", "c", 10, replica=False, reset=True) == (before, False)
    sub, _ = await catalog.commit_cursor("q1", "c", 4, replica=True, reset=True)
    assert (sub.last_id, sub.replica) == (4, True)
    sub, _ = await catalog.commit_cursor("q1", "c", None, replica=None, reset=False)
    assert (sub.last_id, sub.replica) == (4, True)
    sub, created = await catalog.commit_cursor("q1", "r", 7, replica=True, reset=False)
    assert (sub.last_id, sub.replica, created) == (7, True, True)
    assert [s.name for s in await catalog.subscriptions("q1")] == ["c", "r"]
    assert await catalog.delete_subscription("q1", "c")
    assert not await catalog.delete_subscription("q1", "c")
    assert [s.name for s in await catalog.subscriptions("q1")] == ["r"]
    with pytest.raises(QueueNotFound):
        await catalog.commit_cursor("nope", "c", 1, replica=None, reset=False)
    with pytest.raises(InvalidRequest):
        await catalog.commit_cursor("q1", "c", -1, replica=None, reset=False)
    with pytest.raises(InvalidRequest):
        await catalog.commit_cursor("q1", "bad/name", 1, replica=None, reset=False)


# --- definitions ---------------------------------------------------------------------------


async def test_definitions_are_created_changed_and_dropped_with_a_notice(
    db: tuple[str, Pool, Catalog],
) -> None:
    _, pool, catalog = db
    heard = Heard()
    listener = await pool.listen("capella_shared_defs", heard)
    try:
        assert await catalog.create_queue("new", {"storage": "shared", "n": 1})
        assert not await catalog.create_queue("new", {"storage": "shared", "n": 2})
        assert (await catalog.definitions())["new"] == {"storage": "shared", "n": 1}
        assert await catalog.update_queue("new", {"storage": "shared", "n": 3})
        assert not await catalog.update_queue("absent", {})
        assert (await catalog.definitions())["new"]["n"] == 3
        await catalog.commit_object(
            "o1", "n", 200, OWN, [batch("new", 2, Run("s", 1, 2, 0)), batch("q1", 1, offset=100)]
        )
        await catalog.commit_cursor("new", "c", 1, replica=None, reset=False)
        assert await catalog.drop_queue("new")
        assert not await catalog.drop_queue("new")
        assert "new" not in await catalog.definitions()
        assert await catalog.heads(["new"]) == {}
        left = await pool.fetchval(
            "select (select count(*) from capella_identity_runs where queue = 'new') "
            "+ (select count(*) from capella_subscriptions where queue = 'new') "
            "+ (select count(*) from capella_sources where queue = 'new')"
        )
        assert left == 0
        # the object still holds q1's batch: live, with only those bytes
        assert tuple(
            await pool.fetchrow("select live_bytes, state from capella_objects where key = 'o1'")
        ) == (100, "live")
        await heard.wait_for(3)
        assert heard.payloads == ["new", "new", "new"]
    finally:
        await listener.close()
    assert listener.lost.is_set()


async def test_a_commit_notifies_each_queue_once_and_a_cut_listener_says_so(
    db: tuple[str, Pool, Catalog],
) -> None:
    _, pool, catalog = db
    heard = Heard()
    listener = await pool.listen(NOTIFY_CHANNEL, heard)
    await catalog.commit_object("o1", "n", 300, OWN, [batch("q1", 2), batch("q2", 1), batch("q1", 3)])
    await heard.wait_for(2)
    assert sorted(heard.payloads) == ["q1:6", "q2:2"]
    await pool.execute(
        "select pg_terminate_backend(pid) from pg_stat_activity where query like 'LISTEN%' "
        "and datname = current_database() and pid <> pg_backend_pid()"
    )
    async with asyncio.timeout(5):
        await listener.lost.wait()
    await listener.close()


# --- nodes ---------------------------------------------------------------------------------


async def test_a_node_name_is_held_by_one_token_until_its_lease_ends(db: tuple[str, Pool, Catalog]) -> None:
    _, _, catalog = db
    assert await catalog.claim_node("a", "t1", "http://a1", 30.0) is None
    assert await catalog.claim_node("a", "t1", "http://a1", 30.0) is None  # renewed by its holder
    assert await catalog.claim_node("a", "t2", "http://a2", 30.0) == "http://a1"
    assert await catalog.claim_node("b", "t3", "http://b", 0.2) is None
    assert await catalog.live_nodes() == [("a", "http://a1"), ("b", "http://b")]
    assert not await catalog.renew_node("a", "t2", 30.0)
    assert await catalog.renew_node("a", "t1", 0.2)
    await asyncio.sleep(0.3)
    assert await catalog.live_nodes() == []
    assert await catalog.claim_node("a", "t2", "http://a2", 30.0) is None  # expired: taken over
    assert not await catalog.renew_node("a", "t1", 30.0)
    await catalog.release_node("a", "t1")  # not the holder's token: nothing happens
    assert await catalog.live_nodes() == [("a", "http://a2")]
    await catalog.release_node("a", "t2")
    assert await catalog.live_nodes() == []


async def test_a_node_lease_carries_its_kafka_address_and_only_live_ones_are_listed(
    db: tuple[str, Pool, Catalog],
) -> None:
    _, _, catalog = db
    assert await catalog.claim_node("b", "tb", "http://b", 30.0, ("127.0.0.1", 9093)) is None
    assert await catalog.claim_node("a", "ta", "http://a", 30.0, ("10.0.0.1", 9092)) is None
    assert await catalog.claim_node("c", "tc", "http://c", 30.0) is None  # no [kafka] there
    assert await catalog.kafka_nodes() == [("a", "10.0.0.1", 9092), ("b", "127.0.0.1", 9093)]
    # A listener that came after the claim is listed from the renewal on; a refused claim
    # (another token) writes nothing.
    assert await catalog.renew_node("c", "tc", 30.0, ("127.0.0.1", 9094))
    assert await catalog.claim_node("a", "other", "http://x", 30.0, ("6.6.6.6", 1)) == "http://a"
    assert not await catalog.renew_node("b", "other", 30.0, ("6.6.6.6", 1))
    assert await catalog.kafka_nodes() == [
        ("a", "10.0.0.1", 9092),
        ("b", "127.0.0.1", 9093),
        ("c", "127.0.0.1", 9094),
    ]
    await catalog.release_node("b", "tb")
    assert await catalog.renew_node("c", "tc", 0.05, ("127.0.0.1", 9094))
    await asyncio.sleep(0.1)
    assert await catalog.kafka_nodes() == [("a", "10.0.0.1", 9092)]


# --- retention -----------------------------------------------------------------------------


async def test_expire_below_removes_whole_segments_and_their_identities(
    db: tuple[str, Pool, Catalog],
) -> None:
    _, pool, catalog = db
    for n in range(4):  # ids 10n+1..10n+10, s:10n..10n+9, one object each (q2 shares the first)
        extra = [batch("q2", 1, offset=100)] if n == 0 else []
        await catalog.commit_object(
            f"o{n}",
            "n",
            100 + 100 * len(extra),
            OWN,
            [batch("q1", 10, Run("s", 10 * n, 10 * n + 9, 0)), *extra],
        )
    assert await catalog.usage("q1") == (1, 41, 400, 4)
    assert await catalog.usage("nope") is None
    assert await catalog.retention_cut("q1", max_count=25) == 21
    assert await catalog.retention_cut("q1", max_bytes=250) == 21
    assert await catalog.retention_cut("q1", max_bytes=150, max_count=100) == 31
    assert await catalog.retention_cut("q1", max_count=100) == 1
    assert await catalog.retention_cut("q1") == 0
    now = await pool.fetchval("select extract(epoch from clock_timestamp())::float8")
    assert await catalog.retention_cut("q1", before_time=now + 10) == 41  # everything is older
    third = (await catalog.segments_after("q1", 20))[0]
    assert await catalog.retention_cut("q1", before_time=third.time) <= 21
    assert await catalog.expire_below("q1", 15) == 1  # 11..20 straddles the cut: kept
    assert await catalog.usage("q1") == (11, 41, 300, 3)
    states = dict(await pool.fetch("select key, state from capella_objects"))
    assert states == {"o0": "live", "o1": "live", "o2": "live", "o3": "live"}  # o0 still holds q2's
    assert await catalog.expire_below("q1", 31) == 2
    assert (await catalog.heads(["q1"]))["q1"] == (31, 41)
    assert (await catalog.segments_after("q1", 0))[0].first_id == 31
    states = dict(await pool.fetch("select key, state from capella_objects"))
    assert states == {"o0": "live", "o1": "dead", "o2": "dead", "o3": "live"}
    runs = await pool.fetch(
        "select first_ext, last_ext from capella_identity_runs where queue = 'q1' order by 1"
    )
    assert [tuple(r) for r in runs] == [(30, 39)]
    # past the horizon an old identity is new again (dedup covers the retained history)
    [old] = await catalog.commit_object("o9", "n", 100, OWN, [batch("q1", 1, Run("s", 5, 5, 0))])
    assert old.first_id == 41 and old.duplicates == {}
    assert await catalog.expire_below("q1", 1000) == 2
    assert await catalog.usage("q1") == (42, 42, 0, 0)
    assert await pool.fetchval("select count(*) from capella_sources where queue = 'q1'") == 0


# --- compaction ----------------------------------------------------------------------------


async def test_replace_segments_points_a_range_at_one_block(db: tuple[str, Pool, Catalog]) -> None:
    _, pool, catalog = db
    for n in range(3):
        await catalog.commit_object(
            f"o{n}", "n", 200, OWN, [batch("q1", 5, offset=0), batch("q2", 1, offset=100)]
        )
    newest = (await catalog.segments_after("q1", 5))[0].time  # of 6..10, the block's last
    later = (await catalog.segments_after("q1", 10))[0].time
    assert [s.first_id for s in await catalog.compactable("q1", later)] == [1, 6]
    assert not await catalog.replace_segments("q1", 1, 12, "blk", "n", 900)  # not a segment boundary
    assert not await catalog.replace_segments("q1", 2, 10, "blk", "n", 900)
    assert not await catalog.replace_segments("q1", 1, 10, "blk", "n", 900, segments=3)
    assert await catalog.replace_segments("q1", 1, 10, "q1/blocks/1-10.blk", "n", 900, segments=2)
    segments = await catalog.segments_after("q1", 0)
    assert [
        (s.first_id, s.last_id, s.key, s.byte_offset, s.byte_size, s.count, s.skip) for s in segments
    ] == [
        (1, 10, "q1/blocks/1-10.blk", 0, 900, 10, ()),
        (11, 15, "o2", 0, 100, 5, ()),
    ]
    assert segments[0].time == newest  # expiry by age keeps the block while 6..10 is young
    assert await catalog.compactable("q1", later) == []  # a block is not compacted again
    assert [s.first_id for s in await catalog.compactable("q1", later + 1)] == [11]
    live = dict(await pool.fetch("select key, live_bytes from capella_objects"))
    assert live == {"o0": 100, "o1": 100, "o2": 200, "q1/blocks/1-10.blk": 900}
    # the rows changed meanwhile (compacted already): refused, nothing changes
    before = await counts(pool)
    assert not await catalog.replace_segments("q1", 1, 10, "again", "n", 900, segments=2)
    assert not await catalog.replace_segments("q1", 1, 15, "again", "n", 900, segments=3)
    assert await counts(pool) == before
    await assert_gapless(pool, "q1")
    # compacting q2 too leaves o0 and o1 without live bytes: dead, then garbage
    assert await catalog.replace_segments("q2", 1, 2, "q2/blocks/1-2.blk", "n", 50)
    states = dict(await pool.fetch("select key, state from capella_objects"))
    assert states["o0"] == states["o1"] == "dead" and states["o2"] == "live"
    assert await catalog.dead_objects(older_than=3600) == []
    assert sorted(await catalog.dead_objects(older_than=0)) == ["o0", "o1"]
    assert await catalog.known_keys(["o0", "o2", "stray"]) == {"o0", "o2"}
    assert await catalog.forget_objects(["o0", "o1", "o2"]) == 2  # o2 is live: kept
    assert await catalog.known_keys(["o0", "o1", "o2"]) == {"o2"}
    with pytest.raises(Conflict, match="not a committed flush"):
        await catalog.commit_object("q1/blocks/1-10.blk", "n", 1, OWN, [batch("q1", 1)])


async def test_one_compactor_per_queue(db: tuple[str, Pool, Catalog], pg_server: PgServer) -> None:
    database, _, catalog = db
    other_pool = await open_pool(target(pg_server, database))
    other = Catalog(other_pool)
    try:
        async with catalog.compaction_lock("q1") as got:
            assert got
            async with other.compaction_lock("q1") as second, other.compaction_lock("q2") as third:
                assert not second and third
        async with other.compaction_lock("q1") as after:
            assert after
        async with catalog.janitor_lock() as got:
            assert got
            async with other.janitor_lock() as second, other.compaction_lock("q1") as third:
                assert not second and third
        async with other.janitor_lock() as after:
            assert after
    finally:
        await other_pool.close()


# --- connections ---------------------------------------------------------------------------


def test_target_of_reads_the_dsn_or_its_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = target_of(
        SharedSettings(node="n", mount="m", dsn="postgresql://u:pw@db.example:6432/capella"), Secrets()
    )
    assert (plain.shown, plain.password) == ("u@db.example:6432/capella", "pw")
    assert "pw" not in repr(plain)
    monkeypatch.setenv("SHARED_DSN", "postgresql://v:x@db2.example/cap?sslmode=require")
    secrets = Secrets({"dsn": SecretSettings(env="SHARED_DSN", hosts=("db2.example",))})
    found = target_of(SharedSettings(node="n", mount="m", dsn_secret="dsn"), secrets)
    assert (found.shown, found.password, found.sslmode) == ("v@db2.example:5432/cap", "x", "require")
    monkeypatch.setenv("SHARED_DSN", "postgresql://v:x@elsewhere.example/cap")
    with pytest.raises(SecretNotForHost):
        target_of(SharedSettings(node="n", mount="m", dsn_secret="dsn"), secrets)
    with pytest.raises(InvalidConfig, match="not accepted"):
        target_of(SharedSettings(node="n", mount="m", dsn="postgresql://u@h/d?options=-c"), Secrets())


async def test_errors_name_the_database_and_never_the_password(pg_server: PgServer) -> None:
    bad = target_of(
        SharedSettings(
            node="n",
            mount="m",
            dsn=f"postgresql://{PASSWORD_ROLE}:wrong-{PASSWORD}@127.0.0.1:{pg_server.port}/postgres?sslmode=disable",
        ),
        Secrets(),
    )
    pool = await open_pool(bad)
    try:
        with pytest.raises(DatabaseRefused, match="authentication failed") as refused:
            await pool.fetchval("select 1")
        assert PASSWORD not in refused.value.message
        assert refused.value.message.startswith(
            f"shared: postgres {PASSWORD_ROLE}@127.0.0.1:{pg_server.port}/postgres"
        )
    finally:
        await pool.close()
    with SocketClosed() as port:
        down = await open_pool(Target("127.0.0.1", port, "u", "d", "pw", sslmode="disable"))
        try:
            with pytest.raises(
                StorageUnavailable, match=f"shared: postgres u@127.0.0.1:{port}/d: cannot connect"
            ):
                await down.fetchval("select 1")
        finally:
            await down.close()


async def test_a_refused_statement_is_database_refused_and_a_slow_one_times_out(
    pg_server: PgServer, db: tuple[str, Pool, Catalog]
) -> None:
    database, pool, _ = db
    with pytest.raises(DatabaseRefused, match="query failed"):
        await pool.fetchval("select * from no_such_table")
    impatient = await open_pool(target(pg_server, database), command_timeout=0.2)
    try:
        with pytest.raises(StorageUnavailable, match="timed out"):
            await impatient.fetchval("select pg_sleep(3)")
        assert await impatient.fetchval("select 1") == 1  # the pool goes on
    finally:
        await impatient.close()


async def test_the_pool_reconnects_after_postgres_restarts() -> None:
    server = PgServer()
    try:
        # An immediate shutdown loses commits not yet written with synchronous_commit off.
        server.psql("postgres", "alter system set synchronous_commit = on")
        server.psql("postgres", "select pg_reload_conf()")
        dsn = server.create_database("restarts")
        pool = await open_pool(
            target_of(SharedSettings(node="n", mount="m", dsn=dsn + "?sslmode=disable"), Secrets())
        )
        try:
            assert await migrate(pool) == latest()
            catalog = Catalog(pool)
            await catalog.create_queue("q", {})
            await catalog.commit_object("o1", "n", 1, OWN, [batch("q", 1)])
            server.stop("immediate")
            with pytest.raises(StorageUnavailable, match=r"shared: postgres postgres@127\.0\.0\.1"):
                await catalog.heads()
            server.start()
            # at most one statement fails on a stale connection; then the pool is new
            failures = 0
            for _ in range(3):
                try:
                    assert await catalog.heads() == {"q": (1, 2)}
                    break
                except StorageUnavailable:
                    failures += 1
            assert failures <= 1
            [again] = await catalog.commit_object("o1", "n", 1, OWN, [batch("q", 1)])
            assert again.first_id == 1  # idempotent across the restart
        finally:
            await pool.close()
    finally:
        server.close()


class SocketClosed:
    """A loopback port nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *_: object) -> None:
        return None


# --- figures -------------------------------------------------------------------------------


async def test_commit_time_of_eight_queues_of_125_messages(db: tuple[str, Pool, Catalog]) -> None:
    """The note's figure (1.7 ms p50 with runs), printed; bounded loosely so that a commit that
    degrades to a scan per message (tens of ms) fails."""
    _, pool, catalog = db
    figures = []
    for older in (0, 160_000):
        if older:  # older runs of the same producers, as months of traffic leave them
            await pool.execute(
                "insert into capella_identity_runs (queue, source, first_ext, last_ext, first_id) "
                "select 'q' || (1 + g % 8), 'p' || (1 + g % 8), g * 10, g * 10 + 4, g "
                "from generate_series(1, $1) g",
                older,
            )
            await pool.execute("analyze capella_identity_runs")
        times = []
        base = 10_000_000 * (1 + older)
        for k in range(200):
            entries = [
                batch(
                    f"q{q}",
                    125,
                    Run(f"p{q}", base + 125 * k, base + 125 * k + 124, 0),
                    offset=1000 * q,
                    size=1000,
                )
                for q in range(1, 9)
            ]
            start = time.perf_counter()
            answers = await catalog.commit_object(f"bench-{older}-{k}", "n", 8000, OWN, entries)
            times.append(time.perf_counter() - start)
            assert all(a.first_id > 0 and not a.duplicates for a in answers)
        start = time.perf_counter()
        [retry] = await catalog.commit_object(
            f"dup-{older}", "n", 1000, OWN, [batch("q1", 125, Run("p1", base, base + 124, 0))]
        )
        dup_time = time.perf_counter() - start
        assert len(retry.duplicates) == 125
        figures.append((older, statistics.median(times), sorted(times)[int(len(times) * 0.99) - 1], dup_time))
    for older, p50, p99, dup in figures:
        print(
            f"commit 8x125 with {older} older runs: p50 {p50 * 1000:.2f} ms p99 {p99 * 1000:.2f} ms; "
            f"all-duplicate {dup * 1000:.2f} ms"
        )
        assert p50 < 0.05
    await assert_runs_disjoint(pool)


async def test_external_ids_use_all_64_bits(db: tuple[str, Pool, Catalog]) -> None:
    _, _, catalog = db
    big = 2**62
    await catalog.commit_object("o1", "n", 100, OWN, [batch("q1", 3, Run("s", big, big + 2, 0))])
    [mixed] = await catalog.commit_object(
        "o2", "n", 100, OWN, [batch("q1", 3, Run("s", big + 1, big + 3, 0))]
    )
    assert (mixed.first_id, mixed.duplicates) == (4, {0: 2, 1: 3})


async def test_commits_agree_with_a_model_of_dedup(db: tuple[str, Pool, Catalog]) -> None:
    """Random objects of mixed batches (runs of two sources over a small id space, the cluster's
    own source named explicitly now and then, messages without identity between them) against
    a dict of identities: every answer, every id and every skip position as the model says."""
    _, pool, catalog = db
    rng = random.Random(36)
    known: dict[tuple[str, str, int], int] = {}
    next_id = {"q1": 1, "q2": 1}
    skips: dict[tuple[str, int], tuple[int, ...]] = {}
    for n in range(80):
        entries = []
        for _ in range(rng.randint(1, 3)):
            queue, count, runs, position = rng.choice(("q1", "q2")), rng.randint(1, 12), [], 0
            while position < count:
                if rng.random() < 0.3:
                    position += 1  # no identity
                    continue
                length = min(rng.randint(1, 4), count - position)
                first = rng.randint(0, 40) if rng.random() < 0.9 else rng.randint(1, 60)
                source = rng.choice(("a", "b", "a", "b", OWN))
                runs.append(Run(source, first, first + length - 1, position))
                position += length
            entries.append(batch(queue, count, *runs))
        expected = []
        for entry in entries:
            identity = {
                r.index + k: (r.source, r.first_ext + k)
                for r in entry.runs
                for k in range(r.last_ext - r.first_ext + 1)
            }
            first, duplicates = 0, {}
            for position in range(entry.count):
                source_ext = identity.get(position)
                key = None if source_ext is None else (entry.queue, *source_ext)
                if key is not None and key in known:
                    duplicates[position] = known[key]
                    continue
                given = next_id[entry.queue]
                next_id[entry.queue] += 1
                first = first or given
                known.setdefault(key or (entry.queue, OWN, given), given)
            expected.append((first, duplicates))
        answers = await catalog.commit_object(f"m{n}", "n", 100, OWN, entries)
        assert [(a.first_id, a.duplicates) for a in answers] == expected, f"object {n}"
        for entry, (first, duplicates) in zip(entries, expected, strict=True):
            if first:
                skips[(entry.queue, first)] = tuple(sorted(duplicates))
    for queue in ("q1", "q2"):
        await assert_gapless(pool, queue)
    await assert_runs_disjoint(pool)
    stored = await pool.fetch("select queue, first_id, skip from capella_segments")
    assert {(r[0], r[1]): tuple(r[2]) for r in stored} == skips
    assert any(skips.values())
