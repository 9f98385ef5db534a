"""The write path of one queue: ids, the open block, group-commit flushes to its journal, and sealing.

Each call's messages are encoded at once as one record batch per block they go to
(``capella.records.record_batch``) and kept in ``pending`` until a flush appends them to the
block's journal and fsyncs it; the block keeps every batch, which its sealed form holds byte
for byte. ``wait`` and ``immediate`` writes join the next flush (group
commit: concurrent writers share one fsync). A full block moves to ``sealing``; the sealer
writes it once as an immutable block, has the block store record it in the manifest, and
deletes its journal. Ids come from a lease persisted ahead of use (``<q>/state.json``), so
an id that was ever answered is never handed out again, even after ``kill -9``.

A step that fails (journal, seal, state) is a *fault*: the queue says it cannot accept
writes until the step next succeeds.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import orjson

from capella.config import StorageSettings
from capella.core.definition import QueueDefinition
from capella.core.journal.group_commit import fail
from capella.core.log.batch import Batch
from capella.core.log.blocks import BlockMeta, BlockStore
from capella.core.log.codec import JOURNAL_HEADER, assemble_block, columns_of, encode_block, index_entry
from capella.core.log.dedup import BlockSummary
from capella.core.loops import Loop, TaskFailures, first_of
from capella.core.message import Draft, Message, drafts_batch
from capella.core.stats import Histogram, QueueCounters
from capella.errors import CapellaError, ShuttingDown, StorageTimeout, StorageUnavailable
from capella.records import record_batch
from capella.records.record_batch import RecordBatch
from capella.storage import Journal, keys

log = logging.getLogger(__name__)

# Group commits in flight at once: while one fdatasync runs the next group is written and
# synced, and the file system folds concurrent syncs into fewer journal commits.
MAX_FLUSHES = 3

# Full blocks waiting for the sealer; writers wait beyond this (at most
# ``storage.write_timeout``) so memory stays bounded when the disk is slower than the producers.
MAX_SEALING = 2


class Appended(msgspec.Struct, frozen=True, gc=False):
    """A produced message's answer: its id, and whether it was stored before (a duplicate).

    A Struct, not a NamedTuple: one is built per produced message (0.03 against 0.2 µs), and
    msgspec renders a list of them as the answer's ``results`` without a dict per message.
    """

    id: int
    duplicate: bool


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
    messages: list[Message] = field(default_factory=list)  # a format 1 block's only
    v1: bool = False

    def add(self, message: Message) -> None:
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

    def is_full(self, definition: QueueDefinition, now: float) -> bool:
        limits = definition.block
        return bool(self.ids) and (
            len(self.ids) >= limits.max_messages
            or self.size >= limits.max_bytes
            or now - self.opened_at >= limits.max_age
        )


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


class Writer:
    """Ids, the blocks still in memory (``sealing`` then ``open_block``) and their journals.

    The flusher and the sealer are supervised loops that run only while there is work: a
    commit starts the flusher, a full block the sealer, and each ends when it has nothing
    left to do. ``flush_wanted`` and ``seal_wanted`` say there is work (and cut a restart's
    backoff short); ``stopping`` is the queue's, set when it closes.
    """

    def __init__(
        self,
        name: str,
        definition: QueueDefinition,
        store: BlockStore,
        *,
        cluster_name: str,
        settings: StorageSettings,
        counters: QueueCounters,
        flush_latency: Histogram,
        clock: Callable[[], float],
        stopping: asyncio.Event,
        task_failures: TaskFailures,
    ) -> None:
        self.name = name
        self.definition = definition  # replaced by the queue when its definition changes
        self.counters = counters
        # What keeps the queue from accepting writes now, by step ("journal", "seal", "state"):
        # (error, since). Set when a write step fails, cleared when it next succeeds.
        self.faults: dict[str, tuple[str, float]] = {}
        self.last_error: str | None = None
        self.dedup = store.dedup
        self.own = cluster_name  # the source of messages produced here
        self._store = store
        self._settings = settings
        self._flush_latency = flush_latency
        self._clock = clock
        self._stopping = stopping

        self.sealing: list[OpenBlock] = []
        self.open_block: OpenBlock | None = None
        self.last_id = 0
        self.next_id = 1
        self.lease_until = 1  # ids below this may have been answered already
        self.arrived = asyncio.Event()  # set (and replaced) when messages are added
        self.marked = False  # a ``mark`` write waits for the next periodic flush

        self.flush_wanted = asyncio.Event()
        self.seal_wanted = asyncio.Event()
        self._write_lock = asyncio.Lock()
        # Flushes in flight, oldest first; after a failure, those that failed (to write again),
        # the failure that stops new writes until they are requeued, and one to report.
        self._flushes: list[_Flush] = []
        self._failed: list[_Flush] = []
        self._broken: BaseException | None = None
        self._unreported: BaseException | None = None
        self._seal_done = asyncio.Event()
        self._seal_tried = asyncio.Event()  # set (and replaced) after every seal attempt
        self._waiters: list[asyncio.Future[None]] = []
        self._urgent = False

        def loop(kind: str, body: Callable[[], Awaitable[None]], step: str, wake: asyncio.Event) -> Loop:
            """A supervised loop whose failure is a fault of ``step``."""
            return Loop(
                f"{kind}:{name}",
                body,
                failures=task_failures,
                report=lambda message: self.set_fault(step, message),
                stopping=stopping,
                wake=wake,
            )

        self.flusher = loop("flush", self.run_flusher, "journal", self.flush_wanted)
        self.sealer = loop("seal", self.run_sealer, "seal", self.seal_wanted)

    @property
    def closing(self) -> bool:
        return self._stopping.is_set()

    def resume(self, blocks: list[OpenBlock], *, sealed_last: int, lease_until: int) -> None:
        """Take the blocks recovered from journals and continue numbering after everything seen."""
        for block in blocks:
            for source, ext in block.keys:
                self.dedup.note(source, ext)
            self.dedup.note(self.own, block.ids[-1])
        if blocks:
            self.open_block = blocks.pop()
            self.sealing = blocks
            # A format 1 journal takes no record batches: its block is sealed as it is.
            if self.open_block.v1 or self.open_block.is_full(self.definition, self._clock()):
                self.sealing.append(self.open_block)
                self.open_block = None
        self.refresh_recent()
        self.lease_until = lease_until
        self.last_id = max(sealed_last, *(b.ids[-1] for b in self.in_memory()), 0)
        self.next_id = max(self.last_id + 1, lease_until)

    # --- faults ----------------------------------------------------------------------------

    def set_fault(self, step: str, message: str) -> None:
        self.last_error = message
        since = self.faults[step][1] if step in self.faults else self._clock()
        if step not in self.faults:
            log.error("queue cannot accept writes queue=%s step=%s: %s", self.name, step, message)
        self.faults[step] = (message, since)

    def clear_fault(self, step: str) -> None:
        if self.faults.pop(step, None) is not None:
            log.info("queue accepts writes again queue=%s step=%s", self.name, step)

    @property
    def write_fault(self) -> str | None:
        """Why the queue cannot accept writes now, or None when it can."""
        if not self.faults:
            return None
        step, (message, _) = min(self.faults.items(), key=lambda item: item[1][1])
        return f"{step}: {message}"

    def fault_text(self) -> str:
        return self.write_fault or "storage is slow"

    # --- writing ---------------------------------------------------------------------------

    @property
    def sealer_behind(self) -> bool:
        """Too many full blocks wait for the sealer: a writer waits for room first."""
        return len(self.sealing) >= MAX_SEALING

    async def wait_for_sealer(self) -> None:
        """Wait until the backlog of full blocks has room, at most ``storage.write_timeout``.

        While sealing fails, the writer asks for one retry at once and gets its outcome: the
        storage error right away, or room to write if the fault has cleared.
        """
        try:
            async with asyncio.timeout(self._settings.write_timeout):
                while len(self.sealing) >= MAX_SEALING and not self.closing:
                    failing = self.faults.get("seal")
                    if failing is not None:
                        self.want_seal()
                    await first_of(self._seal_done.wait(), self._seal_tried.wait())
                    if failing is not None and "seal" in self.faults and len(self.sealing) >= MAX_SEALING:
                        raise StorageUnavailable(
                            f"queue {self.name}: full blocks are not being sealed ({self.faults['seal'][0]})"
                        )
        except TimeoutError:
            raise StorageTimeout(
                f"queue {self.name}: full blocks were not sealed within "
                f"{self._settings.write_timeout:g}s ({self.fault_text()})"
            ) from None
        if self.closing:
            raise ShuttingDown(f"queue {self.name} is closing")

    async def lock(self) -> None:
        """Take the write lock, waiting at most ``storage.write_timeout`` for it."""
        if not self._write_lock.locked():
            await self._write_lock.acquire()  # free: taken at once, no timer needed
            return
        try:
            async with asyncio.timeout(self._settings.write_timeout):
                await self._write_lock.acquire()
        except TimeoutError:
            raise StorageTimeout(
                f"queue {self.name}: another write held the queue for more than "
                f"{self._settings.write_timeout:g}s ({self.fault_text()})"
            ) from None

    def unlock(self) -> None:
        self._write_lock.release()

    async def assign(self, drafts: Sequence[Draft], now: float, *, check: bool = True) -> list[Appended]:
        """Give the drafts ids and add them to the open block (holding the write lock).

        The messages a block takes from one call become one record batch (a block that fills
        up mid-call ends its batch there). ``check=False`` skips the dedup lookup for drafts
        whose identity is known to be new (it is still noted).
        """
        if self.next_id + len(drafts) > self.lease_until:
            await self.extend_lease(len(drafts))
        # This loop runs once per produced message: limits and bound methods are read once.
        limits = self.definition.block
        max_messages, max_bytes = limits.max_messages, limits.max_bytes
        own = self.own
        dedup = self.dedup
        results: list[Appended] = []
        added = 0
        block = self.open_block
        if block is not None and block.is_full(self.definition, now):
            self.rotate()
            block = None
        run: list[Draft] = []  # the drafts of the block's batch being built
        run_first = 0  # the id of its first message
        size = 0  # the block's bytes with that batch, estimated until it is encoded
        try:
            for d in drafts:
                source = own if d.source is None else d.source
                external_id = d.external_id
                if external_id is not None and check:
                    found = await dedup.find(source, external_id)
                    if (
                        found is None
                        and run
                        and block is not None
                        and source == own
                        and run_first <= external_id < self.next_id
                        and external_id not in block.named
                    ):
                        found = external_id  # a message of this call's batch, not added yet
                    if found is not None:
                        results.append(Appended(found, True))
                        continue
                message_id = self.next_id
                self.next_id = message_id + 1
                if block is None:
                    block = self.open_block = OpenBlock(message_id, now, self._journal_key(message_id), own)
                    self.refresh_recent()
                if not run:
                    run_first = message_id
                    size = block.size
                if external_id is None:
                    external_id = message_id
                if block.name(source, external_id, message_id):
                    dedup.note(source, external_id)
                run.append(d)
                # A message costs its payload and length in the batch; headers about their text.
                size += (
                    len(d.payload)
                    + 4
                    + (sum(len(k) + len(v) for k, v in d.headers.items()) if d.headers else 0)
                )
                added += 1
                results.append(Appended(message_id, False))
                if len(block.ids) + len(run) >= max_messages or size >= max_bytes:
                    done, run = run, []
                    _add_batch(block, done, run_first, now, own)
                    self.rotate()
                    block = None
        finally:
            # Also when a dedup lookup was cancelled: what was added stays, as a batch.
            if run and block is not None:
                done, run = run, []
                _add_batch(block, done, run_first, now, own)
        if added:
            self.last_id = self.next_id - 1
            dedup.note(own, self.last_id)
            self.counters.produced += added
            self.arrived.set()
            self.arrived = asyncio.Event()
        self.counters.duplicates += len(results) - added
        return results

    async def assign_batch(
        self,
        batch: RecordBatch,
        sources: Sequence[str] | None,
        external_ids: Sequence[int | None] | None,
        now: float,
    ) -> list[Appended]:
        """Append a producer's record batch as it came (holding the write lock).

        ``batch`` has the server's time and source already (not its ids); ``sources`` and
        ``external_ids`` are its messages' as given (``record_batch.decode_given``), each None
        when every message has the default (the server's name; its own id). Dedup looks up
        only the explicit external ids; the duplicates are cut out (``record_batch.select``),
        and what is left is stamped with its ids and appended without decoding or encoding a
        message. A block that fills up takes the messages that fit and the next block the rest.
        """
        n = batch.count
        if self.next_id + n > self.lease_until:
            await self.extend_lease(n)
        own, dedup = self.own, self.dedup
        # Per message: None to append it, an Appended for a stored duplicate, or the index of
        # the message earlier in this batch that it repeats.
        found: list[Appended | int | None] = [None] * n
        if external_ids is not None:
            seen: dict[tuple[str, int], int] = {}
            for i, external_id in enumerate(external_ids):
                if external_id is None:
                    continue
                key = (own if sources is None else sources[i], external_id)
                earlier = seen.get(key)
                if earlier is not None:
                    found[i] = earlier
                    continue
                stored = await dedup.find(*key)
                if stored is not None:
                    found[i] = Appended(stored, True)
                else:
                    seen[key] = i
            kept = [i for i, f in enumerate(found) if f is None]
        else:
            kept = list(range(n))  # no identity given: none can be a duplicate
        # The kept messages take the ids from here on, in order, across blocks.
        base = self.next_id
        limits = self.definition.block
        start = 0
        while start < len(kept):
            block = self.open_block
            if block is not None and block.is_full(self.definition, now):
                self.rotate()
                block = None
            first_id = self.next_id
            if block is None:
                block = self.open_block = OpenBlock(first_id, now, self._journal_key(first_id), own)
                self.refresh_recent()
            room = limits.max_messages - len(block.ids)
            take = kept[start : start + room]
            if len(take) == n:
                data = record_batch.stamp(batch, first_id, now, own)
            else:
                piece = [False] * n
                for i in take:
                    piece[i] = True
                cut = record_batch.select(batch, piece, first_id)
                assert cut is not None
                data = cut
            block.add_batch(record_batch.framed(data))
            if sources is not None or external_ids is not None:
                for message_id, i in enumerate(take, first_id):
                    source = own if sources is None else sources[i]
                    given = None if external_ids is None else external_ids[i]
                    external_id = message_id if given is None else given
                    if block.name(source, external_id, message_id):
                        dedup.note(source, external_id)
            self.next_id = first_id + len(take)
            block.size += len(data)
            start += len(take)
            if len(block.ids) >= limits.max_messages or block.size >= limits.max_bytes:
                self.rotate()
        results: list[Appended]
        if len(kept) == n:
            results = list(map(Appended, range(base, base + n), itertools.repeat(False)))
        else:
            ids = dict(zip(kept, itertools.count(base)))
            results = []
            for i, f in enumerate(found):
                if f is None:
                    results.append(Appended(ids[i], False))
                elif isinstance(f, int):
                    results.append(Appended(ids[f], True))
                else:
                    results.append(f)
        if kept:
            self.last_id = self.next_id - 1
            dedup.note(own, self.last_id)
            self.counters.produced += len(kept)
            self.arrived.set()
            self.arrived = asyncio.Event()
        self.counters.duplicates += n - len(kept)
        return results

    async def append_released(self, drafts: list[Draft], new: bool) -> list[Appended]:
        """Append delayed messages that fell due; answered once they are durable.

        They were validated when they were scheduled; the queue's definition may have changed
        since, but refusing them now would keep them in the schedule forever. ``new`` says the
        schedule knows none of them can be in the log yet (the dedup lookup is skipped).
        """
        if self.closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        if self.sealer_behind:
            await self.wait_for_sealer()
        await self.lock()
        try:
            results = await self.assign(drafts, self._clock(), check=not new)
        finally:
            self.unlock()
        await self.commit(urgent=False)
        return results

    def _journal_key(self, first_id: int) -> str:
        return keys.journal(self._store.name, first_id)

    async def extend_lease(self, needed: int) -> None:
        # Persist the lease before any id under it is answered: after a crash, numbering
        # resumes above it, so an answered id is never reused (at the cost of a gap).
        lease = self.next_id + needed + self._settings.id_lease
        await self.save_state(lease)
        self.lease_until = lease

    async def save_state(self, lease_until: int) -> None:
        try:
            await self.put_state(lease_until)
        except CapellaError as exc:
            self.set_fault("state", exc.message)
            raise
        self.clear_fault("state")

    async def put_state(self, lease_until: int) -> None:
        await self._store.meta.put(
            keys.of(self._store.name, keys.STATE), orjson.dumps({"version": 1, "lease_until": lease_until})
        )

    def rotate(self) -> None:
        if self.open_block is not None and self.open_block.ids:
            self.sealing.append(self.open_block)
            self.open_block = None
            self.refresh_recent()
            self.want_seal()

    def want_flush(self) -> None:
        self.flush_wanted.set()
        self.flusher.start()

    def want_seal(self) -> None:
        self.seal_wanted.set()
        self.sealer.start()

    def refresh_recent(self) -> None:
        self.dedup.recent = self.in_memory()

    def in_memory(self) -> list[OpenBlock]:
        """The blocks not sealed yet, oldest first."""
        return [*self.sealing, *([self.open_block] if self.open_block is not None else [])]

    def pending(self) -> bool:
        return any(b.pending for b in self.in_memory())

    def pending_bytes(self) -> int:
        """Bytes added to the journals' buffers and not written yet (``none`` and ``mark`` writes)."""
        return sum(len(chunk) for b in self.in_memory() for chunk in b.pending)

    # --- flushing (group commit) -----------------------------------------------------------

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
                self.want_flush()
            await waiter
        finally:
            expiry.cancel()

    def _expire(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            # The flush goes on: what it covers may still be saved, so say the outcome is unknown.
            waiter.set_exception(
                StorageTimeout(
                    f"queue {self.name}: the write was not saved within {self._settings.write_timeout:g}s "
                    f"({self.fault_text()}); it may still be saved"
                )
            )

    async def run_flusher(self) -> None:
        """Start flushes while writers ask (up to ``MAX_FLUSHES`` at once), then end. A failed
        flush fails its writers (and those of every flush after it) and raises to the
        supervisor; the restarted loop retries what is still pending without a new writer."""
        delay = self._settings.wait_max_delay
        while True:
            if "journal" not in self.faults and not self.flush_wanted.is_set():
                return  # idle: the next commit starts the flusher again
            self.flush_wanted.clear()
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

    async def flush_journals(self) -> None:
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
            and not self.flusher.running
            and "journal" not in self.faults
            and self._unreported is None
            and not self.closing
        )

    def _start_flush(self, waiters: list[asyncio.Future[None]]) -> _Flush:
        """Take what is pending (in order, with no await) and flush it after the flushes in flight."""
        self.marked = False
        chunks = []
        for block in self.in_memory():
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
            flush.task = asyncio.create_task(self._run_flush(flush), name=f"flush:{self.name}")
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
                self.set_fault("journal", error.message)
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
                self.counters.flushes += 1
                self._flush_latency.observe(time.perf_counter() - started)
            if "journal" in self.faults and self._broken is None:
                self.clear_fault("journal")
            for w in flush.waiters:
                if not w.done():
                    w.set_result(None)
        else:
            self._failed.append(flush)
            fail(flush.waiters, error, f"queue {self.name}")
        self._flushes.remove(flush)
        if self._broken is not None and not self._flushes:
            self._requeue_failed()
        flush.done.set_result(error)
        if error is not None:
            self.want_flush()  # the flusher reports it and retries

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

    async def tick(self) -> None:
        """Seal an open block past its age, probe a failed step, save marked writes."""
        if self.open_block is not None and self.open_block.is_full(self.definition, self._clock()):
            self.rotate()
        if "state" in self.faults or ("journal" in self.faults and not self.pending()):
            # Nothing left to retry: probe the meta mount with a harmless write of the state,
            # so the queue says it accepts writes again as soon as it does.
            await self.save_state(self.lease_until)
            self.clear_fault("journal")
        if self.marked:
            await self.commit(urgent=True)

    # --- sealing ---------------------------------------------------------------------------

    async def run_sealer(self) -> None:
        """Seal full blocks one at a time until none is left (supervised: a failed seal backs
        off and retries)."""
        while self.sealing and not self.closing:
            # A writer that sets it from now on gets a retry without the backoff.
            self.seal_wanted.clear()
            try:
                await self._seal_first()
                self.clear_fault("seal")
            finally:
                self._seal_tried.set()
                self._seal_tried = asyncio.Event()

    async def _seal_first(self) -> None:
        block = self.sealing[0]
        # Also when nothing is pending: a flush may be writing this block's journal right now,
        # and closing the journal under it would fail writers whose records the block holds.
        await self.commit(urgent=True)
        # Encoding and the Bloom filter take ~30 ms for a full block: keep them off the loop.
        data, summary, batch = await asyncio.to_thread(_encode_sealed, block)
        meta = BlockMeta(
            first_id=block.ids[0],
            last_id=block.ids[-1],
            count=len(block.ids),
            bytes=len(data),
            mark=0,
            created=block.opened_at,
            sealed=self._clock(),
            key=self._store.block_key(block.ids[0], block.ids[-1]),
        )
        store = self._store
        await store.put_block(meta, data, summary)
        async with store.manifest_lock:
            await store.save_manifest([*store.sealed, meta])
            # No await from here to the end of the swap: a reader sees the block exactly once.
            store.adopt(meta, batch, summary)
            self.sealing.pop(0)
            self._seal_done.set()
            self._seal_done = asyncio.Event()
            self.refresh_recent()
        self.counters.sealed_blocks += 1
        log.info(
            "block sealed queue=%s first_id=%d messages=%d bytes=%d",
            self.name,
            meta.first_id,
            meta.count,
            meta.bytes,
        )
        if block.journal is not None:
            await block.journal.close()
            block.journal = None
        await store.meta.delete(block.journal_key)

    # --- closing ---------------------------------------------------------------------------

    def wake_waiters(self) -> None:
        """Closing: wake long-polling readers and writers waiting for the sealer."""
        self.arrived.set()
        self._seal_done.set()

    async def close_journals(self) -> None:
        """Closing, last step: fail writers still waiting and close every journal."""
        for w in self._waiters:
            if not w.done():
                w.set_exception(ShuttingDown("the queue is closing"))
        for block in self.in_memory():
            if block.journal is not None:
                await block.journal.close()
                block.journal = None


def _ends(appends: Sequence[tuple[OpenBlock, Journal, object]]) -> list[tuple[OpenBlock, int]]:
    """Each journal's size now, just after a flush's append: before any later flush appends."""
    return [(block, journal.size) for block, journal, _ in appends]


def _add_batch(block: OpenBlock, drafts: list[Draft], first_id: int, now: float, own: str) -> None:
    """Encode ``drafts``, given the ids from ``first_id`` on, as one record batch of ``block``.

    A batch that cannot be encoded (a source or header past its length field) takes its
    messages' identities out of the block again before the error goes to the writer.
    """
    try:
        data = drafts_batch(drafts, base_id=first_id, base_time=now, source=own)
        block.add_batch(record_batch.framed(data))
    except BaseException:
        block.forget_names_from(first_id)
        raise
    block.size += len(data)


def _encode_sealed(block: OpenBlock) -> tuple[bytes, BlockSummary, Batch]:
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
