"""The storage suite every provider passes, then what only disk and compression promise."""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from pathlib import Path

import pytest
from support.wait import until

from capella.errors import CorruptData, InvalidRequest, KeyNotFound, StorageUnavailable, Unsupported
from capella.storage import Storage
from capella.storage.file import FileStorage
from capella.storage.zstd import MAGIC, ZstdStorage

# --- every provider ----------------------------------------------------------------------

# Object stores cannot append: their ``journal`` raises Unsupported (queues keep journals on a
# file or memory mount), so the journal tests below run on every other kind.
CANNOT_APPEND = {"s3"}


@pytest.fixture
async def appendable(storage: Storage, request: pytest.FixtureRequest) -> Storage:
    """``storage`` for the journal tests; a kind that cannot append is checked to say so, then skipped."""
    kind = request.node.callspec.params["storage"]
    if kind in CANNOT_APPEND:
        with pytest.raises(Unsupported, match="cannot append"):
            await storage.journal("q/open.blk")
        assert await storage.list("") == []
        pytest.skip(f"{kind} cannot append; journal raised Unsupported as it should")
    return storage


async def test_a_put_value_reads_back(storage: Storage) -> None:
    await storage.put("queues/orders/meta.json", b'{"last_id": 7}')
    assert await storage.get("queues/orders/meta.json") == b'{"last_id": 7}'


async def test_a_put_replaces_the_old_value(storage: Storage) -> None:
    await storage.put("k", b"old")
    await storage.put("k", b"new")
    assert await storage.get("k") == b"new"


async def test_a_missing_key_is_key_not_found(storage: Storage) -> None:
    with pytest.raises(KeyNotFound):
        await storage.get("nothing/here")


async def test_delete_removes_and_is_idempotent(storage: Storage) -> None:
    await storage.put("a/b", b"x")
    await storage.delete("a/b")
    await storage.delete("a/b")
    await storage.delete("never/there")
    with pytest.raises(KeyNotFound):
        await storage.get("a/b")
    assert await storage.list("") == []


async def test_list_returns_keys_under_a_prefix_sorted(storage: Storage) -> None:
    for key in ["q/b/2.blk", "q/a/10.blk", "q/a/1.blk", "q/a/sub/x", "qq/other", "z"]:
        await storage.put(key, b"v")
    assert await storage.list("q/a/") == ["q/a/1.blk", "q/a/10.blk", "q/a/sub/x"]
    assert await storage.list("q/a/1") == ["q/a/1.blk", "q/a/10.blk"]
    assert await storage.list("q") == ["q/a/1.blk", "q/a/10.blk", "q/a/sub/x", "q/b/2.blk", "qq/other"]
    assert await storage.list("") == ["q/a/1.blk", "q/a/10.blk", "q/a/sub/x", "q/b/2.blk", "qq/other", "z"]
    assert await storage.list("missing/") == []


async def test_an_empty_value_reads_back_empty(storage: Storage) -> None:
    await storage.put("empty", b"")
    assert await storage.get("empty") == b""


async def test_an_8_mib_value_reads_back(storage: Storage) -> None:
    value = os.urandom(4 * 1024 * 1024) + bytes(4 * 1024 * 1024)
    await storage.put("big.blk", value)
    assert await storage.get("big.blk") == value


async def test_a_range_reads_back_that_slice_of_the_value(storage: Storage) -> None:
    value = os.urandom(300_000)
    await storage.put("shared/o.cpo", value)
    for start, length in [(0, 1), (0, len(value)), (299_999, 1), (12_345, 70_000), (65_536, 65_536)]:
        assert await storage.get_range("shared/o.cpo", start, length) == value[start : start + length]


async def test_a_range_past_the_end_answers_what_exists(storage: Storage) -> None:
    await storage.put("k", b"0123456789")
    assert await storage.get_range("k", 8, 100) == b"89"
    assert await storage.get_range("k", 0, 1 << 40) == b"0123456789"


