"""The pipelined group commit behind claims, acks and cursor commits (``capella.core.journal.group_commit``).

The flush here is a real change log on a real file (``ChangeLog``), or a small function that
counts what it was asked to save: the rules are about who is answered when.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest
from support.wait import until

from capella.core.journal.changelog import ChangeLog
from capella.core.journal.group_commit import GroupCommit
from capella.errors import StorageUnavailable
from capella.storage import Storage, open_storage

LOG = "q/work/w"


class Changes:
    """An owner that counts changes; its flush saves them all, slowly, or fails on demand."""

    def __init__(self) -> None:
        self.count = 0
        self.flushes: list[int] = []
        self.fail_next = False
        self.release = asyncio.Event()
        self.started = asyncio.Event()  # a flush has taken the count it saves
        self.commit = GroupCommit(self.flush, "test")

    def change(self) -> int:
        self.count += 1
        return self.count

    async def flush(self) -> int:
        count = self.count
        self.started.set()
        await self.release.wait()
        self.release.clear()
        self.flushes.append(count)
        if self.fail_next:
            self.fail_next = False
            raise StorageUnavailable("disk gone")
        return count


async def test_changes_made_during_a_flush_share_the_next_one_and_are_answered_in_order() -> None:
    owner = Changes()
    answered: list[int] = []

    async def save() -> None:
        target = owner.change()
        await owner.commit.wait(target)
        answered.append(target)

    first = asyncio.create_task(save())
    await asyncio.sleep(0)  # one turn of the loop: the first flush starts
    others = [asyncio.create_task(save()) for _ in range(5)]  # arrive while the first flush runs
    await asyncio.sleep(0)  # one turn: they all wait on the commit
    owner.release.set()
    await first
    assert answered == [1] and owner.flushes == [1]
    owner.release.set()
    await asyncio.gather(*others)
    assert answered == [1, 2, 3, 4, 5, 6]
    assert owner.flushes == [1, 6]  # six changes, two flushes
    assert not owner.commit.flushing  # nothing waits: no task is left behind


async def test_a_failed_flush_fails_the_callers_it_covered_and_the_next_flush_serves_later_ones() -> None:
    owner = Changes()
    owner.fail_next = True
    covered = asyncio.create_task(owner.commit.wait(owner.change()))
    await owner.started.wait()
    later = asyncio.create_task(owner.commit.wait(owner.change()))  # changed while the flush runs
    await asyncio.sleep(0)  # one turn: the later caller waits before the flush fails
    owner.release.set()
    with pytest.raises(StorageUnavailable, match="disk gone"):
        await covered
    assert not later.done()
    owner.release.set()
    await later
    assert owner.flushes == [1, 2]
    assert owner.commit.durable == 2


async def opened_log(tmp_path: Path) -> tuple[Storage, ChangeLog]:
    """A file storage at ``tmp_path`` and a work-queue change log on it, loaded."""
    storage = open_storage("file", {"root": tmp_path})
    log = ChangeLog(storage, LOG, write_timeout=10.0)
    await log.load()
    return storage, log


async def records_of(storage: Storage) -> list[bytes]:
    """What a restart finds in the log."""
    return (await ChangeLog(storage, LOG, write_timeout=10.0).load())[1]


async def test_concurrent_change_log_flushes_share_fsyncs_and_are_answered_only_after_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, log = await opened_log(tmp_path)
    synced: list[int] = []  # the log's size at each fdatasync
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        synced.append(os.fstat(fd).st_size)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    answers: list[tuple[int, int]] = []  # (bytes this caller's record ends at, durable bytes then)
    path = tmp_path / "q" / "work" / "w" / "log" / f"{0:020d}.log"
    ends: list[int] = []

    async def save(i: int) -> None:
        log.append(b"record %d" % i)
        ends.append(log.bytes_since_checkpoint)
        end = ends[-1]
        await log.flush()
        answers.append((end, max(synced, default=0)))

    await asyncio.gather(*(save(i) for i in range(200)))
    assert len(answers) == 200
    assert all(end <= durable for end, durable in answers), "answered before its fsync"
    assert [end for end, _ in answers] == sorted(end for end, _ in answers), "answered out of order"
    assert len(synced) < 200, "concurrent flushes did not share fsyncs"
    assert synced[-1] == path.stat().st_size
    await log.close()
    assert len(await records_of(storage)) == 200


async def test_change_log_flushes_that_fail_are_written_again_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, log = await opened_log(tmp_path)
    real_fdatasync = os.fdatasync
    calls = [0]

    def fdatasync(fd: int) -> None:
        calls[0] += 1
        if calls[0] % 3 == 0:
            raise OSError(errno.EIO, "every third fdatasync fails")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    appended: list[bytes] = []
    failures = [0]

    async def append() -> None:
        # Records keep coming while flushes fail: a failed flush's records must still land
        # ahead of those appended after them.
        for i in range(300):
            record = b"r%d" % i
            log.append(record)
            appended.append(record)
            await asyncio.sleep(0.0002 if i % 2 else 0)

    async def flushed() -> bool:
        try:
            await log.flush()
        except StorageUnavailable:
            failures[0] += 1
        return appending.done() and not log.dirty

    async def flush() -> None:
        # A deadline, not a count of passes: a flusher with nothing to write passes at once,
        # and a count ran out while the appender slept.
        await until(flushed, what="the flushes to stop failing", every=0)

    appending = asyncio.create_task(append())
    await asyncio.gather(appending, *(flush() for _ in range(8)))
    assert calls[0] > 30 and failures[0] > 10
    await log.close()
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    # Every record once, in the order it was appended: a failed flush's records were written
    # again after the log was cut back, ahead of the ones appended after them.
    assert await records_of(storage) == appended
