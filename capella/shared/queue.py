"""A shared queue: the same calls as a local queue, its log in S3 objects ordered by PostgreSQL.

Writes are held to the same rules as a local queue's (``capella.core.limits``), encoded as one
record batch per call (base id 0: the commit gives the ids) and handed to the node's flusher;
``wait`` and ``immediate`` are answered after the commit, ``none`` and ``mark`` from the buffer
(``Buffered``: no id yet). Reads walk the queue's segments (the rows that say which bytes of
which object hold which ids), cached per node and refreshed from PostgreSQL, and serve the
bytes stamped with their ids, time and source, duplicates cut out: from there every read form
is the local queue's. Cursors live in PostgreSQL; this node keeps a copy for the calls that
must not wait (``subscription``), refreshed on each commit anywhere (NOTIFY).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from capella.core.base_queue import BaseQueue, Buffered, Page, PageBuilder, wait_until
from capella.core.definition import QueueSettings
from capella.core.filter import MessageFilter
from capella.core.limits import MessageLimits, check_batch, check_drafts
from capella.core.log.blocks import Render
from capella.core.log.writer import Appended
from capella.core.message import Draft, SaveMode, drafts_batch
from capella.core.retention import Retention
from capella.core.stats import QueueCounters
from capella.core.subscription import SubscriptionState
from capella.errors import (
    CorruptData,
    KeyNotFound,
    NotOnSharedQueue,
    QueueNotFound,
    ShuttingDown,
    StorageUnavailable,
    SubscriptionNotFound,
)
from capella.records import record_batch
from capella.records.record_batch import Given, RecordBatch
from capella.shared.catalog import MISSING_QUEUE, Committed, Run, Segment, SubRow

if TYPE_CHECKING:
    from capella.core.delayed.intake import Delayed
    from capella.shared.node import SharedNode

log = logging.getLogger(__name__)

# Segments a read asks PostgreSQL for at a time, and how many a queue keeps cached.
FETCH = 64
CACHED_SEGMENTS = 4096
# A cached segment row is asked for again after this long: compaction may have replaced it
# (its old objects stay readable for the janitor's grace, 10 minutes by default).
SEGMENT_TTL = 120.0


def runs_of(identities: Sequence[tuple[str, int | None]]) -> list[Run]:
    """The explicit identities of a batch as maximal runs of consecutive external ids of one
    source (a monotonic producer's batch is one run); ``None`` names no identity."""
    runs: list[Run] = []
    for i, (source, ext) in enumerate(identities):
        if ext is None:
            continue
        if runs:
            last = runs[-1]
            if (
                last.source == source
                and ext == last.last_ext + 1
                and last.index + last.last_ext - last.first_ext == i - 1
            ):
                runs[-1] = dataclasses.replace(last, last_ext=ext)
                continue
        runs.append(Run(source, ext, ext, i))
    return runs


def answers(committed: Committed, count: int) -> list[Appended]:
    """Per message of a committed batch, in order: its new id, or the id it had (a duplicate)."""
    out: list[Appended] = []
    next_id = committed.first_id
    for i in range(count):
        original = committed.duplicates.get(i)
        if original is not None:
            out.append(Appended(original, True))
        else:
            out.append(Appended(next_id, False))
            next_id += 1
    return out


class SharedQueue(BaseQueue):
    """One shared queue as this node sees it. Built by ``SharedNode``."""

    def __init__(
        self,
        name: str,
        definition: QueueSettings,
        node: SharedNode,
        *,
        limits: MessageLimits,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.limits = limits
        self.counters = QueueCounters()
        self._definition = definition
        self._node = node
        self._clock = clock
        self._closing = False
        self._first_id = 1
        self._next_id = 1  # one past the highest id committed, as far as this node knows
        self._segments: list[Segment] = []  # contiguous, by first_id
        self._firsts: list[int] = []
        self._fetched: list[float] = []  # when each cached segment row was read
        self._subs: dict[str, SubscriptionState] = {}
        self.arrived = asyncio.Event()
        self._last_error: str | None = None
        self._head_task: asyncio.Future[None] | None = None
        self._head_started = 0.0

    # --- the definition ----------------------------------------------------------------------

    @property
    def definition(self) -> QueueSettings:
        return self._definition

    @definition.setter
    def definition(self, definition: QueueSettings) -> None:
        self._definition = definition

    def definition_dict(self) -> dict[str, Any]:
        return self._definition.to_dict()

    async def close(self) -> None:
        self._closing = True
        self._wake()

    async def destroy(self) -> None:
        await self.close()

    # --- faults ------------------------------------------------------------------------------

    @property
    def faults(self) -> dict[str, tuple[str, float]]:
        fault = self._node.fault
        return {} if fault is None else {"shared": (fault, self._node.fault_since)}

    @property
    def write_fault(self) -> str | None:
        return self._node.fault

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @last_error.setter
    def last_error(self, message: str | None) -> None:
        self._last_error = message

    # --- writing -----------------------------------------------------------------------------

    def check(self, drafts: Sequence[Draft]) -> None:
        now = self._clock()
        check_drafts(drafts, self.limits, now, self.definition.segments)
        self._refuse_delayed(drafts, now)

    def _refuse_delayed(self, drafts: Sequence[Draft], now: float) -> None:
        for i, d in enumerate(drafts):
            if d.deliver_at is not None and d.deliver_at > now:
                raise NotOnSharedQueue(
                    f"messages[{i}]: queue {self.name!r} is shared: shared queues have no delayed "
                    "delivery in this version (deliver_at / delay)",
                    field=f"messages[{i}].deliver_at",
                )

    async def append(
        self, drafts: Sequence[Draft], save: SaveMode = SaveMode.DEFAULT
    ) -> list[Appended | Delayed]:
        """Store new messages (dedup by identity across every node) once ``save`` is met."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        self.check(drafts)
        own = self.own
        # An identity named twice in one call is stored once: the later ones answer the first's id.
        first_of: dict[tuple[str, int], int] = {}
        repeats: dict[int, int] = {}
        for i, d in enumerate(drafts):
            if d.external_id is not None:
                key = (own if d.source is None else d.source, d.external_id)
                if key in first_of:
                    repeats[i] = first_of[key]
                else:
                    first_of[key] = i
        kept = [d for i, d in enumerate(drafts) if i not in repeats] if repeats else list(drafts)
        data = drafts_batch(kept, source=own)
        runs = runs_of([(own if d.source is None else d.source, d.external_id) for d in kept])
        results = await self._submit(data, len(kept), runs, save)
        if not repeats:
            return list(results)
        out: list[Appended | Delayed] = []
        at: dict[int, Appended] = {}
        it = iter(results)
        for i in range(len(drafts)):
            first = repeats.get(i)
            if first is None:
                at[i] = next(it)
                out.append(at[i])
            else:
                out.append(Appended(at[first].id, True))
        return out

    async def append_batch(
        self,
        batch: RecordBatch,
        save: SaveMode = SaveMode.DEFAULT,
        *,
        given: Given | None = None,
        whole: bool = False,
    ) -> list[Appended]:
        """A producer's record batch as it came, under ``append``'s rules. A batch is one
        commit (one transaction): it is always stored whole, so ``whole`` asks nothing more."""
        if self._closing:
            raise ShuttingDown(f"queue {self.name} is closing")
        own, now = self.own, self._clock()
        # The defaults the server fills in are read as filled in: the producer's head counts for
        # nothing (its source is this cluster's name at read time too: ``node.stamped``).
        batch = msgspec.structs.replace(batch, base_time=now, source=own)
        fields, external_ids, _ = check_batch(batch, self.limits, now, self.definition.segments, own, given)
        n = batch.count
        repeats: dict[int, int] = {}
        data = batch.raw()
        if external_ids is None:
            runs: list[Run] = []
        else:
            sources = fields.sources if fields is not None else [own] * n
            first_of: dict[tuple[str, int], int] = {}
            for i, ext in enumerate(external_ids):
                if ext is not None:
                    key = (sources[i], ext)
                    if key in first_of:
                        repeats[i] = first_of[key]
                    else:
                        first_of[key] = i
            keep = [i not in repeats for i in range(n)]
            if repeats:
                cut = record_batch.select(batch, keep)
                assert cut is not None  # the first of every repeat is kept
                data = cut
            runs = runs_of([(sources[i], external_ids[i]) for i in range(n) if keep[i]])
        results = await self._submit(data, n - len(repeats), runs, save)
        if not repeats:
            return results
        out: list[Appended] = []
        at: dict[int, Appended] = {}
        it = iter(results)
        for i in range(n):
            first = repeats.get(i)
            if first is None:
                at[i] = next(it)
                out.append(at[i])
            else:
                out.append(Appended(at[first].id, True))
        return out

    async def _submit(self, data: bytes, count: int, runs: list[Run], save: SaveMode) -> list[Appended]:
        mode = save.resolve(self.definition.save)
        self.counters.produce_requests += 1
        unattended = mode is SaveMode.NONE or mode is SaveMode.MARK
        pending = self._node.flusher.add(
            self.name, data, count, runs, urgent=mode is SaveMode.IMMEDIATE, keep=unattended
        )
        if unattended:
            # Answered from the buffer: the flush gives the ids, and a failure is only logged.
            pending.done.add_done_callback(_retrieved)
            return [Buffered(0, False)] * count
        committed = await self._node.wait_committed(pending.done)
        if committed.first_id == MISSING_QUEUE:
            raise QueueNotFound(
                f"no queue {self.name!r}: it was dropped before these messages were committed"
            )
        return answers(committed, count)

    def committed(
        self, result: Committed, count: int, key: str, offset: int, size: int, object_size: int
    ) -> None:
        """This node committed a batch of this queue: note its segment, wake the readers."""
        kept = count - len(result.duplicates)
        if kept <= 0 or result.first_id <= 0:
            return
        last = result.first_id + kept - 1
        segment = Segment(
            self.name,
            result.first_id,
            last,
            key,
            offset,
            size,
            count,
            tuple(sorted(result.duplicates)),
            result.time,
        )
        if self._segments and self._segments[-1].last_id + 1 == result.first_id:
            self._cache([segment])
        self.counters.produced += kept
        self.counters.duplicates += len(result.duplicates)
        self.moved(last + 1)

    def moved(self, next_id: int, first_id: int | None = None) -> None:
        """PostgreSQL says the queue's ids now end below ``next_id`` (a commit on any node)."""
        if first_id is not None and first_id > self._first_id:
            # Retention moved the first id (here or on another node): what lies below it is
            # not served again, though its objects live on through the janitor's grace.
            self._first_id = first_id
            keep = bisect.bisect_left([s.last_id for s in self._segments], first_id)
            if keep:
                del self._segments[:keep], self._firsts[:keep], self._fetched[:keep]
        if next_id > self._next_id:
            self._next_id = next_id
            self._wake()

    def head(self, first_id: int, next_id: int) -> None:
        """The queue's ids as PostgreSQL has them now (a poll, not a notice: notices may come
        late). Ids never go down, so lower ones mean the queue was dropped and created again
        under this name: what this node cached of the old one goes."""
        if next_id < self._next_id:
            self._forget()
            self._next_id = next_id
            self._first_id = first_id
            self._wake()
        self.moved(next_id, first_id)

    def _wake(self) -> None:
        self.arrived.set()
        self.arrived = asyncio.Event()

    async def flush(self) -> int:
        return 0  # the node's flusher saves every shared queue's writes within its window

    async def tick(self) -> None:
        return None

    # --- reading -----------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    @property
    def own(self) -> str:
        return self._node.cluster_name

    @property
    def last_id(self) -> int:
        return self._next_id - 1

    @property
    def first_id(self) -> int:
        return self._first_id

    async def read_page(
        self,
        after: int,
        limit: int,
        segments: Sequence[tuple[int, int]] | None = None,
        match: MessageFilter | None = None,
        render: Render | None = None,
    ) -> Page:
        """The messages with id > ``after`` in id order, at most ``limit``, as slices of batches."""
        self.counters.read_requests += 1
        # A queue read here keeps its heads polled: with NOTIFY lost, this node still learns of
        # what the others commit.
        self._node.watch(self)
        after = max(after, self._first_id - 1)  # nothing below the first id retention kept
        builder = PageBuilder(after, limit, segments, match)
        cursor = after
        done = False
        reread = False
        while not done:
            found = await self._segments_after(cursor)
            if not found:
                break
            for segment in found:
                try:
                    batch = await self._node.batch_of(segment)
                except (KeyNotFound, CorruptData) as exc:
                    # Expired or compacted since the row was read (its object deleted after the
                    # grace): this read asks for the rows again, once; an empty page here would
                    # leave a long poll waiting for a message that exists.
                    log.debug("segment unreadable queue=%s first=%d: %s", self.name, segment.first_id, exc)
                    self._forget()
                    done = reread
                    reread = True
                    break
                cursor = segment.last_id
                if builder.add(batch):
                    done = True
                    break
        page = builder.page()
        self.counters.read += page.count
        return page

    async def _segments_after(self, after: int) -> list[Segment]:
        """The segment rows with ids past ``after``: from the cache when it holds them."""
        now = time.monotonic()
        # Rows read more than SEGMENT_TTL ago go: compaction may have replaced them since.
        stale = bisect.bisect_left(self._fetched, now - SEGMENT_TTL)
        if stale:
            del self._segments[:stale], self._firsts[:stale], self._fetched[:stale]
        segs, firsts = self._segments, self._firsts
        if segs and firsts[0] <= after + 1 <= segs[-1].last_id:
            i = max(0, bisect.bisect_right(firsts, after) - 1)
            if segs[i].last_id <= after:
                i += 1
            return segs[i : i + FETCH]
        if after + 1 >= self._next_id and segs and segs[-1].last_id == after:
            # Nothing newer as far as this node has heard; but a write answered on another node
            # just before this read must be in it: ask PostgreSQL (one query for the reads
            # that come meanwhile).
            try:
                await self._confirm_head()
            except StorageUnavailable:
                return []  # PostgreSQL is down: what this node has is the answer until it is back
            if after + 1 >= self._next_id:
                return []
        rows = await self._node.segments_after(self.name, after, FETCH)
        if rows:
            if segs and segs[-1].last_id + 1 == rows[0].first_id:
                self._cache(rows)
            elif not segs or after >= segs[-1].last_id:
                self._forget()
                self._cache(rows)
            self.moved(rows[-1].last_id + 1)
        return rows

    async def _confirm_head(self) -> None:
        """The queue's head as PostgreSQL has it now: read by a query that started after this
        call did, shared with every read that arrives while it runs."""
        arrived = time.monotonic()
        while True:
            task = self._head_task
            if task is None:
                self._head_started = time.monotonic()
                task = self._head_task = asyncio.ensure_future(self._read_head())
                await asyncio.shield(task)
                return
            started = self._head_started
            await asyncio.shield(task)
            if started >= arrived:
                return
            # That query began before this read: what it saw may not hold a write answered
            # just before; wait for (or start) the next.

    async def _read_head(self) -> None:
        try:
            await self._node.poll_heads([self.name])
        finally:
            self._head_task = None

    def _cache(self, rows: Sequence[Segment]) -> None:
        now = time.monotonic()
        for row in rows:
            if self._segments and row.first_id <= self._segments[-1].last_id:
                continue
            self._segments.append(row)
            self._firsts.append(row.first_id)
            self._fetched.append(now)
        extra = len(self._segments) - CACHED_SEGMENTS
        if extra > 0:
            del self._segments[:extra], self._firsts[:extra], self._fetched[:extra]

    def _forget(self) -> None:
        self._segments, self._firsts, self._fetched = [], [], []

    async def wait_for(self, after: int, timeout: float) -> None:  # noqa: ASYNC109 (long-poll length from the API)
        """Return once a message with id > ``after`` exists, or after ``timeout`` seconds."""
        self._node.watch(self)
        await wait_until(lambda: self._next_id - 1 > after or self._closing, lambda: self.arrived, timeout)

    # --- subscriptions (cursor mode, in PostgreSQL) -----------------------------------------------

    def subscription(self, name: str) -> SubscriptionState:
        try:
            return self._subs[name]
        except KeyError:
            raise SubscriptionNotFound(f"no subscription {name!r}") from None

    def subscriptions(self) -> list[SubscriptionState]:
        return [self._subs[name] for name in sorted(self._subs)]

    async def current_subscription(self, name: str) -> SubscriptionState:
        # This node's copy is as old as the last notice: a consumer whose reads go through
        # one node and then another (a load balancer) would be served again what it had.
        self.noted(await self._node.subscription_row(self.name, name), name)
        return self.subscription(name)

    def noted(self, row: SubRow | None, name: str) -> None:
        """A cursor as PostgreSQL has it now (None: dropped)."""
        if row is None:
            self._subs.pop(name, None)
        else:
            self._subs[name] = SubscriptionState(
                row.name,
                row.last_id,
                row.replica,
                row.created,
                row.updated,
                group=row.group,
                metadata=row.metadata,
            )

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
        row, created = await self._node.commit_cursor(
            self.name, name, last_id, replica=replica, reset=reset, group=group, metadata=metadata
        )
        self.noted(row, name)
        self._wake_replicas()
        return self._subs[name], created

    async def delete_subscription(self, name: str, save: SaveMode = SaveMode.DEFAULT) -> None:
        if not await self._node.delete_subscription(self.name, name):
            raise SubscriptionNotFound(f"no subscription {name!r}")
        self.noted(None, name)

    def replicas(self, message_id: int) -> list[str]:
        return sorted(s.name for s in self._subs.values() if s.replica and s.last_id >= message_id)

    def _wake_replicas(self) -> None:
        self._node.replicas_moved.set()
        self._node.replicas_moved = asyncio.Event()

    async def wait_replicas(self, message_id: int, count: int, timeout: float) -> list[str]:  # noqa: ASYNC109 (API parameter)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            holders = self.replicas(message_id)
            remaining = deadline - loop.time()
            if len(holders) >= count or remaining <= 0 or self._closing:
                return holders
            event = self._node.replicas_moved
            try:
                async with asyncio.timeout(min(remaining, 0.5)):
                    await event.wait()
            except TimeoutError:
                # Behind the NOTIFY of cursor commits; PostgreSQL down only makes the receipt late.
                with contextlib.suppress(StorageUnavailable):
                    await self._node.refresh_subscriptions(self)

    # --- retention ---------------------------------------------------------------------------

    async def expire(self, rule: Retention) -> tuple[int, int]:
        """Delete the oldest segments ``rule`` lets go (the cut PostgreSQL finds: never inside
        a segment), their identities with them; reads start at the new first id."""
        first_id, gone, freed = await self._node.expire(self.name, rule, self._clock())
        self.moved(self._next_id, first_id)
        return gone, freed

    # --- stats -------------------------------------------------------------------------------

    def blocks(self, after: int, limit: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for s in self._segments:
            if s.last_id > after and len(found) < limit:
                found.append(
                    {
                        "first_id": s.first_id,
                        "last_id": s.last_id,
                        "count": s.last_id - s.first_id + 1,
                        "bytes": s.byte_size,
                        "mark": 0,
                        "state": "sealed",
                        "loaded": False,
                        "sealed": s.time,
                    }
                )
        return found

    def stats(self) -> dict[str, Any]:
        fault = self._node.fault
        return {
            "first_id": self._first_id,
            "last_id": self.last_id,
            "messages": max(0, self._next_id - self._first_id),
            "bytes": sum(s.byte_size for s in self._segments),
            "blocks": {"total": len(self._segments), "by_mark": {}, "by_state": {}},
            "subscriptions": len(self._subs),
            "scheduled": {"count": 0, "in_memory": 0, "chunks": 0, "next_due": None},
            "recovery": {"truncated_bytes": 0, "quarantined_blocks": [], "gaps": []},
            "writable": fault is None,
            "faults": []
            if fault is None
            else [{"step": "shared", "error": fault, "since": self._node.fault_since}],
            "last_error": self._last_error,
        }


def _retrieved(done: asyncio.Future[Committed]) -> None:
    if not done.cancelled() and (exc := done.exception()) is not None:
        level = logging.WARNING if isinstance(exc, StorageUnavailable) else logging.ERROR
        log.log(level, "a buffered shared write was not saved: %s", exc)
