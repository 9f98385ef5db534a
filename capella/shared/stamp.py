"""A segment's bytes made into the messages a read serves.

A segment in a flush object is a batch as the producing node buffered it (base id 0): it is
stamped with the ids, time and source its commit gave it, and the positions ``skip`` names
(duplicates: dead bytes) are cut out. A segment in a compacted block (its key ends with
``.blk``, the key of a local queue's sealed block) is that whole block, whose batches carry
their ids already: it is read as the block it is, every checksum checked.
"""

from __future__ import annotations

from capella.core.log.batch import Batch
from capella.core.log.codec import block_records
from capella.errors import CorruptData
from capella.records import record_batch
from capella.records.record_batch import RecordBatch
from capella.shared.catalog import Segment

BLOCK_SUFFIX = ".blk"


def is_block(segment: Segment) -> bool:
    """Whether the segment is a compacted block (rather than a batch in a flush object)."""
    return segment.key.endswith(BLOCK_SUFFIX)


def stamped_records(data: bytes, segment: Segment, source: str) -> RecordBatch:
    """A flush segment's stored batch with its ids, time and source, duplicates cut out."""
    batch = record_batch.framed(data)
    raw = record_batch.stamp(batch, segment.first_id, segment.time, source)
    if segment.skip:
        skip = set(segment.skip)
        keep = [i not in skip for i in range(batch.count)]
        cut = record_batch.select(record_batch.framed(raw), keep, base_id=segment.first_id)
        if cut is None:
            raise ValueError("a segment row with every message skipped")
        raw = cut
    return record_batch.framed(raw)


def block_batch(data: bytes, segment: Segment) -> Batch:
    """A compacted block's messages; ``CorruptData`` unless they are the segment's ids."""
    records = block_records(data)
    if not records or (records[0].base_id, records[-1].last_id) != (segment.first_id, segment.last_id):
        raise CorruptData(
            f"shared: block {segment.key!r} does not hold ids {segment.first_id}..{segment.last_id}"
        )
    return Batch.of_records(records)


def stamped(data: bytes, segment: Segment, source: str) -> Batch:
    """The segment's messages, ready to serve (a flush batch stamped, or a block read)."""
    if is_block(segment):
        return block_batch(data, segment)
    return Batch.of_records([stamped_records(data, segment, source)])
