"""A state that changes by small records: a snapshot plus an append-only log of changes since it.

The delayed-delivery schedule of a queue and the work state of an ack-mode subscription
change many times a second; rewriting a whole document for each change would cost a full
write per ack. Instead every change is one framed record appended to a log, and concurrent
writers share one fsync (pipelined group commit, ``capella.core.journal.group_commit``: while one fsync is
in flight the next group gathers, and is written as soon as it returns). Now and then the owner writes a
snapshot of its state and the log starts over, so recovery never replays much.

Keys under ``<prefix>``: ``snapshot`` (magic, sequence number, CRC32, then the owner's
document) and ``log/<seq>.log`` (records written since snapshot ``seq``). A record is framed
as ``u32 length, u32 CRC32, body``; a torn or corrupt tail (a crash mid-append) is cut at
recovery, so only whole records written before the crash come back.

A checkpoint is crash-safe at every step: the new snapshot names the log that follows it, and
is written atomically before the old log is deleted; a log older than the snapshot is a
leftover and is deleted at the next load.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections.abc import Callable

from capella.core.journal.group_commit import GroupCommit
from capella.core.message import SaveMode
from capella.errors import CapellaError, CorruptData, KeyNotFound, StorageTimeout
from capella.storage import Journal, Storage, keys

log = logging.getLogger(__name__)

_SNAPSHOT_MAGIC = b"CPC1"
_SNAPSHOT_HEAD = struct.Struct("<4sQI")
_FRAME = struct.Struct("<II")


def frame(record: bytes) -> bytes:
    return _FRAME.pack(len(record), zlib.crc32(record)) + record


def unframe(data: bytes) -> tuple[list[bytes], int]:
    """The whole records at the start of ``data`` and the length they take."""
    records: list[bytes] = []
    pos, size = 0, len(data)
    view = memoryview(data)
    while size - pos >= _FRAME.size:
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if end > size or zlib.crc32(view[pos + _FRAME.size : end]) != crc:
            break
        records.append(data[pos + _FRAME.size : end])
        pos = end
    return records, pos


class ChangeLog:
    """The log and snapshot of one owner under ``prefix`` on ``storage``.

    ``append`` is synchronous and costs no I/O; ``save`` makes what was appended durable as the
    save mode asks. ``checkpoint`` takes the owner's document from a callable run under the
    log's lock, so the snapshot and the records it replaces always agree.
    """

    def __init__(self, storage: Storage, prefix: str, *, write_timeout: float) -> None:
        self._storage = storage
        self._prefix = prefix
        self._write_timeout = write_timeout
        self._pending: list[bytes] = []
        self._appended = 0  # records appended so far
        # Counts the records written and fsync'd (or covered by a snapshot) as ``durable``.
        self._commit = GroupCommit(self._write_pending, f"change log {prefix}")
        self._seq = 0
        self._journal: Journal | None = None
        self._journal_size = 0  # durable bytes in the current log
        self._lock = asyncio.Lock()
        self.records_since_checkpoint = 0
        self.bytes_since_checkpoint = 0
        self.marked = False

    def _log_key(self, seq: int) -> str:
        return keys.log_file(self._prefix, seq)

    @property
    def _snapshot_key(self) -> str:
        return keys.of(self._prefix, keys.SNAPSHOT)

    async def load(self) -> tuple[bytes | None, list[bytes]]:
        """The last snapshot's document (``None`` when there is none) and every record since."""
        document: bytes | None = None
        try:
            data = await self._storage.get(self._snapshot_key)
        except KeyNotFound:
            data = None
        if data is not None:
            if len(data) < _SNAPSHOT_HEAD.size:
                raise CorruptData(f"{self._snapshot_key}: shorter than its header")
            magic, seq, crc = _SNAPSHOT_HEAD.unpack_from(data)
            document = data[_SNAPSHOT_HEAD.size :]
            if magic != _SNAPSHOT_MAGIC or zlib.crc32(document) != crc:
                raise CorruptData(f"{self._snapshot_key}: bad magic or checksum")
            self._seq = seq
        records: list[bytes] = []
        for key in await self._storage.list(keys.within(self._prefix, keys.LOGS)):
            seq = keys.number_of(key)
            if seq is None:
                continue
            if seq < self._seq:
                # A checkpoint finished but the crash came before the old log was deleted.
                await self._storage.delete(key)
                continue
            raw = await self._storage.get(key)
            found, valid = unframe(raw)
            if valid != len(raw):
                log.warning("change log tail cut key=%s dropped_bytes=%d", key, len(raw) - valid)
            records.extend(found)
            if seq == self._seq:
                self._journal = await self._storage.journal(key, truncate_to=valid)
                self._journal_size = valid
            else:
                # Only the log named by the snapshot is ever written; anything newer cannot
                # exist unless a snapshot was lost, so read it but write on in the current one.
                log.warning("change log newer than its snapshot key=%s", key)
        self.records_since_checkpoint = len(records)
        return document, records

    def append(self, record: bytes) -> None:
        data = frame(record)
        self._pending.append(data)
        self._appended += 1
        self.records_since_checkpoint += 1
        self.bytes_since_checkpoint += len(data)

    @property
    def dirty(self) -> bool:
        return self._commit.durable < self._appended

    async def save(self, mode: SaveMode) -> None:
        """Make every record appended so far durable when ``mode`` asks for it."""
        if mode is SaveMode.IMMEDIATE or mode is SaveMode.WAIT:
            await self.flush()
        elif mode is SaveMode.MARK:
            self.marked = True

    async def flush(self) -> None:
        """Write and fsync every record appended so far; concurrent callers share fsyncs.

        Waits at most ``storage.write_timeout``: the flush goes on, so ``StorageTimeout`` says
        the records may still be saved.
        """
        try:
            async with asyncio.timeout(self._write_timeout):
                await self._commit.wait(self._appended)
        except TimeoutError:
            raise StorageTimeout(
                f"{self._prefix}: the change was not saved within {self._write_timeout:g}s; "
                "it may still be saved"
            ) from None

    async def _write_pending(self) -> int:
        """One flush of the group commit: everything pending, in one write and one fsync."""
        async with self._lock:
            count = self._appended
            if self._commit.durable >= count:
                return count  # a checkpoint covered them while we waited for the lock
            data = b"".join(self._pending)
            self._pending.clear()
            try:
                await self._write(data)
            except BaseException:
                # Kept for the next flush, ahead of anything appended meanwhile.
                self._pending.insert(0, data)
                raise
            if count >= self._appended:
                self.marked = False
            return count

    async def _write(self, data: bytes) -> None:
        try:
            if self._journal is None:
                # Reopening after a failed write cuts whatever half-written tail it left.
                self._journal = await self._storage.journal(
                    self._log_key(self._seq), truncate_to=self._journal_size
                )
            await self._journal.append_and_sync(data)
        except CapellaError:
            if self._journal is not None:
                journal, self._journal = self._journal, None
                await asyncio.shield(journal.close())
            raise
        self._journal_size = self._journal.size

    async def checkpoint(self, document: Callable[[], bytes]) -> None:
        """Write ``document()`` as the new snapshot and start an empty log after it.

        ``document`` runs under the lock with nothing else in between, so the snapshot holds
        exactly the records appended so far; their waiters are served by the snapshot.
        """
        async with self._lock:
            body = document()
            count = self._appended
            taken, self._pending = self._pending, []
            seq = self._seq + 1
            head = _SNAPSHOT_HEAD.pack(_SNAPSHOT_MAGIC, seq, zlib.crc32(body))
            try:
                await self._storage.put(self._snapshot_key, head + body)
            except CapellaError:
                self._pending[:0] = taken
                raise
            old_journal, old_seq = self._journal, self._seq
            self._seq = seq
            self._journal = None
            self._journal_size = 0
            self._commit.advance(count)
            if count >= self._appended:
                self.marked = False
            self.records_since_checkpoint = len(self._pending)
            self.bytes_since_checkpoint = sum(map(len, self._pending))
            if old_journal is not None:
                await old_journal.close()
            await self._storage.delete(self._log_key(old_seq))

    async def close(self) -> None:
        """Flush what is pending and close the log file."""
        await self.flush()
        async with self._lock:
            if self._journal is not None:
                journal, self._journal = self._journal, None
                await journal.close()
