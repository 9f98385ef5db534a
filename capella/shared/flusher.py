"""The node's write buffer: the batches of every shared queue, flushed as one object per window.

A produce call hands its record batch (base id 0, ids still to come) with the identities it
names to ``Flusher.add``. The flusher collects batches for ``flush_interval`` or until
``flush_bytes`` wait (``immediate`` asks for a flush at once), PUTs them as ONE object
(``capella.shared.object``), then commits that object in one PostgreSQL transaction
(``Catalog.commit_object``) that gives the batches their ids, rejects duplicate identities and
stamps the time. Every call waiting on the flush is then answered with what the commit decided.

Data reaches S3 before any metadata: a node that dies before the commit leaves an object
nobody references (the janitor deletes it); a commit whose answer is lost is retried with the
same key, which answers what the first commit stored. Flushes run one at a time, so a write
answered before the next one was sent always gets the lower id.

A PUT or commit that fails is retried until ``storage.write_timeout`` has passed since the
flush began; each attempt is cut off at that deadline too, so a blackholed S3 or PostgreSQL
cannot hold a flush longer. Failures and successes are noted in the node's ``Faults`` (the
part "s3" for the PUT, "postgres" for the commit).

What a failed flush does with its batches: callers waiting (``wait``, ``immediate``) get the
error (503). Batches nobody waits for (``none``, ``mark``: answered from the buffer) are not
dropped: after a failed PUT they go back into the buffer for the next flush (up to
``HOLD_FLUSHES`` times ``flush_bytes``); after a commit that got no answer the object is
*uncertain*, and before any newer flush it is committed again under the same key (idempotent:
it answers what the first commit did, or applies it now) until PostgreSQL answers, for at most
``UNCERTAIN_FOR`` (well inside the janitor's grace for uncommitted objects). Its waiting
callers have had their 503 by then ("it may still be saved"); the batches are stored at most
once either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from capella.backoff import backoff
from capella.config import SharedSettings
from capella.core.loops import TaskFailures, keep_running
from capella.core.stats import SharedStats
from capella.errors import CapellaError, ShuttingDown, StorageTimeout, StorageUnavailable
from capella.shared import object as objects
from capella.shared.catalog import BatchEntry, Catalog, Committed, Run
from capella.shared.fault import POSTGRES, S3, Faults
from capella.storage import Storage

log = logging.getLogger(__name__)
T = TypeVar("T")

HOLD_FLUSHES = 8  # batches nobody waits for, kept after a failed PUT: at most this many flushes' bytes
# Seconds an unanswered commit is retried. It must stay well below the janitor's age for objects
# no row names (orphans): past that, the object may be deleted, and a late commit would name it.
UNCERTAIN_FOR = 300.0
UNCERTAIN_RETRY = 1.0  # how often, while nothing else is buffered


@dataclass(slots=True)
class Pending:
    """One produce call's batch, waiting for the flush that commits it."""

    queue: str
    data: bytes
    count: int
    runs: list[Run]
    done: asyncio.Future[Committed]
    keep: bool = False  # nobody waits (none, mark): a failed flush keeps it for a later one
    held: bool = False  # kept by the flush that failed: not answered with its error


@dataclass(slots=True)
class Uncertain:
    """An object in S3 whose commit got no answer, committed again under its key until PostgreSQL
    answers (the commit is keyed by the object: it is applied once)."""

    key: str
    size: int
    entries: list[BatchEntry]
    grouped: list[Pending]
    offsets: list[int]
    since: float  # monotonic


@dataclass(slots=True)
class Buffer:
    pending: list[Pending] = field(default_factory=list)
    size: int = 0
    opened: float = 0.0  # monotonic time of the first batch


