"""The core queue on real files: ids, blocks, save modes, dedup, recovery and cursors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.clock import Clock
from support.codec import decode_block, encode_block_v1, encode_record_v1
from support.configs import file_config
from support.wait import holds, parked, sealed, until

from capella.config import Config, parse_config
from capella.core import subscription_store as consumers_module
from capella.core.cluster import Cluster
from capella.core.log import blocks as queue_module
from capella.core.log.codec import (
    JOURNAL_HEADER,
    JOURNAL_HEADER_V1,
    decode_journal,
)
from capella.core.message import Draft, LogMessage, SaveMode, drafts_batch
from capella.core.queue import Queue
from capella.errors import (
    InvalidMessage,
    InvalidName,
    InvalidRequest,
    MessageHeadersTooLarge,
    QueueNotFound,
    StorageTimeout,
    StorageUnavailable,
    SubscriptionNotFound,
)
from capella.records.record_batch import encode, read, scan


def ten_per_block(tmp_path: Path) -> Config:
    """This module's cluster: files under ``tmp_path``, ten messages a block."""
    return file_config(tmp_path, block={"max_messages": 10})


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return ten_per_block(tmp_path)


@contextlib.asynccontextmanager
async def opened(tmp_path: Path, clock: Clock, config: Config | None = None) -> AsyncIterator[Cluster]:
    """The data under ``tmp_path`` opened again (as ``ten_per_block`` unless ``config``), closed after."""
    cluster = await Cluster.open(config or ten_per_block(tmp_path), clock=clock)
    try:
        yield cluster
    finally:
        await cluster.close()


# ``cluster`` runs on ``clock``, which the tests move by hand.
pytestmark = pytest.mark.hand_clock


def drafts(n: int, prefix: str = "m", **fields: Any) -> list[Draft]:
    return [Draft(payload=f"{prefix}{i}".encode(), **fields) for i in range(n)]


async def messages_when_opened(tmp_path: Path, clock: Clock, name: str) -> list[LogMessage]:
    """The first 100 messages of queue ``name`` when the data is opened again."""
    async with opened(tmp_path, clock) as cluster:
        return (await cluster.queue(name).read_after(0, 100)).messages


def queue_dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / "data" / "queues" / name


async def after_a_kill(q: Queue, config: Config, clock: Clock) -> Cluster:
    """Simulate kill -9 of ``q``'s process (nothing more is flushed, its state is simply
    gone), then open its data again."""
    for task in q._tasks:
        task.cancel()
    return await Cluster.open(config, clock=clock)


async def reopen(cluster: Cluster, tmp_path: Path, clock: Clock) -> Cluster:
    await cluster.close()
    return await Cluster.open(ten_per_block(tmp_path), clock=clock)


async def test_ids_strictly_increase_and_answers_follow_request_order(cluster: Cluster) -> None:
    q, created = await cluster.put_queue("orders", {})
    assert created
    first = await q.append(drafts(3))
    second = await q.append(drafts(2))
    assert [a.id for a in first + second] == [1, 2, 3, 4, 5]
    assert not any(a.duplicate for a in first + second)
    page = await q.read_after(0, 100)
    assert [m.payload for m in page.messages] == [b"m0", b"m1", b"m2", b"m0", b"m1"]
    assert page.last_id == 5
    assert page.messages[0].source == "edge" and page.messages[0].external_id == 1


async def test_blocks_seal_at_the_count_limit_and_reads_cross_them(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("orders", {})
    await q.append(drafts(35), SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 3, what="three sealed blocks")
    stats = q.stats()
    assert stats["blocks"]["by_state"]["sealed"] == 3
    assert stats["blocks"]["by_state"]["open"] == 1
    assert stats["messages"] == 35
    page = await q.read_after(8, 5)
    assert [m.id for m in page.messages] == [9, 10, 11, 12, 13]
    page = await q.read_after(13, 100)
    assert [m.id for m in page.messages] == list(range(14, 36))


async def test_a_block_seals_at_its_age_on_the_periodic_tick(cluster: Cluster, clock: Clock) -> None:
    q, _ = await cluster.put_queue("aged", {"block": {"max_age": "10s"}})
    await q.append(drafts(2), SaveMode.WAIT)
    await q.tick()
    assert q.stats()["blocks"]["by_state"]["open"] == 1
    clock.now += 11
    await q.tick()
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 1, what="the aged block sealed")
    assert q.stats()["blocks"]["by_state"] == {
        "open": 0,
        "sealing": 0,
        "sealed": 1,
        "loaded": 1,
        "quarantined": 0,
    }


async def test_a_block_seals_at_its_byte_limit(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("big", {"block": {"max_bytes": "2KiB", "max_messages": 1000}})
    await q.append([Draft(payload=b"x" * 600) for _ in range(10)], SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] >= 2, what="two sealed blocks")


