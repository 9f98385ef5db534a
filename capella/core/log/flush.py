"""Group commit of a queue's open blocks: their pending bytes appended to their journals and fsync'd.

Writers add record batches to a block's ``pending``; a commit waits until everything added so
far is in its journal and synced. When no flush is in flight and nobody waits, the commit
starts its flush itself and a callback on the journal's answer answers it (``_flush_now``: no
task, three turns of the loop); otherwise the flusher loop starts the next flush after the
ones in flight, up to ``MAX_FLUSHES`` at once. Answers go in order: a flush is answered only
once it and every flush before it are durable. A failed flush fails every flush after it;
their bytes go back, in order, ahead of what was added since, and every journal they wrote
to is reopened cut back to its last durable length before anything is written again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from capella.config import StorageSettings
from capella.core.journal.group_commit import fail
from capella.core.log.blocks import BlockStore
from capella.core.log.codec import JOURNAL_HEADER
from capella.core.log.open_block import OpenBlock
from capella.core.loops import Loop
from capella.core.stats import Histogram, QueueCounters
from capella.errors import CapellaError, ShuttingDown, StorageTimeout
from capella.storage import Journal

# Group commits in flight at once: while one fdatasync runs the next group is written and
# synced, and the file system folds concurrent syncs into fewer journal commits.
MAX_FLUSHES = 3


@dataclass(slots=True, eq=False)
class _Flush:
    """One group commit: the bytes it took from each block and the writers it answers."""

    chunks: list[tuple[OpenBlock, bytes]]
    waiters: list[asyncio.Future[None]]
    previous: _Flush | None
    registered: asyncio.Event = field(default_factory=asyncio.Event)  # its appends have their place
    done: asyncio.Future[BaseException | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    task: asyncio.Task[None] | None = None  # held here: the event loop keeps tasks only weakly


class Owner(Protocol):
    """The writer, as the flushes of its journals see it."""

    name: str
    counters: QueueCounters
    faults: dict[str, tuple[str, float]]

    @property
    def closing(self) -> bool: ...

    def in_memory(self) -> list[OpenBlock]: ...

    def set_fault(self, step: str, message: str) -> None: ...

    def clear_fault(self, step: str) -> None: ...

    def fault_text(self) -> str: ...

    def supervised(
        self, kind: str, body: Callable[[], Awaitable[None]], step: str, wake: asyncio.Event
    ) -> Loop: ...


class JournalFlusher:
    """The flushes of one queue's journals: in flight, failed, and the writers waiting for one.

    ``loop`` is the flusher, a supervised loop that runs only while writers ask (``want``);
    its failure is a fault of the "journal" step. ``marked`` says a ``mark`` write waits for
    the next periodic flush.
    """

    def __init__(
        self, owner: Owner, store: BlockStore, settings: StorageSettings, latency: Histogram
    ) -> None:
        self._owner = owner  # the writer: the blocks not sealed yet, the counters, the faults
        self._store = store
        self._settings = settings
        self._flush_latency = latency
        self.wanted = asyncio.Event()
        self.loop = owner.supervised("flush", self.run, "journal", self.wanted)
        self.marked = False
        # Flushes in flight, oldest first; after a failure, those that failed (to write again),
        # the failure that stops new writes until they are requeued, and one to report.
        self._flushes: list[_Flush] = []
        self._failed: list[_Flush] = []
        self._broken: BaseException | None = None
        self._unreported: BaseException | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._urgent = False

    @property
    def closing(self) -> bool:
        return self._owner.closing

    def want(self) -> None:
        self.wanted.set()
        self.loop.start()

    def pending(self) -> bool:
        return any(b.pending for b in self._owner.in_memory())

    def pending_bytes(self) -> int:
        """Bytes added to the journals' buffers and not written yet (``none`` and ``mark`` writes)."""
        return sum(len(chunk) for b in self._owner.in_memory() for chunk in b.pending)

    async def commit(self, *, urgent: bool) -> None:
        """Answer once everything added so far is in a journal, fsync'd."""
        if not self.pending() and not self._flushes:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        # A timer on the waiter, not asyncio.timeout: the same answer for a third of the work.
        expiry = loop.call_later(self._settings.write_timeout, self._expire, waiter)
        try:
            if self._idle() and (urgent or self._settings.wait_max_delay <= 0):
                # Nothing in flight and nobody waiting: this commit starts the flush itself.
                self._start_flush([waiter])
            else:
                self._waiters.append(waiter)
                self._urgent = self._urgent or urgent
                self.want()
            await waiter
        finally:
            expiry.cancel()

    def _expire(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            # The flush goes on: what it covers may still be saved, so say the outcome is unknown.
            waiter.set_exception(
                StorageTimeout(
                    f"queue {self._owner.name}: the write was not saved within "
                    f"{self._settings.write_timeout:g}s ({self._owner.fault_text()}); it may still be saved"
                )
            )

    async def run(self) -> None:
        """Start flushes while writers ask (up to ``MAX_FLUSHES`` at once), then end. A failed
        flush fails its writers (and those of every flush after it) and raises to the
        supervisor; the restarted loop retries what is still pending without a new writer."""
        delay = self._settings.wait_max_delay
        while True:
            if "journal" not in self._owner.faults and not self.wanted.is_set():
                return  # idle: the next commit starts the flusher again
            self.wanted.clear()
            if delay > 0 and not self._urgent and not self.closing:
                await asyncio.sleep(delay)
            while len(self._flushes) >= MAX_FLUSHES:
                await asyncio.wait([self._flushes[0].done])
            failure = await self._failure()
            if failure is not None:
                if self.closing:
                    return  # close() makes its own last attempt and reports it
                raise failure
            self._urgent = False
            waiters, self._waiters = self._waiters, []
            self._start_flush(waiters)
            if self.closing and not self._waiters:
                await self._failure(wait=True)
                return

    async def flush(self) -> None:
        """Write and fsync everything pending now; return once it and every earlier flush is durable."""
        error = await self._start_flush([]).done
        if error is not None:
            raise error

    def _idle(self) -> bool:
        """No flush in flight or wanted, no writer waiting for one, no journal fault to report:
        a commit may start its flush at once (``_start_flush``) without the flusher."""
        return (
            not self._flushes
            and not self._waiters
            and not self.loop.running
            and "journal" not in self._owner.faults
            and self._unreported is None
            and not self.closing
        )

    def _start_flush(self, waiters: list[asyncio.Future[None]]) -> _Flush:
        """Take what is pending (in order, with no await) and flush it after the flushes in flight."""
        self.marked = False
        chunks = []
        for block in self._owner.in_memory():
            if block.pending:
                chunks.append((block, b"".join(block.pending)))
                block.pending.clear()
        flush = _Flush(chunks, waiters, self._flushes[-1] if self._flushes else None)
        self._flushes.append(flush)
        if (
            flush.previous is None
            and self._broken is None
            and all(b.journal is not None and b.journal.size > 0 for b, _ in chunks)
        ):
            self._flush_now(flush)
        else:
            flush.task = asyncio.create_task(self._run_flush(flush), name=f"flush:{self._owner.name}")
        return flush

    def _flush_now(self, flush: _Flush) -> None:
        """Flush to journals open already, with no flush before it: the appends are made now,
        and a callback answers the writers once they are synced. A lone writer's commit so
        takes three turns of the loop instead of seven (two tasks and a gather fewer)."""
        started = time.perf_counter()
        appends: list[tuple[OpenBlock, Journal, asyncio.Future[None]]] = []
        try:
            for block, data in flush.chunks:
                journal = block.journal
                assert journal is not None
                appends.append((block, journal, asyncio.ensure_future(journal.append_and_sync(data))))
        except BaseException as exc:  # a journal refused the call: the task ends the flush
            self._broken = self._broken or exc
            flush.registered.set()
            flush.task = asyncio.create_task(self._end_flush(flush, appends, _ends(appends), exc, started))
            return
        flush.registered.set()
        ends = _ends(appends)
        left = len(appends)

        def synced(_: asyncio.Future[None]) -> None:
            nonlocal left
            left -= 1
            if left:
                return
            if all(not s.cancelled() and s.exception() is None for _, _, s in appends):
                self._settle(flush, ends, None, started)
            else:  # the task path closes the journals that failed and reports it
                flush.task = asyncio.create_task(self._end_flush(flush, appends, ends, None, started))

        for _, _, sync in appends:
            sync.add_done_callback(synced)
        if not appends:
            self._settle(flush, [], None, started)

    async def _run_flush(self, flush: _Flush) -> None:
        started = time.perf_counter()
        previous = flush.previous
        appends: list[tuple[OpenBlock, Journal, Awaitable[None]]] = []
        error: BaseException | None = None
        try:
            if previous is not None:
                # The bytes of a journal land in the order their appends are made.
                await previous.registered.wait()
            if self._broken is not None:
                raise self._broken  # nothing is written after a failed flush until it is retried
            for block, data in flush.chunks:
                journal = block.journal
                if journal is None:
                    # Reopening after a failed write cuts whatever half-written tail it left.
                    journal = block.journal = await self._store.meta.journal(
                        block.journal_key, truncate_to=block.durable_size
                    )
                    if journal.size == 0:
                        data = JOURNAL_HEADER + data
                appends.append((block, journal, journal.append_and_sync(data)))
        except BaseException as exc:
            error = self._broken = self._broken or exc
        finally:
            flush.registered.set()
        await self._end_flush(flush, appends, _ends(appends), error, started)

    async def _end_flush(
        self,
        flush: _Flush,
        appends: Sequence[tuple[OpenBlock, Journal, Awaitable[None]]],
        ends: list[tuple[OpenBlock, int]],
        error: BaseException | None,
        started: float,
    ) -> None:
        """Wait for the syncs of ``flush`` and for the flush before it, then answer its writers.
        ``ends``: each journal's size right after this flush's append, durable once it succeeds."""
        previous = flush.previous
        outcomes = await asyncio.gather(*(sync for _, _, sync in appends), return_exceptions=True)
        error = error or next((o for o in outcomes if isinstance(o, BaseException)), None)
        if error is not None:
            # Set before any await: no flush may reopen a journal and write after this one
            # until every flush in flight has ended and the failed bytes are requeued.
            self._broken = self._broken or error
            if isinstance(error, CapellaError):
                self._owner.set_fault("journal", error.message)
        if previous is not None:
            earlier = await previous.done  # answers go in order
            if error is None and earlier is not None:
                error = earlier
        if error is not None:
            # Its bytes go back for the next flush to write again, so every journal it wrote
            # to is cut back to its last durable length first: also one whose own sync worked
            # (the flush failed on another journal, or an earlier flush failed), which would
            # otherwise hold those batches twice, and recovery ends a journal at a repeat.
            for block, journal, _ in appends:
                if block.journal is journal:
                    block.journal = None
                    await asyncio.shield(journal.close())
        self._settle(flush, ends, error, started)

    def _settle(
        self, flush: _Flush, ends: list[tuple[OpenBlock, int]], error: BaseException | None, started: float
    ) -> None:
        """``flush`` ended (and every flush before it): answer its writers with ``error`` or
        success, and requeue what failed once no flush is in flight."""
        if error is None:
            for block, end in ends:
                block.durable_size = end
            if flush.chunks:
                self._owner.counters.flushes += 1
                self._flush_latency.observe(time.perf_counter() - started)
            if "journal" in self._owner.faults and self._broken is None:
                self._owner.clear_fault("journal")
            for w in flush.waiters:
                if not w.done():
                    w.set_result(None)
        else:
            self._failed.append(flush)
            fail(flush.waiters, error, f"queue {self._owner.name}")
        self._flushes.remove(flush)
        if self._broken is not None and not self._flushes:
            self._requeue_failed()
        flush.done.set_result(error)
        if error is not None:
            self.want()  # the flusher reports it and retries

    def _requeue_failed(self) -> None:
        """Every flush in flight has ended and some failed: put their bytes back, in order,
        ahead of what was added since, for the next flush to write again."""
        chunks: dict[int, list[bytes]] = {}
        blocks: dict[int, OpenBlock] = {}
        for flush in self._failed:
            for block, data in flush.chunks:
                chunks.setdefault(id(block), []).append(data)
                blocks[id(block)] = block
        for key, requeued in chunks.items():
            blocks[key].pending[:0] = requeued
        self._failed.clear()
        self._unreported, self._broken = self._broken, None

    async def _failure(self, *, wait: bool = False) -> BaseException | None:
        """The error of a failed flush not reported yet, once the flushes after it have ended
        too (with ``wait``: once every flush in flight has ended)."""
        while self._flushes and (wait or self._broken is not None):
            await asyncio.wait([self._flushes[-1].done])
        error, self._unreported = self._unreported, None
        return error

    def fail_waiters(self) -> None:
        """Closing: fail the writers still waiting for a flush."""
        for w in self._waiters:
            if not w.done():
                w.set_exception(ShuttingDown("the queue is closing"))


def _ends(appends: Sequence[tuple[OpenBlock, Journal, object]]) -> list[tuple[OpenBlock, int]]:
    """Each journal's size now, just after a flush's append: before any later flush appends."""
    return [(block, journal.size) for block, journal, _ in appends]
