"""The change log behind schedules and work queues: records, torn tails, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from capella.core.journal.changelog import ChangeLog
from capella.core.message import SaveMode
from capella.errors import CorruptData
from capella.storage import open_storage


async def test_records_come_back_in_order_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    storage = open_storage("file", {"root": tmp_path})
    log = ChangeLog(storage, "q/x", write_timeout=10.0)
    assert await log.load() == (None, [])
    for i in range(5):
        log.append(b"r%d" % i)
    await log.save(SaveMode.WAIT)
    log.append(b"not saved")
    await log.save(SaveMode.NONE)
    await log.close()
    path = tmp_path / "q" / "x" / "log" / f"{0:020d}.log"
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # a crash in the middle of the last append

    again = ChangeLog(storage, "q/x", write_timeout=10.0)
    document, records = await again.load()
    assert document is None and records == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    again.append(b"r5")
    await again.flush()
    await again.close()
    assert (await ChangeLog(storage, "q/x", write_timeout=10.0).load())[1][-2:] == [b"r4", b"r5"]


async def test_a_checkpoint_replaces_the_log_with_a_snapshot(tmp_path: Path) -> None:
    storage = open_storage("file", {"root": tmp_path})
    log = ChangeLog(storage, "q/x", write_timeout=10.0)
    await log.load()
    log.append(b"a")
    log.append(b"b")
    await log.checkpoint(lambda: b"state after a and b")
    assert not log.dirty and log.records_since_checkpoint == 0
    log.append(b"c")
    await log.close()
    assert sorted(p.name for p in (tmp_path / "q" / "x" / "log").iterdir()) == [f"{1:020d}.log"]
    assert await ChangeLog(storage, "q/x", write_timeout=10.0).load() == (b"state after a and b", [b"c"])

    # A log older than the snapshot (the crash came before its delete) is a leftover.
    (tmp_path / "q" / "x" / "log" / f"{0:020d}.log").write_bytes(b"")
    assert await ChangeLog(storage, "q/x", write_timeout=10.0).load() == (b"state after a and b", [b"c"])
    assert not (tmp_path / "q" / "x" / "log" / f"{0:020d}.log").exists()


async def test_a_corrupt_snapshot_is_reported(tmp_path: Path) -> None:
    storage = open_storage("file", {"root": tmp_path})
    log = ChangeLog(storage, "q/x", write_timeout=10.0)
    await log.load()
    await log.checkpoint(lambda: b"doc")
    await log.close()
    path = tmp_path / "q" / "x" / "snapshot"
    path.write_bytes(path.read_bytes()[:-1] + b"X")
    with pytest.raises(CorruptData):
        await ChangeLog(storage, "q/x", write_timeout=10.0).load()
