"""The window of one work queue, in memory: the claimed messages that are not finished, and the dead.

``high`` is the highest id ever claimed; ids above it are simply the queue's log. An entry is
kept for each id at or below ``high`` that is leased (``in_flight``) or waiting for a retry
(``failed``), and a dead entry for each message that used up its attempts. Every change
appends a record to ``records``; ``capella.core.work.work_queue`` writes them to its change log, and
``apply`` replays them at recovery on top of the snapshot (``dump``/``load``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from capella.errors import CorruptData

LEASED = "in_flight"
WAITING = "failed"

# The kinds of change record: a JSON array whose first element is the kind. The letters are
# what the change log holds on disk, so they never change.
RECORD_LEASE = "L"  # ["L", high, [[id, claims, attempts, until], ...]]
RECORD_WAIT = "W"  # ["W", [[id, claims, attempts, until, error], ...]]
RECORD_REMOVE = "A"  # ["A", [id, ...]]: acked or deleted (A for the ack it mostly is)
RECORD_BURY = "D"  # ["D", [[id, claims, attempts, error, died], ...]]
RECORD_FORGET = "F"  # ["F", [id, ...]]: dead entries forgotten
RECORD_SKIP = "S"  # ["S", [id, ...]]: ids above ``high`` deleted before any claim
# Dead messages kept for operators; the oldest are forgotten beyond this (they stay in the
# dead-letter queue when there is one).
MAX_DEAD = 10_000


@dataclass(slots=True)
class Entry:
    """A claimed message that is not finished."""

    id: int
    state: str  # LEASED or WAITING
    claims: int  # claims ever: the second half of the receipt
    attempts: int  # claims since it was last moved back from the dead letters
    until: float  # leased: when the lease ends; waiting: when it may be claimed again
    error: str | None = None

    @property
    def receipt(self) -> str:
        return f"{self.id}.{self.claims}"

    def row(self) -> list[Any]:
        return [self.id, self.state, self.claims, self.attempts, self.until, self.error]


@dataclass(slots=True)
class DeadEntry:
    id: int
    claims: int
    attempts: int
    error: str | None
    died: float

    def row(self) -> list[Any]:
        return [self.id, self.claims, self.attempts, self.error, self.died]


class WorkState:
    """The window of one ack-mode subscription, in memory; every change emits a log record."""

    def __init__(self) -> None:
        self.high = 0
        self.entries: dict[int, Entry] = {}
        self.dead: dict[int, DeadEntry] = {}
        self.skipped: set[int] = set()  # ids above ``high`` an operator deleted before any claim
        self._leases: list[tuple[float, int]] = []
        self._waits: list[tuple[float, int]] = []
        self.records: list[bytes] = []
        self._replays: dict[str, Callable[[list[Any]], None]] = {
            RECORD_LEASE: self._replay_lease,
            RECORD_WAIT: self._replay_wait,
            RECORD_REMOVE: self._replay_remove,
            RECORD_BURY: self._replay_bury,
            RECORD_FORGET: self._replay_forget,
            RECORD_SKIP: self._replay_skip,
        }

    @property
    def floor(self) -> int:
        """Every id at or below this is finished (acked, dead or deleted)."""
        return min(self.entries, default=self.high + 1) - 1

    def count(self, state: str) -> int:
        return sum(1 for e in self.entries.values() if e.state == state)

    def next_timer(self) -> float | None:
        """When the next lease ends or the next failed message may be claimed again."""
        self._trim(self._leases, LEASED)
        self._trim(self._waits, WAITING)
        times = [h[0][0] for h in (self._leases, self._waits) if h]
        return min(times) if times else None

    def _trim(self, heap: list[tuple[float, int]], state: str) -> None:
        while heap:
            until, mid = heap[0]
            e = self.entries.get(mid)
            if e is not None and e.state == state and e.until == until:
                return
            heapq.heappop(heap)

    def due(self, heap_state: str, now: float, limit: int | None = None) -> list[Entry]:
        """Entries in ``heap_state`` whose time is up, earliest first (at most ``limit``)."""
        heap = self._leases if heap_state == LEASED else self._waits
        out: list[Entry] = []
        while heap and heap[0][0] <= now and (limit is None or len(out) < limit):
            until, mid = heapq.heappop(heap)
            e = self.entries.get(mid)
            if e is not None and e.state == heap_state and e.until == until:
                out.append(e)
        return out

    def put_back(self, entries: Iterable[Entry]) -> None:
        for e in entries:
            self._push(e)

    def _push(self, e: Entry) -> None:
        heapq.heappush(self._leases if e.state == LEASED else self._waits, (e.until, e.id))

    # --- changes (each emits a record) ---------------------------------------------------

    def lease(self, entries: list[Entry], high: int) -> None:
        if not entries and high <= self.high:
            return  # an empty claim changes nothing: no record, no fsync
        for e in entries:
            self.entries[e.id] = e
            self._push(e)
        if high > self.high:
            self.high = high
            self.skipped = {i for i in self.skipped if i > high}
        self._emit([RECORD_LEASE, self.high, [[e.id, e.claims, e.attempts, e.until] for e in entries]])

    def wait(self, entries: list[Entry]) -> None:
        for e in entries:
            self.entries[e.id] = e
            self._push(e)
        self._emit([RECORD_WAIT, [[e.id, e.claims, e.attempts, e.until, e.error] for e in entries]])

    def remove(self, ids: list[int]) -> None:
        for i in ids:
            self.entries.pop(i, None)
        self._emit([RECORD_REMOVE, ids])

    def bury(self, dead: list[DeadEntry]) -> None:
        for d in dead:
            self.entries.pop(d.id, None)
            self.dead[d.id] = d
        forgotten = self._trim_dead()
        self._emit([RECORD_BURY, [d.row() for d in dead]])
        if forgotten:
            self._emit([RECORD_FORGET, forgotten])

    def forget_dead(self, ids: list[int]) -> None:
        for i in ids:
            self.dead.pop(i, None)
        self._emit([RECORD_FORGET, ids])

    def skip(self, ids: list[int]) -> None:
        self.skipped.update(i for i in ids if i > self.high)
        self._emit([RECORD_SKIP, ids])

    def _trim_dead(self) -> list[int]:
        if len(self.dead) <= MAX_DEAD:
            return []
        oldest = sorted(self.dead.values(), key=lambda d: d.died)[: len(self.dead) - MAX_DEAD]
        for d in oldest:
            del self.dead[d.id]
        return [d.id for d in oldest]

    def _emit(self, record: list[Any]) -> None:
        self.records.append(orjson.dumps(record))

    # --- durable form --------------------------------------------------------------------

    def apply(self, record: bytes) -> None:
        """Replay one record at recovery."""
        try:
            kind, *rest = orjson.loads(record)
            replay = self._replays.get(kind)
            if replay is None:
                raise ValueError(f"unknown record kind {kind!r}")
            replay(rest)
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise CorruptData(f"work record is not valid: {exc}") from None

    # Each takes the record after its kind, as ``lease`` ... ``skip`` above wrote it.

    def _replay_lease(self, rest: list[Any]) -> None:
        high, rows = rest
        for i, claims, attempts, until in rows:
            self._set(Entry(i, LEASED, claims, attempts, until))
        if high > self.high:
            self.high = high
            self.skipped = {i for i in self.skipped if i > high}

    def _replay_wait(self, rest: list[Any]) -> None:
        for i, claims, attempts, until, error in rest[0]:
            self._set(Entry(i, WAITING, claims, attempts, until, error))

    def _replay_remove(self, rest: list[Any]) -> None:
        for i in rest[0]:
            self.entries.pop(i, None)

    def _replay_bury(self, rest: list[Any]) -> None:
        for i, claims, attempts, error, died in rest[0]:
            self.entries.pop(i, None)
            self.dead[i] = DeadEntry(i, claims, attempts, error, died)

    def _replay_forget(self, rest: list[Any]) -> None:
        for i in rest[0]:
            self.dead.pop(i, None)

    def _replay_skip(self, rest: list[Any]) -> None:
        self.skipped.update(i for i in rest[0] if i > self.high)

    def _set(self, e: Entry) -> None:
        self.entries[e.id] = e
        self._push(e)

    def dump(self) -> bytes:
        return orjson.dumps(
            {
                "version": 1,
                "high": self.high,
                "entries": [e.row() for e in self.entries.values()],
                "dead": [d.row() for d in self.dead.values()],
                "skipped": sorted(self.skipped),
            }
        )

    def load(self, data: bytes) -> None:
        try:
            doc = orjson.loads(data)
            self.high = int(doc["high"])
            for i, state, claims, attempts, until, error in doc["entries"]:
                if state not in (LEASED, WAITING):
                    raise ValueError(f"unknown state {state!r}")
                self._set(Entry(i, state, claims, attempts, until, error))
            for i, claims, attempts, error, died in doc["dead"]:
                self.dead[i] = DeadEntry(i, claims, attempts, error, died)
            self.skipped = set(doc["skipped"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptData(f"work snapshot is not valid: {exc}") from None
