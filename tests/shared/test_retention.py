"""Retention of shared queues (design note D7): the expire rule by count, age and size cuts
whole segments; their rows, identity runs and objects go, and reads start at the new first id,
on every node. Real PostgreSQL and moto, SharedNodes in this process (tests/support/upkeep.py).
"""

from __future__ import annotations

import time

from support.shared import SharedRig
from support.upkeep import all_keys, create, database, drafts, produce, read_all, rows, shared_node
from support.wait import until

from capella.core.message import SaveMode
from capella.core.retention import Retention


class Unit:
    def __init__(self, count: int, size: int, sealed: float) -> None:
        self.count, self.bytes, self.sealed = count, size, sealed


def test_one_rule_cuts_from_the_oldest_end() -> None:
    units = [Unit(10, 100, float(t)) for t in range(10)]  # sealed at 0..9
    assert Retention(max_messages=35).expired(units, 100, 1000, now=10.0) == 7
    assert Retention(max_bytes=300).expired(units, 100, 1000, now=10.0) == 7
    assert Retention(max_age=4.0).expired(units, 100, 1000, now=10.0) == 7  # sealed at 6 is 4 old
    assert Retention(max_age=4.0, max_messages=20).expired(units, 100, 1000, now=10.0) == 8
    assert Retention(max_messages=1000).expired(units, 100, 1000, now=10.0) == 0
    assert Retention(max_age=4.0).before(10.0) == 6.0 and Retention().before(10.0) is None


async def test_retention_by_count_drops_whole_segments_their_identities_and_objects(
    shared_rig: SharedRig,
) -> None:
    async with (
        shared_node(shared_rig, 0, garbage_grace="200ms") as (node, storage),
        database(shared_rig) as pool,
    ):
        queue = await create(node, "d7")
        for r in range(10):  # one object each: ids 10r+1..10r+10, identities p:10r..10r+9
            assert await produce(queue, drafts(10 * r, 10, source="p"), SaveMode.IMMEDIATE) == list(
                range(10 * r + 1, 10 * r + 11)
            )
        sizes = {r[0]: r[1] for r in await pool.fetch("select first_id, byte_size from capella_segments")}
        assert await queue.expire(Retention(max_messages=100)) == (0, 0)
        # at most 35 kept, cut at a segment's start: 71..100 stay
        gone, freed = await queue.expire(Retention(max_messages=35))
        assert (gone, freed) == (7, sum(sizes[f] for f in sizes if f < 71))
        assert [r[0] for r in await rows(pool, "d7")] == [71, 81, 91]
        assert queue.first_id == 71 and queue.stats()["first_id"] == 71 and queue.stats()["messages"] == 30
        runs = await pool.fetch("select source, first_ext, last_ext, first_id from capella_identity_runs")
        assert [tuple(r) for r in runs] == [("p", 70, 99, 71)]
        states = [r[0] for r in await pool.fetch("select state from capella_objects order by object_id")]
        assert states == ["dead"] * 7 + ["live"] * 3
        # reads start at the new first id, here and on a node that starts now
        assert [m.id for m in await read_all(queue)] == list(range(71, 101))
        async with shared_node(shared_rig, 1) as (other, _):
            there = other.queues()["d7"]
            assert there.first_id == 71
            assert [m.id for m in await read_all(there)] == list(range(71, 101))
        # dedup's horizon is what is kept: below the cut an identity is new again
        again = await queue.append(drafts(5, 1, source="p") + drafts(80, 1, source="p"))
        assert [(a.id, a.duplicate) for a in again] == [(101, False), (81, True)]
        # and the janitor deletes the dead objects after the grace
        swept = 0

        async def all_swept() -> bool:
            nonlocal swept
            swept += (await node.janitor.run_once(scan=False)).dead  # type: ignore[union-attr]
            return swept == 7

        await until(all_swept, within=20, what="the expired objects deleted", every=0.2)
        assert len(await all_keys(storage)) == 4  # three kept objects and the last write's


async def test_retention_by_age_and_by_size(shared_rig: SharedRig) -> None:
    shift = [0.0]
    async with (
        shared_node(shared_rig, 0, clock=lambda: time.time() + shift[0]) as (node, _),
        database(shared_rig) as pool,
    ):
        queue = await create(node, "aged")
        for r in range(5):
            await produce(queue, drafts(10 * r, 10), SaveMode.IMMEDIATE)
        times = [r[0] for r in await pool.fetch("select time from capella_segments order by first_id")]
        assert times == sorted(times) and len(set(times)) == 5
        # The node's clock an hour past the middle of the third and fourth commits: an hour's
        # limit lets the first three go.
        shift[0] = (times[2] + times[3]) / 2 + 3600 - time.time()
        assert (await queue.expire(Retention(max_age=3600)))[0] == 3
        assert queue.first_id == 31
        assert [m.id for m in await read_all(queue)] == list(range(31, 51))
        # by size: what is kept holds at most one segment's bytes
        size = await pool.fetchval("select max(byte_size) from capella_segments")
        assert (await queue.expire(Retention(max_bytes=size)))[0] == 1
        assert queue.first_id == 41 and [r[0] for r in await rows(pool, "aged")] == [41]