async def test_a_range_that_starts_at_or_past_the_end_is_corrupt_data(storage: Storage) -> None:
    # The caller took the range from an index the value does not match: every provider says so
    # the same way (S3 answers 416 InvalidRange).
    await storage.put("k", b"0123456789")
    await storage.put("empty", b"")
    for key, start in [("k", 10), ("k", 11), ("k", 1 << 40), ("empty", 0)]:
        with pytest.raises(CorruptData, match="starts at byte"):
            await storage.get_range(key, start, 4)


async def test_a_range_of_a_missing_key_is_key_not_found(storage: Storage) -> None:
    with pytest.raises(KeyNotFound):
        await storage.get_range("nothing/here", 0, 10)


@pytest.mark.parametrize(("start", "length"), [(-1, 4), (0, 0), (3, -2)])
async def test_a_range_no_value_can_have_is_refused(storage: Storage, start: int, length: int) -> None:
    await storage.put("k", b"0123456789")
    with pytest.raises(InvalidRequest, match="bad range"):
        await storage.get_range("k", start, length)


async def test_a_journal_grows_and_reads_back_after_sync(appendable: Storage) -> None:
    journal = await appendable.journal("q/open.blk")
    assert journal.size == 0
    await journal.append(b"one,")
    await journal.append(b"two,")
    assert journal.size == 8
    await journal.sync()
    await journal.append_and_sync(b"three")
    assert journal.size == 13
    assert await appendable.get("q/open.blk") == b"one,two,three"
    await journal.close()


async def written_journal(storage: Storage, key: str, data: bytes) -> None:
    """A journal at ``key`` that holds ``data``, synced and closed."""
    journal = await storage.journal(key)
    await journal.append_and_sync(data)
    await journal.close()


@pytest.mark.parametrize(
    ("before", "truncate_to", "size", "more", "after"),
    [
        pytest.param(b"abc", None, 3, b"def", b"abcdef", id="a reopened journal appends after its bytes"),
        pytest.param(b"good|torn", 5, 5, b"next", b"good|next", id="truncate_to drops a torn tail"),
    ],
)
async def test_a_reopened_journal_keeps_its_bytes_and_appends_after_them(
    appendable: Storage, before: bytes, truncate_to: int | None, size: int, more: bytes, after: bytes
) -> None:
    await written_journal(appendable, "j", before)
    journal = await appendable.journal("j", truncate_to=truncate_to)
    assert journal.size == size
    await journal.append_and_sync(more)
    await journal.close()
    assert await appendable.get("j") == after


async def test_truncate_to_past_the_end_is_refused(appendable: Storage) -> None:
    await written_journal(appendable, "j", b"abc")
    with pytest.raises(InvalidRequest):
        await appendable.journal("j", truncate_to=4)
    assert await appendable.get("j") == b"abc"


async def test_a_closed_journal_refuses_appends_and_closes_twice(appendable: Storage) -> None:
    journal = await appendable.journal("j")
    await journal.append(b"kept")
    await journal.close()
    await journal.close()
    with pytest.raises(StorageUnavailable):
        await journal.append(b"x")
    assert await appendable.get("j") == b"kept"


async def test_a_journal_is_listed_and_deleted_like_any_value(appendable: Storage) -> None:
    journal = await appendable.journal("q/blocks/00000002.blk")
    await journal.append_and_sync(b"x")
    await journal.close()
    assert await appendable.list("q/blocks/") == ["q/blocks/00000002.blk"]
    await appendable.delete("q/blocks/00000002.blk")
    with pytest.raises(KeyNotFound):
        await appendable.get("q/blocks/00000002.blk")


# --- file --------------------------------------------------------------------------------


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "a//b", "a/", "./a", "a/./b", "a\0b", "a.tmp-1"])
async def test_file_rejects_keys_that_are_not_plain_relative_paths(tmp_path: Path, key: str) -> None:
    store = FileStorage(tmp_path / "store")
    with pytest.raises(InvalidRequest):
        await store.put(key, b"x")
    with pytest.raises(InvalidRequest):
        await store.get(key)
    with pytest.raises(InvalidRequest):
        await store.delete(key)
    with pytest.raises(InvalidRequest):
        await store.journal(key)
    assert not (tmp_path / "b").exists()


