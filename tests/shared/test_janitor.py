"""The janitor: objects uploaded and never committed (their node died between the PUT and the
commit) are deleted once ``orphan_after`` old, and only those; one janitor at a time. Real
PostgreSQL and moto, SharedNodes in this process (tests/support/upkeep.py)."""

from __future__ import annotations

import time

from support.shared import SharedRig
from support.upkeep import all_keys, create, database, drafts, produce, read_all, shared_node

from capella.core.message import SaveMode, drafts_batch
from capella.shared import object as objects
from capella.storage import Storage


async def orphan(storage: Storage, written: float) -> str:
    """An object as a flush writes it, PUT by a node that then died: no commit names it."""
    data, _ = objects.build([("orph", drafts_batch(drafts(0, 3), source="shared-test"))])
    key = objects.object_key("ghost", written)
    await storage.put(key, data)
    return key


async def test_orphans_go_after_orphan_after_and_nothing_else_does(shared_rig: SharedRig) -> None:
    shift = [0.0]
    async with (
        shared_node(shared_rig, 0, clock=lambda: time.time() + shift[0]) as (node, storage),
        shared_node(shared_rig, 1) as (other, _),
        database(shared_rig) as pool,
    ):
        janitor = node.janitor
        assert janitor is not None
        queue = await create(node, "orph")
        await produce(queue, drafts(0, 5), SaveMode.IMMEDIATE)
        [committed] = await all_keys(storage)
        old = await orphan(storage, time.time() - 7200)  # two hours: past the default hour
        young = await orphan(storage, time.time() - 60)
        await storage.put("shared/notes.txt", b"not an object")  # a key of another shape
        await storage.put("elsewhere/x.cpo", b"not under shared/")

        # one janitor at a time: while another node holds the lock, a pass does nothing
        async with other._need().janitor_lock() as got:
            assert got
            assert tuple(await janitor.run_once(scan=True)) == (0, 0, False)
        assert old in await all_keys(storage)

        assert tuple(await janitor.run_once(scan=True)) == (0, 1, True)
        assert sorted(await all_keys(storage)) == sorted(
            [committed, young, "shared/notes.txt", "elsewhere/x.cpo"]
        )
        # The LIST is not repeated on every pass: every half orphan_after.
        assert (await janitor.run_once()).orphans == 0

        # An hour later the young one is an orphan too; the committed object has its row: kept.
        shift[0] = 3600.0
        assert (await janitor.run_once()).orphans == 1
        assert sorted(await all_keys(storage)) == sorted([committed, "shared/notes.txt", "elsewhere/x.cpo"])
        assert node.stats.garbage_objects == 2
        assert await pool.fetchval("select count(*) from capella_objects") == 1
        assert [m.payload for m in await read_all(queue)] == [f"m{n}".encode() for n in range(5)]
