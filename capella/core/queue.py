"""A queue: an append-only log of messages split into blocks, with its write, read and recovery paths.

Writes go to the open block: each record is encoded at once and kept in ``pending`` until a
flush appends it to the block's journal and fsyncs it. ``wait`` and ``immediate`` writes
join the next flush (group commit: concurrent writers share one fsync). A full block moves
to ``sealing``; a background task writes it once as an immutable sealed object, records it
in the manifest and deletes its journal. Ids come from a lease persisted ahead of use, so an
id that was ever answered is never handed out again, even after ``kill -9``.

Keys on the queue's mounts (``<q>`` is the queue name):
``<q>/manifest.json``, ``<q>/state.json``, ``<q>/subscriptions.json``,
``<q>/journal/<first-id>.log``, ``<q>/summaries/<first-id>.sum`` on the meta mount and
``<q>/blocks/<first-id>-<last-id>.blk`` on the mount of the block's mark.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from capella.config import StorageSettings
from capella.core.codec import (
    JOURNAL_HEADER,
    block_keys,
    decode_block,
    decode_journal,
    encode_block,
    encode_record,
)
from capella.core.dedup import BlockSummary, DedupIndex
from capella.core.definition import I64_MAX, I64_MIN, QueueDefinition
from capella.core.message import Draft, Message, SaveMode
from capella.core.retry import RetryPolicy
from capella.core.schedule import Schedule, Scheduled
from capella.core.stats import Histogram, QueueCounters
from capella.core.subscription import ACK, Subscription, Subscriptions
from capella.core.task import TaskFailures, supervise
from capella.core.work import WorkQueue
from capella.errors import (
    CapellaError,
    Conflict,
    CorruptData,
    InvalidMessage,
    InvalidRequest,
    KeyNotFound,
    QueueNotFound,
    ShuttingDown,
    StorageTimeout,
    StorageUnavailable,
    WrongSubscriptionMode,
)
from capella.storage import Journal, Storage

log = logging.getLogger(__name__)

# An external_time this far ahead of our clock is "in the future" (clocks of two clusters
# are never exactly equal, and a copy must not be refused for a few milliseconds of skew).
FUTURE_SKEW = 5.0
# Sealed blocks whose contents stay in memory after a read (the unload handler trims more).
LOADED_BLOCKS = 4
# Full blocks waiting for the sealer; writers wait beyond this (at most
# ``storage.write_timeout``) so memory stays bounded when the disk is slower than the producers.
MAX_SEALING = 2
KEY_SETS = 8
# A filtered read stops scanning after this many messages and answers with what it has.
SCAN_LIMIT = 100_000
# The releaser of delayed messages looks at the clock at least this often (an injected clock
# may jump; a chunk of far-future items must be read in before its items fall due).
RELEASE_POLL = 1.0


class Appended(NamedTuple):
    id: int
    duplicate: bool


class Delayed(NamedTuple):
    """A message that waits in the schedule; it gets its id when it is delivered."""

    scheduled: int
    deliver_at: float
    duplicate: bool

    @property
    def id(self) -> int:
        return 0


class ReadResult(NamedTuple):
    messages: list[Message]
    last_id: int


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


@dataclass(slots=True)
class OpenBlock:
    """A block still taking writes (or waiting to be sealed), held in memory with its journal."""

    first_id: int
    opened_at: float
    journal_key: str
    ids: list[int] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    keys: dict[tuple[str, int], int] = field(default_factory=dict)
    size: int = 0
    pending: list[bytes] = field(default_factory=list)
    journal: Journal | None = None
    durable_size: int = 0

    def add(self, message: Message, record: bytes) -> None:
        self.ids.append(message.id)
        self.messages.append(message)
        self.keys[(message.source, message.external_id)] = message.id
        self.size += len(record)
        self.pending.append(record)

    def is_full(self, definition: QueueDefinition, now: float) -> bool:
        limits = definition.block
        return bool(self.ids) and (
            len(self.ids) >= limits.max_messages
            or self.size >= limits.max_bytes
            or now - self.opened_at >= limits.max_age
        )


@dataclass(slots=True)
class Recovery:
    """What recovery found; shown in the queue's stats."""

    truncated_bytes: int = 0
    quarantined: list[str] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "truncated_bytes": self.truncated_bytes,
            "quarantined_blocks": list(self.quarantined),
            "gaps": [{"from_id": lo, "to_id": hi} for lo, hi in self.gaps],
        }