async def test_file_list_refuses_a_prefix_that_climbs_out(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest):
        await FileStorage(tmp_path / "store").list("../")


async def test_file_put_leaves_only_the_final_file(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    await store.put("q/a/1.blk", b"one")
    await store.put("q/a/1.blk", b"two")
    await store.put("q/b", b"three")
    assert files_under(tmp_path) == ["q/a/1.blk", "q/b"]


async def test_file_put_keeps_the_old_value_when_the_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStorage(tmp_path)
    await store.put("q/meta", b"old")

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StorageUnavailable, match="q/meta"):
        await store.put("q/meta", b"new")
    with pytest.raises(StorageUnavailable):
        await store.put("q/other", b"new")
    monkeypatch.undo()

    assert await store.get("q/meta") == b"old"
    assert await store.list("") == ["q/meta"]
    assert files_under(tmp_path) == ["q/meta"]


async def test_file_list_ignores_temporary_leftovers(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    await store.put("q/meta", b"v")
    (tmp_path / "q" / "meta.tmp-0123abcd").write_bytes(b"half")
    assert await store.list("") == ["q/meta"]


async def test_file_a_directory_or_a_path_through_a_file_holds_no_value(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    await store.put("q/a/1.blk", b"v")
    with pytest.raises(KeyNotFound):
        await store.get("q/a")
    with pytest.raises(KeyNotFound):
        await store.get("q/a/1.blk/x")
    await store.delete("q/a")
    assert await store.get("q/a/1.blk") == b"v"


async def test_file_write_errors_become_storage_unavailable(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    await store.put("q", b"a file where a directory is needed")
    with pytest.raises(StorageUnavailable, match="q/x"):
        await store.put("q/x", b"v")
    with pytest.raises(StorageUnavailable, match="q/j"):
        await store.journal("q/j")


async def test_file_range_reads_only_the_range(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    await storage.put("big.cpo", bytes(32 * 1024 * 1024))
    tracemalloc.start()
    try:
        assert await storage.get_range("big.cpo", 20 * 1024 * 1024, 100) == bytes(100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak


async def test_file_range_of_a_synced_journal_sees_its_bytes(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    journal = await storage.journal("q/open.blk")
    await journal.append_and_sync(b"abcdef")
    assert await storage.get_range("q/open.blk", 2, 3) == b"cde"
    await journal.close()


async def test_file_journal_appends_reach_the_file_by_sync(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    journal = await store.journal("j")
    await journal.append(b"buffered")
    await journal.sync()
    assert (tmp_path / "j").read_bytes() == b"buffered"
    await journal.close()


async def test_a_file_journal_keeps_no_written_bytes_while_its_thread_waits(tmp_path: Path) -> None:
    journal = await FileStorage(tmp_path).journal("j")
    tracemalloc.start()
    try:
        await journal.append_and_sync(os.urandom(4 << 20))
        # The thread waits up to 2 s for the next call before it ends: well before, its last
        # group's 4 MB are the file's only, not the process's.
        await until(lambda: tracemalloc.get_traced_memory()[0] < 1 << 20, within=1.0, what="4 MB freed")
    finally:
        tracemalloc.stop()
    assert journal.size == 4 << 20
    await journal.close()


async def test_file_journal_refuses_use_after_a_failed_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStorage(tmp_path)
    journal = await store.journal("j")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    monkeypatch.setattr(os, "fdatasync", failing_fsync, raising=False)
    with pytest.raises(StorageUnavailable, match="'j'"):
        await journal.append_and_sync(b"lost?")
    monkeypatch.undo()
    # The kernel may have dropped the pages; a retry must not report them durable.
    with pytest.raises(StorageUnavailable, match="failed earlier"):
        await journal.sync()
    await journal.close()


async def test_overlapping_journal_appends_land_in_call_order(appendable: Storage) -> None:
    journal = await appendable.journal("j")
    chunks = [f"{i:04d}|".encode() * (1 + i % 7) for i in range(200)]
    calls = [journal.append_and_sync(chunk) for chunk in chunks]  # each takes its place now
    await asyncio.gather(*calls)
    assert journal.size == sum(map(len, chunks))
    await journal.close()
    assert await appendable.get("j") == b"".join(chunks)


async def test_a_failed_sync_fails_every_overlapping_append_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStorage(tmp_path)
    journal = await store.journal("j")
    await journal.append_and_sync(b"durable|")
    failures = iter([True])

    def fdatasync_failing_once(fd: int) -> None:
        if next(failures, False):
            raise OSError(5, "Input/output error")
        os.fsync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync_failing_once, raising=False)
    calls = [journal.append_and_sync(b"after|") for _ in range(3)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    # The first sync failed; the later ones may have synced their own bytes, but what came
    # before them is not to be trusted, so none of them is reported durable.
    assert all(isinstance(o, StorageUnavailable) for o in outcomes), outcomes
    with pytest.raises(StorageUnavailable, match="failed earlier"):
        await journal.append_and_sync(b"x")
    await journal.close()
    reopened = await store.journal("j", truncate_to=len(b"durable|"))
    await reopened.close()
    assert (tmp_path / "j").read_bytes() == b"durable|"


# --- zstd --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1000, 1024 * 1024], ids=["inline", "threaded"])
async def test_zstd_stores_compressed_frames(tmp_path: Path, size: int) -> None:
    store = ZstdStorage(FileStorage(tmp_path), level=3)
    value = b"message " * (size // 8)
    await store.put("b.blk", value)
    packed = (tmp_path / "b.blk").read_bytes()
    assert packed.startswith(MAGIC)
    assert len(packed) < len(value) // 10
    assert await store.get("b.blk") == value


@pytest.mark.parametrize("size", [1000, 1024 * 1024], ids=["inline", "threaded"])
async def test_zstd_reports_corrupted_bytes(tmp_path: Path, size: int) -> None:
    store = ZstdStorage(FileStorage(tmp_path))
    await store.put("b.blk", os.urandom(size))
    path = tmp_path / "b.blk"
    packed = bytearray(path.read_bytes())
    packed[len(packed) // 2] ^= 0xFF
    path.write_bytes(bytes(packed))
    with pytest.raises(CorruptData, match=r"b\.blk"):
        await store.get("b.blk")


async def test_zstd_reports_a_cut_short_frame(tmp_path: Path) -> None:
    store = ZstdStorage(FileStorage(tmp_path))
    await store.put("b.blk", b"abc" * 1000)
    path = tmp_path / "b.blk"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CorruptData):
        await store.get("b.blk")


async def test_zstd_ranges_are_of_the_decompressed_value(tmp_path: Path) -> None:
    inner = FileStorage(tmp_path)
    storage = ZstdStorage(inner)
    value = b"abc" * 100_000
    await storage.put("k", value)
    assert (await inner.get("k")).startswith(MAGIC)
    assert await storage.get_range("k", 150_001, 6) == value[150_001:150_007]
    with pytest.raises(CorruptData, match="starts at byte"):
        await storage.get_range("k", len(value), 1)


async def test_zstd_returns_values_written_before_compression_as_they_are(tmp_path: Path) -> None:
    await FileStorage(tmp_path).put("meta.json", b'{"legacy": true}')
    assert await ZstdStorage(FileStorage(tmp_path)).get("meta.json") == b'{"legacy": true}'


async def test_zstd_journals_are_stored_uncompressed(tmp_path: Path) -> None:
    store = ZstdStorage(FileStorage(tmp_path))
    journal = await store.journal("open.blk")
    await journal.append_and_sync(b"raw bytes")
    await journal.close()
    assert (tmp_path / "open.blk").read_bytes() == b"raw bytes"
