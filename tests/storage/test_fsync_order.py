"""FileStorage makes data durable in the right order.

The real ``os.fsync`` and ``os.replace`` are wrapped with recorders, so each test sees the
sequence of durability steps as the kernel saw it: which path each fsync'd descriptor named,
and what that file or directory held at the moment of the fsync.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from capella.storage.file import FileStorage

Event = tuple[str, ...]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    recorded: list[Event] = []
    real_fsync, real_replace = os.fsync, os.replace
    real_fdatasync = getattr(os, "fdatasync", os.fsync)

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        recorded.append(("fsync", path, held(fd, path)))
        real_fsync(fd)

    # Journals use fdatasync where it exists (enough for append-only data); it counts the same.
    def fdatasync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        recorded.append(("fsync", path, held(fd, path)))
        real_fdatasync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        recorded.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync, raising=False)
    monkeypatch.setattr(os, "replace", replace)
    return recorded


def held(fd: int, path: str) -> str:
    """A directory's entries or a file's size, as they were when made durable."""
    if os.path.isdir(path):
        return ",".join(sorted(os.listdir(path)))
    return str(os.fstat(fd).st_size)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # /proc/self/fd links name real paths, so compare against the resolved root.
    return tmp_path.resolve()


async def test_put_fsyncs_the_data_then_renames_then_fsyncs_the_directory(
    root: Path, events: list[Event]
) -> None:
    store = FileStorage(root)
    await store.put("q/meta", b"old")
    events.clear()

    await store.put("q/meta", b"new value")

    tmp = events[1][1]
    assert Path(tmp).parent == root / "q"
    assert Path(tmp).name.startswith("meta.tmp-")
    assert events == [
        ("fsync", tmp, "9"),
        ("replace", tmp, str(root / "q" / "meta")),
        ("fsync", str(root / "q"), "meta"),
    ]


async def test_put_into_new_directories_fsyncs_each_parent_first(root: Path, events: list[Event]) -> None:
    await FileStorage(root).put("q/blocks/1.blk", b"abc")

    tmp = events[3][1]
    assert events == [
        ("fsync", str(root), "q"),
        ("fsync", str(root / "q"), "blocks"),
        ("fsync", tmp, "3"),
        ("replace", tmp, str(root / "q" / "blocks" / "1.blk")),
        ("fsync", str(root / "q" / "blocks"), "1.blk"),
    ]


async def test_delete_fsyncs_the_directory_after_the_unlink(root: Path, events: list[Event]) -> None:
    store = FileStorage(root)
    await store.put("q/a", b"1")
    await store.put("q/b", b"2")
    events.clear()

    await store.delete("q/a")

    assert events == [("fsync", str(root / "q"), "b")]


async def test_creating_a_journal_fsyncs_its_directory(root: Path, events: list[Event]) -> None:
    store = FileStorage(root)
    await store.put("q/meta", b"")
    events.clear()

    journal = await store.journal("q/open.blk")

    assert events == [("fsync", str(root / "q"), "meta,open.blk")]
    await journal.close()


async def test_reopening_a_journal_fsyncs_nothing(root: Path, events: list[Event]) -> None:
    store = FileStorage(root)
    await (await store.journal("j")).close()
    events.clear()

    journal = await store.journal("j")

    assert events == []
    await journal.close()


async def test_append_and_sync_fsyncs_the_journal_with_the_data_in_it(
    root: Path, events: list[Event]
) -> None:
    journal = await FileStorage(root).journal("j")
    events.clear()

    await journal.append(b"12")
    assert events == []
    await journal.append_and_sync(b"345")
    await journal.sync()

    assert events == [("fsync", str(root / "j"), "5"), ("fsync", str(root / "j"), "5")]
    await journal.close()


async def test_truncate_to_is_fsynced_before_the_journal_is_used(root: Path, events: list[Event]) -> None:
    store = FileStorage(root)
    journal = await store.journal("j")
    await journal.append_and_sync(b"good|torn")
    await journal.close()
    events.clear()

    journal = await store.journal("j", truncate_to=4)

    assert events == [("fsync", str(root / "j"), "4")]
    await journal.close()
