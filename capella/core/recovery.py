"""Opening a queue from what is on disk: the manifest, the id lease, the journals, the consumers.

Nothing here trusts that the last run ended cleanly. The manifest says which sealed blocks
exist; a journal may hold a torn tail (cut off), may belong to a block that was sealed
before the crash (deleted), or may not be a journal at all (quarantined, kept for an
operator). A journal of either format is read (``CPJ2`` record batches, ``CPJ1`` frames); a
block recovered from a format 1 journal is sealed (as format 2) before anything is written, so
no file ever mixes the formats. The id lease in ``state.json`` is where numbering resumes, so an id answered
before a ``kill -9`` is never handed out again.
"""

from __future__ import annotations

import logging

import orjson

from capella.core.log.blocks import BlockStore
from capella.core.log.codec import JOURNAL_HEADER, decode_journal
from capella.core.log.open_block import OpenBlock
from capella.core.log.writer import Writer
from capella.core.stats import Recovery
from capella.core.subscription_store import SubscriptionStore
from capella.errors import CorruptData, KeyNotFound
from capella.records.record_batch import RecordBatch, framed, select
from capella.storage import keys

log = logging.getLogger(__name__)


async def recover(store: BlockStore, writer: Writer, consumers: SubscriptionStore) -> None:
    """Load the sealed blocks into ``store``, the unsealed ones into ``writer``, then the consumers."""
    await store.load_manifest()
    lease_until = await _read_lease(store)
    # A journal may outlive its block (a crash before its delete); its records are in a
    # sealed block, or were, if that block has expired since: never replay them.
    sealed_last = store.sealed_last
    await store.load_summaries()
    blocks = await _recover_journals(store, sealed_last, store.recovery, writer.own)
    writer.resume(blocks, sealed_last=sealed_last, lease_until=lease_until)
    await writer.extend_lease(0)
    await consumers.open()
    log.info(
        "queue recovered queue=%s last_id=%d sealed_blocks=%d open_messages=%d truncated_bytes=%d",
        store.name,
        writer.last_id,
        len(store.sealed),
        sum(len(b.ids) for b in writer.in_memory()),
        store.recovery.truncated_bytes,
    )


def _tail(batch: RecordBatch, first: int) -> bytes:
    """The batch's messages from id ``first`` on (at least one), with their ids."""
    cut = select(batch, [i >= first for i in range(batch.base_id, batch.last_id + 1)], first)
    assert cut is not None
    return cut


async def _read_lease(store: BlockStore) -> int:
    """The first id that was never leased (1 for a new queue)."""
    try:
        state = orjson.loads(await store.meta.get(keys.of(store.name, keys.STATE)))
        return int(state["lease_until"])
    except KeyNotFound:
        return 1
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CorruptData(f"queue {store.name}: state is not valid: {exc}") from None


async def _recover_journals(
    store: BlockStore, sealed_last: int, recovery: Recovery, own: str
) -> list[OpenBlock]:
    """The blocks that were not sealed, oldest first, with their journals open for appends."""
    meta, name = store.meta, store.name
    blocks: list[OpenBlock] = []
    for key in await meta.list(keys.within(name, keys.JOURNALS)):
        data = await meta.get(key)
        try:
            scan = decode_journal(data)
        except CorruptData as exc:
            # The header itself is bad: keep the bytes for an operator, never read them as data.
            await meta.put(keys.of(name, keys.QUARANTINE, key.rsplit("/", 1)[-1]), data)
            await meta.delete(key)
            recovery.quarantined.append(key)
            log.error("journal quarantined queue=%s key=%s reason=%s", name, key, exc.message)
            continue
        if scan.torn:
            recovery.truncated_bytes += len(data) - scan.valid_length
            log.warning(
                "journal tail truncated queue=%s key=%s dropped_bytes=%d reason=%s",
                name,
                key,
                len(data) - scan.valid_length,
                scan.reason,
            )
        messages = [m for m in scan.messages if m.id > sealed_last]
        if not messages:
            # Its block was sealed before the crash; only the delete was missing.
            await meta.delete(key)
            continue
        if len(messages) != len(scan.messages):
            log.warning("journal overlaps sealed blocks queue=%s key=%s", name, key)
        first = keys.number_of(key)
        if first is None:
            raise CorruptData(f"queue {name}: journal {key} does not name its first id")
        block = OpenBlock(first, messages[0].time, key, own, v1=scan.version == 1)
        if block.v1:
            for m in messages:
                block.add(m)
        else:
            # A batch that overlaps the sealed blocks is cut to its messages after them.
            for batch in scan.batches:
                if batch.base_id > sealed_last:
                    block.add_batch(batch.alone(), journaled=True)
                elif batch.last_id > sealed_last:
                    block.add_batch(framed(_tail(batch, sealed_last + 1)), journaled=True)
            for m in messages:
                block.name(m.source, m.external_id, m.id)
        block.journal = await meta.journal(key, truncate_to=scan.valid_length)
        block.durable_size = block.journal.size
        block.size = scan.valid_length - len(JOURNAL_HEADER)
        blocks.append(block)
    return blocks
