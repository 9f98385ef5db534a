"""A block still taking writes, held in memory with its journal, and its sealed form.

The open block keeps its record batches (``capella.records.record_batch``) as they go to its
journal, each with the entry the sealed block's index will hold, so sealing joins bytes;
per message it keeps only the id, and the identities dedup cannot tell from the ids.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field

from capella.core.definition import QueueSettings
from capella.core.log.batch import Batch
from capella.core.log.codec import assemble_block, columns_of, encode_block, index_entry
from capella.core.log.dedup import BlockSummary
from capella.core.message import Draft, LogMessage, drafts_batch
from capella.records import record_batch
from capella.records.record_batch import RecordBatch
from capella.storage import Journal


@dataclass(slots=True)
class OpenBlock:
    """A block still taking writes (or waiting to be sealed), held in memory with its journal.

    Its messages are its record batches (``batches``), in order, each over its own bytes: its
    journal after the header, and the batches of its sealed form, each with its entry in the
    sealed block's index, made as it is added, so sealing only joins bytes. Nothing else is
    kept per message but its id: a read decodes the batches it serves, and dedup keeps only
    the identities that are not the default ``(own, id)`` (``keys``; ``find`` knows the rest
    from ``ids``). A block recovered from a format 1 journal (``v1``) holds its ``messages``
    instead of batches; it takes no more writes and is sealed from its messages.
    """

    first_id: int
    opened_at: float
    journal_key: str
    own: str  # the cluster's name: the source of a message that names none
    # Unsigned 64-bit, 8 bytes an id: a list held an int object per message (40 bytes).
    ids: array[int] = field(default_factory=lambda: array("Q"))
    # The identities other than (own, id), and the ids of their messages.
    keys: dict[tuple[str, int], int] = field(default_factory=dict)
    named: set[int] = field(default_factory=set)
    size: int = 0
    pending: list[bytes] = field(default_factory=list)
    journal: Journal | None = None
    durable_size: int = 0
    batches: list[RecordBatch] = field(default_factory=list)
    firsts: list[int] = field(default_factory=list)  # each batch's first id, for bisecting
    index: bytearray = field(default_factory=bytearray)  # the sealed block's index entries, joined
    batch_bytes: int = 0
    messages: list[LogMessage] = field(default_factory=list)  # a format 1 block's only
    v1: bool = False

    def add(self, message: LogMessage) -> None:
        """Add a message of a format 1 journal (such a block holds no batches)."""
        self.ids.append(message.id)
        self.messages.append(message)
        self.name(message.source, message.external_id, message.id)

    def add_batch(self, batch: RecordBatch, *, journaled: bool = False) -> None:
        """Add a batch that holds its bytes alone (``RecordBatch.alone``) after the others;
        it is pending for the journal unless it is ``journaled`` already (recovery).

        ``ValueError`` unless its ids follow the block's: ``sealed`` relies on that order.
        """
        if self.ids and batch.base_id <= self.ids[-1]:
            raise ValueError(
                f"block batches must have strictly increasing ids: {batch.base_id} after {self.ids[-1]}"
            )
        entry = index_entry(batch, self.batch_bytes)
        self.batches.append(batch)
        self.firsts.append(batch.base_id)
        self.index += entry
        self.batch_bytes += batch.end
        self.ids.extend(range(batch.base_id, batch.base_id + batch.count))
        if not journaled:
            self.pending.append(batch.data)

    def add_drafts(self, drafts: list[Draft], first_id: int, now: float) -> None:
        """Encode ``drafts``, given the ids from ``first_id`` on, as one record batch of the block.

        A batch that cannot be encoded (a source or header past its length field) takes its
        messages' identities out of the block again before the error goes to the writer.
        """
        try:
            data = drafts_batch(drafts, base_id=first_id, base_time=now, source=self.own)
            self.add_batch(record_batch.framed(data))
        except BaseException:
            self.forget_names_from(first_id)
            raise
        self.size += len(data)

    def sealed(self) -> bytes:
        """The block's sealed form (format 2): its batches' bytes as they are, with their index."""
        ids = self.ids or [0]
        return assemble_block([b.data for b in self.batches], (self.index,), len(self.ids), ids[0], ids[-1])

    def name(self, source: str, external_id: int, message_id: int) -> bool:
        """Note a message's identity for dedup, where it is not the default ``(own, id)``;
        ``True`` when it was noted (the queue's dedup index notes it too)."""
        if source == self.own and external_id == message_id:
            return False
        self.keys[(source, external_id)] = message_id
        self.named.add(message_id)
        return True

    def forget_names_from(self, message_id: int) -> None:
        """Forget the identities of the messages from ``message_id`` on (their batch could not be encoded)."""
        for key, named in list(self.keys.items()):
            if named >= message_id:
                del self.keys[key]
                self.named.discard(named)

    def find(self, source: str, external_id: int) -> int | None:
        """The id of the message with this identity in the block, or None."""
        found = self.keys.get((source, external_id))
        if found is None and source == self.own and external_id not in self.named:
            ids = self.ids
            at = bisect.bisect_left(ids, external_id)
            if at < len(ids) and ids[at] == external_id:
                return external_id
        return found

    def contents(self, after: int, wanted: int) -> Batch:
        """The first ``wanted`` messages after id ``after`` (or all there are), as a batch of
        their own: the record batches that hold them, a batch cut at either edge re-framed."""
        if self.v1:
            start = bisect.bisect_right(self.ids, after)
            return Batch.of_messages(
                self.messages[start : start + wanted], list(self.ids[start : start + wanted])
            )
        first = max(0, bisect.bisect_right(self.firsts, after) - 1)
        # Each batch holds a message at least, and the first may end at ``after``: a slice, not
        # an islice, which would step over the ``first`` batches before it one by one.
        return Batch.of_records(
            record_batch.page_batches(self.batches[first : first + wanted + 1], after, wanted)
        )

    def is_full(self, definition: QueueSettings, now: float) -> bool:
        limits = definition.block
        return bool(self.ids) and (
            len(self.ids) >= limits.max_messages
            or self.size >= limits.max_bytes
            or now - self.opened_at >= limits.max_age
        )


def encode_sealed(block: OpenBlock) -> tuple[bytes, BlockSummary, Batch]:
    """The block's bytes, its summary, and its batch for the block store's cache.

    The block holds its journal's batches byte for byte, with their index entries; a block
    recovered from a format 1 journal is encoded as batches here, once. The cached batch is
    the block's own batches, the same bytes as the sealed object's, so a sealed block is in
    memory once (a reader's render decodes it, in the prefetch thread). The summary needs only
    the identities the block keeps (``keys``): nothing here is done per message.
    """
    if block.v1:
        raw = record_batch.encode_fields(columns_of(block.messages))
        data, records = encode_block(record_batch.read_all(b"".join(raw)))
    else:
        data, records = block.sealed(), block.batches
    summary = BlockSummary.of_block(block.ids[0], block.ids[-1], block.keys.keys(), block.own)
    return data, summary, Batch.of_records(records)
