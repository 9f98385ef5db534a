"""Delayed delivery: messages stored durably at once that enter their queue's log when due.

A delayed message gets a *schedule id* (``sid``) at once, drawn from the queue's own id
numbers so it is never reused; it gets its message id only when it is released, at the end
of the log, so a reader's cursor never misses it.

Where items live:

- every change (add, reschedule, cancel, release) is a record in a ``ChangeLog``;
- items due within ``horizon`` seconds are in memory, in a heap ordered by due time;
- the others are written at each checkpoint into immutable *chunk* files of up to
  ``CHUNK_ITEMS`` items sorted by due time, and leave memory; only a small index per chunk
  stays (its due range, sorted schedule ids and identity hashes: 16 bytes an item), so
  millions of far-future items do not fill memory. A chunk is read back when its earliest
  item comes within the horizon.

An item and its encoding are in ``capella.core.delayed.item``, the chunk files in
``capella.core.delayed.chunks``; this module decides what is where and when it is released.

Nothing is released twice: a release is a dedup insert keyed by the item's identity
``(source, external_id)``, where an item without an external id uses its sid. The release
record is written after the messages are durable; if a crash loses it, the items are
released again at recovery and dedup answers with the ids they already have.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import logging
import math
import struct
from array import array
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from capella.core.delayed.chunks import Chunk, ChunkFiles
from capella.core.delayed.item import DelayedMessage, decode_item, encode_item, identity_hash
from capella.core.journal.changelog import ChangeLog, frame, unframe
from capella.core.message import Draft, SaveMode
from capella.errors import CapellaError, Conflict, CorruptData, ScheduledNotFound, ShuttingDown
from capella.storage import Storage

log = logging.getLogger(__name__)

HORIZON = 60.0
CHUNK_ITEMS = 4096
# Items only in the log (not yet in a chunk) before a checkpoint writes them out.
SPILL_AT = 20_000
CHECKPOINT_BYTES = 64 * 1024 * 1024
RELEASE_BATCH = 10_000
# The release loop looks at the clock at least this often (an injected clock may jump; a
# chunk of far-future items must be read in before its items fall due).
RELEASE_POLL = 1.0
SMALL_RELEASE = 256

_ADD = b"A"
_DEL = b"D"
_SNAPSHOT_HEAD = struct.Struct("<I")

# (drafts, new): ``new`` when none of the drafts can be in the log already.
Release = Callable[[list[Draft], bool], Awaitable[Any]]


@dataclass(slots=True)
class ScheduleCounters:
    scheduled: int = 0
    released: int = 0
    released_duplicates: int = 0
    cancelled: int = 0
    rescheduled: int = 0
    checkpoints: int = 0
    chunks_loaded: int = 0


class Schedule:
    """The delayed messages of one queue; ``release`` appends due ones to the queue."""

    def __init__(
        self,
        storage: Storage,
        prefix: str,
        *,
        release: Release,
        clock: Callable[[], float],
        horizon: float = HORIZON,
        wake: Callable[[], None] = lambda: None,
        write_timeout: float,
    ) -> None:
        self._prefix = prefix
        self._release = release
        self._clock = clock
        self.horizon = horizon
        self.counters = ScheduleCounters()
        self._log = ChangeLog(storage, prefix, write_timeout=write_timeout)
        self._files = ChunkFiles(storage, prefix)
        self._items: dict[int, DelayedMessage] = {}
        self._heap: list[tuple[float, int]] = []
        self._by_identity: dict[tuple[str, int], int] = {}
        self._chunks: dict[int, Chunk] = {}
        self._next_chunk = 1
        # Far-future items that are only in the log: the memory a checkpoint gives back. Near
        # ones are not counted: they stay in memory anyway, and spilling them would rewrite
        # them at every checkpoint when many short delays are in flight.
        self._far_unspilled: set[int] = set()
        self._releasing: set[int] = set()
        # Sids at or above this were handed out by this process; those without an external id
        # cannot have been released before unless a release of theirs failed (``_tried``).
        self._first_new_sid = 2**63
        self._tried: set[int] = set()
        self._release_lock = asyncio.Lock()
        self._checkpoint_lock = asyncio.Lock()
        self.changed = asyncio.Event()  # set when an item may now be due earlier than before
        self._wake = wake  # starts the release loop (``run_releases``) unless it runs

    def _changed(self) -> None:
        self.changed.set()
        self._wake()

    # --- recovery -----------------------------------------------------------------------

    async def open(self, first_new_sid: int = 2**63) -> None:
        """Recover; ``first_new_sid`` is the first id the queue hands out in this process."""
        self._first_new_sid = first_new_sid
        document, records = await self._log.load()
        carried: list[bytes] = []
        if document is not None:
            carried = await self._load_snapshot(document)
        for record in [*carried, *records]:
            self._replay(record)
        # A checkpoint that crashed before its snapshot leaves chunk files nobody names.
        await self._files.delete_unknown(self._chunks)
        await self._load_near(self._clock())
        if self._items or self._chunks:
            log.info(
                "schedule recovered prefix=%s items=%d in_memory=%d chunks=%d",
                self._prefix,
                self.count,
                len(self._items),
                len(self._chunks),
            )

    async def _load_snapshot(self, document: bytes) -> list[bytes]:
        try:
            (size,) = _SNAPSHOT_HEAD.unpack_from(document)
            head = orjson.loads(document[_SNAPSHOT_HEAD.size : _SNAPSHOT_HEAD.size + size])
            self._next_chunk = int(head["next_chunk"])
            entries = head["chunks"]
        except (struct.error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptData(f"{self._prefix}: schedule snapshot is not valid: {exc}") from None
        for entry in entries:
            number = int(entry["n"])
            sids, hashes = await self._files.read_index(number)
            self._chunks[number] = Chunk(
                number,
                int(entry["count"]),
                float(entry["min_due"]),
                float(entry["max_due"]),
                sids,
                hashes,
                set(entry["deleted"]),
            )
        records, _ = unframe(document[_SNAPSHOT_HEAD.size + size :])
        return records

    def _replay(self, record: bytes) -> None:
        kind = record[:1]
        if kind == _ADD:
            item = decode_item(record, 1)
            self._forget(item.sid)
            self._remember(item)
        elif kind == _DEL:
            for sid in _sids_of(record):
                self._forget(sid)
        else:
            raise CorruptData(f"{self._prefix}: unknown schedule record {kind!r}")

    # --- what is scheduled -------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._items) + sum(c.live for c in self._chunks.values() if not c.loaded)

    @property
    def in_memory(self) -> int:
        return len(self._items)

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    def next_due(self) -> float | None:
        """The earliest due time of anything scheduled (a chunk counts with its earliest item)."""
        self._drop_stale_heads()
        due = self._heap[0][0] if self._heap else math.inf
        for c in self._chunks.values():
            if not c.loaded and c.live:
                due = min(due, c.min_due)
        return None if due == math.inf else due

    def _drop_stale_heads(self) -> None:
        heap, items = self._heap, self._items
        while heap:
            due, sid = heap[0]
            item = items.get(sid)
            if item is not None and item.due == due:
                return
            heapq.heappop(heap)

    async def get(self, sid: int) -> DelayedMessage:
        item = self._items.get(sid)
        if item is not None:
            return item
        for chunk in self._chunks.values():
            if chunk.holds(sid):
                for found in await self._files.read(chunk):
                    if found.sid == sid:
                        return found
        raise ScheduledNotFound(f"nothing scheduled has id {sid} (released, cancelled or never scheduled)")

    async def find(self, identity: tuple[str, int]) -> DelayedMessage | None:
        """The delayed message with this identity (only items with an external id are looked up)."""
        sid = self._by_identity.get(identity)
        if sid is not None:
            return self._items[sid]
        wanted = identity_hash(*identity)
        for chunk in list(self._chunks.values()):
            if chunk.loaded or not chunk.may_hold(wanted):
                continue
            for item in await self._files.read(chunk):
                if item.identity == identity and item.external_id is not None and chunk.holds(item.sid):
                    return item
        return None

    async def page(self, after: tuple[float, int] | None, limit: int) -> list[DelayedMessage]:
        """Up to ``limit`` items in (due, sid) order after the ``after`` key."""
        start = after or (-math.inf, -1)
        best = heapq.nsmallest(limit, (i for i in self._items.values() if i.key > start), key=_key)
        for chunk in sorted(self._chunks.values(), key=lambda c: c.min_due):
            if chunk.loaded or not chunk.live or chunk.max_due < start[0]:
                continue
            if len(best) >= limit and chunk.min_due > best[-1].due:
                break
            found = [i for i in await self._files.read(chunk) if i.key > start and chunk.holds(i.sid)]
            best = heapq.nsmallest(limit, [*best, *found], key=_key)
        return best

    # --- changes ------------------------------------------------------------------------

    def stage(self, item: DelayedMessage) -> None:
        """Register a new item (its sid is fresh); ``save`` makes it durable."""
        if not self._heap or item.due < self._heap[0][0]:
            self._changed()
        self._log.append(_ADD + encode_item(item))
        self._remember(item)
        self.counters.scheduled += 1

    async def add(self, items: Sequence[DelayedMessage], save: SaveMode) -> None:
        for item in items:
            self.stage(item)
        await self.save(save)
        await self.spill_if_needed()

    async def save(self, mode: SaveMode) -> None:
        await self._log.save(mode)

    def mark(self) -> None:
        """Save what was staged at the next periodic flush."""
        if self._log.dirty:
            self._log.marked = True

    async def reschedule(self, sid: int, due: float, save: SaveMode) -> DelayedMessage:
        self.check_not_releasing(sid)
        current = await self.get(sid)
        self.check_not_releasing(sid)
        moved = replace(current, due=due, chunk=0)
        self._log.append(_ADD + encode_item(moved))
        self._forget(sid)
        self._remember(moved)
        self.counters.rescheduled += 1
        self._changed()
        await self._log.save(save)
        return moved

    async def cancel(self, sids: Iterable[int], save: SaveMode) -> list[int]:
        """Cancel each sid; answers those that were scheduled (the rest are ignored)."""
        done: list[int] = []
        for sid in sids:
            if sid in self._releasing:
                continue
            if self._forget(sid):
                done.append(sid)
        if done:
            self._log.append(_DEL + array("q", done).tobytes())
            self.counters.cancelled += len(done)
            await self._log.save(save)
        return done

    def releasing(self, sid: int) -> bool:
        return sid in self._releasing

    def check_not_releasing(self, sid: int) -> None:
        if sid in self._releasing:
            raise Conflict(f"scheduled message {sid} is being delivered right now")

    def _remember(self, item: DelayedMessage) -> None:
        self._items[item.sid] = item
        heapq.heappush(self._heap, (item.due, item.sid))
        if item.external_id is not None:
            self._by_identity[item.identity] = item.sid
        if item.chunk == 0 and item.due > self._clock() + self.horizon:
            self._far_unspilled.add(item.sid)

    def _forget(self, sid: int) -> bool:
        """Drop ``sid`` wherever it is (memory and its chunk); whether it was there."""
        item = self._items.pop(sid, None)
        if item is not None:
            self._far_unspilled.discard(sid)
            if item.external_id is not None and self._by_identity.get(item.identity) == sid:
                del self._by_identity[item.identity]
            if item.chunk:
                chunk = self._chunks.get(item.chunk)
                if chunk is not None:
                    chunk.deleted.add(sid)
            return True
        for chunk in self._chunks.values():
            if chunk.holds(sid):
                chunk.deleted.add(sid)
                return True
        return False

    # --- release ------------------------------------------------------------------------

    async def run_releases(self, stopping: asyncio.Event) -> None:
        """Deliver items as they fall due until nothing is scheduled or ``stopping`` is set
        (the queue supervises it: a failure backs off and retries; ``wake`` starts it again)."""
        while not stopping.is_set():
            self.changed.clear()
            try:
                await self.release_due(self._clock())
            except ShuttingDown:
                return
            due = self.next_due()
            if due is None:
                return  # nothing scheduled: the next item staged starts the loop again
            delay = min(RELEASE_POLL, max(0.0, due - self._clock()))
            if delay == 0.0 or stopping.is_set():
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.changed.wait()

    async def release_due(self, now: float | None = None) -> int:
        """Append every item due at ``now`` to the queue, in due order; answers how many."""
        now = self._clock() if now is None else now
        released = 0
        async with self._release_lock:
            await self._load_near(now)
            while True:
                # Two batches in flight: the second is assigned ids while the first one's fsync
                # runs, and both share the queue's group commit.
                batches = [b for b in (self._take_due(now), self._take_due(now)) if b]
                if not batches:
                    break
                outcomes = await asyncio.gather(*map(self._release_batch, batches), return_exceptions=True)
                for outcome in outcomes:
                    if isinstance(outcome, BaseException):
                        raise outcome
                    released += outcome
        return released

    async def _release_batch(self, batch: list[DelayedMessage]) -> int:
        # The dedup lookup is what makes a repeated release harmless; it is skipped only for
        # items that cannot have been released before (the common case, ~25 % of the cost).
        first_new, tried = self._first_new_sid, self._tried
        new = all(i.external_id is None and i.sid >= first_new for i in batch) and not (
            tried and any(i.sid in tried for i in batch)
        )
        sids = [item.sid for item in batch]
        try:
            results = await self._release(
                [
                    Draft(
                        i.payload,
                        i.source,
                        i.sid if i.external_id is None else i.external_id,
                        i.external_time,
                        i.segment,
                        i.headers,
                    )
                    for i in batch
                ],
                new,
            )
        except BaseException:
            self._releasing.difference_update(sids)
            tried.update(sids)
            for item in batch:
                heapq.heappush(self._heap, (item.due, item.sid))
            raise
        self._releasing.difference_update(sids)
        if tried:
            tried.difference_update(sids)
        # Once per released message: the common case (in memory, in no chunk, no external id)
        # is a dict delete; _forget handles the rest.
        items, far = self._items, self._far_unspilled
        for item in batch:
            if items.get(item.sid) is item:
                if item.chunk or item.external_id is not None:
                    self._forget(item.sid)
                else:
                    del items[item.sid]
                    far.discard(item.sid)
        # The messages are durable now. If this record is lost in a crash, the items come back
        # and are released again as duplicates, which dedup absorbs.
        self._log.append(_DEL + array("q", sids).tobytes())
        self._log.marked = True
        duplicates = sum(1 for r in results if r.duplicate)
        self.counters.released += len(batch) - duplicates
        self.counters.released_duplicates += duplicates
        return len(batch)

    def _take_due(self, now: float) -> list[DelayedMessage]:
        heap, items, releasing = self._heap, self._items, self._releasing
        batch: list[DelayedMessage] = []
        pop = heapq.heappop
        # A few due items: pop them. Many: sort the heap once (C speed, and nearly free once
        # sorted), cut the due prefix off, and the rest is still a heap (a sorted list is
        # one). 100,000 heappops in a Python loop cost a quarter of a release.
        while heap and heap[0][0] <= now and len(batch) < SMALL_RELEASE:
            due, sid = pop(heap)
            item = items.get(sid)
            if item is not None and item.due == due and sid not in releasing:
                releasing.add(sid)
                batch.append(item)
        if len(batch) < SMALL_RELEASE or not heap or heap[0][0] > now:
            return batch
        heap.sort()
        cut = bisect.bisect_right(heap, (now, math.inf))
        taken = 0
        for due, sid in heap[:cut]:
            taken += 1
            item = items.get(sid)
            if item is None or item.due != due or sid in releasing:
                continue
            releasing.add(sid)
            batch.append(item)
            if len(batch) >= RELEASE_BATCH:
                break
        del heap[:taken]
        return batch

    async def _load_near(self, now: float) -> None:
        limit = now + self.horizon
        for chunk in sorted(self._chunks.values(), key=lambda c: c.min_due):
            if chunk.min_due > limit:
                break
            if chunk.loaded:
                continue
            items = await self._files.read(chunk)
            if chunk.loaded or chunk.number not in self._chunks:
                continue  # someone else loaded or replaced it while we read
            for item in items:
                if item.sid not in chunk.deleted and item.sid not in self._items:
                    self._remember(item)
            chunk.loaded = True
            self.counters.chunks_loaded += 1
            self._changed()

    # --- saving -------------------------------------------------------------------------

    async def tick(self) -> None:
        """The periodic pass: save marked changes, and checkpoint when the log has grown."""
        if self._log.marked:
            await self._log.flush()
        if len(self._far_unspilled) >= SPILL_AT or self._log.bytes_since_checkpoint >= CHECKPOINT_BYTES:
            await self.checkpoint()

    async def flush(self) -> None:
        await self._log.flush()

    async def spill_if_needed(self) -> None:
        if len(self._far_unspilled) >= SPILL_AT and not self._checkpoint_lock.locked():
            await self.checkpoint()

    async def checkpoint(self) -> None:
        """Write in-log items to chunks, rewrite mostly-deleted chunks, and start a fresh log."""
        async with self._checkpoint_lock:
            fresh = sorted((i for i in self._items.values() if i.chunk == 0), key=_key)
            # Near and far items go to separate chunks, so the far ones can all leave memory.
            cut = bisect.bisect_right([i.due for i in fresh], self._clock() + self.horizon)
            written: list[tuple[Chunk, list[DelayedMessage]]] = []
            for part in (fresh[:cut], fresh[cut:]):
                for start in range(0, len(part), CHUNK_ITEMS):
                    group = part[start : start + CHUNK_ITEMS]
                    written.append((await self._files.write(self._take_chunk_number(), group), group))
            rewrites: list[tuple[Chunk, Chunk]] = []
            for chunk in list(self._chunks.values()):
                if not chunk.loaded and chunk.live and len(chunk.deleted) * 2 >= chunk.count:
                    kept = [i for i in await self._files.read(chunk) if i.sid not in chunk.deleted]
                    rewrites.append((chunk, await self._files.write(self._take_chunk_number(), kept)))
            dropped: list[int] = []

            def document() -> bytes:
                # Runs with nothing else in between: adopt the new chunks and describe the result.
                for chunk, group in written:
                    self._chunks[chunk.number] = chunk
                    chunk.loaded = True
                    for item in group:
                        if self._items.get(item.sid) is item:
                            item.chunk = chunk.number
                        else:
                            chunk.deleted.add(item.sid)
                for old, new in rewrites:
                    if old.loaded or self._chunks.get(old.number) is not old:
                        dropped.append(new.number)  # loaded meanwhile: the rewrite is moot
                        continue
                    new.deleted = {sid for sid in old.deleted if new.holds(sid)}
                    del self._chunks[old.number]
                    self._chunks[new.number] = new
                    dropped.append(old.number)
                for chunk in list(self._chunks.values()):
                    if chunk.live <= 0:
                        del self._chunks[chunk.number]
                        dropped.append(chunk.number)
                return self._snapshot()

            try:
                await self._log.checkpoint(document)
            except CapellaError:
                # The new files are leftovers the next start removes; state stays as it was.
                for chunk, _ in written:
                    self._chunks.pop(chunk.number, None)
                raise
            self.counters.checkpoints += 1
            self._far_unspilled = {
                i.sid for i in self._items.values() if i.chunk == 0 and i.sid in self._far_unspilled
            }
            self._evict_far(self._clock())
            for number in dropped:
                await self._files.delete(number)

    def _take_chunk_number(self) -> int:
        number = self._next_chunk
        self._next_chunk += 1
        return number

    def _snapshot(self) -> bytes:
        head = orjson.dumps(
            {
                "version": 1,
                "next_chunk": self._next_chunk,
                "chunks": [
                    {
                        "n": c.number,
                        "count": c.count,
                        "min_due": c.min_due,
                        "max_due": c.max_due,
                        "deleted": sorted(c.deleted),
                    }
                    for c in sorted(self._chunks.values(), key=lambda c: c.number)
                ],
            }
        )
        # Items added while the chunks were being written are in no chunk yet: carry them.
        carried = [frame(_ADD + encode_item(i)) for i in self._items.values() if i.chunk == 0]
        return b"".join([_SNAPSHOT_HEAD.pack(len(head)), head, *carried])

    def _evict_far(self, now: float) -> None:
        """Drop from memory the chunks whose every item is beyond the horizon."""
        limit = now + self.horizon
        nearest: dict[int, float] = {}
        for item in self._items.values():
            if item.chunk and (item.chunk not in nearest or item.due < nearest[item.chunk]):
                nearest[item.chunk] = item.due
            if item.sid in self._releasing:
                nearest[item.chunk] = -math.inf
        for number, due in nearest.items():
            chunk = self._chunks.get(number)
            if chunk is None or due <= limit:
                continue
            for item in [i for i in self._items.values() if i.chunk == number]:
                del self._items[item.sid]
                if item.external_id is not None and self._by_identity.get(item.identity) == item.sid:
                    del self._by_identity[item.identity]
            chunk.loaded = False
            chunk.min_due = max(chunk.min_due, due)

    async def close(self) -> None:
        await self._log.close()


def _sids_of(record: bytes) -> array[int]:
    sids = array("q")
    sids.frombytes(record[1:])
    return sids


def _key(item: DelayedMessage) -> tuple[float, int]:
    return (item.due, item.sid)