class Queue:
    """One queue. Build it with ``await Queue.open(...)``; ``close`` flushes everything."""

    def __init__(
        self,
        name: str,
        definition: QueueDefinition,
        mounts: dict[str, Storage],
        *,
        cluster_name: str,
        settings: StorageSettings,
        flush_latency: Histogram | None = None,
        task_failures: TaskFailures | None = None,
        clock: Callable[[], float] = time.time,
        lookup: Callable[[str], Queue] | None = None,
    ) -> None:
        self.name = name
        self.definition = definition
        self.counters = QueueCounters()
        self.recovery = Recovery()
        self.last_error: str | None = None
        # What keeps the queue from accepting writes now, by step ("journal", "seal", "state"):
        # (error, since). Set when a write step fails, cleared when it next succeeds.
        self.faults: dict[str, tuple[str, float]] = {}
        self._task_failures = task_failures or TaskFailures()
        self._mounts = mounts
        self._cluster_name = cluster_name
        self._settings = settings
        self._flush_latency = flush_latency or Histogram()
        self._clock = clock
        self._lookup = lookup

        self._sealed: list[BlockMeta] = []
        self._firsts: list[int] = []
        self._sealing: list[OpenBlock] = []
        self._open: OpenBlock | None = None
        self._last_id = 0
        self._deleted_through = 0  # highest id of any block deleted (expired) so far
        self._next_id = 1
        self._lease_until = 1  # ids below this may have been answered already

        self._loaded: OrderedDict[int, tuple[list[int], list[Message]]] = OrderedDict()
        self._used: dict[int, float] = {}  # first id of a loaded block -> when it was last read
        self._blocks_lock = asyncio.Lock()  # moves, deletes and leftover clean-up, one at a time
        # A crash (before this start) or a failed move or delete may have left copies behind.
        self._leftovers_possible = True
        self._loading: dict[int, asyncio.Task[tuple[list[int], list[Message]]]] = {}
        self._key_sets: OrderedDict[int, dict[tuple[str, int], int]] = OrderedDict()
        self._dedup = DedupIndex(self._keys_of_block)
        self._subs = Subscriptions()
        self._work: dict[str, WorkQueue] = {}
        self.schedule = Schedule(
            self._meta, self._key("schedule"), release=self._append_released, clock=clock
        )

        self._write_lock = asyncio.Lock()
        self._flush_lock = asyncio.Lock()
        self._manifest_lock = asyncio.Lock()
        self._subs_lock = asyncio.Lock()
        self._arrived = asyncio.Event()
        self._committed = asyncio.Event()  # set (and replaced) on every cursor change
        self._flush_wanted = asyncio.Event()
        self._seal_wanted = asyncio.Event()
        self._seal_done = asyncio.Event()
        self._seal_tried = asyncio.Event()  # set (and replaced) after every seal attempt
        self._waiters: list[asyncio.Future[None]] = []
        self._urgent = False
        self._marked = False
        self._subs_marked = False
        self._closing = False
        self._stopping = asyncio.Event()  # set by close; wakes loops that back off
        self._tasks: list[asyncio.Task[None]] = []

    # --- keys ------------------------------------------------------------------------------

    @property
    def _meta(self) -> Storage:
        return self._mounts[self.definition.meta_mount]

    def _key(self, *parts: str) -> str:
        return "/".join((self.name, *parts))

    def _journal_key(self, first_id: int) -> str:
        return self._key("journal", f"{first_id:020d}.log")

    def _summary_key(self, first_id: int) -> str:
        return self._key("summaries", f"{first_id:020d}.sum")

    # --- opening and closing ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        name: str,
        definition: QueueDefinition,
        mounts: dict[str, Storage],
        *,
        cluster_name: str,
        settings: StorageSettings,
        flush_latency: Histogram | None = None,
        task_failures: TaskFailures | None = None,
        clock: Callable[[], float] = time.time,
        lookup: Callable[[str], Queue] | None = None,
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
        )
        await queue._recover()
        await queue.schedule.open(first_new_sid=queue._next_id)
        queue._tasks = [
            queue._supervised("flush", queue._run_flusher, wake=queue._flush_wanted),
            queue._supervised("seal", queue._run_sealer, wake=queue._seal_wanted),
            queue._supervised("release", queue._run_releaser),
        ]
        return queue

    def _supervised(
        self, kind: str, body: Callable[[], Awaitable[None]], wake: asyncio.Event | None = None
    ) -> asyncio.Task[None]:
        """Run ``body`` as a supervised task; a flush or seal that fails is a write fault.

        Between restarts it waits for the backoff, or less when the queue closes or ``wake``
        is set: a new writer retries a failed flush or seal at once and gets its outcome.
        """
        task = f"{kind}:{self.name}"
        step = {"flush": "journal", "seal": "seal"}.get(kind)

        async def pause(seconds: float) -> None:
            waits = [self._stopping.wait(), *([wake.wait()] if wake is not None else [])]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await _first_of(*waits)

        def report(message: str) -> None:
            if step is None:
                self.last_error = message
            else:
                self._set_fault(step, message)

        return asyncio.create_task(
            supervise(task, body, failures=self._task_failures, report=report, sleep=pause), name=task
        )

    # --- faults ----------------------------------------------------------------------------

    def _set_fault(self, step: str, message: str) -> None:
        self.last_error = message
        since = self.faults[step][1] if step in self.faults else self._clock()
        if step not in self.faults:
            log.error("queue cannot accept writes queue=%s step=%s: %s", self.name, step, message)
        self.faults[step] = (message, since)

    def _clear_fault(self, step: str) -> None:
        if self.faults.pop(step, None) is not None:
            log.info("queue accepts writes again queue=%s step=%s", self.name, step)

    @property
    def write_fault(self) -> str | None:
        """Why the queue cannot accept writes now, or None when it can."""
        if not self.faults:
            return None
        step, (message, _) = min(self.faults.items(), key=lambda item: item[1][1])
        return f"{step}: {message}"

    async def _recover(self) -> None:
        try:
            manifest = orjson.loads(await self._meta.get(self._key("manifest.json")))
            self._sealed = [BlockMeta(**b) for b in manifest["blocks"]]
            self._deleted_through = int(manifest.get("deleted_through", 0))
        except KeyNotFound:
            self._sealed = []
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CorruptData(f"queue {self.name}: manifest is not valid: {exc}") from None
        self._sealed.sort(key=lambda b: b.first_id)
        self._firsts = [b.first_id for b in self._sealed]
        for meta in self._sealed:
            if meta.state == "quarantined":
                self._report_quarantine(meta, "recorded in the manifest")
        try:
            state = orjson.loads(await self._meta.get(self._key("state.json")))
            self._lease_until = int(state["lease_until"])
        except KeyNotFound:
            pass
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptData(f"queue {self.name}: state is not valid: {exc}") from None

        # A journal may outlive its block (a crash before its delete); its records are in a
        # sealed block, or were, if that block has expired since: never replay them.
        sealed_last = max(self._sealed[-1].last_id if self._sealed else 0, self._deleted_through)
        for meta in self._sealed:
            if meta.state == "sealed":
                await self._load_summary(meta)

        blocks = await self._recover_journals(sealed_last)
        for block in blocks:
            for (source, ext), _ in block.keys.items():
                self._dedup.note(source, ext)
        if blocks:
            self._open = blocks.pop()
            self._sealing = blocks
            if self._open.is_full(self.definition, self._clock()):
                self._sealing.append(self._open)
                self._open = None
        self._refresh_recent()

        self._last_id = max(sealed_last, *(b.ids[-1] for b in self._blocks_in_memory()), 0)
        self._next_id = max(self._last_id + 1, self._lease_until)
        await self._extend_lease(0)

        try:
            self._subs.load(await self._meta.get(self._key("subscriptions.json")))
            self._subs.saved_version = self._subs.version
        except KeyNotFound:
            pass
        for sub in self._subs.all():
            if sub.mode == ACK and sub.policy is not None:
                work = self._new_work(sub.name, sub.policy)
                await work.open()
                self._work[sub.name] = work
        log.info(
            "queue recovered queue=%s last_id=%d sealed_blocks=%d open_messages=%d truncated_bytes=%d",
            self.name,
            self._last_id,
            len(self._sealed),
            sum(len(b.ids) for b in self._blocks_in_memory()),
            self.recovery.truncated_bytes,
        )

    async def _recover_journals(self, sealed_last: int) -> list[OpenBlock]:
        blocks: list[OpenBlock] = []
        for key in await self._meta.list(self._key("journal", "")):
            data = await self._meta.get(key)
            try:
                scan = decode_journal(data)
            except CorruptData as exc:
                # The header itself is bad: keep the bytes for an operator, never read them as data.
                await self._meta.put(self._key("quarantine", key.rsplit("/", 1)[-1]), data)
                await self._meta.delete(key)
                self.recovery.quarantined.append(key)
                log.error("journal quarantined queue=%s key=%s reason=%s", self.name, key, exc.message)
                continue
            if scan.torn:
                self.recovery.truncated_bytes += len(data) - scan.valid_length
                log.warning(
                    "journal tail truncated queue=%s key=%s dropped_bytes=%d reason=%s",
                    self.name,
                    key,
                    len(data) - scan.valid_length,
                    scan.reason,
                )
            messages = [m for m in scan.messages if m.id > sealed_last]
            if not messages:
                # Its block was sealed before the crash; only the delete was missing.
                await self._meta.delete(key)
                continue
            if len(messages) != len(scan.messages):
                log.warning("journal overlaps sealed blocks queue=%s key=%s", self.name, key)
            first = int(key.rsplit("/", 1)[-1].split(".", 1)[0])
            block = OpenBlock(first_id=first, opened_at=messages[0].time, journal_key=key)
            for m in messages:
                block.add(m, b"")
            block.pending.clear()
            block.journal = await self._meta.journal(key, truncate_to=scan.valid_length)
            block.durable_size = block.journal.size
            block.size = scan.valid_length - len(JOURNAL_HEADER)
            blocks.append(block)
        return blocks

    async def close(self) -> None:
        """Finish the seal in progress, flush every write and cursor, then stop."""
        if self._closing:
            return
        self._closing = True
        self._stopping.set()
        self._arrived.set()
        self._committed.set()
        self._seal_done.set()
        flusher, sealer, releaser = self._tasks or (None, None, None)
        # The tasks stop on their own between steps; cancelling one mid-write would leave a
        # half-written temporary file and an open descriptor behind. The releaser and the
        # sealer go first: they may still need the flusher to complete a journal write.
        for task, wake in (
            (releaser, self.schedule.changed),
            (sealer, self._seal_wanted),
            (flusher, self._flush_wanted),
        ):
            if task is not None:
                wake.set()
                (result,) = await asyncio.gather(task, return_exceptions=True)
                if isinstance(result, BaseException):
                    log.error("background task failed queue=%s", self.name, exc_info=result)
        await asyncio.gather(*self._loading.values(), return_exceptions=True)
        try:
            await self._flush_journals()
            await self._save_subscriptions()
            await self.schedule.close()
            for work in self._work.values():
                await work.close()
            # Every id handed out is below next_id now, so a clean restart continues without a gap.
            await self._meta.put(
                self._key("state.json"), orjson.dumps({"version": 1, "lease_until": self._next_id})
            )
        finally:
            for w in self._waiters:
                if not w.done():
                    w.set_exception(ShuttingDown("the queue is closing"))
            for block in self._blocks_in_memory():
                if block.journal is not None:
                    await block.journal.close()
                    block.journal = None

    async def destroy(self) -> None:
        """Close the queue and delete every key it has on every mount."""
        await self.close()
        for mount in {self.definition.meta_mount, *self.definition.marks.values()}:
            storage = self._mounts[mount]
            for key in await storage.list(self._key("")):
                await storage.delete(key)

    # --- writing ---------------------------------------------------------------------------

    async def append(
        self, drafts: Sequence[Draft], save: SaveMode = SaveMode.DEFAULT
    ) -> list[Appended | Delayed]:
        """Store new messages (dedup by identity) and answer once ``save`` is satisfied."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        now = self._clock()
        self._validate(drafts, now)
        mode = save.resolve(self.definition.save)
        self.counters.produce_requests += 1
        if len(self._sealing) >= MAX_SEALING:
            await self._wait_for_sealer()
        later = [i for i, d in enumerate(drafts) if d.deliver_at is not None and d.deliver_at > now]
        results: list[Appended | Delayed]
        await self._lock_writes()
        try:
            if later:
                results = await self._assign_mixed(drafts, later, now)
            else:
                results = list(await self._assign(drafts, now))
        finally:
            self._write_lock.release()
        if mode is SaveMode.IMMEDIATE or mode is SaveMode.WAIT:
            if later:
                await asyncio.gather(
                    self._commit(urgent=mode is SaveMode.IMMEDIATE), self.schedule.save(mode)
                )
            else:
                await self._commit(urgent=mode is SaveMode.IMMEDIATE)
        elif mode is SaveMode.MARK:
            self._marked = True
            self.schedule.mark()
        if later:
            await self.schedule.spill_if_needed()
        return results

    async def _assign_mixed(
        self, drafts: Sequence[Draft], later: list[int], now: float
    ) -> list[Appended | Delayed]:
        """Append the drafts due now and schedule the others, answering in request order."""
        waiting = set(later)
        at_once = [d for i, d in enumerate(drafts) if i not in waiting]
        appended = iter(await self._assign(at_once, now))
        if self._next_id + len(later) > self._lease_until:
            await self._extend_lease(len(later))
        results: list[Appended | Delayed] = []
        own = self._cluster_name
        for index, d in enumerate(drafts):
            if index not in waiting:
                results.append(next(appended))
                continue
            source = own if d.source is None else d.source
            if d.external_id is not None:
                found = await self._dedup.find(source, d.external_id)
                if found is not None:
                    results.append(Appended(found, True))
                    continue
                existing = await self.schedule.find((source, d.external_id))
                if existing is not None:
                    results.append(Delayed(existing.sid, existing.due, True))
                    continue
            # The schedule id is a message id that no message will ever get: it can stand in
            # for the external id without clashing with a message produced here.
            sid = self._next_id
            self._next_id = sid + 1
            assert d.deliver_at is not None
            self.schedule.stage(
                Scheduled(
                    sid,
                    d.deliver_at,
                    now,
                    source,
                    d.external_id,
                    d.external_time,
                    d.segment,
                    d.payload,
                    d.headers,
                )
            )
            results.append(Delayed(sid, d.deliver_at, False))
        return results

    async def _append_released(self, drafts: list[Draft], new: bool) -> list[Appended]:
        """Append delayed messages that fell due; answered once they are durable.

        They were validated when they were scheduled; the queue's definition may have changed
        since, but refusing them now would keep them in the schedule forever. ``new`` says the
        schedule knows none of them can be in the log yet (the dedup lookup is skipped).
        """
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        if len(self._sealing) >= MAX_SEALING:
            await self._wait_for_sealer()
        await self._lock_writes()
        try:
            results = await self._assign(drafts, self._clock(), check=not new)
        finally:
            self._write_lock.release()
        await self._commit(urgent=False)
        return results

    async def _run_releaser(self) -> None:
        """Deliver delayed messages as they fall due (supervised: a failure backs off and retries)."""
        schedule = self.schedule
        while not self._closing:
            schedule.changed.clear()
            try:
                await schedule.release_due(self._clock())
            except ShuttingDown:
                return
            due = schedule.next_due()
            # Nothing scheduled: sleep until something is.
            delay = None if due is None else min(RELEASE_POLL, max(0.0, due - self._clock()))
            if delay == 0.0 or self._closing:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await schedule.changed.wait()

    async def reschedule(self, sid: int, deliver_at: float, save: SaveMode = SaveMode.DEFAULT) -> Scheduled:
        """Move a scheduled message to ``deliver_at`` (a time in the past releases it at once)."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        return await self.schedule.reschedule(sid, deliver_at, save.resolve(self.definition.save))

    async def cancel_scheduled(self, sids: Sequence[int], save: SaveMode = SaveMode.DEFAULT) -> list[int]:
        """Cancel scheduled messages; answers the sids that were still waiting."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        return await self.schedule.cancel(sids, save.resolve(self.definition.save))

    async def _wait_for_sealer(self) -> None:
        """Wait until the backlog of full blocks has room, at most ``storage.write_timeout``.

        While sealing fails, the writer asks for one retry at once and gets its outcome: the
        storage error right away, or room to write if the fault has cleared.
        """
        try:
            async with asyncio.timeout(self._settings.write_timeout):
                while len(self._sealing) >= MAX_SEALING and not self._closing:
                    failing = self.faults.get("seal")
                    if failing is not None:
                        self._seal_wanted.set()
                    await _first_of(self._seal_done.wait(), self._seal_tried.wait())
                    if failing is not None and "seal" in self.faults and len(self._sealing) >= MAX_SEALING:
                        raise StorageUnavailable(
                            f"queue {self.name}: full blocks are not being sealed ({self.faults['seal'][0]})"
                        )
        except TimeoutError:
            raise StorageTimeout(
                f"queue {self.name}: full blocks were not sealed within "
                f"{self._settings.write_timeout:g}s ({self._fault_text()})"
            ) from None
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")

    async def _lock_writes(self) -> None:
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
                f"{self._settings.write_timeout:g}s ({self._fault_text()})"
            ) from None

    def _fault_text(self) -> str:
        return self.write_fault or "storage is slow"

    def _validate(self, drafts: Sequence[Draft], now: float) -> None:
        segments = self.definition.segments
        for index, d in enumerate(drafts):
            if d.external_time is not None and d.external_time > now + FUTURE_SKEW:
                raise InvalidMessage(
                    f"message {index}: external_time is in the future", index=index, field="external_time"
                )
            if segments is not None and not segments[0] <= d.segment <= segments[1]:
                raise InvalidMessage(
                    f"message {index}: segment {d.segment} is outside the queue's range "
                    f"{segments[0]}-{segments[1]}",
                    index=index,
                    field="segment",
                )
            if d.external_id is not None and not I64_MIN <= d.external_id <= I64_MAX:
                raise InvalidMessage(
                    f"message {index}: external_id must be a 64-bit integer", index=index, field="external_id"
                )

    async def _assign(self, drafts: Sequence[Draft], now: float, *, check: bool = True) -> list[Appended]:
        """Give the drafts ids and add them to the open block; ``check=False`` skips the dedup
        lookup for drafts whose identity is known to be new (it is still noted)."""
        if self._next_id + len(drafts) > self._lease_until:
            await self._extend_lease(len(drafts))
        # This loop runs once per produced message: limits and bound methods are read once.
        limits = self.definition.block
        max_count, max_bytes = limits.max_messages, limits.max_bytes
        own = self._cluster_name
        dedup = self._dedup
        results: list[Appended] = []
        added = 0
        block = self._open
        if block is not None and block.is_full(self.definition, now):
            self._rotate()
            block = None
        for d in drafts:
            source = own if d.source is None else d.source
            external_id = d.external_id
            if external_id is not None and check:
                found = await dedup.find(source, external_id)
                if found is not None:
                    results.append(Appended(found, True))
                    continue
            message_id = self._next_id
            self._next_id = message_id + 1
            if external_id is None:
                external_id = message_id
            message = Message(
                message_id,
                now,
                source,
                external_id,
                now if d.external_time is None else d.external_time,
                d.segment,
                d.payload,
                d.headers,
            )
            if block is None:
                block = self._open = OpenBlock(message_id, now, self._journal_key(message_id))
                self._refresh_recent()
            block.add(message, encode_record(message))
            if source is not own or external_id != message_id:
                dedup.note(source, external_id)
            added += 1
            results.append(Appended(message_id, False))
            if len(block.ids) >= max_count or block.size >= max_bytes:
                self._rotate()
                block = None
        if added:
            self._last_id = self._next_id - 1
            dedup.note(own, self._last_id)
            self.counters.produced += added
            self._arrived.set()
            self._arrived = asyncio.Event()
        self.counters.duplicates += len(results) - added
        return results

    async def _extend_lease(self, needed: int) -> None:
        # Persist the lease before any id under it is answered: after a crash, numbering
        # resumes above it, so an answered id is never reused (at the cost of a gap).
        lease = self._next_id + needed + self._settings.id_lease
        await self._save_state(lease)
        self._lease_until = lease

    async def _save_state(self, lease_until: int) -> None:
        try:
            await self._meta.put(
                self._key("state.json"), orjson.dumps({"version": 1, "lease_until": lease_until})
            )
        except CapellaError as exc:
            self._set_fault("state", exc.message)
            raise
        self._clear_fault("state")

    def _rotate(self) -> None:
        if self._open is not None and self._open.ids:
            self._sealing.append(self._open)
            self._open = None
            self._refresh_recent()
            self._seal_wanted.set()

    def _refresh_recent(self) -> None:
        self._dedup.recent = [b.keys for b in self._blocks_in_memory()]

    def _blocks_in_memory(self) -> list[OpenBlock]:
        return [*self._sealing, *([self._open] if self._open is not None else [])]

    # --- flushing (group commit) -----------------------------------------------------------

    async def _commit(self, *, urgent: bool) -> None:
        if not any(b.pending for b in self._blocks_in_memory()) and not self._flush_lock.locked():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._urgent = self._urgent or urgent
        self._flush_wanted.set()
        try:
            async with asyncio.timeout(self._settings.write_timeout):
                await waiter
        except TimeoutError:
            # The flush goes on: what it covers may still be saved, so say the outcome is unknown.
            raise StorageTimeout(
                f"queue {self.name}: the write was not saved within {self._settings.write_timeout:g}s "
                f"({self._fault_text()}); it may still be saved"
            ) from None

    async def _run_flusher(self) -> None:
        """Flush when a writer asks. A failed flush fails its writers and raises to the
        supervisor; the restarted loop retries what is still pending without a new writer."""
        delay = self._settings.wait_max_delay
        while True:
            if "journal" not in self.faults:
                await self._flush_wanted.wait()
            self._flush_wanted.clear()
            if delay > 0 and not self._urgent and not self._closing:
                await asyncio.sleep(delay)
            self._urgent = False
            waiters, self._waiters = self._waiters, []
            try:
                await self._flush_journals()
            except BaseException as exc:
                _fail(waiters, exc, self.name)
                if self._closing:
                    return  # close() makes its own last attempt and reports it
                raise
            for w in waiters:
                if not w.done():
                    w.set_result(None)
            if self._closing and not self._waiters:
                return

    async def _flush_journals(self) -> None:
        async with self._flush_lock:
            self._marked = False
            started = time.perf_counter()
            wrote = False
            for block in self._blocks_in_memory():
                if not block.pending:
                    continue
                data = b"".join(block.pending)
                block.pending.clear()
                try:
                    await self._write_journal(block, data)
                except BaseException as exc:
                    block.pending.insert(0, data)
                    if isinstance(exc, CapellaError):
                        self._set_fault("journal", exc.message)
                    raise
                wrote = True
            self._clear_fault("journal")
            if wrote:
                self.counters.flushes += 1
                self._flush_latency.observe(time.perf_counter() - started)

    async def _write_journal(self, block: OpenBlock, data: bytes) -> None:
        try:
            if block.journal is None:
                # Reopening after a failed write cuts whatever half-written tail it left.
                block.journal = await self._meta.journal(block.journal_key, truncate_to=block.durable_size)
                if block.journal.size == 0:
                    data = JOURNAL_HEADER + data
            await block.journal.append_and_sync(data)
        except CapellaError:
            if block.journal is not None:
                journal, block.journal = block.journal, None
                await asyncio.shield(journal.close())
            raise
        block.durable_size = block.journal.size

    async def flush(self) -> None:
        """Save everything written so far (what a periodic flush does for ``mark``)."""
        await self._flush_journals()
        await self._save_subscriptions()
        await self.schedule.flush()
        for work in list(self._work.values()):
            await work.flush()

    async def tick(self) -> None:
        """The periodic pass: seal an open block past its age, save marked writes and cursors."""
        if self._open is not None and self._open.is_full(self.definition, self._clock()):
            self._rotate()
        if "state" in self.faults or (
            "journal" in self.faults and not any(b.pending for b in self._blocks_in_memory())
        ):
            # Nothing left to retry: probe the meta mount with a harmless write of the state,
            # so the queue says it accepts writes again as soon as it does.
            await self._save_state(self._lease_until)
            self._clear_fault("journal")
        if self._marked:
            await self._commit(urgent=True)
        if self._subs_marked:
            self._subs_marked = False
            await self._save_subscriptions()
        await self.schedule.tick()
        for work in list(self._work.values()):
            await work.tick()

    # --- sealing ---------------------------------------------------------------------------

    async def _run_sealer(self) -> None:
        """Seal full blocks one at a time (supervised: a failed seal backs off and retries)."""
        while not self._closing:
            if not self._sealing:
                await self._seal_wanted.wait()
                self._seal_wanted.clear()
                continue
            # A writer that sets it from now on gets a retry without the backoff.
            self._seal_wanted.clear()
            try:
                await self._seal_first()
                self._clear_fault("seal")
            finally:
                self._seal_tried.set()
                self._seal_tried = asyncio.Event()

    async def _seal_first(self) -> None:
        block = self._sealing[0]
        if block.pending:
            await self._commit(urgent=True)
        # Encoding and the Bloom filter take ~30 ms for a full block: keep them off the loop.
        data, summary = await asyncio.to_thread(_encode_sealed, block, self._cluster_name)
        mark = 0
        meta = BlockMeta(
            first_id=block.ids[0],
            last_id=block.ids[-1],
            count=len(block.ids),
            bytes=len(data),
            mark=mark,
            created=block.opened_at,
            sealed=self._clock(),
            key=self._key("blocks", f"{block.ids[0]:020d}-{block.ids[-1]:020d}.blk"),
        )
        await self._mounts[self.definition.mount_for_mark(mark)].put(meta.key, data)
        await self._meta.put(self._summary_key(meta.first_id), summary.dump())
        async with self._manifest_lock:
            await self._save_manifest([*self._sealed, meta])
            # No await from here to the end of the swap: a reader sees the block exactly once.
            self._sealed.append(meta)
            self._firsts.append(meta.first_id)
            self._sealing.pop(0)
            self._seal_done.set()
            self._seal_done = asyncio.Event()
            self._loaded[meta.first_id] = (block.ids, block.messages)
            self._used[meta.first_id] = self._clock()
            self._trim_loaded()
            self._remember_keys(meta.first_id, block.keys)
            self._dedup.add_summary(summary)
            self._refresh_recent()
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
        await self._meta.delete(block.journal_key)

    async def _save_manifest(self, blocks: list[BlockMeta]) -> None:
        doc = {
            "version": 1,
            "deleted_through": self._deleted_through,
            "blocks": [b.to_dict() for b in blocks],
        }
        await self._meta.put(self._key("manifest.json"), orjson.dumps(doc))

    # --- reading ---------------------------------------------------------------------------

    def now(self) -> float:
        """The queue's clock (tests inject one)."""
        return self._clock()

    @property
    def last_id(self) -> int:
        return self._last_id

    @property
    def first_id(self) -> int:
        for meta in self._sealed:
            if meta.state == "sealed":
                return meta.first_id
        for block in self._blocks_in_memory():
            return block.ids[0]
        return self._last_id + 1

    async def read_after(
        self, after: int, limit: int, segments: Sequence[tuple[int, int]] | None = None
    ) -> ReadResult:
        """Messages with id > ``after`` in id order, at most ``limit`` of them."""
        self.counters.read_requests += 1
        out: list[Message] = []
        last = after
        scanned = 0
        for source in self._blocks_after(after):
            if isinstance(source, BlockMeta):
                if source.state != "sealed":
                    last = max(last, source.last_id)
                    continue
                try:
                    ids, messages = await self._contents(source)
                except CorruptData:
                    last = max(last, source.last_id)
                    continue
            else:
                ids, messages = source.ids, source.messages
            start = bisect.bisect_right(ids, after)
            if segments is None:
                take = messages[start : start + limit - len(out)]
                out.extend(take)
                if take:
                    last = take[-1].id
            else:
                for m in messages[start:]:
                    scanned += 1
                    last = m.id
                    if any(lo <= m.segment <= hi for lo, hi in segments):
                        out.append(m)
                        if len(out) >= limit:
                            break
                    if scanned >= SCAN_LIMIT:
                        break
            if len(out) >= limit or scanned >= SCAN_LIMIT:
                break
        self.counters.read += len(out)
        self._prefetch_after(last)
        return ReadResult(out, last)

    def _prefetch_after(self, last: int) -> None:
        """Start loading the next sealed block while the reader handles this page.

        A sequential reader would otherwise wait for every block's decode; this way the
        decode runs while the answer is sent and the client parses it.
        """
        index = bisect.bisect_right(self._firsts, last)
        if index >= len(self._sealed):
            return
        meta = self._sealed[index]
        if meta.state != "sealed" or meta.first_id in self._loaded or meta.first_id in self._loading:
            return
        # Only when the reader is close: within the last tenth of the block it is in.
        if index > 0 and last < self._sealed[index - 1].last_id - self._sealed[index - 1].count // 10:
            return
        self._start_load(meta)

    def _blocks_after(self, after: int) -> Iterator[BlockMeta | OpenBlock]:
        # Snapshot the lists: a seal may move a block from sealing to sealed while we await.
        # Only the tail from the block holding ``after + 1`` is copied.
        start = max(0, bisect.bisect_right(self._firsts, after) - 1)
        sealed, sealing, open_block = self._sealed[start:], list(self._sealing), self._open
        for meta in sealed:
            if meta.last_id > after:
                yield meta
        for block in sealing:
            if block.ids and block.ids[-1] > after:
                yield block
        if open_block is not None and open_block.ids and open_block.ids[-1] > after:
            yield open_block

    async def _contents(self, meta: BlockMeta) -> tuple[list[int], list[Message]]:
        cached = self._loaded.get(meta.first_id)
        if cached is not None:
            self._loaded.move_to_end(meta.first_id)
            self._used[meta.first_id] = self._clock()
            return cached
        # The load is a task of its own: a reader that goes away does not cancel it for the
        # others waiting on the same block.
        return await asyncio.shield(self._start_load(meta))

    def _start_load(self, meta: BlockMeta) -> asyncio.Task[tuple[list[int], list[Message]]]:
        task = self._loading.get(meta.first_id)
        if task is None:
            task = asyncio.create_task(self._load_block(meta), name=f"load:{self.name}:{meta.first_id}")
            task.add_done_callback(_retrieve)
            self._loading[meta.first_id] = task
        return task

    async def _load_block(self, meta: BlockMeta) -> tuple[list[int], list[Message]]:
        try:
            found = await self._block_bytes(meta.first_id)
            if found is None:
                return [], []  # expired while we were on our way: nothing to read here
            current, data = found
            try:
                messages = await asyncio.to_thread(decode_block, data)
            except CorruptData as exc:
                await self._quarantine(current, exc.message)
                raise
        finally:
            del self._loading[meta.first_id]
        contents = ([m.id for m in messages], messages)
        self._loaded[meta.first_id] = contents
        self._used[meta.first_id] = self._clock()
        self._trim_loaded()
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
        index = bisect.bisect_left(self._firsts, first_id)
        if index < len(self._sealed) and self._sealed[index].first_id == first_id:
            return self._sealed[index]
        return None

    def _trim_loaded(self) -> None:
        while len(self._loaded) > LOADED_BLOCKS:
            first_id, _ = self._loaded.popitem(last=False)
            self._used.pop(first_id, None)

    async def _keys_of_block(self, first_id: int) -> dict[tuple[str, int], int]:
        keys = self._key_sets.get(first_id)
        if keys is not None:
            self._key_sets.move_to_end(first_id)
            return keys
        found = await self._block_bytes(first_id)
        if found is None:
            return {}
        meta, data = found
        try:
            ids, pairs = await asyncio.to_thread(block_keys, data)
        except CorruptData as exc:
            await self._quarantine(meta, exc.message)
            return {}
        keys = dict(zip(pairs, ids, strict=True))
        self._remember_keys(first_id, keys)
        return keys

    def _remember_keys(self, first_id: int, keys: dict[tuple[str, int], int]) -> None:
        # Bounded: a sealed block's exact keys are ~100 bytes per message.
        self._key_sets[first_id] = keys
        while len(self._key_sets) > KEY_SETS:
            self._key_sets.popitem(last=False)

    async def _load_summary(self, meta: BlockMeta) -> None:
        try:
            summary = BlockSummary.load(await self._meta.get(self._summary_key(meta.first_id)))
        except (KeyNotFound, CorruptData):
            # Rebuild it from the block: a missing summary must never disable dedup.
            keys = await self._keys_of_block(meta.first_id)
            if meta.state != "sealed":
                return
            summary = BlockSummary.build(keys, self._cluster_name)
            await self._meta.put(self._summary_key(meta.first_id), summary.dump())
        self._dedup.add_summary(summary)

    async def _quarantine(self, meta: BlockMeta, reason: str) -> None:
        if meta.state == "quarantined":
            return
        meta.state = "quarantined"
        self._loaded.pop(meta.first_id, None)
        self._dedup.drop_summary(meta.first_id)
        self._report_quarantine(meta, reason)
        async with self._manifest_lock:
            try:
                await self._save_manifest(self._sealed)
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

    async def wait_for(self, after: int, timeout: float) -> None:  # noqa: ASYNC109 (long-poll length from the API)
        """Return once a message with id > ``after`` exists, or after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._last_id <= after and not self._closing:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            event = self._arrived
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                return

    # --- subscriptions ---------------------------------------------------------------------

    def subscription(self, name: str) -> Subscription:
        return self._with_floor(self._subs.get(name))

    def subscriptions(self) -> list[Subscription]:
        return [self._with_floor(s) for s in self._subs.all()]

    def _with_floor(self, sub: Subscription) -> Subscription:
        # An ack-mode subscription's cursor is the id below which everything is finished.
        if sub.mode == ACK:
            return dataclasses.replace(sub, last_id=self._work[sub.name].state.floor)
        return sub

    def work(self, name: str) -> WorkQueue:
        """The work queue of an ack-mode subscription."""
        sub = self._subs.get(name)
        if sub.mode != ACK:
            raise WrongSubscriptionMode(f"subscription {name!r} is a cursor, not in ack mode")
        return self._work[name]

    def work_queues(self) -> list[WorkQueue]:
        return [self._work[name] for name in sorted(self._work)]

    async def define_work(
        self, name: str, policy: RetryPolicy, save: SaveMode = SaveMode.DEFAULT
    ) -> tuple[Subscription, bool]:
        """Create an ack-mode subscription (a work queue) or change its retry policy."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        if policy.dead_letter is not None:
            if policy.dead_letter == self.name:
                raise InvalidRequest("policy.dead_letter must name another queue", field="policy.dead_letter")
            try:
                if self._lookup is not None:
                    self._lookup(policy.dead_letter)
            except QueueNotFound:
                raise InvalidRequest(
                    f"policy.dead_letter: no queue {policy.dead_letter!r}", field="policy.dead_letter"
                ) from None
        sub, created = self._subs.define_ack(name, policy, now=self._clock())
        if created:
            # A subscription of this name deleted before a crash may have left its files.
            for key in await self._meta.list(self._key("work", name, "")):
                await self._meta.delete(key)
            work = self._new_work(name, policy)
            await work.open()
            self._work[name] = work
        else:
            self._work[name].policy = policy
        await self._after_subscription_change(save)
        return self._with_floor(sub), created

    def _new_work(self, name: str, policy: RetryPolicy) -> WorkQueue:
        return WorkQueue(
            self,
            name,
            policy,
            self._meta,
            self._key("work", name),
            clock=self._clock,
            dead_letter=self._dead_letter,
            default_save=lambda: self.definition.subscription_save,
        )

    async def _dead_letter(self, target: str, drafts: list[Draft]) -> None:
        if self._lookup is None or not drafts:
            return
        await self._lookup(target).append(drafts, SaveMode.WAIT)

    async def commit(
        self,
        name: str,
        last_id: int | None,
        *,
        replica: bool | None = None,
        reset: bool = False,
        save: SaveMode = SaveMode.DEFAULT,
    ) -> tuple[Subscription, bool]:
        """Move a cursor forward (or anywhere with ``reset``), creating it on first use."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        sub, created = self._subs.commit(name, last_id, replica=replica, reset=reset, now=self._clock())
        await self._after_subscription_change(save)
        return sub, created

    async def delete_subscription(self, name: str, save: SaveMode = SaveMode.DEFAULT) -> None:
        self._subs.delete(name)
        await self._after_subscription_change(save)
        work = self._work.pop(name, None)
        if work is not None:
            await work.destroy()

    def replicas(self, message_id: int) -> list[str]:
        return self._subs.replicas(message_id)

    async def wait_replicas(self, message_id: int, count: int, timeout: float) -> list[str]:  # noqa: ASYNC109 (API parameter)
        """The replica subscriptions past ``message_id`` once there are ``count``, or at ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(holders := self._subs.replicas(message_id)) < count and not self._closing:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            event = self._committed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await event.wait()
        return holders

    async def _after_subscription_change(self, save: SaveMode) -> None:
        self._committed.set()
        self._committed = asyncio.Event()
        mode = save.resolve(self.definition.subscription_save)
        if mode is SaveMode.IMMEDIATE or mode is SaveMode.WAIT:
            # The save goes on when the writer stops waiting: saves are serialised by a lock
            # and versioned, so a late one never overwrites a newer one.
            save_task = asyncio.ensure_future(self._save_subscriptions())
            try:
                async with asyncio.timeout(self._settings.write_timeout):
                    await asyncio.shield(save_task)
            except TimeoutError:
                # Should the late save fail, the periodic tick saves the cursors again.
                self._subs_marked = True
                save_task.add_done_callback(_retrieve)
                raise StorageTimeout(
                    f"queue {self.name}: the cursor was not saved within {self._settings.write_timeout:g}s "
                    f"({self._fault_text()}); it may still be saved"
                ) from None
        elif mode is SaveMode.MARK:
            self._subs_marked = True

    async def _save_subscriptions(self) -> None:
        target = self._subs.version
        async with self._subs_lock:
            # Someone else's save already covered this change: share it (group commit).
            if self._subs.saved_version >= target:
                return
            version, data = self._subs.version, self._subs.dump()
            await self._meta.put(self._key("subscriptions.json"), data)
            self._subs.saved_version = version

    # --- block maintenance (used by the unload, archive and expire handlers) ----------------

    def sealed_blocks(self) -> list[BlockMeta]:
        """The sealed blocks, oldest first (a copy of the list; do not change the entries)."""
        return list(self._sealed)

    def unload(self, *, idle: float | None, age: float | None) -> tuple[int, int]:
        """Drop the contents of sealed blocks not read for ``idle`` s or sealed ``age`` s ago.

        Answers (blocks, bytes) dropped. The next read of such a block loads it again.
        """
        now = self._clock()
        by_id = {b.first_id: b for b in self._sealed}
        dropped = dropped_bytes = 0
        for first_id in list(self._loaded):
            meta = by_id.get(first_id)
            unused = now - self._used.get(first_id, now)
            old = meta is not None and now - meta.sealed
            if (idle is not None and unused >= idle) or (age is not None and meta is not None and old >= age):
                del self._loaded[first_id]
                self._used.pop(first_id, None)
                self._key_sets.pop(first_id, None)
                dropped += 1
                dropped_bytes += meta.bytes if meta is not None else 0
        return dropped, dropped_bytes

    async def delete_block(self, first_id: int) -> int:
        """Delete the oldest sealed block (expiry); answers the bytes it held.

        The manifest forgets the block first, durably; then its objects go. A crash in
        between leaves only unreferenced objects, which ``clean_leftovers`` removes.
        """
        async with self._blocks_lock, self._noting_leftovers():
            if not self._sealed or self._sealed[0].first_id != first_id:
                raise Conflict(f"queue {self.name}: only the oldest sealed block can be deleted")
            meta = self._sealed[0]
            async with self._manifest_lock:
                remaining = self._sealed[1:]
                previous, self._deleted_through = (
                    self._deleted_through,
                    max(self._deleted_through, meta.last_id),
                )
                try:
                    await self._save_manifest(remaining)
                except CapellaError:
                    self._deleted_through = previous
                    raise
                self._sealed = remaining
                self._firsts = [b.first_id for b in remaining]
            self._loaded.pop(first_id, None)
            self._used.pop(first_id, None)
            self._key_sets.pop(first_id, None)
            self._dedup.drop_summary(first_id)
            await self._mounts[self.definition.mount_for_mark(meta.mark)].delete(meta.key)
            await self._meta.delete(self._summary_key(first_id))
        log.info("block deleted queue=%s first_id=%d messages=%d", self.name, first_id, meta.count)
        return meta.bytes

    async def move_block(self, first_id: int, mark: int) -> int:
        """Move a sealed block to the mount of ``mark``; answers the bytes copied.

        The new copy is written, read back and compared, the manifest is switched durably,
        and only then is the old copy deleted: a crash at any point leaves a readable copy,
        and the other one is a leftover for ``clean_leftovers``.
        """
        async with self._blocks_lock, self._noting_leftovers():
            meta = next((b for b in self._sealed if b.first_id == first_id), None)
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
                    await self._quarantine(meta, exc.message)
                    raise
                await target.put(meta.key, data)
                if await target.get(meta.key) != data:
                    raise StorageUnavailable(f"mount {target_name}: {meta.key} did not read back intact")
                copied = len(data)
            async with self._manifest_lock:
                moved = BlockMeta(**{**meta.to_dict(), "mark": mark})
                blocks = [moved if b is meta else b for b in self._sealed]
                await self._save_manifest(blocks)
                self._sealed = blocks
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
            sealed_last = self._sealed[-1].last_id if self._sealed else 0
            where = {b.key: self.definition.mount_for_mark(b.mark) for b in self._sealed}
            removed = 0
            for mount_name in sorted({self.definition.meta_mount, *self.definition.marks.values()}):
                storage = self._mounts[mount_name]
                for key in await storage.list(self._key("blocks", "")):
                    last = _last_id_of(key)
                    # A block past the manifest may be sealing right now: not a leftover.
                    if last is None or last > sealed_last or where.get(key) == mount_name:
                        continue
                    await storage.delete(key)
                    removed += 1
                    log.info(
                        "leftover block copy deleted queue=%s mount=%s key=%s", self.name, mount_name, key
                    )
            first = self._sealed[0].first_id if self._sealed else sealed_last + 1
            for key in await self._meta.list(self._key("summaries", "")):
                last = _first_id_of(key)
                if last is not None and last < first:
                    await self._meta.delete(key)
            self._leftovers_possible = False
            return removed

    @contextlib.asynccontextmanager
    async def _noting_leftovers(self) -> AsyncIterator[None]:
        try:
            yield
        except BaseException:
            self._leftovers_possible = True
            raise

    # --- stats -----------------------------------------------------------------------------

    def definition_dict(self) -> dict[str, Any]:
        return self.definition.to_dict()

    def stats(self) -> dict[str, Any]:
        in_memory = self._blocks_in_memory()
        sealed = [b for b in self._sealed if b.state == "sealed"]
        by_mark: dict[str, int] = {}
        for b in sealed:
            by_mark[str(b.mark)] = by_mark.get(str(b.mark), 0) + 1
        if in_memory:
            by_mark["0"] = by_mark.get("0", 0) + len(in_memory)
        count = sum(b.count for b in sealed) + sum(len(b.ids) for b in in_memory)
        size = sum(b.bytes for b in sealed) + sum(b.size for b in in_memory)
        return {
            "first_id": self.first_id,
            "last_id": self._last_id,
            "messages": count,
            "bytes": size,
            "blocks": {
                "total": len(sealed) + len(in_memory),
                "by_mark": by_mark,
                "by_state": {
                    "open": 1 if self._open is not None and self._open.ids else 0,
                    "sealing": len(self._sealing),
                    "sealed": len(sealed),
                    "loaded": len(self._loaded),
                    "quarantined": len(self._sealed) - len(sealed),
                },
            },
            "subscriptions": len(self._subs.all()),
            "scheduled": {
                "count": self.schedule.count,
                "in_memory": self.schedule.in_memory,
                "chunks": self.schedule.chunk_count,
                "next_due": self.schedule.next_due(),
            },
            "recovery": self.recovery.to_dict(),
            "writable": not self.faults,
            "faults": [
                {"step": step, "error": message, "since": since}
                for step, (message, since) in sorted(self.faults.items())
            ],
            "last_error": self.last_error,
        }


