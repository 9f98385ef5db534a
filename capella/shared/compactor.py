"""Compaction of shared queues: a queue's old segments rewritten into ordinary sealed blocks.

A flush object holds one window of one node's writes to every shared queue, so a queue's
history is spread over many small objects and one segment row per flush. For each queue, the
compactor takes the oldest segments older than ``compact_after`` still in flush objects, as
many consecutive ones as one block of the queue's limits holds (``groups``), once they fill a
block, span ``MIN_OBJECTS`` objects or hold ``compact_min`` bytes. It reads them (one ranged
GET per object, or the node's cached copy), stamps them with their ids, time and source
(duplicates cut out: ``stamp.stamped_records``), writes ONE sealed block of format 2
(``codec.encode_block``) on the shared mount at a local queue's block key under
``shared/queues/`` (``block_key``: a local queue of the same name with blocks on that mount
never shares a key with it), then points the range at it (``Catalog.replace_segments``): the old objects
lose those bytes and die once none are left; the janitor deletes them after the grace period,
so a reader holding the old segment rows keeps reading meanwhile.

One node per queue at a time: a PostgreSQL advisory lock (``Catalog.compaction_lock``), no
leader; a node that does not get it skips the queue this pass. A block written for a range
that changed meanwhile (expired, or compacted by a node whose lock was lost) is deleted again
unless a row names it: the same range gives the same key and the same bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from capella.config import SharedSettings
from capella.core.definition import SealLimits
from capella.core.log.codec import encode_block
from capella.core.stats import SharedStats
from capella.errors import CapellaError, CorruptData, StorageUnavailable
from capella.records.record_batch import RecordBatch
from capella.shared import object as objects
from capella.shared.cache import ObjectCache
from capella.shared.catalog import Catalog, Segment
from capella.shared.stamp import stamped_records
from capella.storage import Storage, keys

log = logging.getLogger(__name__)


def block_key(queue: str, first_id: int, last_id: int) -> str:
    """Where a compacted block of shared queue ``queue`` lives on the shared mount: an ordinary
    block key (``keys.block``), under ``shared/queues/``, away from every local queue's keys."""
    return f"{objects.PREFIX}queues/{keys.block(queue, first_id, last_id)}"


# A group short of a full block is compacted once it spans this many objects (or compact_min).
MIN_OBJECTS = 32
# Bounded work: blocks written per queue per pass, segment rows looked at, GETs at once.
BLOCKS_PER_PASS = 16
SEGMENTS_PER_PASS = 4096
GETS_AT_ONCE = 8


@dataclass(frozen=True, slots=True)
class Group:
    """Consecutive segments that become one block."""

    segments: tuple[Segment, ...]
    messages: int
    bytes: int
    objects: int
    full: bool  # the next segment would not have fitted in the block

    @property
    def first_id(self) -> int:
        return self.segments[0].first_id

    @property
    def last_id(self) -> int:
        return self.segments[-1].last_id


def groups(
    segments: Sequence[Segment], limits: SealLimits, *, min_objects: int, min_bytes: int
) -> list[Group]:
    """The groups worth a block among ``segments`` (a queue's, by first id): runs of
    consecutive ids cut where the next segment would take the block past its message or byte
    limit (a segment larger than the limits alone is a group of its own), kept when full, or
    spanning ``min_objects`` objects, or holding ``min_bytes`` bytes."""
    found: list[Group] = []
    run: list[Segment] = []
    messages = size = 0

    def close(full: bool) -> None:
        objects = len({s.key for s in run})
        if full or objects >= min_objects or size >= min_bytes:
            found.append(Group(tuple(run), messages, size, objects, full))

    for segment in segments:
        count = segment.last_id - segment.first_id + 1
        if run and segment.first_id != run[-1].last_id + 1:
            close(False)
            run, messages, size = [], 0, 0
        elif run and (messages + count > limits.max_messages or size + segment.byte_size > limits.max_bytes):
            close(True)
            run, messages, size = [], 0, 0
        run.append(segment)
        messages += count
        size += segment.byte_size
    if run:
        close(messages >= limits.max_messages or size >= limits.max_bytes)
    return found


