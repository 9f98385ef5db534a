"""The sealed blocks of one queue: the manifest, the block objects on their mounts, and their summaries.

A sealed block is immutable. The manifest (``<q>/manifest.json`` on the meta mount) lists
them, oldest first, with the mark whose mount holds each one; a block is readable exactly
when the manifest names it. Contents are loaded on demand (decoded in a thread, a few kept
in memory), moved between mounts by the archive handler, deleted oldest first by expiry,
and quarantined when they no longer decode. Every change of the manifest is written before
the objects it stops pointing at are deleted, so a crash leaves at most leftovers, which
``clean_leftovers`` removes.

The dedup index lives here too: it is built from the sealed blocks' summaries and loads a
block's exact keys only when a summary says the block may hold a key.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from capella.core.definition import QueueSettings
from capella.core.log.batch import Batch
from capella.core.log.codec import block_columns, block_keys, block_records
from capella.core.log.dedup import BlockSummary, DedupIndex
from capella.core.loops import retrieve
from capella.core.stats import Recovery
from capella.errors import CapellaError, Conflict, CorruptData, KeyNotFound, StorageUnavailable
from capella.storage import Storage, keys

log = logging.getLogger(__name__)

# Sealed blocks whose contents stay in memory after a read (the unload handler trims more).
LOADED_BLOCKS = 4
# Of those, the most recently read ones that keep the forms a read rendered (JSON objects,
# binary frames; each about as large as the block's payloads): a sequential reader holds the
# block it is in, the one its page began in, and the next one, rendered ahead of it.
RENDERED_BLOCKS = 3
# Sealed blocks whose exact dedup keys stay in memory (~100 bytes per message each).
KEY_SETS = 8

# What a reader does with a batch it loads: make the form it reads in (``Batch.json``...).
Render = Callable[[Batch], object]


@dataclass(slots=True)
class BlockMeta:
    """A sealed block as the manifest records it."""

    first_id: int
    last_id: int
    count: int
    bytes: int
    mark: int
    created: float
    sealed: float
    key: str
    state: str = "sealed"  # or "quarantined"

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_id": self.first_id,
            "last_id": self.last_id,
            "count": self.count,
            "bytes": self.bytes,
            "mark": self.mark,
            "created": self.created,
            "sealed": self.sealed,
            "key": self.key,
            "state": self.state,
        }


class BlockStore:
    """The sealed blocks of one queue and the objects behind them.

    ``sealed`` and ``firsts`` are replaced or appended to only with no await in between, so
    a reader that snapshots them sees a consistent list.
    """

    def __init__(
        self,
        name: str,
        definition: QueueSettings,
        mounts: dict[str, Storage],
        *,
        cluster_name: str,
        recovery: Recovery,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.definition = definition  # replaced by the queue when its definition changes
        self.recovery = recovery
        self._mounts = mounts
        self._cluster_name = cluster_name
        self._clock = clock

        self.sealed: list[BlockMeta] = []
        self.firsts: list[int] = []
        self.deleted_through = 0  # highest id of any block deleted (expired) so far
        self.loaded: OrderedDict[int, Batch] = OrderedDict()
        self.key_sets: OrderedDict[int, dict[tuple[str, int], int]] = OrderedDict()
        self.dedup = DedupIndex(self.keys_of_block)
        # Held while the manifest is written and the lists above follow it.
        self.manifest_lock = asyncio.Lock()
        self._used: dict[int, float] = {}  # first id of a loaded block -> when it was last read
        self._read: OrderedDict[int, Batch] = OrderedDict()  # the last RENDERED_BLOCKS read
        self._loading: dict[int, asyncio.Task[Batch]] = {}
        self._blocks_lock = asyncio.Lock()  # moves, deletes and leftover clean-up, one at a time
        # A crash (before this start) or a failed move or delete may have left copies behind.
        self._leftovers_possible = True

    # --- keys ------------------------------------------------------------------------------

    @property
    def meta(self) -> Storage:
        return self._mounts[self.definition.meta_mount]

    def block_key(self, first_id: int, last_id: int) -> str:
        return keys.block(self.name, first_id, last_id)

    def _summary_key(self, first_id: int) -> str:
        return keys.summary(self.name, first_id)

    # --- the manifest ----------------------------------------------------------------------

    async def load_manifest(self) -> None:
        """Read the manifest (recovery); a block it records as quarantined is reported again."""
        try:
            manifest = orjson.loads(await self.meta.get(keys.of(self.name, keys.MANIFEST)))
            self.sealed = [BlockMeta(**b) for b in manifest["blocks"]]
            self.deleted_through = int(manifest.get("deleted_through", 0))
        except KeyNotFound:
            self.sealed = []
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CorruptData(f"queue {self.name}: manifest is not valid: {exc}") from None
        self.sealed.sort(key=lambda b: b.first_id)
        self.firsts = [b.first_id for b in self.sealed]
        for meta in self.sealed:
            if meta.state == "quarantined":
                self._report_quarantine(meta, "recorded in the manifest")

    @property
    def sealed_last(self) -> int:
        """The highest id that is, or was before it expired, in a sealed block."""
        return max(self.sealed[-1].last_id if self.sealed else 0, self.deleted_through)

    async def load_summaries(self) -> None:
        """Give dedup every sealed block's summary (recovery); a lost one is rebuilt."""
        for meta in self.sealed:
            if meta.state == "sealed":
                await self._load_summary(meta)

    async def save_manifest(self, blocks: list[BlockMeta]) -> None:
        doc = {
            "version": 1,
            "deleted_through": self.deleted_through,
            "blocks": [b.to_dict() for b in blocks],
        }
        await self.meta.put(keys.of(self.name, keys.MANIFEST), orjson.dumps(doc))

    # --- adding a sealed block -------------------------------------------------------------

    async def put_block(self, meta: BlockMeta, data: bytes, summary: BlockSummary) -> None:
        """Write a new block's object and summary; the manifest does not name it yet."""
        await self._mounts[self.definition.mount_for_mark(meta.mark)].put(meta.key, data)
        await self.meta.put(self._summary_key(meta.first_id), summary.dump())

    def adopt(self, meta: BlockMeta, contents: Batch, summary: BlockSummary) -> None:
        """Take a block whose manifest entry is saved (under ``manifest_lock``; never awaits).

        Its exact keys are read from its bytes when a lookup first needs them."""
        self.sealed.append(meta)
        self.firsts.append(meta.first_id)
        self.loaded[meta.first_id] = contents
        self._used[meta.first_id] = self._clock()
        self._trim_loaded()
        self.dedup.add_summary(summary)

    # --- reading ---------------------------------------------------------------------------

    async def contents(self, meta: BlockMeta, render: Render | None = None) -> Batch:
        """The block's batch, loaded (and, if it was not loaded yet, ``render``ed) in a thread."""
        cached = self.loaded.get(meta.first_id)
        if cached is not None and meta.first_id not in self._loading:
            self.loaded.move_to_end(meta.first_id)
            self._used[meta.first_id] = self._clock()
        else:
            # The load (or a prefetch's render) is a task of its own: a reader that goes away
            # does not cancel it for the others waiting on the same block.
            cached = await asyncio.shield(self._start_load(meta, render))
        self._note_rendered(meta.first_id, cached)
        return cached

    def _note_rendered(self, first_id: int, batch: Batch) -> None:
        """``batch`` was read or rendered ahead: only the last ``RENDERED_BLOCKS`` keep their forms."""
        self._read[first_id] = batch
        self._read.move_to_end(first_id)
        while len(self._read) > RENDERED_BLOCKS:
            self._read.popitem(last=False)[1].drop_forms()

    def prefetch_after(self, last: int, render: Render | None = None) -> None:
        """Start loading the next sealed block while the reader handles this page.

        A sequential reader would otherwise wait for every block's decode (and ``render``,
        the form it reads in); this way both run while the answer is sent and the client
        parses it.
        """
        index = bisect.bisect_right(self.firsts, last)
        if index >= len(self.sealed):
            return
        meta = self.sealed[index]
        if meta.state != "sealed" or meta.first_id in self._loading:
            return
        # Once the reader is a tenth into the block it is in: decoding and rendering a block
        # takes as long as serving most of the one before (starting in its last tenth, the
        # first page of every block waited ~13 ms for it).
        if index > 0 and last < self.sealed[index - 1].last_id - self.sealed[index - 1].count * 9 // 10:
            return
        loaded = self.loaded.get(meta.first_id)
        if loaded is None:
            self._start_load(meta, render)
        elif render is not None and not loaded.holds(render):
            # A block the writer sealed is loaded already, from its bytes: render it.
            task = asyncio.create_task(self._rendered(meta.first_id, loaded, render))
            task.add_done_callback(retrieve)
            self._loading[meta.first_id] = task

    async def finish_loads(self) -> None:
        """Wait for the loads in flight (closing: none may outlive the queue)."""
        await asyncio.gather(*self._loading.values(), return_exceptions=True)

    def _start_load(self, meta: BlockMeta, render: Render | None) -> asyncio.Task[Batch]:
        task = self._loading.get(meta.first_id)
        if task is None:
            load = self._load_block(meta, render)
            task = asyncio.create_task(load, name=f"load:{self.name}:{meta.first_id}")
            task.add_done_callback(retrieve)
            self._loading[meta.first_id] = task
        return task

    async def _rendered(self, first_id: int, batch: Batch, render: Render) -> Batch:
        try:
            await asyncio.to_thread(render, batch)
        finally:
            del self._loading[first_id]
        self._note_rendered(first_id, batch)
        return batch

    async def _load_block(self, meta: BlockMeta, render: Render | None) -> Batch:
        try:
            found = await self._block_bytes(meta.first_id)
            if found is None:
                return Batch([], messages=[])  # expired while we were on our way: nothing to read here
            current, data = found
            try:
                contents = await asyncio.to_thread(_batch_of, data, render)
            except CorruptData as exc:
                await self.quarantine(current, exc.message)
                raise
        finally:
            del self._loading[meta.first_id]
        self.loaded[meta.first_id] = contents
        self._used[meta.first_id] = self._clock()
        self._trim_loaded()
        if render is not None:
            self._note_rendered(meta.first_id, contents)
        return contents

    async def _block_bytes(self, first_id: int) -> tuple[BlockMeta, bytes] | None:
        """The bytes of a sealed block from wherever it is now; None once it was deleted.

        A reader may hold a block's metadata while the archive handler moves it; when the
        old copy is already gone, follow the manifest to the new one.
        """
        for _ in range(3):
            meta = self._sealed_block(first_id)
            if meta is None or meta.state != "sealed":
                return None
            mount = self.definition.mount_for_mark(meta.mark)
            try:
                return meta, await self._mounts[mount].get(meta.key)
            except KeyNotFound:
                latest = self._sealed_block(first_id)
                if latest is None:
                    return None
                if latest.mark != meta.mark:
                    continue
                raise StorageUnavailable(
                    f"queue {self.name}: block {meta.key} is missing from mount {mount!r}"
                ) from None
        raise StorageUnavailable(f"queue {self.name}: block at id {first_id} keeps moving; retry")

    def _sealed_block(self, first_id: int) -> BlockMeta | None:
        index = bisect.bisect_left(self.firsts, first_id)
        if index < len(self.sealed) and self.sealed[index].first_id == first_id:
            return self.sealed[index]
        return None

    def _trim_loaded(self) -> None:
        while len(self.loaded) > LOADED_BLOCKS:
            first_id, _ = self.loaded.popitem(last=False)
            self._read.pop(first_id, None)
            self._used.pop(first_id, None)

    # --- dedup keys and summaries ----------------------------------------------------------

    async def keys_of_block(self, first_id: int) -> dict[tuple[str, int], int]:
        keys = self.key_sets.get(first_id)
        if keys is not None:
            self.key_sets.move_to_end(first_id)
            return keys
        found = await self._block_bytes(first_id)
        if found is None:
            return {}
        meta, data = found
        try:
            ids, pairs = await asyncio.to_thread(block_keys, data)
        except CorruptData as exc:
            await self.quarantine(meta, exc.message)
            return {}
        keys = dict(zip(pairs, ids, strict=True))
        self._remember_keys(first_id, keys)
        return keys

    def _remember_keys(self, first_id: int, keys: dict[tuple[str, int], int]) -> None:
        # Bounded: a sealed block's exact keys are ~100 bytes per message.
        self.key_sets[first_id] = keys
        while len(self.key_sets) > KEY_SETS:
            self.key_sets.popitem(last=False)

    async def _load_summary(self, meta: BlockMeta) -> None:
        try:
            summary = BlockSummary.load(await self.meta.get(self._summary_key(meta.first_id)))
        except (KeyNotFound, CorruptData):
            # Rebuild it from the block: a missing summary must never disable dedup.
            keys = await self.keys_of_block(meta.first_id)
            if meta.state != "sealed":
                return
            summary = BlockSummary.build(keys, self._cluster_name)
            await self.meta.put(self._summary_key(meta.first_id), summary.dump())
        self.dedup.add_summary(summary)

    # --- quarantine ------------------------------------------------------------------------

    async def quarantine(self, meta: BlockMeta, reason: str) -> None:
        if meta.state == "quarantined":
            return
        meta.state = "quarantined"
        self.loaded.pop(meta.first_id, None)
        self._read.pop(meta.first_id, None)
        self.dedup.drop_summary(meta.first_id)
        self._report_quarantine(meta, reason)
        async with self.manifest_lock:
            try:
                await self.save_manifest(self.sealed)
            except StorageUnavailable as exc:
                log.error("cannot record quarantine queue=%s key=%s", self.name, meta.key, exc_info=exc)

    def _report_quarantine(self, meta: BlockMeta, reason: str) -> None:
        if meta.key not in self.recovery.quarantined:
            self.recovery.quarantined.append(meta.key)
            self.recovery.gaps.append((meta.first_id, meta.last_id))
        log.error(
            "block quarantined queue=%s key=%s ids=%d-%d reason=%s",
            self.name,
            meta.key,
            meta.first_id,
            meta.last_id,
            reason,
        )

    # --- maintenance (the unload, archive and expire handlers) -----------------------------

    def unload(self, *, idle: float | None, age: float | None) -> tuple[int, int]:
        """Drop the contents of sealed blocks not read for ``idle`` s or sealed ``age`` s ago.

        Answers (blocks, bytes) dropped. The next read of such a block loads it again.
        """
        now = self._clock()
        by_id = {b.first_id: b for b in self.sealed}
        dropped = dropped_bytes = 0
        for first_id in list(self.loaded):
            meta = by_id.get(first_id)
            unused = now - self._used.get(first_id, now)
            old = meta is not None and now - meta.sealed
            if (idle is not None and unused >= idle) or (age is not None and meta is not None and old >= age):
                del self.loaded[first_id]
                self._read.pop(first_id, None)
                self._used.pop(first_id, None)
                self.key_sets.pop(first_id, None)
                dropped += 1
                dropped_bytes += meta.bytes if meta is not None else 0
        return dropped, dropped_bytes

    async def delete_block(self, first_id: int) -> int:
        """Delete the oldest sealed block (expiry); answers the bytes it held.

        The manifest forgets the block first, durably; then its objects go. A crash in
        between leaves only unreferenced objects, which ``clean_leftovers`` removes.
        """
        async with self._blocks_lock, self._noting_leftovers():
            if not self.sealed or self.sealed[0].first_id != first_id:
                raise Conflict(f"queue {self.name}: only the oldest sealed block can be deleted")
            meta = self.sealed[0]
            async with self.manifest_lock:
                remaining = self.sealed[1:]
                previous, self.deleted_through = (
                    self.deleted_through,
                    max(self.deleted_through, meta.last_id),
                )
                try:
                    await self.save_manifest(remaining)
                except CapellaError:
                    self.deleted_through = previous
                    raise
                self.sealed = remaining
                self.firsts = [b.first_id for b in remaining]
            self.loaded.pop(first_id, None)
            self._read.pop(first_id, None)
            self._used.pop(first_id, None)
            self.key_sets.pop(first_id, None)
            self.dedup.drop_summary(first_id)
            await self._mounts[self.definition.mount_for_mark(meta.mark)].delete(meta.key)
            await self.meta.delete(self._summary_key(first_id))
        log.info("block deleted queue=%s first_id=%d messages=%d", self.name, first_id, meta.count)
        return meta.bytes

    async def move_block(self, first_id: int, mark: int) -> int:
        """Move a sealed block to the mount of ``mark``; answers the bytes copied.

        The new copy is written, read back and compared, the manifest is switched durably,
        and only then is the old copy deleted: a crash at any point leaves a readable copy,
        and the other one is a leftover for ``clean_leftovers``.
        """
        async with self._blocks_lock, self._noting_leftovers():
            meta = next((b for b in self.sealed if b.first_id == first_id), None)
            if meta is None or meta.state != "sealed":
                raise Conflict(f"queue {self.name}: no sealed block starts at id {first_id}")
            source_name = self.definition.mount_for_mark(meta.mark)
            target_name = self.definition.mount_for_mark(mark)
            copied = 0
            if target_name != source_name:
                source, target = self._mounts[source_name], self._mounts[target_name]
                data = await source.get(meta.key)
                try:
                    await asyncio.to_thread(block_keys, data)  # never spread a corrupt block
                except CorruptData as exc:
                    await self.quarantine(meta, exc.message)
                    raise
                await target.put(meta.key, data)
                if await target.get(meta.key) != data:
                    raise StorageUnavailable(f"mount {target_name}: {meta.key} did not read back intact")
                copied = len(data)
            async with self.manifest_lock:
                moved = BlockMeta(**{**meta.to_dict(), "mark": mark})
                blocks = [moved if b is meta else b for b in self.sealed]
                await self.save_manifest(blocks)
                self.sealed = blocks
            if target_name != source_name:
                await self._mounts[source_name].delete(meta.key)
        log.info("block moved queue=%s first_id=%d mark=%d mount=%s", self.name, first_id, mark, target_name)
        return copied

    async def clean_leftovers(self) -> int:
        """Delete block copies the manifest does not point at (interrupted moves and deletes).

        Only lists the mounts when something may have been left: after a start, or after a
        move or delete failed half-way. A healthy pass costs nothing here.
        """
        if not self._leftovers_possible:
            return 0
        async with self._blocks_lock:
            sealed_last = self.sealed[-1].last_id if self.sealed else 0
            where = {b.key: self.definition.mount_for_mark(b.mark) for b in self.sealed}
            removed = 0
            for mount_name in sorted({self.definition.meta_mount, *self.definition.marks.values()}):
                storage = self._mounts[mount_name]
                for key in await storage.list(keys.within(self.name, keys.BLOCKS)):
                    last = keys.last_id_of(key)
                    # A block past the manifest may be sealing right now: not a leftover.
                    if last is None or last > sealed_last or where.get(key) == mount_name:
                        continue
                    await storage.delete(key)
                    removed += 1
                    log.info(
                        "leftover block copy deleted queue=%s mount=%s key=%s", self.name, mount_name, key
                    )
            first = self.sealed[0].first_id if self.sealed else sealed_last + 1
            for key in await self.meta.list(keys.within(self.name, keys.SUMMARIES)):
                last = keys.number_of(key)
                if last is not None and last < first:
                    await self.meta.delete(key)
            self._leftovers_possible = False
            return removed

    @contextlib.asynccontextmanager
    async def _noting_leftovers(self) -> AsyncIterator[None]:
        try:
            yield
        except BaseException:
            self._leftovers_possible = True
            raise


def _batch_of(data: bytes, render: Render | None) -> Batch:
    """The batch of a sealed block's bytes, with ``render``'s form made (in the load thread)."""
    records = block_records(data)  # None for a block of format 1
    batch = Batch.of_columns(block_columns(data)) if records is None else Batch.of_records(records)
    if render is not None:
        render(batch)
    return batch
