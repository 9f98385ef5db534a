"""A queue as the API, the handlers and the metrics see it, whether local or shared.

``capella.core.queue.Queue`` keeps its log in blocks on this node's mounts;
``capella.shared.queue.SharedQueue`` keeps it in S3 objects ordered by PostgreSQL, written and
read through every node of a shared cluster. Both answer the same calls with the same shapes
(``Page``, ``Appended``), and both hold every message to the same rules
(``capella.core.limits.check_drafts``). What only a local queue does (delayed delivery, ack-mode
work queues, block maintenance) is refused here with ``NotOnSharedQueue``; the local queue
overrides it.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

from capella.core.definition import QueueSettings
from capella.core.filter import MessageFilter, matches
from capella.core.limits import MessageLimits
from capella.core.log.batch import Batch
from capella.core.log.blocks import BlockMeta, Render
from capella.core.log.writer import Appended
from capella.core.message import Draft, LogMessage, SaveMode
from capella.core.retention import Retention
from capella.core.stats import QueueCounters
from capella.core.subscription import SubscriptionState
from capella.errors import NotOnSharedQueue
from capella.records.record_batch import Given, RecordBatch

if TYPE_CHECKING:
    from capella.core.delayed.intake import Delayed
    from capella.core.delayed.item import DelayedMessage
    from capella.core.delayed.schedule import Schedule
    from capella.core.work.retry import RetrySettings
    from capella.core.work.work_queue import WorkQueue


class ReadResult(NamedTuple):
    messages: list[LogMessage]
    last_id: int


@dataclass(frozen=True, slots=True)
class Page:
    """What a read found: slices ``(batch, start, stop)`` in id order, and how far it looked."""

    parts: list[tuple[Batch, int, int]]
    last_id: int

    @property
    def count(self) -> int:
        return sum(stop - start for _, start, stop in self.parts)

    def messages(self) -> list[LogMessage]:
        return list(chain.from_iterable(batch.messages[start:stop] for batch, start, stop in self.parts))


# A filtered read stops scanning after this many messages and answers with what it has.
SCAN_LIMIT = 100_000


class PageBuilder:
    """A read's page, put together from the batches past ``after`` in id order.

    ``add`` takes each batch in turn and answers True once the page is full (or a filtered read
    has looked at ``SCAN_LIMIT`` messages); ``passed`` notes ids a read skipped (a block it
    cannot serve), so ``last_id`` still says how far it looked.
    """

    def __init__(
        self,
        after: int,
        limit: int,
        segments: Sequence[tuple[int, int]] | None = None,
        match: MessageFilter | None = None,
    ) -> None:
        self._limit = limit
        self._passes = _passes(segments, match)
        self._parts: list[tuple[Batch, int, int]] = []
        self._count = 0
        self._last = after
        self._scanned = 0

    @property
    def room(self) -> int:
        """How many more messages the read may look at."""
        if self._passes is None:
            return self._limit - self._count
        return SCAN_LIMIT - self._scanned

    def passed(self, last_id: int) -> None:
        self._last = max(self._last, last_id)

    def add(self, batch: Batch) -> bool:
        limit, passes = self._limit, self._passes
        # Past the last id the page holds (or looked at), not only past ``after``: a shared
        # queue's read may meet a compacted block holding ids it already served from the
        # older segments it had cached.
        start = bisect.bisect_right(batch.ids, self._last)
        if passes is None:
            stop = min(len(batch), start + limit - self._count)
            if stop > start:
                self._count += stop - start
                self._last = batch.ids[stop - 1]
                self._parts.append((batch, start, stop))
        else:
            found: list[LogMessage] = []
            for m in batch.messages[start:]:
                self._scanned += 1
                self._last = m.id
                if passes(m):
                    found.append(m)
                    if self._count + len(found) >= limit:
                        break
                if self._scanned >= SCAN_LIMIT:
                    break
            if found:
                self._parts.append((Batch.of_messages(found), 0, len(found)))
                self._count += len(found)
        return self._count >= limit or self._scanned >= SCAN_LIMIT

    def page(self) -> Page:
        return Page(self._parts, self._last)


def _passes(
    segments: Sequence[tuple[int, int]] | None, match: MessageFilter | None
) -> Callable[[LogMessage], bool] | None:
    """The test a filtered read puts each message to; ``None`` when every message passes."""
    if match is None or match.empty:
        if segments is None:
            return None
        match = MessageFilter(segments=tuple(segments))
    elif segments is not None:
        raise ValueError("read_after: give segments inside match, not beside it")
    return functools.partial(matches, match)


async def wait_until(
    arrived: Callable[[], bool],
    event: Callable[[], asyncio.Event],
    timeout: float,  # noqa: ASYNC109 (a long poll's length, from the API)
) -> None:
    """A long poll: return once ``arrived()`` is true, or after ``timeout`` seconds. ``event()``
    is the event the next arrival (or close) sets, read again after each wake."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not arrived():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        try:
            async with asyncio.timeout(remaining):
                await event().wait()
        except TimeoutError:
            return


class Buffered(Appended, frozen=True, gc=False):
    """A message of a shared queue answered from the node's buffer (``save`` none or mark):
    its id comes with the flush, so it has none yet (0) and says it is pending."""

    pending: bool = True


