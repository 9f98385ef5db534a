"""Compaction of shared queues (design note D5) and the janitor's dead objects: real PostgreSQL,
real moto S3, SharedNodes in this process (tests/support/upkeep.py), each pass run by the test.

What must hold: reads before and after compaction are the same messages byte for byte (ids,
payloads, headers, sources, times), duplicates included; objects fall at least tenfold; a
reader holding the segment rows from before keeps reading through the grace period; the dead
objects are gone after it; two nodes compacting at once write each range once.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.shared import SharedRig
from support.upkeep import (
    all_keys,
    create,
    database,
    drafts,
    live_objects,
    produce,
    read_all,
    rendered,
    rows,
    shared_node,
)
from support.wait import until

from capella.core.base_queue import BaseQueue
from capella.core.definition import SealLimits
from capella.core.log.codec import block_records
from capella.core.message import SaveMode
from capella.core.retention import Retention
from capella.shared.catalog import Segment
from capella.shared.compactor import MIN_OBJECTS, Group, block_key, groups
from capella.shared.queue import SharedQueue
from capella.storage import Journal, Storage

# --- which segments make a block (pure) ------------------------------------------------------


def seg(first: int, last: int, key: str, size: int = 100) -> Segment:
    return Segment("q", first, last, key, 0, size, last - first + 1, (), 0.0)


def spans(found: list[Group]) -> list[tuple[int, int]]:
    return [(g.first_id, g.last_id) for g in found]


def test_groups_cut_at_the_block_limits_and_wait_for_enough_objects() -> None:
    segments = [seg(10 * n + 1, 10 * n + 10, f"o{n}") for n in range(10)]
    never = 10**9
    found = groups(segments, SealLimits(max_messages=30, max_bytes=10_000), min_objects=3, min_bytes=never)
    # 30 messages a block: three full blocks; the tenth segment alone spans 1 object: it waits.
    assert [(g.first_id, g.last_id, g.full, g.objects) for g in found] == [
        (1, 30, True, 3),
        (31, 60, True, 3),
        (61, 90, True, 3),
    ]
    by_bytes = groups(segments, SealLimits(max_messages=1000, max_bytes=250), min_objects=99, min_bytes=never)
    assert spans(by_bytes) == [(1, 20), (21, 40), (41, 60), (61, 80)]  # 81..100: 200 bytes, waits
    # short of a full block: enough objects, or enough bytes
    assert spans(groups(segments[:4], SealLimits(), min_objects=4, min_bytes=never)) == [(1, 40)]
    assert groups(segments[:4], SealLimits(), min_objects=5, min_bytes=401) == []
    assert [g.bytes for g in groups(segments[:4], SealLimits(), min_objects=5, min_bytes=400)] == [400]
    # two segments of one object count as one object
    same = [seg(1, 5, "o"), seg(6, 10, "o"), seg(11, 15, "p")]
    assert groups(same, SealLimits(), min_objects=3, min_bytes=never) == []
    assert groups(same, SealLimits(), min_objects=2, min_bytes=never)[0].objects == 2
    # a gap (a block between) ends a run; a segment past the limits alone is a block of its own
    gap = [seg(1, 10, "a"), seg(21, 30, "b"), seg(31, 40, "c")]
    assert spans(groups(gap, SealLimits(), min_objects=2, min_bytes=never)) == [(21, 40)]
    huge = [seg(1, 50, "a"), seg(51, 52, "b")]
    found = groups(huge, SealLimits(max_messages=10), min_objects=99, min_bytes=never)
    assert [(g.first_id, g.last_id, g.full) for g in found] == [(1, 50, True)]


# --- D5 -------------------------------------------------------------------------------------------

ROUNDS = 250  # 200 messages a round (one repeated identity cut out): 50,000 messages


@pytest.mark.shared_rig(flush_interval="20ms")
async def test_compaction_keeps_every_byte_and_the_grace_keeps_old_readers_reading(
    shared_rig: SharedRig,
) -> None:
    async with (
        shared_node(shared_rig, 0) as (writer, storage),
        shared_node(shared_rig, 1, garbage_grace="1h") as (reader_node, _),
        database(shared_rig) as pool,
    ):
        queue = await create(writer, "d5")
        started = time.monotonic()
        n = 0
        for _ in range(ROUNDS):
            # Two calls in one window: mostly one object with two segments of the queue; the
            # second repeats the first's last identity, a partial duplicate (a skip position).
            first = queue.append(drafts(n, 100, source="prod"))
            second = queue.append(drafts(n + 99, 1, source="prod") + drafts(n + 100, 100))
            a, b = await asyncio.gather(first, second)
            assert b[0].duplicate and b[0].id == a[-1].id
            n += 200
        produced = time.monotonic() - started
        assert queue.last_id == 50_000
        segments_before = await rows(pool, "d5")
        objects_before = await live_objects(pool)
        assert objects_before >= 200 and len(segments_before) >= 400, (objects_before, len(segments_before))
        keys_before = await all_keys(storage)
        assert len(keys_before) == objects_before

        before = await read_all(queue)
        assert [m.id for m in before] == list(range(1, 50_001))
        # A reader on another node holds the segment rows of the first pages from before.
        reader = reader_node.queues()["d5"]
        assert isinstance(reader, SharedQueue)
        early = await read_all(reader, limit=1000)

        # A node that wrote none of it compacts (the writer's own objects are in its memory):
        # one ranged GET per object.
        async with shared_node(shared_rig, 2) as (compacting, _):
            await until(lambda: "d5" in compacting.queues(), what="the compacting node sees the queue")
            started = time.monotonic()
            written = await compacting.compactor.run_once(compacting.block_limits())  # type: ignore[union-attr]
            compacted = time.monotonic() - started
            assert written == 5  # 10,000 messages a block
            stats = compacting.stats
            assert stats.compactions == 5 and stats.compacted_objects >= objects_before
            assert objects_before <= stats.gets <= objects_before + 5  # an object spanning two blocks: twice
            assert stats.puts == 5
        after_rows = await rows(pool, "d5")
        bounds = [(10_000 * b + 1, 10_000 * (b + 1)) for b in range(5)]
        assert after_rows == [(first, last, block_key("d5", first, last)) for first, last in bounds]
        assert await live_objects(pool) == 5
        assert objects_before >= 10 * 5
        # Each is an ordinary sealed block, every checksum checked, its batches carrying their ids.
        records = block_records(await storage.get(after_rows[0][2]))
        assert records is not None and (records[0].base_id, records[-1].last_id) == (1, 10_000)

        # The old reader still reads through its old rows (their objects live through the grace).
        assert reader._segments and reader._segments[-1].key.endswith(".cpo")
        rest = await read_all(reader, after=early[-1].id)
        assert rendered(early + rest) == rendered(before)

        # A node that never saw the old rows reads the blocks: the same bytes.
        async with shared_node(shared_rig, 3) as (fresh, _):
            fresh_queue = fresh.queues()["d5"]
            started = time.monotonic()
            after = await read_all(fresh_queue)
            read_blocks = time.monotonic() - started
            assert fresh.stats.gets == 5  # the whole history in five GETs, one per block
            assert after == before
            assert rendered(after) == rendered(before)
            assert {m.source for m in after} == {"prod", "shared-test"}

        # Within the grace nothing is deleted (the reader node's janitor keeps them an hour).
        assert (await reader_node.janitor.run_once(scan=False)).dead == 0  # type: ignore[union-attr]
        assert len(await all_keys(storage)) == objects_before + 5

        # Past the (shortened) grace the dead objects go: S3 holds the five blocks only.
        async with shared_node(shared_rig, 4, garbage_grace="500ms") as (sweeper, _):
            swept = 0

            async def swept_all() -> bool:
                nonlocal swept
                swept += (await sweeper.janitor.run_once(scan=False)).dead  # type: ignore[union-attr]
                return swept == objects_before

            await until(swept_all, within=20, what="the dead objects deleted", every=0.2)
            assert sorted(await all_keys(storage)) == [r[2] for r in after_rows]
            assert await pool.fetchval("select count(*) from capella_objects") == 5
            assert sweeper.stats.garbage_objects == objects_before
            # and the blocks alone serve the whole queue, to a new reader and to the old one
            assert await read_all(sweeper.queues()["d5"]) == before
        assert await read_all(reader) == before
    print(
        f"\nD5: 50,000 messages in {produced:.1f}s: {objects_before} objects, {len(segments_before)} "
        f"segment rows; compacted into 5 blocks in {compacted:.2f}s; a new node read them all in "
        f"{read_blocks:.2f}s"
    )


@pytest.mark.shared_rig(flush_interval="20ms")
async def test_two_nodes_compacting_at_once_write_each_range_once(shared_rig: SharedRig) -> None:
    names = [f"race{i}" for i in range(4)]
    async with (
        shared_node(shared_rig, 0) as (one, storage),
        shared_node(shared_rig, 1) as (two, _),
        database(shared_rig) as pool,
    ):
        queues = [await create(one, name, max_messages=1000) for name in names]
        await until(lambda: set(names) <= set(two.queues()), what="node 2 sees the queues")
        for r in range(MIN_OBJECTS + 8):
            # Through both nodes, every queue in each window.
            await asyncio.gather(
                *(q.append(drafts(100 * r, 50)) for q in queues),
                *(two.queues()[name].append(drafts(100 * r + 50, 50)) for name in names),
            )
        before = {name: await read_all(q) for name, q in zip(names, queues, strict=True)}
        assert all(len(m) == 100 * (MIN_OBJECTS + 8) for m in before.values())
        written = await asyncio.gather(
            one.compactor.run_once(one.block_limits()),  # type: ignore[union-attr]
            two.compactor.run_once(two.block_limits()),  # type: ignore[union-attr]
            one.compactor.run_once(one.block_limits()),  # type: ignore[union-attr]
        )
        total = (MIN_OBJECTS + 8) * 100 // 1000  # full blocks of 1,000; the rest waits (short of K objects)
        assert sum(written) == total * len(names)
        assert one.stats.compactions + two.stats.compactions == total * len(names)
        for name in names:
            found = await rows(pool, name)
            blocks = [r for r in found if r[2].endswith(".blk")]
            assert [(b[0], b[1]) for b in blocks] == [(1000 * i + 1, 1000 * (i + 1)) for i in range(total)]
            assert [r[0] for r in found] == sorted({r[0] for r in found})  # each range once
            assert all(found[i][1] + 1 == found[i + 1][0] for i in range(len(found) - 1))  # no gap
        block_keys = [k for k in await all_keys(storage) if k.endswith(".blk")]
        assert len(block_keys) == total * len(names)
        async with shared_node(shared_rig, 2) as (fresh, _):
            for name in names:
                assert await read_all(fresh.queues()[name]) == before[name]


async def test_reloads_racing_creates_never_close_a_live_queue(shared_rig: SharedRig) -> None:
    # Every create notifies every node, which reloads the definitions: a reload that read them
    # before the next create committed must not close a queue a later reload has opened.
    async with shared_node(shared_rig, 0) as (maker, _), shared_node(shared_rig, 1) as (other, _):
        seen: dict[int, BaseQueue] = {}
        done = False

        async def reload() -> None:
            for _ in range(200):
                if done:
                    return
                await other._load_definitions()
                seen.update((id(q), q) for q in other.queues().values())

        async def make() -> None:
            nonlocal done
            for i in range(30):
                await create(maker, f"row{i}")
            done = True

        await asyncio.gather(make(), reload(), reload(), reload())
        await other._load_definitions()
        assert set(other.queues()) == {f"row{i}" for i in range(30)}
        assert [q.name for q in seen.values() if q._closing] == []  # type: ignore[attr-defined]


@pytest.mark.shared_rig(flush_interval="20ms")
async def test_a_reader_whose_old_objects_are_gone_reads_the_blocks_at_once(shared_rig: SharedRig) -> None:
    # A grace shorter than the reader's cached rows live: its next GET finds nothing, and the
    # same read asks PostgreSQL for the rows again (an empty page would stall a long poll).
    async with (
        shared_node(shared_rig, 0, garbage_grace="10ms") as (writer, _),
        shared_node(shared_rig, 1) as (reader_node, _),
    ):
        queue = await create(writer, "short", max_messages=100)
        for r in range(MIN_OBJECTS + 8):
            await produce(queue, drafts(10 * r, 10), SaveMode.IMMEDIATE)
        everything = await read_all(queue)
        await until(lambda: "short" in reader_node.queues(), what="the reader node sees the queue")
        reader = reader_node.queues()["short"]
        first = (await reader.read_page(0, 15)).messages()  # rows of every segment cached, two read
        assert [m.id for m in first] == list(range(1, 16))
        assert await writer.compactor.run_once(writer.block_limits()) == 4  # type: ignore[union-attr]
        swept = 0

        async def gone() -> bool:
            nonlocal swept
            swept += (await writer.janitor.run_once(scan=False)).dead  # type: ignore[union-attr]
            return swept == MIN_OBJECTS + 8

        await until(gone, within=20, what="the old objects deleted", every=0.1)
        page = (await reader.read_page(15, 50)).messages()
        assert page == everything[15:65]


async def test_a_queue_created_while_a_node_starts_listening_is_seen_at_once(shared_rig: SharedRig) -> None:
    # Created after the node read the definitions but before its LISTEN was up: the notice is
    # lost, so the listener reads the definitions once it is up (not only at the 5 s poll).
    async with shared_node(shared_rig, 0) as (maker, _), shared_node(shared_rig, 1) as (late, _):
        await create(maker, "early")
        await until(lambda: "early" in late.queues(), within=2.0, what="the new node sees the queue")


class HeldBlocks:
    """The real storage, with the PUT of a block held until the test releases it (a test double
    of the storage around a real provider, as in test_cache.py)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.putting = asyncio.Event()
        self.release = asyncio.Event()

    async def get(self, key: str) -> bytes:
        return await self.inner.get(key)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self.inner.get_range(key, start, length)

    async def put(self, key: str, value: bytes) -> None:
        await self.inner.put(key, value)
        if key.endswith(".blk"):
            self.putting.set()
            await asyncio.wait_for(self.release.wait(), 20.0)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str) -> list[str]:
        return await self.inner.list(prefix)

    async def journal(self, key: str, *, truncate_to: int | None = None) -> Journal:
        return await self.inner.journal(key, truncate_to=truncate_to)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_block_whose_range_expired_meanwhile_is_not_kept(shared_rig: SharedRig) -> None:
    held: list[HeldBlocks] = []

    def wrap(inner: Storage) -> Storage:
        held.append(HeldBlocks(inner))
        return held[0]

    async with (
        shared_node(shared_rig, 0, wrap=wrap) as (node, storage),
        database(shared_rig) as pool,
    ):
        queue = await create(node, "raced", max_messages=100)
        for r in range(10):
            await produce(queue, drafts(10 * r, 10), SaveMode.IMMEDIATE)
        before = await read_all(queue)
        # Every segment past compact_after on PostgreSQL's clock, so that the ten fill one block.
        catalog = node._need()

        async def all_due() -> bool:
            return len(await catalog.compactable("raced", node._clock() - node._settings.compact_after)) == 10

        await until(all_due, what="all ten segments due for compaction")
        compacting = asyncio.create_task(node.compactor.compact("raced", queue.definition.block))  # type: ignore[union-attr]
        await asyncio.wait_for(held[0].putting.wait(), 20.0)
        # While the block is being written, retention takes the first segments of its range.
        assert (await queue.expire(Retention(max_messages=75)))[0] == 3
        held[0].release.set()
        assert await compacting == 0
        assert not [k for k in await all_keys(storage) if k.endswith(".blk")]  # written, then deleted
        assert [r[0] for r in await rows(pool, "raced")] == list(range(31, 101, 10))
        assert await read_all(queue) == before[30:]
        assert node.stats.compactions == 0


async def test_two_readers_missing_one_segment_count_its_bytes_once(shared_rig: SharedRig) -> None:
    async with shared_node(shared_rig, 0) as (node, _):
        queue = await create(node, "raced-readers", max_messages=100)
        await produce(queue, drafts(0, 10), SaveMode.IMMEDIATE)
        (segment,) = await node.segments_after("raced-readers", 0, 10)
        # As on a node that has not read it yet: neither stamped nor its object in memory, so both
        # readers wait on one GET and both stamp what it brings.
        node._batches.clear()
        node._batch_bytes = 0
        node._objects.discard(segment.key)
        first, second = await asyncio.gather(node.batch_of(segment), node.batch_of(segment))
        assert list(first.ids) == list(second.ids) == list(range(1, 11))
        assert len(node._batches) == 1
        assert node._batch_bytes == segment.byte_size