def _encode_sealed(block: OpenBlock, own: str) -> tuple[bytes, BlockSummary]:
    return encode_block(block.messages), BlockSummary.build(block.keys, own)


def _fail(waiters: list[asyncio.Future[None]], exc: BaseException, queue: str) -> None:
    """Answer writers of a failed flush: its storage error, or a generic one for anything else."""
    if isinstance(exc, CapellaError):
        error: BaseException = exc
    elif isinstance(exc, asyncio.CancelledError):
        error = ShuttingDown(f"queue {queue} is closing")
    else:
        error = CapellaError(f"queue {queue}: the flush failed unexpectedly ({exc!r})")
    for w in waiters:
        if not w.done():
            w.set_exception(error)


async def _first_of(*waits: Awaitable[object]) -> None:
    """Return when the first of ``waits`` finishes; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _retrieve(task: asyncio.Future[Any]) -> None:
    # Readers get the error from the task; this only keeps asyncio from logging it as lost.
    if not task.cancelled():
        task.exception()


def _last_id_of(key: str) -> int | None:
    """The last id in a block key ``.../<first>-<last>.blk``, or None for other names."""
    name = key.rsplit("/", 1)[-1]
    stem, _, ext = name.partition(".")
    first, _, last = stem.partition("-")
    return int(last) if ext == "blk" and first.isdigit() and last.isdigit() else None


def _first_id_of(key: str) -> int | None:
    stem = key.rsplit("/", 1)[-1].partition(".")[0]
    return int(stem) if stem.isdigit() else None
