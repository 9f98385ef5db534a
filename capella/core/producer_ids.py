"""Producer ids: numbers handed to producers that number their own messages, never one twice.

A producer that numbers its messages itself (an idempotent producer: its id, epoch and
sequence) mints identities ``(a source named for its id, its numbers)``. Two producers given one
id would mint one identity for two messages, and dedup would drop the second as a retry. So an
id, once handed out, is never handed out again, also after ``kill -9`` (DESIGN.md: every writer
that generates external ids owns its id space).

``LocalProducerIds`` leases them in blocks, as a queue leases its message ids
(``core/log/writer.py``): before the first id of a block is handed out, the block's end is saved
in the ``PRODUCER_IDS`` document on the default mount (``storage/catalog.py``; a file mount's put
writes a temporary file, fsyncs it, renames it and fsyncs the directory). A start resumes at the
saved end: the unused rest of the last block is skipped, never reused. Nothing is read or
written before the first ``take``, so a broker that hands out no producer ids pays nothing.

``SharedProducerIds`` asks the shared home instead (one PostgreSQL sequence for every node of a
shared cluster, ``shared/sql/002_producer_ids_and_groups.sql``): a node's ids are unique among
all the nodes, for its local queues as for the shared ones.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

from capella.core.shared_home import SharedHome
from capella.errors import CapellaError
from capella.storage import Storage
from capella.storage.catalog import PRODUCER_IDS
from capella.wire.records import ProducerIdLease

# Ids are int64 and not negative (-1 means "no producer" on the wire): every id is below this,
# int64's largest, which is the highest lease a document can hold.
MAX_ID = 2**63 - 1
# Ids leased per save: a restart skips at most this many.
BLOCK = 1000


class ProducerIds(ABC):
    """Where a front door gets producer ids from."""

    @abstractmethod
    async def take(self) -> int:
        """An id from 0 to 2**63 - 2 never answered before. ``StorageUnavailable`` when the
        lease cannot be saved (then no id is answered), ``CorruptData`` when the saved lease
        does not read."""


class LocalProducerIds(ProducerIds):
    """Ids leased in blocks of ``block``, the lease saved on ``mount`` ahead of use."""

    def __init__(self, mount: Storage, block: int = BLOCK) -> None:
        if block < 1:
            raise ValueError(f"producer ids: a block of {block} ids")
        self._mount = mount
        self._block = block
        self._next = 0  # the next id to hand out
        self._lease_until = 0  # ids from _next up to here are saved as leased and still free
        self._loaded = False
        # One save in flight: concurrent takes past the lease wait for it, then share its block.
        self._lock = asyncio.Lock()

    @property
    def lease_until(self) -> int:
        """The end of the saved lease (0 before the first ``take``)."""
        return self._lease_until

    async def take(self) -> int:
        # Bounded: each pass of the loop either saves a new block or finds one saved by another.
        while self._next >= self._lease_until:
            async with self._lock:
                if self._next >= self._lease_until:
                    await self._extend()
        taken = self._next
        self._next += 1
        return taken

    async def _extend(self) -> None:
        if not self._loaded:
            saved = await PRODUCER_IDS.load(self._mount)
            # The rest of the block saved last may have been answered before a crash: skip it.
            self._next = self._lease_until = max(self._next, saved.lease_until)
            self._loaded = True
        end = min(self._next + self._block, MAX_ID)
        if end <= self._next:
            # 2**63 ids: unreachable in practice; still, none is ever handed out twice.
            raise CapellaError(f"producer ids: all {MAX_ID} were handed out")
        # Saved before any id of the block is answered; a failed save answers none of them.
        await PRODUCER_IDS.save(self._mount, ProducerIdLease(lease_until=end))
        self._lease_until = end


class SharedProducerIds(ProducerIds):
    """Ids from the shared home: unique across every node of the shared cluster."""

    def __init__(self, home: SharedHome) -> None:
        self._home = home

    async def take(self) -> int:
        return await self._home.take_producer_id()
