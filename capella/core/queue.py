"""A queue: an append-only log of messages split into blocks, and the one object the rest of Capella uses.

``Queue`` puts its parts together and answers for them: the sealed blocks
(``capella.core.log.blocks``), the write path of ids, journals and sealing
(``capella.core.log.writer``), recovery at open (``capella.core.recovery``), subscriptions
and work queues (``capella.core.subscription_store``), delayed messages
(``capella.core.delayed.intake`` at produce time, ``capella.core.delayed.schedule`` after) and
its stats (``capella.core.report``). What it does
itself: validate writes, start the release of delayed messages when there are some, walk the
sealed and then the unsealed blocks for a read, and close its parts in order. Its background
loops (flush, seal, release) run under supervision only while they have work, so an idle
queue holds no task.

Keys on the queue's mounts (``<q>`` is the queue name):
``<q>/manifest.json``, ``<q>/state.json``, ``<q>/subscriptions/`` (a change log),
``<q>/journal/<first-id>.log``, ``<q>/summaries/<first-id>.sum`` on the meta mount and
``<q>/blocks/<first-id>-<last-id>.blk`` on the mount of the block's mark.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec

from capella.config import StorageSettings
from capella.core.base_queue import BaseQueue, Page, PageBuilder, wait_until
from capella.core.base_queue import ReadResult as ReadResult  # answered by ``read_after``
from capella.core.definition import QueueSettings
from capella.core.delayed.intake import Delayed as Delayed  # answered by ``Queue.append``
from capella.core.delayed.intake import assign_mixed
from capella.core.delayed.item import DelayedMessage
from capella.core.delayed.schedule import Schedule
from capella.core.filter import MessageFilter
from capella.core.limits import MessageLimits, check_batch, check_drafts
from capella.core.log.batch import Batch
from capella.core.log.blocks import BlockMeta, BlockStore, Render
from capella.core.log.dedup import DedupIndex
from capella.core.log.open_block import OpenBlock
from capella.core.log.writer import Appended as Appended  # answered by ``Queue.append``
from capella.core.log.writer import Writer
from capella.core.loops import Loop, TaskFailures
from capella.core.message import Draft, SaveMode
from capella.core.recovery import recover
from capella.core.report import block_list, queue_stats
from capella.core.retention import Retention
from capella.core.stats import Histogram, QueueCounters, Recovery
from capella.core.subscription import SubscriptionState
from capella.core.subscription_store import SubscriptionStore
from capella.core.work.retry import RetrySettings
from capella.core.work.work_queue import WorkQueue
from capella.errors import CorruptData, ShuttingDown
from capella.records.record_batch import Given, RecordBatch
from capella.storage import Storage, keys

log = logging.getLogger(__name__)


class Queue(BaseQueue):
    """One local queue. Build it with ``await Queue.open(...)``; ``close`` flushes everything."""

    def __init__(
        self,
        name: str,
        definition: QueueSettings,
        mounts: dict[str, Storage],
        *,
        cluster_name: str,
        settings: StorageSettings,
        flush_latency: Histogram | None = None,
        task_failures: TaskFailures | None = None,
        clock: Callable[[], float] = time.time,
        lookup: Callable[[str], Queue] | None = None,
        limits: MessageLimits | None = None,
    ) -> None:
        self.name = name
        # What a message must meet to be stored, whichever way it came in (capella.core.limits).
        self.limits = limits or MessageLimits()
        self.counters = QueueCounters()
        self.recovery = Recovery()
        self._definition = definition
        self._mounts = mounts
        self._task_failures = task_failures or TaskFailures()
        self._clock = clock
        self._closing = False
        self._stopping = asyncio.Event()  # set by close; wakes loops that back off

        self._store = BlockStore(
            name, definition, mounts, cluster_name=cluster_name, recovery=self.recovery, clock=clock
        )
        self._writer = Writer(
            name,
            definition,
            self._store,
            cluster_name=cluster_name,
            settings=settings,
            counters=self.counters,
            flush_latency=flush_latency or Histogram(),
            clock=clock,
            stopping=self._stopping,
            task_failures=self._task_failures,
        )
        self._consumers = SubscriptionStore(
            self,
            definition,
            self._store.meta,
            settings=settings,
            clock=clock,
            stopping=self._stopping,
            lookup=lookup,
            fault_text=self._writer.fault_text,
        )
        self._schedule = Schedule(
            self._store.meta,
            keys.of(name, keys.SCHEDULE),
            release=self._writer.append_released,
            clock=clock,
            wake=lambda: self._releaser.start(),
            write_timeout=settings.write_timeout,
        )
        self._releaser = Loop(
            f"release:{name}",
            lambda: self._schedule.run_releases(self._stopping),
            failures=self._task_failures,
            report=self._report,
            stopping=self._stopping,
            wake=self._schedule.changed,
        )

    @property
    def schedule(self) -> Schedule:
        """The queue's delayed messages."""
        return self._schedule

    @property
    def definition(self) -> QueueSettings:
        return self._definition

    @definition.setter
    def definition(self, definition: QueueSettings) -> None:
        # The cluster replaces the definition when a queue is updated; every part reads it.
        self._definition = definition
        self._store.definition = definition
        self._writer.definition = definition
        self._consumers.definition = definition

    # --- opening and closing ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        name: str,
        definition: QueueSettings,
        mounts: dict[str, Storage],
        *,
        cluster_name: str,
        settings: StorageSettings,
        flush_latency: Histogram | None = None,
        task_failures: TaskFailures | None = None,
        clock: Callable[[], float] = time.time,
        lookup: Callable[[str], Queue] | None = None,
        limits: MessageLimits | None = None,
    ) -> Queue:
        queue = cls(
            name,
            definition,
            mounts,
            cluster_name=cluster_name,
            settings=settings,
            flush_latency=flush_latency,
            task_failures=task_failures,
            clock=clock,
            lookup=lookup,
            limits=limits,
        )
        writer = queue._writer
        await recover(queue._store, writer, queue._consumers)
        await queue._schedule.open(first_new_sid=writer.next_id)
        # Recovery is done: seal the full blocks it found and release what is due.
        if writer.sealing:
            writer.want_seal()
        if queue._schedule.next_due() is not None:
            queue._releaser.start()
        return queue

    def _report(self, message: str) -> None:
        self._writer.last_error = message

    @property
    def _tasks(self) -> list[asyncio.Task[None]]:
        """The background tasks running now (none when the queue is idle)."""
        loops = (self._writer.flusher, self._writer.sealer, self._releaser)
        return [loop.task for loop in loops if loop.task is not None and loop.running]

    async def close(self) -> None:
        """Finish the seal in progress, flush every write and cursor, then stop."""
        if self._closing:
            return
        self._closing = True
        self._stopping.set()
        writer = self._writer
        writer.wake_waiters()
        self._consumers.wake_waiters()
        # The loops stop on their own between steps. The releaser and the sealer go first:
        # they may still need the flusher to complete a journal write.
        for loop in (self._releaser, writer.sealer, writer.flusher):
            await loop.finish()
        await self._store.finish_loads()
        try:
            await writer.flush_journals()
            await self._consumers.save()
            await self._schedule.close()
            await self._consumers.close()
            # Every id handed out is below next_id now, so a clean restart continues without a gap.
            await writer.put_state(writer.next_id)
        finally:
            await writer.close_journals()

    async def destroy(self) -> None:
        """Close the queue and delete every key it has on every mount."""
        await self.close()
        for mount in {self.definition.meta_mount, *self.definition.marks.values()}:
            storage = self._mounts[mount]
            for key in await storage.list(keys.within(self.name)):
                await storage.delete(key)

    # --- faults ----------------------------------------------------------------------------

    @property
    def faults(self) -> dict[str, tuple[str, float]]:
        """What keeps the queue from accepting writes now, by step: (error, since)."""
        return self._writer.faults

    @property
    def write_fault(self) -> str | None:
        """Why the queue cannot accept writes now, or None when it can."""
        return self._writer.write_fault

    @property
    def last_error(self) -> str | None:
        return self._writer.last_error

    @last_error.setter
    def last_error(self, message: str | None) -> None:
        self._writer.last_error = message

    # --- writing ---------------------------------------------------------------------------

    async def append(
        self, drafts: Sequence[Draft], save: SaveMode = SaveMode.DEFAULT
    ) -> list[Appended | Delayed]:
        """Store new messages (dedup by identity) and answer once ``save`` is satisfied.

        Every message is held to the rules first (``capella.core.limits.check_drafts``, with the
        server's limits): one that breaks one refuses the whole append, before any id is taken.
        """
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        now = self._clock()
        check_drafts(drafts, self.limits, now, self.definition.segments)
        mode = save.resolve(self.definition.save)
        self.counters.produce_requests += 1
        writer = self._writer
        if writer.sealer_behind:
            await writer.wait_for_sealer()
        later = [i for i, d in enumerate(drafts) if d.deliver_at is not None and d.deliver_at > now]
        results: list[Appended | Delayed]
        await writer.lock()
        try:
            if later:
                results = await assign_mixed(writer, self._schedule, drafts, later, now)
            else:
                results = list(await writer.assign(drafts, now))
        finally:
            writer.unlock()
        if mode is SaveMode.IMMEDIATE or mode is SaveMode.WAIT:
            if later:
                await asyncio.gather(
                    writer.commit(urgent=mode is SaveMode.IMMEDIATE), self._schedule.save(mode)
                )
            else:
                await writer.commit(urgent=mode is SaveMode.IMMEDIATE)
        elif mode is SaveMode.MARK:
            writer.marked = True
            self._schedule.mark()
        if later:
            await self._schedule.spill_if_needed()
        return results

    def check(self, drafts: Sequence[Draft]) -> None:
        """``append``'s rules on ``drafts``, storing nothing (a door that checks what it was given
        before it has the messages, such as a raw body's query metadata with another body)."""
        check_drafts(drafts, self.limits, self._clock(), self.definition.segments)

    async def append_batch(
        self,
        batch: RecordBatch,
        save: SaveMode = SaveMode.DEFAULT,
        *,
        given: Given | None = None,
        whole: bool = False,
    ) -> list[Appended]:
        """Store a producer's record batch as it came: ``append``'s rules, dedup and durability,
        without encoding a message again.

        The batch is given the server's ids, time and cluster name (its default source); its
        messages are held to ``append``'s rules (``capella.core.limits``: the count, each
        payload's size, sources, external times, segments, headers) before any id is taken. A
        batch of payloads alone is checked from its payload lengths, never decoded. A duplicate
        is cut out and answered with the id it has. The answers follow the batch's order.
        ``given``: the batch's ``decode_given`` with this cluster's name as its default source,
        when the caller made it already, so that it is not decoded twice. ``whole``: the batch
        is not split across two blocks (``LogWriter.assign_batch``).
        """
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        now = self._clock()
        writer = self._writer
        # The defaults the server fills in are read as filled in: the producer's head counts for nothing.
        batch = msgspec.structs.replace(batch, base_time=now, source=writer.own)
        fields, external_ids, _ = check_batch(
            batch, self.limits, now, self.definition.segments, writer.own, given
        )
        sources = None if fields is None else fields.sources
        mode = save.resolve(self.definition.save)
        self.counters.produce_requests += 1
        if writer.sealer_behind:
            await writer.wait_for_sealer()
        await writer.lock()
        try:
            results = await writer.assign_batch(batch, sources, external_ids, now, whole=whole)
        finally:
            writer.unlock()
        if mode is SaveMode.IMMEDIATE or mode is SaveMode.WAIT:
            await writer.commit(urgent=mode is SaveMode.IMMEDIATE)
        elif mode is SaveMode.MARK:
            writer.marked = True
        return results

    async def reschedule(
        self, sid: int, deliver_at: float, save: SaveMode = SaveMode.DEFAULT
    ) -> DelayedMessage:
        """Move a delayed message to ``deliver_at`` (a time in the past releases it at once)."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        return await self._schedule.reschedule(sid, deliver_at, save.resolve(self.definition.save))

    async def cancel_delayed(self, sids: Sequence[int], save: SaveMode = SaveMode.DEFAULT) -> list[int]:
        """Cancel delayed messages; answers the sids that were still waiting."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        return await self._schedule.cancel(sids, save.resolve(self.definition.save))

    async def flush(self) -> int:
        """Save everything written so far, ``none`` writes too; answers the message bytes it wrote."""
        written = self._writer.pending_bytes()
        await self._writer.flush_journals()
        await self._consumers.save()
        await self._schedule.flush()
        await self._consumers.flush_work()
        return written

    async def tick(self) -> None:
        """The periodic pass: seal an open block past its age, save marked writes and cursors."""
        await self._writer.tick()
        await self._consumers.tick_cursors()
        await self._schedule.tick()
        await self._consumers.tick_work()

    # --- reading ---------------------------------------------------------------------------

    def now(self) -> float:
        """The queue's clock (tests inject one)."""
        return self._clock()

    @property
    def own(self) -> str:
        """The cluster's name: the source of the messages produced here without one."""
        return self._writer.own

    @property
    def last_id(self) -> int:
        return self._writer.last_id

    @property
    def first_id(self) -> int:
        for meta in self._store.sealed:
            if meta.state == "sealed":
                return meta.first_id
        for block in self._writer.in_memory():
            return block.ids[0]
        return self._writer.last_id + 1

    async def read_page(
        self,
        after: int,
        limit: int,
        segments: Sequence[tuple[int, int]] | None = None,
        match: MessageFilter | None = None,
        render: Render | None = None,
    ) -> Page:
        """The messages with id > ``after`` in id order, at most ``limit`` of them, as slices of batches.

        With ``segments`` or ``match`` (a filter, which may hold segments itself), only the
        messages that pass; such a read looks at most ``SCAN_LIMIT`` messages, and ``last_id``
        says how far it looked. A sealed block's slice is of its cached batch, so the forms a
        read renders (JSON, binary frames) are made once per block, not once per read;
        ``render`` (``Batch.json``...) makes the reader's form in the thread that loads a block.
        """
        self.counters.read_requests += 1
        builder = PageBuilder(after, limit, segments, match)
        contents = self._store.contents
        for source in self._blocks_after(after):
            if isinstance(source, BlockMeta):
                if source.state != "sealed":
                    builder.passed(source.last_id)
                    continue
                try:
                    batch = await contents(source, render)
                except CorruptData:
                    builder.passed(source.last_id)
                    continue
            else:
                # A block still in memory keeps growing: the page takes a batch of its own.
                batch = source.contents(after, builder.room)
            if builder.add(batch):
                break
        page = builder.page()
        self.counters.read += page.count
        self._store.prefetch_after(page.last_id, render)
        return page

    def _blocks_after(self, after: int) -> Iterator[BlockMeta | OpenBlock]:
        # Snapshot the lists: a seal may move a block from sealing to sealed while we await.
        # Only the tail from the block holding ``after + 1`` is copied.
        store, writer = self._store, self._writer
        start = max(0, bisect.bisect_right(store.firsts, after) - 1)
        sealed, sealing, open_block = store.sealed[start:], list(writer.sealing), writer.open_block
        for meta in sealed:
            if meta.last_id > after:
                yield meta
        for block in sealing:
            if block.ids and block.ids[-1] > after:
                yield block
        if open_block is not None and open_block.ids and open_block.ids[-1] > after:
            yield open_block

    async def wait_for(self, after: int, timeout: float) -> None:  # noqa: ASYNC109 (long-poll length from the API)
        """Return once a message with id > ``after`` exists, or after ``timeout`` seconds."""
        writer = self._writer
        await wait_until(lambda: writer.last_id > after or self._closing, lambda: writer.arrived, timeout)

    # --- subscriptions (capella.core.subscription_store) --------------------------------------------

    def subscription(self, name: str) -> SubscriptionState:
        return self._consumers.subscription(name)

    def subscriptions(self) -> list[SubscriptionState]:
        return self._consumers.subscriptions()

    def work(self, name: str) -> WorkQueue:
        """The work queue of an ack-mode subscription."""
        return self._consumers.work(name)

    def work_queues(self) -> list[WorkQueue]:
        return self._consumers.work_queues()

    async def define_work(
        self, name: str, policy: RetrySettings, save: SaveMode = SaveMode.DEFAULT
    ) -> tuple[SubscriptionState, bool]:
        """Create an ack-mode subscription (a work queue) or change its retry policy."""
        return await self._consumers.define_work(name, policy, save)

    async def commit(
        self,
        name: str,
        last_id: int | None,
        *,
        replica: bool | None = None,
        reset: bool = False,
        save: SaveMode = SaveMode.DEFAULT,
        group: str | None = None,
        metadata: str | None = None,
    ) -> tuple[SubscriptionState, bool]:
        """Move a cursor forward (or anywhere with ``reset``), creating it on first use."""
        return await self._consumers.commit(
            name, last_id, replica=replica, reset=reset, save=save, group=group, metadata=metadata
        )

    async def delete_subscription(self, name: str, save: SaveMode = SaveMode.DEFAULT) -> None:
        await self._consumers.delete(name, save)

    def replicas(self, message_id: int) -> list[str]:
        return self._consumers.replicas(message_id)

    async def wait_replicas(self, message_id: int, count: int, timeout: float) -> list[str]:  # noqa: ASYNC109 (API parameter)
        """The replica subscriptions past ``message_id`` once there are ``count``, or at ``timeout``."""
        return await self._consumers.wait_replicas(message_id, count, timeout)

    # --- block maintenance (the unload, archive and expire handlers; capella.core.log.blocks) ---

    def sealed_blocks(self) -> list[BlockMeta]:
        """The sealed blocks, oldest first (a copy of the list; do not change the entries)."""
        return list(self._store.sealed)

    def unload(self, *, idle: float | None, age: float | None) -> tuple[int, int]:
        """Drop the contents of sealed blocks not read for ``idle`` s or sealed ``age`` s ago."""
        return self._store.unload(idle=idle, age=age)

    async def expire(self, rule: Retention) -> tuple[int, int]:
        """Delete the oldest sealed blocks ``rule`` lets go (the open block never goes)."""
        stats = self.stats()
        sealed = self.sealed_blocks()
        gone = rule.expired(sealed, stats["messages"], stats["bytes"], self.now())
        freed = 0
        for block in sealed[:gone]:
            freed += await self.delete_block(block.first_id)
        # Objects of a delete interrupted by a crash (the manifest had already let go).
        await self.clean_leftovers()
        return gone, freed

    async def delete_block(self, first_id: int) -> int:
        """Delete the oldest sealed block (expiry); answers the bytes it held."""
        return await self._store.delete_block(first_id)

    async def move_block(self, first_id: int, mark: int) -> int:
        """Move a sealed block to the mount of ``mark``; answers the bytes copied."""
        return await self._store.move_block(first_id, mark)

    async def clean_leftovers(self) -> int:
        """Delete block copies the manifest does not point at (interrupted moves and deletes)."""
        return await self._store.clean_leftovers()

    # The tests look at what the block store keeps in memory and how often dedup reads blocks.
    @property
    def _dedup(self) -> DedupIndex:
        return self._store.dedup

    @property
    def _loaded(self) -> OrderedDict[int, Batch]:
        return self._store.loaded

    @property
    def _key_sets(self) -> OrderedDict[int, dict[tuple[str, int], int]]:
        return self._store.key_sets

    # --- stats -----------------------------------------------------------------------------

    def definition_dict(self) -> dict[str, Any]:
        return self.definition.to_dict()

    def blocks(self, after: int, limit: int) -> list[dict[str, Any]]:
        """The blocks holding ids past ``after``, in id order, at most ``limit`` of them."""
        return block_list(self._store, self._writer, after, limit)

    def stats(self) -> dict[str, Any]:
        return queue_stats(
            self._store,
            self._writer,
            self._schedule,
            first_id=self.first_id,
            subscriptions=self._consumers.count,
        )