class Compactor:
    """One node's compaction passes over the shared queues."""

    def __init__(
        self,
        settings: SharedSettings,
        storage: Storage,
        catalog: Catalog,
        objects: ObjectCache,
        *,
        own: str,
        stats: SharedStats,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._storage = storage
        self._catalog = catalog
        self._objects = objects
        self._own = own
        self._stats = stats
        self._clock = clock

    async def run_once(self, queues: Mapping[str, SealLimits]) -> int:
        """One pass over ``queues`` (name → block limits); answers the blocks written. A queue
        whose pass fails is logged and left for the next pass; the others go on. PostgreSQL or
        S3 unreachable ends the pass (the node's loop retries it with a backoff, and logs once)."""
        written = 0
        failed: list[str] = []
        for name, limits in sorted(queues.items()):
            try:
                written += await self.compact(name, limits)
            except StorageUnavailable:
                raise
            except CapellaError as exc:
                failed.append(name)
                log.warning("shared compaction failed queue=%s: %s", name, exc.message)
        if failed:
            self._stats.failures["compact"] = self._stats.failures.get("compact", 0) + len(failed)
        return written

    async def compact(self, queue: str, limits: SealLimits) -> int:
        """Compact what is due in ``queue``, under its lock; 0 when another node holds it."""
        async with self._catalog.compaction_lock(queue) as got:
            if not got:
                log.debug("compaction skipped queue=%s: another node holds it", queue)
                return 0
            before = self._clock() - self._settings.compact_after
            due = await self._catalog.compactable(queue, before, SEGMENTS_PER_PASS)
            written = 0
            for group in groups(due, limits, min_objects=MIN_OBJECTS, min_bytes=self._settings.compact_min)[
                :BLOCKS_PER_PASS
            ]:
                if await self._write(queue, group):
                    written += 1
            return written

    async def _write(self, queue: str, group: Group) -> bool:
        records = await self._read(group)
        data, _ = encode_block(records)
        key = block_key(queue, group.first_id, group.last_id)
        await self._storage.put(key, data)
        self._stats.puts += 1
        self._stats.put_bytes += len(data)
        replaced = await self._catalog.replace_segments(
            queue,
            group.first_id,
            group.last_id,
            key,
            self._settings.node,
            len(data),
            segments=len(group.segments),
        )
        if not replaced:
            # The range changed while the block was made: nobody may need these bytes.
            if not await self._catalog.known_keys([key]):
                await self._storage.delete(key)
            log.info("compaction lost its range queue=%s ids=%d..%d", queue, group.first_id, group.last_id)
            return False
        self._stats.compactions += 1
        self._stats.compacted_objects += group.objects
        log.info(
            "shared block written queue=%s ids=%d..%d segments=%d objects=%d bytes=%d",
            queue, group.first_id, group.last_id, len(group.segments), group.objects, len(data),
        )  # fmt: skip
        return True

    async def _read(self, group: Group) -> list[RecordBatch]:
        """The group's batches stamped, in id order: per object one ranged GET over this
        queue's segments in it (adjacent: an object holds its batches grouped by queue)."""
        by_key: dict[str, list[Segment]] = {}
        for segment in group.segments:
            by_key.setdefault(segment.key, []).append(segment)
        gate = asyncio.Semaphore(GETS_AT_ONCE)

        async def span(key: str, parts: list[Segment]) -> tuple[int, bytes]:
            start = min(s.byte_offset for s in parts)
            end = max(s.byte_offset + s.byte_size for s in parts)
            cached = self._objects.get(key)
            if cached is not None and len(cached) >= end:
                return start, cached[start:end]
            async with gate:
                data = await self._storage.get_range(key, start, end - start)
            self._stats.gets += 1
            self._stats.get_bytes += len(data)
            return start, data

        spans = dict(zip(by_key, await asyncio.gather(*(span(k, p) for k, p in by_key.items())), strict=True))
        records: list[RecordBatch] = []
        for segment in group.segments:
            start, data = spans[segment.key]
            at = segment.byte_offset - start
            piece = data[at : at + segment.byte_size]
            if len(piece) != segment.byte_size:
                raise CorruptData(f"shared: object {segment.key!r} is shorter than its segments")
            records.append(stamped_records(piece, segment, self._own))
        return records
