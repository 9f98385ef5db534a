"""The object cache of a node: shared objects' bytes in memory, bounded by their total size.

Two kinds of entry. A node's own recent objects are *pinned* (write-through, ``pin``): a tail
read of what the node just wrote costs no GET, however busy the LRU is, until the pin's time
passes; then the entry is an ordinary one. Ordinary entries form an LRU of at most
``max_bytes``; an object larger than that is never kept. Pinned bytes count against
``max_bytes`` (while they fill it the LRU holds nothing) but are never evicted: what they hold
is bounded by the caller, about ``flush_bytes`` per flush for the pin's length. The cache reads
no clock of its own; it is given the caller's.

``fetch`` is the read policy, kept simple:

- the object is in the cache: its slice, no GET;
- the caller knows the object's size, it is at most ``whole_below`` bytes and fits in the
  cache: ONE whole-object GET, kept in the LRU, then the slice. An object holds one window of
  a node's writes to every shared queue, so when one read needs part of it the next page, the
  other queues and the other readers usually need the rest (WarpStream's over-read): one GET
  per object per node instead of one per read. A caller that knows only one read will need
  the object passes ``whole_below=0``;
- otherwise one ranged GET of just the bytes asked for, not kept.

Concurrent misses for one object (or one range) share ONE GET (single flight): the first
caller's GET runs as a task of its own that the others await, and a waiter that is cancelled
does not cancel it for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from capella.errors import CorruptData, InvalidRequest
from capella.storage import Storage


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What the cache holds and how it served: for metrics and ``/readyz``."""

    hits: int
    misses: int
    bytes: int
    entries: int
    pinned: int
    whole_gets: int
    range_gets: int
    fetched_bytes: int