async def test_segment_filter_advances_last_id_over_skipped_messages(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("seg", {})
    await q.append([Draft(payload=b"a", segment=s) for s in (1, 5, 1, 7, 9)])
    page = await q.read_after(0, 10, segments=[(5, 7)])
    assert [m.id for m in page.messages] == [2, 4]
    assert page.last_id == 5
    page = await q.read_after(0, 1, segments=[(5, 7)])
    assert [m.id for m in page.messages] == [2] and page.last_id == 2


async def test_validation_rejects_the_whole_batch(cluster: Cluster, clock: Clock) -> None:
    q, _ = await cluster.put_queue("v", {"segments": {"min": 0, "max": 10}})
    batch = [*drafts(3), Draft(payload=b"late", external_time=clock.now + 3600)]
    with pytest.raises(InvalidMessage) as info:
        await q.append(batch)
    assert info.value.details["index"] == 3
    with pytest.raises(InvalidMessage) as info:
        await q.append([Draft(payload=b"a"), Draft(payload=b"b", segment=11)])
    assert info.value.details["index"] == 1
    assert q.last_id == 0 and (await q.read_after(0, 10)).messages == []


async def test_dedup_answers_the_original_id_for_repeats(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("d", {})
    first = await q.append([Draft(payload=b"a", source="s1", external_id=i) for i in (10, 20, 30)])
    again = await q.append(
        [Draft(payload=b"b", source="s1", external_id=20), Draft(payload=b"c", source="s2", external_id=20)]
    )
    assert (again[0].id, again[0].duplicate) == (first[1].id, True)
    assert again[1].duplicate is False
    # Out of order: 15 is below the highest seen id of s1, but new.
    late = await q.append([Draft(payload=b"d", source="s1", external_id=15)])
    assert late[0].duplicate is False
    # A repeat inside one batch is stored once.
    batch = await q.append([Draft(payload=b"e", source="s3", external_id=1)] * 3)
    assert [a.duplicate for a in batch] == [False, True, True]
    assert len({a.id for a in batch}) == 1
    assert q.counters.duplicates == 3


async def test_dedup_covers_sealed_blocks_and_restarts(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("d", {})
    sources = [f"src{i}" for i in range(5)]
    originals: dict[tuple[str, int], int] = {}
    for round_ in range(8):
        batch = [Draft(payload=b"x", source=s, external_id=round_ * 7 % 50) for s in sources]
        for d, a in zip(batch, await q.append(batch, SaveMode.WAIT), strict=True):
            originals.setdefault((d.source or "", d.external_id or 0), a.id)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] >= 3, what="three sealed blocks")

    cluster2 = await reopen(cluster, tmp_path, clock)
    try:
        q = cluster2.queue("d")
        keys = list(originals)
        answers = await q.append([Draft(payload=b"again", source=s, external_id=e) for s, e in keys])
        assert all(a.duplicate for a in answers)
        assert [a.id for a in answers] == [originals[k] for k in keys]
        new = await q.append([Draft(payload=b"new", source="src0", external_id=3)])
        assert new[0].duplicate is False
    finally:
        await cluster2.close()


async def test_dedup_of_an_old_key_loads_only_the_blocks_that_may_hold_it(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("d", {"block": {"max_messages": 100}})
    for start in range(0, 2000, 100):
        await q.append([Draft(payload=b"x", source="s", external_id=i) for i in range(start, start + 100)])
    await q.append([], SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 20, what="twenty sealed blocks")
    assert q.stats()["blocks"]["by_state"]["sealed"] == 20
    before = q._dedup.exact_lookups
    answers = await q.append([Draft(payload=b"x", source="s", external_id=i) for i in (5, 555, 1999)])
    assert all(a.duplicate for a in answers)
    # Each key is in exactly one block; ranges and Bloom filters rule out the other 19.
    assert q._dedup.exact_lookups - before <= 4
    # A key that was never stored and lies inside the range is also cheap.
    before = q._dedup.exact_lookups
    miss = await q.append([Draft(payload=b"x", source="other", external_id=-5)])
    assert miss[0].duplicate is False and q._dedup.exact_lookups == before


async def test_restart_keeps_every_message_and_never_reuses_an_id(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("r", {})
    answered = [a.id for a in await q.append(drafts(25), SaveMode.WAIT)]
    cluster = await reopen(cluster, tmp_path, clock)
    try:
        q = cluster.queue("r")
        page = await q.read_after(0, 100)
        assert [m.id for m in page.messages] == answered
        assert [m.payload for m in page.messages] == [f"m{i}".encode() for i in range(25)]
        # A clean shutdown records exactly how far ids went, so numbering continues without a gap.
        new = await q.append(drafts(1))
        assert new[0].id == 26
    finally:
        await cluster.close()


async def test_ids_leased_but_not_saved_are_skipped_after_a_crash(tmp_path: Path, clock: Clock) -> None:
    config = file_config(tmp_path)
    cluster = await Cluster.open(config, clock=clock)
    q, _ = await cluster.put_queue("crash", {})
    await q.append(drafts(3), SaveMode.WAIT)
    lost = await q.append(drafts(2), SaveMode.NONE)
    cluster2 = await after_a_kill(q, config, clock)
    try:
        q2 = cluster2.queue("crash")
        assert q2.last_id == 3
        new = await q2.append(drafts(1), SaveMode.WAIT)
        assert new[0].id > max(a.id for a in lost)
    finally:
        await cluster2.close()


async def test_a_sealed_block_with_a_gap_in_its_ids_reads_every_page_cached_and_loaded(
    tmp_path: Path, clock: Clock
) -> None:
    # A sealed block's batch keeps its ids as a range when they have no gap, as a list when a
    # crash left one: both must bisect and slice alike, as sealed (cached) and as loaded.
    config = file_config(tmp_path, block={"max_messages": 10})
    cluster = await Cluster.open(config, clock=clock)
    q, _ = await cluster.put_queue("gap", {})
    await q.append(drafts(3), SaveMode.WAIT)
    await q.append(drafts(2, "lost"), SaveMode.NONE)
    cluster = await after_a_kill(q, config, clock)
    try:
        q = cluster.queue("gap")
        later = await q.append(drafts(7, "later"), SaveMode.WAIT)
        await q.append(drafts(10, "next"), SaveMode.WAIT)  # a block with no gap after it
        await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2)
        ids = [1, 2, 3, *(a.id for a in later), *range(later[-1].id + 1, later[-1].id + 11)]
        assert later[0].id > 5 and ids == sorted(ids)
        loaded = q._store.loaded  # what sealing cached: no int per message for a block with no gap
        assert isinstance(loaded[1].ids, list) and isinstance(loaded[ids[10]].ids, range)
        for reopened in (False, True):
            if reopened:
                cluster = await reopen(cluster, tmp_path, clock)
                q = cluster.queue("gap")
            for after in [0, *ids]:
                for limit in (1, 2, 7, 30):
                    page = await q.read_after(after, limit)
                    assert [m.id for m in page.messages] == [i for i in ids if i > after][:limit], (
                        after,
                        limit,
                    )
    finally:
        await cluster.close()


async def test_a_torn_journal_tail_is_truncated_and_reported(tmp_path: Path, clock: Clock) -> None:
    config = file_config(tmp_path)
    cluster = await Cluster.open(config, clock=clock)
    q, _ = await cluster.put_queue("torn", {})
    await q.append(drafts(4), SaveMode.WAIT)
    await cluster.close()
    [journal] = (queue_dir(tmp_path, "torn") / "journal").iterdir()
    with journal.open("ab") as f:
        f.write(b"\x40\x00\x00\x00garbage-half-record")
    async with opened(tmp_path, clock, config) as cluster:
        q = cluster.queue("torn")
        assert [m.payload for m in (await q.read_after(0, 10)).messages] == [b"m0", b"m1", b"m2", b"m3"]
        assert q.stats()["recovery"]["truncated_bytes"] == 4 + len(b"garbage-half-record")
        await q.append(drafts(1, "after"), SaveMode.WAIT)
    async with opened(tmp_path, clock, config) as cluster:
        page = await cluster.queue("torn").read_after(0, 10)
        assert [m.payload for m in page.messages][-1] == b"after0"
        assert cluster.queue("torn").stats()["recovery"]["truncated_bytes"] == 0


async def test_a_queue_written_in_format_1_reads_on_and_seals_its_open_block_as_format_2(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("old", {})
    await q.append(drafts(15, headers={"k": "v"}), SaveMode.WAIT)
    await q.append(drafts(10, source="dc-eu", external_id=None), SaveMode.WAIT)
    await sealed(q, 2)
    before = (await q.read_after(0, 100)).messages
    await cluster.close()
    # What an earlier version left: its first sealed block and its open journal in format 1.
    folder = queue_dir(tmp_path, "old")
    first_block = sorted((folder / "blocks").iterdir())[0]
    first_block.write_bytes(encode_block_v1(decode_block(first_block.read_bytes())))
    [journal] = (folder / "journal").iterdir()
    open_messages = decode_journal(journal.read_bytes()).messages
    journal.write_bytes(JOURNAL_HEADER_V1 + b"".join(map(encode_record_v1, open_messages)))

    async with opened(tmp_path, clock) as cluster:
        q = cluster.queue("old")
        assert (await q.read_after(0, 100)).messages == before
        # The format 1 journal took no new bytes: its block was sealed, as format 2.
        await until(lambda: not journal.exists(), what="the format 1 journal sealed away")
        assert not journal.exists()
        magics = [p.read_bytes()[:4] for p in sorted((folder / "blocks").iterdir())]
        assert magics == [b"CPB1", b"CPB2", b"CPB2"]
        await q.append(drafts(3, "new"), SaveMode.WAIT)
        [new_journal] = (folder / "journal").iterdir()
        assert new_journal.read_bytes()[:4] == b"CPJ2"
        after = (await q.read_after(0, 100)).messages
        assert after[:25] == before
        assert [m.payload for m in after[25:]] == [b"new0", b"new1", b"new2"]
    assert await messages_when_opened(tmp_path, clock, "old") == after


async def test_a_journal_batch_that_straddles_the_sealed_blocks_is_cut_when_its_block_is_sealed(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("cut", {})
    await q.append(drafts(10), SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 1, what="the first block sealed")
    await cluster.close()
    # A journal whose first batch holds ids 8-12, of which 8-10 are sealed already.
    batch = encode([b"j%d" % i for i in range(8, 13)], base_id=8, base_time=clock.now, source="edge")
    (queue_dir(tmp_path, "cut") / "journal").mkdir(exist_ok=True)
    (queue_dir(tmp_path, "cut") / "journal" / f"{8:020d}.log").write_bytes(JOURNAL_HEADER + batch)
    async with opened(tmp_path, clock) as cluster:
        q = cluster.queue("cut")
        await q.append(drafts(8, "new"), SaveMode.WAIT)
        await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2, what="two sealed blocks")
        by_state = q.stats()["blocks"]["by_state"]
        assert (by_state["sealed"], by_state["open"]) == (2, 0)
        page = (await q.read_after(0, 100)).messages
        assert [m.payload for m in page] == [*(b"m%d" % i for i in range(10)), b"j11", b"j12"] + [
            b"new%d" % i for i in range(8)
        ]
        assert [m.id for m in page[10:12]] == [11, 12]
    assert await messages_when_opened(tmp_path, clock, "cut") == page


async def test_a_corrupt_sealed_block_is_quarantined_and_never_served(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("bad", {})
    await q.append(drafts(25), SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2, what="both full blocks sealed")
    cluster = await reopen(cluster, tmp_path, clock)
    try:
        blocks = sorted((queue_dir(tmp_path, "bad") / "blocks").iterdir())
        assert len(blocks) == 2
        data = bytearray(blocks[0].read_bytes())
        data[len(data) // 2] ^= 0x01
        blocks[0].write_bytes(bytes(data))
        q = cluster.queue("bad")
        page = await q.read_after(0, 100)
        assert [m.id for m in page.messages] == list(range(11, 26))
        stats = q.stats()
        assert stats["blocks"]["by_state"]["quarantined"] == 1
        assert stats["recovery"]["gaps"] == [{"from_id": 1, "to_id": 10}]
        assert blocks[0].exists(), "the bad bytes stay for an operator"
    finally:
        await cluster.close()
    async with opened(tmp_path, clock) as cluster:
        assert cluster.queue("bad").stats()["blocks"]["by_state"]["quarantined"] == 1


async def test_a_journal_left_after_its_block_was_sealed_is_removed(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("left", {})
    await q.append(drafts(10), SaveMode.WAIT)
    journal = next((queue_dir(tmp_path, "left") / "journal").iterdir())
    saved = journal.read_bytes()
    await until(lambda: not journal.exists(), what="the sealed block's journal removed")
    # A crash between the manifest update and the journal delete leaves this behind.
    journal.write_bytes(saved)
    cluster = await reopen(cluster, tmp_path, clock)
    try:
        page = await cluster.queue("left").read_after(0, 100)
        assert [m.id for m in page.messages] == list(range(1, 11))
        assert not journal.exists()
    finally:
        await cluster.close()


async def test_save_modes_decide_when_the_journal_holds_the_write(tmp_path: Path, cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("modes", {})
    journal_dir = queue_dir(tmp_path, "modes") / "journal"

    def journal_size() -> int:
        return sum(p.stat().st_size for p in journal_dir.iterdir()) if journal_dir.exists() else 0

    await q.append(drafts(1), SaveMode.NONE)
    await q.append(drafts(1), SaveMode.MARK)
    await holds(lambda: journal_size() == 0, 0.01, "no write before the tick")  # only the tick saves these
    assert journal_size() == 0
    await q.tick()  # the periodic flush saves marked writes (and the unmarked ones before them)
    after_tick = journal_size()
    assert after_tick > 0
    await q.append(drafts(1), SaveMode.IMMEDIATE)
    after_immediate = journal_size()
    assert after_immediate > after_tick
    await q.append(drafts(1), SaveMode.WAIT)
    assert journal_size() > after_immediate


async def test_concurrent_wait_writers_share_fsyncs(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("group", {"block": {"max_messages": 100_000}})
    await asyncio.gather(*(q.append(drafts(1), SaveMode.WAIT) for _ in range(200)))
    assert q.last_id == 200
    assert q.counters.flushes < 100


async def test_subscription_commits_never_move_backwards(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("s", {})
    await q.append(drafts(20))
    sub, created = await q.commit("billing", 10)
    assert created and sub.last_id == 10
    sub, created = await q.commit("billing", 5)
    assert not created and sub.last_id == 10
    sub, _ = await q.commit("billing", 3, reset=True)
    assert sub.last_id == 3
    await q.commit("dc2", 15, replica=True)
    await q.commit("dc3", 8, replica=True)
    assert q.replicas(8) == ["dc2", "dc3"]
    assert q.replicas(9) == ["dc2"]
    assert q.replicas(16) == []
    with pytest.raises(InvalidName):
        await q.commit("bad/name", 1)
    with pytest.raises(InvalidRequest):
        await q.commit("neg", -1)
    await q.delete_subscription("dc3")
    with pytest.raises(SubscriptionNotFound):
        q.subscription("dc3")

    cluster = await reopen(cluster, tmp_path, clock)
    try:
        q = cluster.queue("s")
        assert [(s.name, s.last_id, s.replica) for s in q.subscriptions()] == [
            ("billing", 3, False),
            ("dc2", 15, True),
        ]
    finally:
        await cluster.close()


async def test_a_cursor_commit_appends_a_record_and_a_long_log_becomes_a_snapshot(
    tmp_path: Path, clock: Clock, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumers_module, "CHECKPOINT_RECORDS", 50)
    q, _ = await cluster.put_queue("c", {})
    log_dir = queue_dir(tmp_path, "c") / "subscriptions" / "log"
    await q.commit("a", 1, save=SaveMode.IMMEDIATE)
    first_log = log_dir / f"{0:020d}.log"
    size = first_log.stat().st_size
    await q.commit("a", 2, save=SaveMode.IMMEDIATE)
    # One small record per commit, not a rewrite of every cursor.
    assert first_log.stat().st_size - size == size
    await asyncio.gather(*(q.commit(name, i, save=SaveMode.IMMEDIATE) for i in range(3, 60) for name in "ab"))
    await q.delete_subscription("b", save=SaveMode.IMMEDIATE)
    await q.commit("z", 7, save=SaveMode.NONE)
    await q.tick()
    # Past CHECKPOINT_RECORDS the periodic pass wrote a snapshot and started a new log.
    assert (queue_dir(tmp_path, "c") / "subscriptions" / "snapshot").exists()
    assert not first_log.exists()
    await q.commit("a", 70, save=SaveMode.IMMEDIATE)
    assert [p.name for p in log_dir.iterdir()] == [f"{1:020d}.log"]

    cluster = await reopen(cluster, tmp_path, clock)
    try:
        q = cluster.queue("c")
        assert [(s.name, s.last_id) for s in q.subscriptions()] == [("a", 70), ("z", 7)]
    finally:
        await cluster.close()


async def test_cursors_saved_by_a_version_without_the_log_become_its_first_snapshot(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    await cluster.put_queue("old", {})
    cluster = await reopen(cluster, tmp_path, clock)
    await cluster.close()
    # What versions before the change log kept: one document of every cursor.
    document = queue_dir(tmp_path, "old") / "subscriptions.json"
    subscription = {"last_id": 12, "replica": True, "created": 1.0, "updated": 2.0}
    document.write_bytes(orjson.dumps({"version": 1, "subscriptions": {"dc2": subscription}}))
    async with opened(tmp_path, clock) as cluster:
        q = cluster.queue("old")
        assert [(s.name, s.last_id, s.replica) for s in q.subscriptions()] == [("dc2", 12, True)]
        assert not document.exists()
        assert (queue_dir(tmp_path, "old") / "subscriptions" / "snapshot").exists()
        await q.commit("dc2", 13, save=SaveMode.IMMEDIATE)
        cluster = await reopen(cluster, tmp_path, clock)
        assert [(s.name, s.last_id) for s in cluster.queue("old").subscriptions()] == [("dc2", 13)]
        # A crash after the first snapshot and before the delete: the old document is a leftover.
        await cluster.close()
        document.write_bytes(orjson.dumps({"version": 1, "subscriptions": {"dc2": subscription}}))
        cluster = await Cluster.open(ten_per_block(tmp_path), clock=clock)
        assert [(s.name, s.last_id) for s in cluster.queue("old").subscriptions()] == [("dc2", 13)]
        assert not document.exists()


async def test_definitions_persist_update_and_drop(tmp_path: Path, clock: Clock, cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("a", {"block": {"max_messages": 5}, "save": "mark"})
    _, created = await cluster.put_queue("a", {"block": {"max_age": "2m"}})
    assert not created
    assert q.definition_dict()["block"] == {"max_messages": 5, "max_bytes": 8 * 1024 * 1024, "max_age": 120.0}
    await cluster.put_queue("b", {})
    await q.append(drafts(3), SaveMode.WAIT)
    await cluster.drop_queue("b")
    with pytest.raises(QueueNotFound):
        cluster.queue("b")
    assert not queue_dir(tmp_path, "b").exists() or not any(queue_dir(tmp_path, "b").rglob("*.*"))
    cluster = await reopen(cluster, tmp_path, clock)
    try:
        assert [x.name for x in cluster.queues()] == ["a"]
        assert cluster.queue("a").definition_dict()["save"] == "mark"
        assert cluster.queue("a").last_id == 3
    finally:
        await cluster.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"block": {"max_messages": 0}}, "max_messages"),
        ({"block": {"max_age": "soon"}}, "max_age"),
        ({"block": {"max_bytes": "1b"}}, "max_bytes"),
        ({"save": "sometimes"}, "save mode"),
        ({"segments": {"min": 5, "max": 1}}, "segments"),
        ({"mounts": {"marks": {"0": "nowhere"}}}, "nowhere"),
        ({"colour": "blue"}, "colour"),
    ],
)
async def test_bad_definitions_name_the_field(cluster: Cluster, body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        await cluster.put_queue("q", body)
    assert field in info.value.message
    with pytest.raises(QueueNotFound):
        cluster.queue("q")


async def test_bad_queue_names_are_refused(cluster: Cluster) -> None:
    for name in ("", ".hidden", "a/b", "x" * 129, "-dash"):
        with pytest.raises(InvalidName):
            await cluster.put_queue(name, {})


async def test_an_unfinished_drop_completes_on_start(tmp_path: Path, clock: Clock) -> None:
    config = file_config(tmp_path)
    cluster = await Cluster.open(config, clock=clock)
    q, _ = await cluster.put_queue("gone", {})
    await q.append(drafts(3), SaveMode.WAIT)
    await cluster.close()
    registry = tmp_path / "data" / "queues" / ".capella" / "queues.json"
    registry.write_text(registry.read_text().replace('"active"', '"dropping"'))
    os.sync()
    async with opened(tmp_path, clock, config) as cluster:
        assert cluster.queues() == []
        _, created = await cluster.put_queue("gone", {})
        assert created and cluster.queue("gone").last_id == 0


async def test_long_poll_returns_when_a_message_arrives(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("poll", {})
    waiter = asyncio.create_task(q.wait_for(0, 5.0))
    await parked("Queue.wait_for")  # nothing may wake it yet
    assert not waiter.done()
    await q.append(drafts(1))
    await asyncio.wait_for(waiter, 1.0)
    started = asyncio.get_running_loop().time()
    await q.wait_for(1, 0.05)
    assert asyncio.get_running_loop().time() - started >= 0.04


async def test_readers_racing_seals_see_every_id_once_in_order(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("race", {"block": {"max_messages": 7}})
    total = 600
    done = asyncio.Event()

    async def produce() -> None:
        for i in range(0, total, 3):
            await q.append(drafts(3, f"b{i}-"), SaveMode.WAIT if i % 2 else SaveMode.NONE)
        done.set()

    async def read() -> list[int]:
        seen: list[int] = []
        after = 0
        while not (done.is_set() and after >= total):
            page = await q.read_after(after, 5)
            seen.extend(m.id for m in page.messages)
            after = page.last_id
            if not page.messages:
                await q.wait_for(after, 0.05)
        return seen

    results = await asyncio.gather(produce(), *(read() for _ in range(3)))
    for seen in results[1:]:
        assert seen == list(range(1, total + 1))
    # Seals really happened while the readers ran (the sealer trails the writers).
    assert q.stats()["blocks"]["by_state"]["sealed"] >= 10


async def test_a_failed_fsync_answers_503_and_the_write_is_retried(
    tmp_path: Path, clock: Clock, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, _ = await cluster.put_queue("enospc", {})
    await q.append(drafts(2, "ok"), SaveMode.WAIT)
    real = os.fdatasync

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full_disk)
    with pytest.raises(StorageUnavailable):
        await q.append(drafts(1, "unsure"), SaveMode.WAIT)
    assert q.stats()["last_error"]
    monkeypatch.setattr(os, "fdatasync", real)
    # The next flush reopens the journal at its last durable length and writes both.
    await q.append(drafts(1, "later"), SaveMode.WAIT)
    cluster = await reopen(cluster, tmp_path, clock)
    try:
        page = await cluster.queue("enospc").read_after(0, 10)
        assert [m.payload for m in page.messages] == [b"ok0", b"ok1", b"unsure0", b"later0"]
    finally:
        await cluster.close()


async def test_a_lone_writers_commit_starts_no_task(cluster: Cluster) -> None:
    """With nothing in flight, a ``wait`` write makes its own flush: no flusher task, no flush
    task, just the journal call and a callback (three turns of the loop instead of seven)."""
    q, _ = await cluster.put_queue("lone", {})
    await q.append(drafts(1), SaveMode.WAIT)  # the journal is open from here on
    loop = asyncio.get_running_loop()
    made: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(asyncio.Task(coro, loop=loop, **kwargs))
        return made[-1]

    loop.set_task_factory(factory)
    try:
        for _ in range(3):
            await q.append(drafts(1), SaveMode.WAIT)
    finally:
        loop.set_task_factory(None)
    names = [task.get_name() for task in made]  # named after the factory made them
    assert not [name for name in names if name.startswith("flush:")], names
    assert q.counters.flushes >= 4


async def after_a_restart(
    cluster: Cluster, tmp_path: Path, clock: Clock, name: str, *, truncated: int | None = None
) -> list[bytes]:
    """The payloads queue ``name`` holds once the cluster is closed and opened again (with
    ``truncated``: what recovery must have cut off its journals)."""
    cluster = await reopen(cluster, tmp_path, clock)
    try:
        if truncated is not None:
            assert cluster.queue(name).stats()["recovery"]["truncated_bytes"] == truncated
        return [m.payload for m in (await cluster.queue(name).read_after(0, 1000)).messages]
    finally:
        await cluster.close()


def held_until(released: threading.Event, entered: threading.Event | None = None) -> Any:
    """An ``os.fdatasync`` that syncs only once ``released`` is set (at most 10 s later); it sets
    ``entered`` when a sync is held."""
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if entered is not None:
            entered.set()
        released.wait(10)
        real(fd)

    return fdatasync


async def test_a_writer_that_stops_waiting_leaves_the_flush_and_the_journal_whole(
    tmp_path: Path, clock: Clock, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, _ = await cluster.put_queue("gone", {})
    await q.append(drafts(1, "a"), SaveMode.WAIT)
    released, held = threading.Event(), threading.Event()
    monkeypatch.setattr(os, "fdatasync", held_until(released, held))
    waiting = asyncio.create_task(q.append(drafts(1, "b"), SaveMode.WAIT))
    await until(lambda: q.last_id == 2, what="the second write assigned")
    await until(held.is_set, what="its flush in the journal's thread, held there")
    waiting.cancel()  # the client went away while its flush was in flight
    with pytest.raises(asyncio.CancelledError):
        await waiting
    released.set()
    monkeypatch.undo()
    await q.append(drafts(1, "c"), SaveMode.WAIT)
    assert not q.stats()["faults"]
    assert await after_a_restart(cluster, tmp_path, clock, "gone") == [b"a0", b"b0", b"c0"]


async def test_a_hung_fsync_answers_a_timeout_and_the_write_lands_once_it_returns(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = {
        "cluster": {"name": "edge", "data_dir": str(tmp_path / "data")},
        "storage": {"flush_interval": "1h", "write_timeout": "0.2s"},
    }
    cluster = await Cluster.open(parse_config(raw, {}, base=tmp_path), clock=clock)
    try:
        q, _ = await cluster.put_queue("hung", {})
        await q.append(drafts(1, "ok"), SaveMode.WAIT)
        released = threading.Event()
        monkeypatch.setattr(os, "fdatasync", held_until(released))
        started = asyncio.get_running_loop().time()
        with pytest.raises(StorageTimeout, match="may still be saved"):
            await q.append(drafts(1, "slow"), SaveMode.WAIT)
        assert asyncio.get_running_loop().time() - started < 2.0
        released.set()
        await q.append(drafts(1, "after"), SaveMode.WAIT)
    finally:
        await cluster.close()
    assert await after_a_restart(cluster, tmp_path, clock, "hung") == [b"ok0", b"slow0", b"after0"]


def failing_for(journal_of: int, released: threading.Event | None = None) -> Any:
    """An ``os.fdatasync`` that fails with EIO for the journal of the block from id
    ``journal_of`` (after ``released`` is set, when given) and syncs every other file."""
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"{journal_of:020d}.log"):
            if released is not None:
                released.wait(10)
            raise OSError(5, "Input/output error")
        real(fd)

    return fdatasync


async def b0_c0_d0_after_a_restart(cluster: Cluster, tmp_path: Path, clock: Clock) -> None:
    """Once the disk is well again: queue "two" takes a write (d0) after retrying its failed
    journal, and a restart finds b0, c0 and d0 at its end, with no journal tail cut off."""
    q = cluster.queue("two")

    async def written() -> bool:
        try:
            await q.append(drafts(1, "d"), SaveMode.WAIT)
        except StorageUnavailable:
            return False
        return True

    await until(written, 10, "the queue taking a write again", every=0.05)
    assert (await after_a_restart(cluster, tmp_path, clock, "two", truncated=0))[-3:] == [b"b0", b"c0", b"d0"]


async def test_a_commit_that_fails_on_one_journal_keeps_every_answered_write(
    tmp_path: Path, clock: Clock, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One group commit across a block boundary: the full block's journal fails, the new
    one's sync works. Both batches go back and are written again; the new journal is cut back
    first, or it would hold its batch twice and recovery would end it there, with every
    answered write after it."""
    q, _ = await cluster.put_queue("two", {})
    await q.append(drafts(9, "a"), SaveMode.WAIT)
    monkeypatch.setattr(os, "fdatasync", failing_for(journal_of=1))
    await q.append(drafts(1, "b"), SaveMode.MARK)  # id 10 fills block 1
    with pytest.raises(StorageUnavailable):
        await q.append(drafts(1, "c"), SaveMode.WAIT)  # id 11, block 2: one flush, two journals
    monkeypatch.undo()
    await b0_c0_d0_after_a_restart(cluster, tmp_path, clock)


async def test_a_commit_failed_by_the_one_before_it_keeps_every_answered_write(
    tmp_path: Path, clock: Clock, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two group commits in flight on two journals: the second one's sync works, but the first
    fails, so the second fails too (answers go in order) and its batch is written again."""
    q, _ = await cluster.put_queue("two", {})
    await q.append(drafts(9, "a"), SaveMode.WAIT)
    released = threading.Event()
    monkeypatch.setattr(os, "fdatasync", failing_for(journal_of=1, released=released))
    first = asyncio.create_task(q.append(drafts(1, "b"), SaveMode.WAIT))  # id 10 fills block 1
    await until(lambda: q.last_id == 10, what="the first write assigned")
    second = asyncio.create_task(q.append(drafts(1, "c"), SaveMode.WAIT))  # id 11, block 2
    journal_2 = queue_dir(tmp_path, "two") / "journal" / f"{11:020d}.log"
    header = len(JOURNAL_HEADER)
    await until(
        lambda: journal_2.exists() and journal_2.stat().st_size > header, what="c0 in block 2's journal"
    )
    released.set()
    for task in (first, second):
        with pytest.raises(StorageUnavailable):
            await task
    monkeypatch.undo()
    await b0_c0_d0_after_a_restart(cluster, tmp_path, clock)


async def test_own_keys_are_found_by_id_range_after_seal_and_restart(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    # A message produced here without an external id has the identity (cluster, id); a copy
    # that comes back (A -> B -> A) carries exactly that identity and must be recognised.
    q, _ = await cluster.put_queue("own", {})
    produced = await q.append(drafts(25), SaveMode.WAIT)
    await q.append([Draft(payload=b"foreign", source="edge", external_id=10_000)], SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2, what="two sealed blocks")
    cluster = await reopen(cluster, tmp_path, clock)
    try:
        q = cluster.queue("own")
        echoes = await q.append([Draft(payload=b"echo", source="edge", external_id=a.id) for a in produced])
        assert [(a.id, a.duplicate) for a in echoes] == [(a.id, True) for a in produced]
        again = await q.append([Draft(payload=b"foreign", source="edge", external_id=10_000)])
        assert again[0].duplicate
        # An id that was never assigned here is new, even below the highest id.
        fresh = await q.append([Draft(payload=b"x", source="edge", external_id=-3)])
        assert not fresh[0].duplicate
    finally:
        await cluster.close()


async def test_identities_of_blocks_sealed_in_this_run_are_read_from_their_bytes(cluster: Cluster) -> None:
    # Sealing keeps no key set: the first lookup in a block sealed now reads it from its bytes.
    q, _ = await cluster.put_queue("sealed", {})
    produced = await q.append(drafts(12), SaveMode.WAIT)
    named = await q.append([Draft(payload=b"n", source="dc-2", external_id=77)], SaveMode.WAIT)
    produced += await q.append(drafts(12), SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2, what="two sealed blocks")
    echoes = await q.append([Draft(payload=b"echo", source="edge", external_id=a.id) for a in produced])
    assert [(a.id, a.duplicate) for a in echoes] == [(a.id, True) for a in produced]
    [again] = await q.append([Draft(payload=b"n", source="dc-2", external_id=77)])
    assert (again.id, again.duplicate) == (named[0].id, True)
    [nobody] = await q.append([Draft(payload=b"echo", source="edge", external_id=named[0].id)])
    assert not nobody.duplicate  # that id's identity is (dc-2, 77)


async def test_own_identities_in_the_open_block_are_found_by_id_and_a_gap_is_new(
    tmp_path: Path, clock: Clock
) -> None:
    # The open block keeps no identity for a message produced here without an external id:
    # (cluster, id) is found from the block's ids, also for a message of the same call, and an
    # id skipped after a crash (the lease) was never a message.
    config = file_config(tmp_path, block={"max_messages": 10})
    cluster = await Cluster.open(config, clock=clock)
    q, _ = await cluster.put_queue("own", {})
    plain = await q.append_batch(read(produced([b"a", b"b", b"c"])), SaveMode.WAIT)
    mixed = await q.append([Draft(payload=b"d"), Draft(payload=b"echo", source="edge", external_id=4)])
    assert [(a.id, a.duplicate) for a in plain + mixed] == [
        (1, False),
        (2, False),
        (3, False),
        (4, False),
        (4, True),
    ]
    named = await q.append([Draft(payload=b"n", source="edge", external_id=900)], SaveMode.WAIT)
    assert named[0].id == 5
    # LogMessage 5 has the identity (edge, 900): (edge, 5) is nobody's.
    echoes = await q.append(
        [Draft(payload=b"echo", source="edge", external_id=i) for i in (1, 3, 4, 5)], SaveMode.WAIT
    )
    assert [(a.id, a.duplicate) for a in echoes] == [(1, True), (3, True), (4, True), (6, False)]
    cluster = await after_a_kill(q, config, clock)  # the lease was saved ahead of the ids
    try:
        q = cluster.queue("own")
        [after_gap] = await q.append([Draft(payload=b"later")], SaveMode.WAIT)
        assert after_gap.id > 7 and q.stats()["blocks"]["by_state"]["open"] == 1
        gap, old, new = after_gap.id - 1, 2, after_gap.id
        answers = await q.append(
            [Draft(payload=b"echo", source="edge", external_id=i) for i in (gap, old, new)]
        )
        assert [(a.duplicate, a.id if a.duplicate else None) for a in answers] == [
            (False, None),
            (True, old),
            (True, new),
        ]
        again = await q.append([Draft(payload=b"n", source="edge", external_id=900)])
        assert again[0].duplicate and again[0].id == 5
    finally:
        await cluster.close()


@pytest.mark.parametrize("binary", [False, True])
async def test_reads_of_the_open_block_start_and_end_inside_its_batches(
    cluster: Cluster, binary: bool
) -> None:
    # The open block is read from its record batches: a page may start and end in any of them.
    q, _ = await cluster.put_queue("open", {})
    sizes = [3, 1, 4, 1]
    payloads = [f"m{i}".encode() for i in range(sum(sizes))]
    start = 0
    for size in sizes:
        chunk = payloads[start : start + size]
        if binary:
            await q.append_batch(read(produced(chunk)))
        else:
            await q.append([Draft(payload=p) for p in chunk])
        start += size
    by_state = q.stats()["blocks"]["by_state"]
    assert (by_state["open"], by_state["sealing"], by_state["sealed"]) == (1, 0, 0)
    for after in range(len(payloads) + 1):
        for limit in range(1, len(payloads) + 2):
            page = await q.read_after(after, limit)
            assert [m.payload for m in page.messages] == payloads[after : after + limit], (after, limit)
            assert [m.id for m in page.messages] == list(
                range(after + 1, min(after + limit, len(payloads)) + 1)
            )
    even = await q.read_after(0, 100, segments=[(0, 0)])
    assert [m.payload for m in even.messages] == payloads


async def test_writers_wait_for_a_stuck_sealer_and_resume_when_it_recovers(
    tmp_path: Path, clock: Clock
) -> None:
    blocked = tmp_path / "cold"
    blocked.write_text("a file where the mount's directory should be")
    config = parse_config(
        {
            "cluster": {"name": "edge", "data_dir": str(tmp_path / "data")},
            "mounts": {"default": {"provider": "file"}, "cold": {"provider": "file", "path": str(blocked)}},
        },
        {},
        base=tmp_path,
    )
    async with opened(tmp_path, clock, config) as cluster:
        q, _ = await cluster.put_queue(
            "stuck", {"block": {"max_messages": 2}, "mounts": {"marks": {"0": "cold"}}}
        )
        await q.append(drafts(4), SaveMode.WAIT)  # two full blocks the sealer cannot write
        with pytest.raises(StorageUnavailable, match="not being sealed"):
            await q.append(drafts(1), SaveMode.WAIT)
        assert "cannot write" in (q.stats()["last_error"] or "")
        blocked.unlink()
        blocked.mkdir()
        answers = await asyncio.wait_for(q.append(drafts(1, "after"), SaveMode.WAIT), 10)
        assert answers[0].id == 5
        page = await q.read_after(0, 10)
        assert [m.id for m in page.messages] == [1, 2, 3, 4, 5]


async def test_memory_per_sealed_block_stays_bounded(cluster: Cluster) -> None:
    # Found by the tiers-memory benchmark: exact key sets of sealed blocks were kept forever.
    q, _ = await cluster.put_queue("bounded", {"block": {"max_messages": 10}})
    for _ in range(30):
        await q.append(drafts(10), SaveMode.NONE)
    await q.append([], SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 30, what="thirty sealed blocks")
    assert q.stats()["blocks"]["by_state"]["sealed"] == 30
    assert len(q._key_sets) <= queue_module.KEY_SETS
    assert len(q._loaded) <= queue_module.LOADED_BLOCKS


# --- appending a record batch as it came ---------------------------------------------------


def produced(payloads: list[bytes], **columns: object) -> bytes:
    """A batch as a producer sends it: no ids, no time, no source."""
    return encode(payloads, **columns)  # type: ignore[arg-type]


async def test_a_batch_is_stored_as_append_would_store_its_drafts(cluster: Cluster, clock: Clock) -> None:
    q, _ = await cluster.put_queue("orders", {})
    drafts = [
        Draft(payload=b"a"),
        Draft(payload=b"b", source="dc-eu", external_id=7, external_time=clock.now - 5, segment=3),
        Draft(payload=b"c", headers={"trace": "x"}),
    ]
    answers = await q.append_batch(
        read(drafts_batch(drafts)),
        SaveMode.WAIT,
    )
    assert [(a.id, a.duplicate) for a in answers] == [(1, False), (2, False), (3, False)]
    await q.append(drafts, SaveMode.WAIT)
    page = (await q.read_after(0, 100)).messages
    # The batch's answer to each draft is the drafts' own; only the ids differ (and the
    # second, a repeat of identity ("dc-eu", 7), is a duplicate of the first's).
    assert len(page) == 5
    fields = [(m.time, m.source, m.external_time, m.segment, m.payload, m.headers) for m in page]
    assert fields[3:] == [fields[0], fields[2]]
    assert [m.external_id for m in page[:3]] == [1, 7, 3]
    assert page[0].source == "edge" and page[0].time == clock.now
    assert page[1].key == ("dc-eu", 7)


async def test_the_journal_holds_the_producers_body_byte_for_byte(tmp_path: Path, cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("raw", {})
    body = produced([b"x" * 40, b"y" * 7], segments=[0, 2])
    await q.append_batch(read(body), SaveMode.WAIT)
    [journal] = (tmp_path / "data" / "queues" / "raw" / "journal").iterdir()
    [stored] = scan(journal.read_bytes(), 16).batches
    assert (stored.base_id, stored.count, stored.source) == (1, 2, "edge")
    produced_batch = read(body)
    assert stored.raw()[stored.body - stored.start :] == body[produced_batch.body :]


async def test_duplicates_are_cut_out_of_the_batch_and_answered_with_their_ids(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("dedup", {})
    await q.append([Draft(payload=b"old", source="s", external_id=5)], SaveMode.WAIT)
    answers = await q.append_batch(
        read(
            produced(
                [b"dup-of-stored", b"new", b"dup-in-batch", b"plain"],
                sources=["s", "s", "s", None],
                external_ids=[5, 6, 6, None],
            )
        ),
        SaveMode.WAIT,
    )
    assert [(a.id, a.duplicate) for a in answers] == [(1, True), (2, False), (2, True), (3, False)]
    page = (await q.read_after(0, 100)).messages
    assert [(m.id, m.payload, m.external_id) for m in page] == [
        (1, b"old", 5),
        (2, b"new", 6),
        (3, b"plain", 3),
    ]
    again = await q.append_batch(read(produced([b"x", b"y"], sources=["s", "s"], external_ids=[5, 6])))
    assert [(a.id, a.duplicate) for a in again] == [(1, True), (2, True)]
    assert q.stats()["messages"] == 3


@pytest.mark.parametrize(
    ("columns", "error", "field"),
    [
        ({"external_times": [None, 4e9]}, InvalidMessage, "external_time"),
        ({"segments": [0, 99]}, InvalidMessage, "segment"),
        ({"headers": [{}, {f"h{i}": "v" for i in range(65)}]}, MessageHeadersTooLarge, "headers"),
        ({"headers": [{}, {"big": "v" * 16_384}]}, MessageHeadersTooLarge, "headers"),
    ],
)
async def test_a_batch_breaking_a_rule_is_refused_whole(
    cluster: Cluster, columns: dict[str, object], error: type[Exception], field: str
) -> None:
    q, _ = await cluster.put_queue("rules", {"segments": {"min": 0, "max": 10}})
    with pytest.raises(error) as caught:
        await q.append_batch(read(produced([b"a", b"b"], **columns)), SaveMode.WAIT)
    assert caught.value.details["index"] == 1  # type: ignore[attr-defined]
    assert caught.value.details["field"] == field  # type: ignore[attr-defined]
    assert q.stats()["messages"] == 0


async def test_a_batch_of_payloads_alone_is_refused_where_segment_0_is_out_of_range(cluster: Cluster) -> None:
    # A batch without optional columns is appended without a decode; its messages are all in
    # segment 0, which a queue's range may leave out.
    q, _ = await cluster.put_queue("ranged", {"segments": {"min": 1, "max": 10}})
    with pytest.raises(InvalidMessage, match="segment 0 is outside") as caught:
        await q.append_batch(read(produced([b"a", b"b"])), SaveMode.WAIT)
    assert (caught.value.details["index"], caught.value.details["field"]) == (0, "segment")  # type: ignore[attr-defined]
    assert q.stats()["messages"] == 0


async def test_a_body_that_does_not_parse_is_an_invalid_message(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("bad", {})
    batch = read(produced([b"abc"]))
    lying = read(produced([b"abc", b"de"]))
    # Two payload lengths for one message: the checksums hold, the body does not parse.
    bad = batch.__class__(lying.data, lying.start, lying.end, lying.body, 0, 1, 0, 0.0, "")
    with pytest.raises(InvalidMessage, match="record batch"):
        await q.append_batch(bad)
    assert q.stats()["messages"] == 0


async def test_a_batch_larger_than_the_blocks_room_fills_one_and_opens_the_next(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("split", {})
    await q.append([Draft(payload=b"first")], SaveMode.WAIT)
    payloads = [b"p%d" % i for i in range(25)]
    answers = await q.append_batch(read(produced(payloads, external_ids=[None] * 24 + [99])), SaveMode.WAIT)
    assert [a.id for a in answers] == list(range(2, 27))
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2, what="two sealed blocks")
    assert q.stats()["blocks"]["by_state"]["sealed"] == 2
    before = (await q.read_after(0, 100)).messages
    assert [m.payload for m in before] == [b"first", *payloads]
    assert before[-1].external_id == 99
    await cluster.close()
    async with opened(tmp_path, clock) as reopened:
        assert (await reopened.queue("split").read_after(0, 100)).messages == before


@pytest.mark.parametrize("whole", [False, True])
async def test_a_whole_batch_goes_to_one_block(tmp_path: Path, cluster: Cluster, whole: bool) -> None:
    # The pieces of a split batch go to two journals, saved one after the other: a kill -9
    # between the saves keeps the first piece only, and a Kafka producer (answered with one
    # base offset, capella/kafka/produce.py) could not be answered right when it sends the
    # batch again. ``whole`` seals the open block first instead.
    q, _ = await cluster.put_queue("whole", {})
    await q.append([Draft(payload=b"m%d" % i) for i in range(8)], SaveMode.WAIT)
    answers = await q.append_batch(read(produced([b"w%d" % i for i in range(5)])), SaveMode.WAIT, whole=whole)
    assert [a.id for a in answers] == [9, 10, 11, 12, 13]
    await sealed(q, 1)
    journal = queue_dir(tmp_path, "whole") / "journal"
    first = 9 if whole else 11  # the open block's first id
    await until(lambda: [p.name for p in journal.iterdir()] == [f"{first:020d}.log"], what="one journal")
    # Larger than a block, a whole batch makes a block of its own.
    bigger = await q.append_batch(read(produced([b"b%d" % i for i in range(15)])), SaveMode.WAIT, whole=whole)
    assert [a.id for a in bigger] == list(range(14, 29))
    # whole: 1-8, 9-13 and 14-28, all sealed; else 1-10, 11-20 and 21-28 still open.
    await sealed(q, 3 if whole else 2)
    left = [] if whole else [f"{21:020d}.log"]
    await until(lambda: [p.name for p in journal.iterdir()] == left, what="the journals left")
    page = (await q.read_after(0, 100)).messages
    assert [m.payload for m in page] == [
        *(b"m%d" % i for i in range(8)),
        *(b"w%d" % i for i in range(5)),
        *(b"b%d" % i for i in range(15)),
    ]