class BaseQueue(ABC):
    """One queue, local or shared."""

    name: str
    limits: MessageLimits
    counters: QueueCounters

    @property
    def shared(self) -> bool:
        return self.definition.shared

    # --- what every queue does -----------------------------------------------------------------

    @property
    @abstractmethod
    def definition(self) -> QueueSettings: ...

    @definition.setter
    @abstractmethod
    def definition(self, definition: QueueSettings) -> None: ...

    @abstractmethod
    def definition_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def destroy(self) -> None: ...

    @property
    @abstractmethod
    def faults(self) -> dict[str, tuple[str, float]]: ...

    @property
    @abstractmethod
    def write_fault(self) -> str | None: ...

    @property
    @abstractmethod
    def last_error(self) -> str | None: ...

    @last_error.setter
    @abstractmethod
    def last_error(self, message: str | None) -> None: ...

    @abstractmethod
    async def append(
        self, drafts: Sequence[Draft], save: SaveMode = SaveMode.DEFAULT
    ) -> list[Appended | Delayed]: ...

    @abstractmethod
    def check(self, drafts: Sequence[Draft]) -> None: ...

    @abstractmethod
    async def append_batch(
        self,
        batch: RecordBatch,
        save: SaveMode = SaveMode.DEFAULT,
        *,
        given: Given | None = None,
        whole: bool = False,
    ) -> list[Appended]: ...

    @abstractmethod
    async def flush(self) -> int: ...

    @abstractmethod
    async def tick(self) -> None: ...

    @abstractmethod
    def now(self) -> float: ...

    @property
    @abstractmethod
    def own(self) -> str: ...

    @property
    @abstractmethod
    def last_id(self) -> int: ...

    @property
    @abstractmethod
    def first_id(self) -> int: ...

    async def read_after(
        self,
        after: int,
        limit: int,
        segments: Sequence[tuple[int, int]] | None = None,
        match: MessageFilter | None = None,
    ) -> ReadResult:
        """Messages with id > ``after`` in id order, at most ``limit`` of them (``read_page``)."""
        page = await self.read_page(after, limit, segments, match)
        return ReadResult(page.messages(), page.last_id)

    @abstractmethod
    async def read_page(
        self,
        after: int,
        limit: int,
        segments: Sequence[tuple[int, int]] | None = None,
        match: MessageFilter | None = None,
        render: Render | None = None,
    ) -> Page: ...

    @abstractmethod
    async def wait_for(self, after: int, timeout: float) -> None: ...  # noqa: ASYNC109 (long-poll length from the API)

    @abstractmethod
    def subscription(self, name: str) -> SubscriptionState: ...

    @abstractmethod
    def subscriptions(self) -> list[SubscriptionState]: ...

    async def current_subscription(self, name: str) -> SubscriptionState:
        """``subscription`` as its cursor's store has it now, for a read that moves on from it:
        a shared queue asks PostgreSQL (another node may have moved it a moment ago)."""
        return self.subscription(name)

    @abstractmethod
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
        """Create or move cursor ``name`` (backwards only with ``reset``). ``replica``, ``group``
        (the consumer group that commits it) and ``metadata`` (its commit's own text) None keep
        what the cursor has; a commit that changes nothing saves nothing."""

    @abstractmethod
    async def delete_subscription(self, name: str, save: SaveMode = SaveMode.DEFAULT) -> None: ...

    @abstractmethod
    def replicas(self, message_id: int) -> list[str]: ...

    @abstractmethod
    async def wait_replicas(self, message_id: int, count: int, timeout: float) -> list[str]: ...  # noqa: ASYNC109 (API parameter)

    @abstractmethod
    def blocks(self, after: int, limit: int) -> list[dict[str, Any]]: ...

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    @abstractmethod
    async def expire(self, rule: Retention) -> tuple[int, int]:
        """Delete the oldest messages ``rule`` lets go, whole blocks (or segments) at a time;
        answers how many blocks (or segments) went and the bytes they held."""

    # --- what only a local queue does -------------------------------------------------------

    def _refuse(self, what: str) -> NotOnSharedQueue:
        return NotOnSharedQueue(
            f"queue {self.name!r} is shared: shared queues have no {what} in this version"
        )

    @property
    def schedule(self) -> Schedule:
        raise self._refuse("delayed delivery")

    async def reschedule(
        self, sid: int, deliver_at: float, save: SaveMode = SaveMode.DEFAULT
    ) -> DelayedMessage:
        raise self._refuse("delayed delivery")

    async def cancel_delayed(self, sids: Sequence[int], save: SaveMode = SaveMode.DEFAULT) -> list[int]:
        raise self._refuse("delayed delivery")

    def work(self, name: str) -> WorkQueue:
        raise self._refuse("ack-mode subscriptions")

    def work_queues(self) -> list[WorkQueue]:
        return []

    async def define_work(
        self, name: str, policy: RetrySettings, save: SaveMode = SaveMode.DEFAULT
    ) -> tuple[SubscriptionState, bool]:
        raise self._refuse("ack-mode subscriptions")

    def sealed_blocks(self) -> list[BlockMeta]:
        return []

    def unload(self, *, idle: float | None, age: float | None) -> tuple[int, int]:
        return 0, 0

    async def delete_block(self, first_id: int) -> int:
        raise self._refuse("blocks of its own to delete (retention runs on its segments)")

    async def move_block(self, first_id: int, mark: int) -> int:
        raise self._refuse("tiers to archive to")

    async def clean_leftovers(self) -> int:
        return 0
