"""The write path of one queue: ids, the write lock, the blocks still in memory, and sealing.

Each call's messages are encoded at once as one record batch per block they go to
(``capella.records.record_batch``) and added to the open block (``open_block.OpenBlock``),
pending until a flush appends them to the block's journal and fsyncs it
(``flush.JournalFlusher``: ``wait`` and ``immediate`` writes join the next flush, so
concurrent writers share one fsync). A full block moves to ``sealing``; the sealer writes it
once as an immutable block, has the block store record it in the manifest, and deletes its
journal. Ids come from a lease persisted ahead of use (``<q>/state.json``), so an id that was
ever answered is never handed out again, even after ``kill -9``.

A step that fails (journal, seal, state) is a *fault*: the queue says it cannot accept
writes until the step next succeeds.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import orjson

from capella.config import StorageSettings
from capella.core.definition import QueueSettings
from capella.core.log.blocks import BlockMeta, BlockStore
from capella.core.log.flush import JournalFlusher
from capella.core.log.open_block import OpenBlock, encode_sealed
from capella.core.loops import Loop, TaskFailures, first_of
from capella.core.message import Draft
from capella.core.stats import Histogram, QueueCounters
from capella.errors import CapellaError, ShuttingDown, StorageTimeout, StorageUnavailable
from capella.records import record_batch
from capella.records.record_batch import RecordBatch
from capella.storage import keys

log = logging.getLogger(__name__)

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


class Writer:
    """Ids, the blocks still in memory (``sealing`` then ``open_block``) and their journals.

    The flusher and the sealer are supervised loops that run only while there is work: a
    commit starts the flusher, a full block the sealer, and each ends when it has nothing
    left to do. ``journals.wanted`` and ``seal_wanted`` say there is work (and cut a restart's
    backoff short); ``stopping`` is the queue's, set when it closes.
    """

    def __init__(
        self,
        name: str,
        definition: QueueSettings,
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
        self._clock = clock
        self._stopping = stopping

        self.sealing: list[OpenBlock] = []
        self.open_block: OpenBlock | None = None
        self.last_id = 0
        self.next_id = 1
        self.lease_until = 1  # ids below this may have been answered already
        self.arrived = asyncio.Event()  # set (and replaced) when messages are added

        self.seal_wanted = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._seal_done = asyncio.Event()
        self._seal_tried = asyncio.Event()  # set (and replaced) after every seal attempt

        self._task_failures = task_failures
        self.journals = JournalFlusher(self, store, settings, flush_latency)
        self.flusher = self.journals.loop
        self.sealer = self.supervised("seal", self.run_sealer, "seal", self.seal_wanted)

    def supervised(
        self, kind: str, body: Callable[[], Awaitable[None]], step: str, wake: asyncio.Event
    ) -> Loop:
        """A supervised loop whose failure is a fault of ``step``."""
        return Loop(
            f"{kind}:{self.name}",
            body,
            failures=self._task_failures,
            report=lambda message: self.set_fault(step, message),
            stopping=self._stopping,
            wake=wake,
        )

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
                    block.add_drafts(done, run_first, now)
                    self.rotate()
                    block = None
        finally:
            # Also when a dedup lookup was cancelled: what was added stays, as a batch.
            if run and block is not None:
                done, run = run, []
                block.add_drafts(done, run_first, now)
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
        *,
        whole: bool = False,
    ) -> list[Appended]:
        """Append a producer's record batch as it came (holding the write lock).

        ``batch`` has the server's time and source already (not its ids); ``sources`` and
        ``external_ids`` are its messages' as given (``record_batch.decode_given``), each None
        when every message has the default (the server's name; its own id). Dedup looks up
        only the explicit external ids; the duplicates are cut out (``record_batch.select``),
        and what is left is stamped with its ids and appended without decoding or encoding a
        message. A block that fills up takes the messages that fit and the next block the rest.

        ``whole``: the batch goes to one block, the open one sealed first if the batch does not
        fit in what is left of it; a batch larger than a block makes a block of its own (as a
        block's last batch may take it past its byte limit). The two pieces of a split batch
        go to two journals, saved one after the other: a ``kill -9`` between them keeps the
        first piece only, and a producer that answers a batch with one offset (Kafka: the
        base offset; its messages are base + i) cannot be answered right when it sends the
        batch again (its first piece keeps its ids, the rest gets new ones).
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
            if whole:
                if block.ids and room < len(kept):
                    self.rotate()
                    continue
                room = len(kept)
            take = kept[start : start + room]
            # As ``assign`` does: the identities first, then the batch, in one step of the
            # batch format; a piece that cannot be added takes its identities out again.
            if sources is not None or external_ids is not None:
                for message_id, i in enumerate(take, first_id):
                    source = own if sources is None else sources[i]
                    given = None if external_ids is None else external_ids[i]
                    external_id = message_id if given is None else given
                    if block.name(source, external_id, message_id):
                        dedup.note(source, external_id)
            try:
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
            except BaseException:
                block.forget_names_from(first_id)
                raise
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

    def want_seal(self) -> None:
        self.seal_wanted.set()
        self.sealer.start()

    def refresh_recent(self) -> None:
        self.dedup.recent = self.in_memory()

    def in_memory(self) -> list[OpenBlock]:
        """The blocks not sealed yet, oldest first."""
        return [*self.sealing, *([self.open_block] if self.open_block is not None else [])]

    # --- flushing (group commit): ``self.journals`` ---------------------------------------

    @property
    def marked(self) -> bool:
        """A ``mark`` write waits for the next periodic flush."""
        return self.journals.marked

    @marked.setter
    def marked(self, value: bool) -> None:
        self.journals.marked = value

    async def commit(self, *, urgent: bool) -> None:
        """Answer once everything added so far is in a journal, fsync'd."""
        await self.journals.commit(urgent=urgent)

    async def flush_journals(self) -> None:
        """Write and fsync everything pending now; return once it and every earlier flush is durable."""
        await self.journals.flush()

    def pending_bytes(self) -> int:
        """Bytes added to the journals' buffers and not written yet (``none`` and ``mark`` writes)."""
        return self.journals.pending_bytes()

    async def tick(self) -> None:
        """Seal an open block past its age, probe a failed step, save marked writes."""
        if self.open_block is not None and self.open_block.is_full(self.definition, self._clock()):
            self.rotate()
        if "state" in self.faults or ("journal" in self.faults and not self.journals.pending()):
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
        data, summary, batch = await asyncio.to_thread(encode_sealed, block)
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
        self.journals.fail_waiters()
        for block in self.in_memory():
            if block.journal is not None:
                await block.journal.close()
                block.journal = None
