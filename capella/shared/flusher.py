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
"""

from __future__ import annotations

import asyncio
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


@dataclass(slots=True)
class Pending:
    """One produce call's batch, waiting for the flush that commits it."""

    queue: str
    data: bytes
    count: int
    runs: list[Run]
    done: asyncio.Future[Committed]


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
        on_commit: Callable[[str, Committed, Pending, str, int], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._storage = storage
        self._catalog = catalog
        self._own = own
        self._write_timeout = write_timeout
        self._stats = stats
        self._faults = faults
        self._on_commit = on_commit
        self._clock = clock
        self._buffer = Buffer()
        self._wake = asyncio.Event()  # a batch arrived, or a flush is wanted now
        self._urgent = False
        self._closing = False
        self._task: asyncio.Task[None] | None = None
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
        for p in self._buffer.pending:
            if not p.done.done():
                p.done.set_exception(ShuttingDown("the node is stopping"))

    @property
    def buffered(self) -> int:
        return self._buffer.size

    @property
    def idle(self) -> bool:
        """Nothing buffered and no flush under way (a probe then tells whether S3 is back)."""
        return not self.flushing and not self._buffer.pending

    def add(self, queue: str, data: bytes, count: int, runs: list[Run], *, urgent: bool) -> Pending:
        """Buffer one batch; its ``done`` is answered by the flush that commits it."""
        if self._closing:
            raise ShuttingDown("the node is stopping")
        buffer = self._buffer
        if not buffer.pending:
            buffer.opened = time.monotonic()
        pending = Pending(queue, data, count, runs, asyncio.get_running_loop().create_future())
        buffer.pending.append(pending)
        buffer.size += len(data)
        if urgent or buffer.size >= self._settings.flush_bytes:
            self._urgent = True
        self._wake.set()
        return pending

    async def _run(self) -> None:
        while True:
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
                    if not p.done.done():
                        p.done.set_exception(error)
                        # Retrieved here so that a caller that stopped waiting leaves no warning.
                        p.done.exception()
            finally:
                self.flushing = False
            if self._closing and not self._buffer.pending:
                return

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
        await self._retry("put", S3, deadline, lambda: self._storage.put(key, data))
        self._stats.puts += 1
        self._stats.put_bytes += len(data)
        put_done = time.perf_counter()
        committed = await self._retry(
            "commit",
            POSTGRES,
            deadline,
            lambda: self._catalog.commit_object(key, self._settings.node, len(data), self._own, entries),
        )
        self._stats.commit_seconds.observe(time.perf_counter() - put_done)
        self._stats.flush_seconds.observe(time.perf_counter() - started)
        self._stats.flushes += 1
        self._stats.objects += 1
        for result, p, spot in zip(committed, grouped, placed, strict=True):
            self._stats.duplicates += len(result.duplicates)
            self._on_commit(p.queue, result, p, key, spot.offset)
            if not p.done.done():
                p.done.set_result(result)

    async def _retry(self, step: str, part: str, deadline: float, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` until it succeeds or the write timeout passes (then ``StorageTimeout``:
        the outcome of a commit is unknown, as with any 503). Each attempt ends at the deadline."""
        failures = 0
        while True:
            try:
                async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                    found = await call()
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