class Flusher:
    def __init__(
        self,
        settings: SharedSettings,
        storage: Storage,
        catalog: Catalog,
        *,
        own: str,
        write_timeout: float,
        stats: SharedStats,
        faults: Faults,
        uncertain_for: float = UNCERTAIN_FOR,
        on_commit: Callable[[str, Committed, Pending, str, int, int], None],
        on_object: Callable[[str, bytes], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._storage = storage
        self._catalog = catalog
        self._own = own
        self._write_timeout = write_timeout
        self._stats = stats
        self._faults = faults
        self._uncertain_for = uncertain_for
        self._on_commit = on_commit
        self._on_object = on_object
        self._clock = clock
        self._buffer = Buffer()
        self._wake = asyncio.Event()  # a batch arrived, or a flush is wanted now
        self._urgent = False
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._uncertain: list[Uncertain] = []
        self.flushing = False

    def start(self, failures: TaskFailures) -> None:
        """Run the flush loop, supervised: a bug in it is logged and counted, and the loop goes
        on with what is buffered (each flush answers its own waiters whatever happens)."""
        self._task = asyncio.create_task(
            keep_running("shared-flush", self._run, failures=failures), name="shared-flush"
        )

    async def close(self) -> None:
        """Flush what is buffered, then stop."""
        self._closing = True
        self._urgent = True
        self._wake.set()
        if self._task is not None:
            await self._task
        lost = [p for u in self._uncertain for p in u.grouped] + self._buffer.pending
        if self._uncertain:
            log.error(
                "shared node stopping with %d commits unanswered: their objects stay in S3 "
                "for the janitor; batches nobody waited for may be lost: %d",
                len(self._uncertain),
                sum(p.keep for u in self._uncertain for p in u.grouped),
            )
        for p in lost:
            if not p.done.done():
                p.done.set_exception(ShuttingDown("the node is stopping"))
                p.done.exception()

    @property
    def buffered(self) -> int:
        return self._buffer.size

    @property
    def idle(self) -> bool:
        """Nothing buffered and no flush under way (a probe then tells whether S3 is back)."""
        return not self.flushing and not self._buffer.pending

    @property
    def uncertain(self) -> int:
        """Objects whose commit got no answer yet (retried by key)."""
        return len(self._uncertain)

    def add(
        self, queue: str, data: bytes, count: int, runs: list[Run], *, urgent: bool, keep: bool = False
    ) -> Pending:
        """Buffer one batch; its ``done`` is answered by the flush that commits it. ``keep``:
        nobody waits for it, so a failed flush keeps it for a later one."""
        if self._closing:
            raise ShuttingDown("the node is stopping")
        buffer = self._buffer
        if not buffer.pending:
            buffer.opened = time.monotonic()
        pending = Pending(queue, data, count, runs, asyncio.get_running_loop().create_future(), keep)
        buffer.pending.append(pending)
        buffer.size += len(data)
        if urgent or buffer.size >= self._settings.flush_bytes:
            self._urgent = True
        self._wake.set()
        return pending

    async def _run(self) -> None:
        while True:
            if self._uncertain and not await self._settle() and not self._buffer.pending:
                if self._closing:
                    return
                # PostgreSQL still gives no answer: again in a while, or when a batch comes.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(UNCERTAIN_RETRY):
                        await self._wake.wait()
                continue
            await self._wake.wait()
            self._wake.clear()
            if not self._buffer.pending:
                if self._closing:
                    return
                continue
            if not self._urgent:
                # The window runs from the first batch buffered; a full buffer or an
                # immediate write ends it early.
                remaining = self._buffer.opened + self._settings.flush_interval - time.monotonic()
                while remaining > 0 and not self._urgent:
                    try:
                        async with asyncio.timeout(remaining):
                            await self._wake.wait()
                    except TimeoutError:
                        break
                    self._wake.clear()
                    remaining = self._buffer.opened + self._settings.flush_interval - time.monotonic()
            buffer, self._buffer = self._buffer, Buffer()
            self._urgent = False
            self.flushing = True
            try:
                await self._flush(buffer.pending)
            except Exception as exc:  # answered to every waiter; the loop goes on
                error = (
                    exc
                    if isinstance(exc, CapellaError)
                    else StorageUnavailable(f"shared: flush failed: {exc!r}")
                )
                if not isinstance(exc, CapellaError):
                    log.error("shared flush crashed", exc_info=exc)
                for p in buffer.pending:
                    if not p.done.done() and not p.held:
                        p.done.set_exception(error)
                        # Retrieved here so that a caller that stopped waiting leaves no warning.
                        p.done.exception()
            finally:
                self.flushing = False
            if self._closing and not self._buffer.pending and not self._uncertain:
                return

    async def _settle(self) -> bool:
        """Commit the uncertain objects again, oldest first; whether none is left."""
        while self._uncertain:
            u = self._uncertain[0]
            if time.monotonic() - u.since > self._uncertain_for:
                self._uncertain.pop(0)
                log.error(
                    "shared commit given up after %.0fs without an answer key=%s: its object is "
                    "left for the janitor",
                    self._uncertain_for,
                    u.key,
                )
                self._fail(u.grouped, StorageTimeout(f"shared: the commit of {u.key} got no answer"))
                continue
            try:
                async with asyncio.timeout(self._write_timeout):
                    committed = await self._catalog.commit_object(
                        u.key, self._settings.node, u.size, self._own, u.entries
                    )
            except (StorageUnavailable, TimeoutError):
                return False
            except CapellaError as exc:  # refused: rolled back, so nothing of it is stored
                self._uncertain.pop(0)
                log.error("shared commit refused key=%s: %s", u.key, exc.message)
                self._fail(u.grouped, exc)
                continue
            self._uncertain.pop(0)
            self._faults.ok(POSTGRES)
            log.info("shared commit answered on retry key=%s", u.key)
            self._answer(u.key, u.size, committed, u.grouped, u.offsets)
        return True

    def _fail(self, pending: Sequence[Pending], error: Exception) -> None:
        for p in pending:
            if not p.done.done():
                p.done.set_exception(error)
                p.done.exception()

    def _hold(self, pending: Sequence[Pending]) -> None:
        """Batches nobody waits for go back to the front of the buffer (within its bound; not
        while the node stops: close must end)."""
        if self._closing:
            return
        room = HOLD_FLUSHES * self._settings.flush_bytes - self._buffer.size
        held: list[Pending] = []
        for p in pending:
            if p.keep and not p.done.done() and len(p.data) <= room:
                p.held = True
                room -= len(p.data)
                held.append(p)
        if not held:
            return
        buffer = self._buffer
        if not buffer.pending:
            buffer.opened = time.monotonic()
        buffer.pending[:0] = held
        buffer.size += sum(len(p.data) for p in held)
        self._wake.set()

    def _answer(
        self, key: str, size: int, committed: list[Committed], grouped: Sequence[Pending], offsets: list[int]
    ) -> None:
        self._stats.objects += 1
        for result, p, offset in zip(committed, grouped, offsets, strict=True):
            if not p.done.done():  # a caller that stopped waiting: the commit stands all the same
                p.done.set_result(result)  # a dropped queue's marker is answered by SharedQueue
            self._stats.duplicates += len(result.duplicates)
            self._on_commit(p.queue, result, p, key, offset, size)

    async def _flush(self, pending: Sequence[Pending]) -> None:
        started = time.perf_counter()
        deadline = time.monotonic() + self._write_timeout
        # Grouped by queue here (in the order the queues came, each queue's batches in theirs),
        # so the object holds them in this order and placed[i] is grouped[i].
        first: dict[str, int] = {}
        for i, p in enumerate(pending):
            first.setdefault(p.queue, i)
        grouped = sorted(pending, key=lambda p: first[p.queue])
        data, placed = objects.build([(p.queue, p.data) for p in grouped])
        key = objects.object_key(self._settings.node, self._clock())
        entries = [
            BatchEntry(spot.queue, spot.offset, spot.size, p.count, p.runs)
            for spot, p in zip(placed, grouped, strict=True)
        ]
        assert all(e.queue == p.queue for e, p in zip(entries, grouped, strict=True))
        for p in grouped:
            p.held = False
        try:
            await self._retry("put", S3, deadline, lambda: self._storage.put(key, data))
        except StorageUnavailable:
            self._hold(grouped)
            raise
        self._stats.puts += 1
        self._stats.put_bytes += len(data)
        put_done = time.perf_counter()
        try:
            committed = await self._retry(
                "commit",
                POSTGRES,
                deadline,
                lambda: self._catalog.commit_object(key, self._settings.node, len(data), self._own, entries),
            )
        except StorageUnavailable:
            # Applied or not, nobody knows: commit it again under this key before anything newer.
            offsets = [spot.offset for spot in placed]
            self._uncertain.append(
                Uncertain(key, len(data), entries, list(grouped), offsets, time.monotonic())
            )
            for p in grouped:
                p.held = p.keep
            raise
        self._stats.commit_seconds.observe(time.perf_counter() - put_done)
        self._stats.flush_seconds.observe(time.perf_counter() - started)
        self._stats.flushes += 1
        self._on_object(key, data)
        self._answer(key, len(data), committed, grouped, [spot.offset for spot in placed])

    async def _retry(self, step: str, part: str, deadline: float, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` until it succeeds or the write timeout passes (then ``StorageTimeout``:
        the outcome of a commit is unknown, as with any 503). Each attempt ends at the deadline."""
        failures = 0
        while True:
            try:
                try:
                    async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                        found = await call()
                except StorageUnavailable:
                    raise
                except CapellaError as exc:
                    # A refusal of the bucket or the database (a missing bucket, a permission): a
                    # producer's request did nothing wrong, so it is answered as unavailable.
                    raise StorageUnavailable(f"shared: {step}: {exc.message}") from exc
                self._faults.ok(part)
                return found
            except (StorageUnavailable, TimeoutError) as exc:
                failures += 1
                text = exc.message if isinstance(exc, StorageUnavailable) else "no answer in time"
                where = "S3" if part == S3 else "PostgreSQL"
                self._faults.failed(part, f"shared: {step} to {where} failing: {text}")
                self._stats.failures[step] = self._stats.failures.get(step, 0) + 1
                delay = backoff(failures, 0.05, 1.0)
                if time.monotonic() + delay >= deadline:
                    if step == "put":
                        raise StorageUnavailable(f"shared: cannot write the object to S3: {text}") from None
                    raise StorageTimeout(
                        f"shared: the commit was not confirmed within the write timeout: {text}"
                    ) from None
                log.warning("shared %s failed, retrying in %.2fs: %s", step, delay, text)
                await asyncio.sleep(delay)
