"""Delayed delivery in the core: due order, ids at the end of the log, chunks on disk, recovery."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest
from support.clock import Clock
from support.configs import file_config

from capella.config import Config
from capella.core.cluster import Cluster
from capella.core.delayed import schedule as schedule_module
from capella.core.message import Draft, SaveMode
from capella.core.queue import Appended, Delayed, Queue
from capella.errors import Conflict, ScheduledNotFound


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return file_config(tmp_path)


# ``cluster`` runs on ``clock``, which the tests move by hand.
pytestmark = pytest.mark.hand_clock


async def reopen(cluster: Cluster, tmp_path: Path, clock: Clock) -> Cluster:
    await cluster.close()
    return await Cluster.open(file_config(tmp_path), clock=clock)


async def jobs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, chunk_items: int) -> Queue:
    """A queue "jobs" whose schedule keeps ``chunk_items`` far items in a chunk file."""
    monkeypatch.setattr(schedule_module, "CHUNK_ITEMS", chunk_items)
    q, _ = await cluster.put_queue("jobs", {})
    return q


def later(text: str, at: float, **fields: Any) -> Draft:
    return Draft(text.encode(), deliver_at=at, **fields)


async def payloads(q: Queue) -> list[bytes]:
    return [m.payload for m in (await q.read_after(0, 10_000)).messages]


async def test_delayed_messages_enter_the_log_at_the_end_in_due_order(cluster: Cluster, clock: Clock) -> None:
    q, _ = await cluster.put_queue("jobs", {})
    now = clock.now
    answers = await q.append(
        [later("c", now + 30), Draft(b"now"), later("a", now + 10), later("b", now + 20)], SaveMode.WAIT
    )
    assert [isinstance(a, Delayed) for a in answers] == [True, False, True, True]
    assert answers[1].id == 1
    assert [a.deliver_at for a in answers if isinstance(a, Delayed)] == [now + 30, now + 10, now + 20]
    assert await payloads(q) == [b"now"]
    assert q.schedule.count == 3

    assert await q.schedule.release_due(now + 9) == 0
    await q.append([Draft(b"between")])
    clock.now = now + 25
    assert await q.schedule.release_due() == 2
    assert await payloads(q) == [b"now", b"between", b"a", b"b"]
    clock.now = now + 30
    await q.schedule.release_due()
    messages = (await q.read_after(0, 100)).messages
    assert [m.payload for m in messages] == [b"now", b"between", b"a", b"b", b"c"]
    # Each released message keeps a stable identity: its schedule id, never a message id.
    sids = {a.scheduled for a in answers if isinstance(a, Delayed)}
    assert {m.external_id for m in messages[2:]} == sids
    assert not sids & {m.id for m in messages}
    assert [m.id for m in messages] == sorted(m.id for m in messages)
    assert q.schedule.count == 0
    assert q.schedule.counters.released == 3


async def test_overdue_items_are_released_at_once_after_a_restart(
    cluster: Cluster, tmp_path: Path, clock: Clock
) -> None:
    q, _ = await cluster.put_queue("jobs", {})
    await q.append([later(f"m{i}", clock.now + 5 + i) for i in range(5)], SaveMode.WAIT)
    cluster = await reopen(cluster, tmp_path, clock)
    q = cluster.queue("jobs")
    assert q.schedule.count == 5
    clock.now += 100
    await q.schedule.release_due()
    assert await payloads(q) == [f"m{i}".encode() for i in range(5)]
    cluster = await reopen(cluster, tmp_path, clock)
    q = cluster.queue("jobs")
    assert q.schedule.count == 0
    assert await payloads(q) == [f"m{i}".encode() for i in range(5)]
    await cluster.close()


async def test_a_lost_release_record_never_delivers_twice(
    cluster: Cluster, tmp_path: Path, clock: Clock
) -> None:
    q, _ = await cluster.put_queue("jobs", {})
    await q.append(
        [later("own", clock.now + 5), later("ext", clock.now + 5, source="shop", external_id=7)],
        SaveMode.WAIT,
    )
    clock.now += 10
    assert await q.schedule.release_due() == 2
    await cluster.close()
    # A crash between "appended" and "removed from the schedule": cut the release record off.
    log_dir = tmp_path / "data" / "queues" / "jobs" / "schedule" / "log"
    (log_file,) = log_dir.iterdir()
    data = log_file.read_bytes()
    pos = last = 0
    while pos < len(data):
        last = pos
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 8 + length
    assert data[last + 8 : last + 9] == b"D"
    log_file.write_bytes(data[:last])

    cluster = await Cluster.open(file_config(tmp_path), clock=clock)
    q = cluster.queue("jobs")
    # The releaser finds both overdue at once; the lock makes this wait for its pass.
    await q.schedule.release_due()
    assert q.schedule.count == 0
    assert q.schedule.counters.released_duplicates == 2
    assert await payloads(q) == [b"own", b"ext"]
    await cluster.close()


async def test_far_items_wait_on_disk_and_come_back_when_near(
    cluster: Cluster, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = await jobs(cluster, monkeypatch, chunk_items=50)
    now = clock.now
    # 300 items a day or more ahead, in reverse order, and 10 near ones.
    far = [later(f"far{i:03d}", now + 86_400 + 300 - i) for i in range(300)]
    near = [later(f"near{i}", now + 10 + i) for i in range(10)]
    await q.append(far + near, SaveMode.WAIT)
    await q.schedule.checkpoint()
    assert q.schedule.count == 310
    assert q.schedule.in_memory == 10  # the far ones left memory for their chunk files
    assert q.schedule.chunk_count == 7
    assert q.schedule.next_due() == now + 10

    cluster = await reopen(cluster, tmp_path, clock)
    q = cluster.queue("jobs")
    assert (q.schedule.count, q.schedule.in_memory) == (310, 10)
    clock.now = now + 100
    await q.schedule.release_due()
    assert await payloads(q) == [f"near{i}".encode() for i in range(10)]
    assert q.schedule.in_memory == 0
    clock.now = now + 86_400 + 150
    await q.schedule.release_due()
    released = await payloads(q)
    assert released[10:] == [f"far{i:03d}".encode() for i in range(299, 149, -1)]
    assert q.schedule.count == 150
    await q.schedule.checkpoint()
    cluster = await reopen(cluster, tmp_path, clock)
    q = cluster.queue("jobs")
    assert q.schedule.count == 150
    clock.now = now + 86_400 + 1000
    await q.schedule.release_due()
    assert len(await payloads(q)) == 310
    await q.schedule.checkpoint()
    assert q.schedule.chunk_count == 0
    chunk_dir = tmp_path / "data" / "queues" / "jobs" / "schedule" / "chunks"
    assert not list(chunk_dir.iterdir())
    await cluster.close()


async def test_cancel_and_reschedule_near_and_far_items(
    cluster: Cluster, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = await jobs(cluster, monkeypatch, chunk_items=4)
    now = clock.now
    answers = await q.append([later(f"m{i}", now + 1000 * (i + 1)) for i in range(10)], SaveMode.WAIT)
    sids = [a.scheduled for a in answers if isinstance(a, Delayed)]
    assert len(sids) == 10
    await q.schedule.checkpoint()
    assert q.schedule.in_memory == 0
    assert await q.cancel_delayed([sids[0], sids[5], 999_999], SaveMode.WAIT) == [sids[0], sids[5]]
    assert await q.cancel_delayed([sids[0]]) == []
    moved = await q.reschedule(sids[9], now + 5, SaveMode.WAIT)
    assert (moved.due, moved.payload) == (now + 5, b"m9")
    with pytest.raises(ScheduledNotFound):
        await q.schedule.get(sids[0])
    assert (await q.schedule.get(sids[3])).payload == b"m3"
    page = await q.schedule.page(None, 3)
    assert [i.payload for i in page] == [b"m9", b"m1", b"m2"]
    rest = await q.schedule.page(page[-1].key, 100)
    assert [i.payload for i in rest] == [b"m3", b"m4", b"m6", b"m7", b"m8"]

    cluster = await reopen(cluster, tmp_path, clock)
    q = cluster.queue("jobs")
    assert q.schedule.count == 8
    clock.now = now + 10
    await q.schedule.release_due()
    assert await payloads(q) == [b"m9"]
    clock.now = now + 100_000
    await q.schedule.release_due()
    assert await payloads(q) == [b"m9", b"m1", b"m2", b"m3", b"m4", b"m6", b"m7", b"m8"]
    await cluster.close()


async def test_an_identity_is_scheduled_once_and_delivered_once(cluster: Cluster, clock: Clock) -> None:
    q, _ = await cluster.put_queue("jobs", {})
    at = clock.now + 60
    (first,) = await q.append([later("x", at, source="shop", external_id=1)])
    (again,) = await q.append([later("x", at + 5, source="shop", external_id=1)])
    assert isinstance(first, Delayed)
    assert again == Delayed(first.scheduled, at, True)
    clock.now = at
    await q.schedule.release_due()
    (message,) = (await q.read_after(0, 10)).messages
    assert (message.source, message.external_id) == ("shop", 1)
    late = await q.append([later("x", at + 60, source="shop", external_id=1)])
    assert late == [Appended(message.id, True)]


async def test_a_message_being_released_cannot_be_changed(cluster: Cluster, clock: Clock) -> None:
    q, _ = await cluster.put_queue("jobs", {})
    (answer,) = await q.append([later("x", clock.now + 1)])
    assert isinstance(answer, Delayed)
    sid = answer.scheduled
    q.schedule._releasing.add(sid)  # as during the append of its release
    with pytest.raises(Conflict):
        await q.reschedule(sid, clock.now + 100)
    assert await q.cancel_delayed([sid]) == []
    q.schedule._releasing.discard(sid)
    assert await q.cancel_delayed([sid]) == [sid]


async def test_due_in_the_past_is_delivered_at_once(cluster: Cluster, clock: Clock) -> None:
    q, _ = await cluster.put_queue("jobs", {})
    assert await q.append([later("x", clock.now - 1)]) == [Appended(1, False)]


async def test_many_items_falling_due_at_once_are_released_in_due_order(
    cluster: Cluster, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule_module, "RELEASE_BATCH", 700)
    q, _ = await cluster.put_queue("jobs", {})
    now = clock.now
    rng = random.Random(5)
    dues = [now + rng.uniform(1, 10) for _ in range(3000)]
    answers = await q.append([later(f"{i}", due) for i, due in enumerate(dues)], SaveMode.WAIT)
    sids = [a.scheduled for a in answers if isinstance(a, Delayed)]
    cancelled = set(sids[::7])
    await q.cancel_delayed(list(cancelled))
    await q.reschedule(sids[1], now + 20)
    clock.now = now + 5
    await q.schedule.release_due()
    expected = sorted(
        (due, i) for i, due in enumerate(dues) if due <= now + 5 and sids[i] not in cancelled and i != 1
    )
    assert await payloads(q) == [str(i).encode() for _, i in expected]
    clock.now = now + 30
    await q.schedule.release_due()
    assert len(await payloads(q)) == 3000 - len(cancelled)
    assert q.schedule.count == 0


async def test_only_far_items_make_the_schedule_spill(
    cluster: Cluster, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule_module, "SPILL_AT", 50)
    q, _ = await cluster.put_queue("jobs", {})
    await q.append([later(f"near{i}", clock.now + 5) for i in range(100)], SaveMode.WAIT)
    await q.schedule.tick()
    assert (q.schedule.chunk_count, q.schedule.in_memory) == (0, 100)  # near ones stay, unwritten
    await q.append([later(f"far{i}", clock.now + 3600) for i in range(60)], SaveMode.WAIT)
    assert q.schedule.in_memory == 100 and q.schedule.count == 160  # the far ones spilled at once
    assert q.schedule.chunk_count >= 2