class ObjectCache:
    """Object bytes by key: an LRU of at most ``max_bytes`` plus the node's pinned own objects."""

    def __init__(self, max_bytes: int, clock: Callable[[], float]) -> None:
        if max_bytes < 0:
            raise InvalidRequest(f"object cache: max_bytes {max_bytes} is negative")
        self.max_bytes = max_bytes
        self._clock = clock
        self._lru: OrderedDict[str, bytes] = OrderedDict()
        self._lru_bytes = 0
        self._pinned: dict[str, tuple[bytes, float]] = {}
        self._pinned_bytes = 0
        self._next_unpin = float("inf")
        self._flights: dict[tuple[str, int, int], asyncio.Task[bytes]] = {}
        self._hits = self._misses = 0
        self._whole_gets = self._range_gets = self._fetched_bytes = 0

    @property
    def stats(self) -> CacheStats:
        self._unpin()
        return CacheStats(
            hits=self._hits,
            misses=self._misses,
            bytes=self._lru_bytes + self._pinned_bytes,
            entries=len(self._lru) + len(self._pinned),
            pinned=len(self._pinned),
            whole_gets=self._whole_gets,
            range_gets=self._range_gets,
            fetched_bytes=self._fetched_bytes,
        )

    def get(self, key: str) -> bytes | None:
        """The object's bytes if the cache holds them (a hit makes it the most recent)."""
        found = self._peek(key)
        if found is None:
            self._misses += 1
        else:
            self._hits += 1
        return found

    def put(self, key: str, data: bytes) -> None:
        """Keep ``data`` as the most recent ordinary entry (not if it alone exceeds ``max_bytes``).

        A pinned key keeps its pin; it gets the new bytes.
        """
        self._unpin()
        pinned = self._pinned.get(key)
        if pinned is not None:
            self._pinned_bytes += len(data) - len(pinned[0])
            self._pinned[key] = (data, pinned[1])
            self._evict()
            return
        self._drop_lru(key)
        if len(data) > self.max_bytes:
            return
        self._lru[key] = data
        self._lru_bytes += len(data)
        self._evict()

    def pin(self, key: str, data: bytes, until: float) -> None:
        """Keep ``data`` whatever the LRU needs until the clock reaches ``until``, then as ordinary."""
        self._unpin()
        if until <= self._clock():
            self.put(key, data)
            return
        self._drop_lru(key)
        old = self._pinned.get(key)
        if old is not None:
            self._pinned_bytes -= len(old[0])
            until = max(until, old[1])
        self._pinned[key] = (data, until)
        self._pinned_bytes += len(data)
        self._next_unpin = min(self._next_unpin, until)
        self._evict()

    def discard(self, key: str) -> None:
        """Forget the object (deleted from the store, say), pinned or not."""
        pinned = self._pinned.pop(key, None)
        if pinned is not None:
            self._pinned_bytes -= len(pinned[0])
        self._drop_lru(key)

    async def fetch(
        self, key: str, start: int, length: int, storage: Storage, *, size: int | None, whole_below: int
    ) -> bytes:
        """Bytes ``start`` to ``start + length`` of the object at ``key``, by the policy above.

        ``size`` is the object's size if the caller knows it (the objects table does). Errors
        are ``Storage.get_range``'s: ``KeyNotFound``, ``CorruptData`` for a start at or past
        the end (also of a cached object), ``StorageUnavailable``.
        """
        if start < 0 or length < 1:
            raise InvalidRequest(f"object cache: bad range of {key!r}: start {start}, length {length}")
        found = self._peek(key)
        if found is not None:
            self._hits += 1
            return _slice(key, found, start, length)
        self._misses += 1
        if size is not None and size <= whole_below and size <= self.max_bytes:
            whole = await self._once((key, 0, -1), lambda: self._load_whole(key, storage))
            return _slice(key, whole, start, length)
        return await self._once((key, start, length), lambda: self._load_range(key, start, length, storage))

    async def _load_whole(self, key: str, storage: Storage) -> bytes:
        self._whole_gets += 1
        data = await storage.get(key)
        self._fetched_bytes += len(data)
        if key not in self._pinned:  # pinned meanwhile by our own flush: those bytes stay
            self.put(key, data)
        return data

    async def _load_range(self, key: str, start: int, length: int, storage: Storage) -> bytes:
        self._range_gets += 1
        data = await storage.get_range(key, start, length)
        self._fetched_bytes += len(data)
        return data

    async def _once(self, flight: tuple[str, int, int], load: Callable[[], Awaitable[bytes]]) -> bytes:
        task = self._flights.get(flight)
        if task is None:

            async def run() -> bytes:
                return await load()

            task = asyncio.ensure_future(run())
            self._flights[flight] = task
            task.add_done_callback(lambda done: self._landed(flight, done))
        # shield: a waiter that is cancelled leaves the GET running for the others.
        return await asyncio.shield(task)

    def _landed(self, flight: tuple[str, int, int], task: asyncio.Task[bytes]) -> None:
        if self._flights.get(flight) is task:
            del self._flights[flight]
        # Every waiter may have been cancelled: the error must not go unretrieved.
        with contextlib.suppress(asyncio.CancelledError):
            task.exception()

    def _peek(self, key: str) -> bytes | None:
        self._unpin()
        pinned = self._pinned.get(key)
        if pinned is not None:
            return pinned[0]
        data = self._lru.get(key)
        if data is not None:
            self._lru.move_to_end(key)
        return data

    def _unpin(self) -> None:
        """Pins whose time has come become ordinary entries (the most recent ones)."""
        now = self._clock()
        if now < self._next_unpin:
            return
        due = sorted((until, key) for key, (_, until) in self._pinned.items() if until <= now)
        for _, key in due:
            data, _ = self._pinned.pop(key)
            self._pinned_bytes -= len(data)
            if len(data) <= self.max_bytes:
                self._lru[key] = data
                self._lru_bytes += len(data)
        self._next_unpin = min((until for _, until in self._pinned.values()), default=float("inf"))
        self._evict()

    def _drop_lru(self, key: str) -> None:
        old = self._lru.pop(key, None)
        if old is not None:
            self._lru_bytes -= len(old)

    def _evict(self) -> None:
        while self._lru_bytes + self._pinned_bytes > self.max_bytes and self._lru:
            _, data = self._lru.popitem(last=False)
            self._lru_bytes -= len(data)


def _slice(key: str, data: bytes, start: int, length: int) -> bytes:
    """``Storage.get_range``'s answer, from bytes in memory."""
    if start >= len(data):
        raise CorruptData(
            f"object cache: range of {key!r} starts at byte {start}, but the value has {len(data)} bytes"
        )
    if start == 0 and length >= len(data):
        return data
    return data[start : start + length]
