"""M-of-K writes: store a batch on at least M of K clusters, and say which ones hold it.

Every message gets a stable identity (``source`` plus a generated ``external_id``) before
the first attempt, so writing it to several clusters, or again after a failure, can never
create two different messages: each cluster's dedup, and the copy handlers between them, see
one identity. An ``external_id`` the caller gives is used as it is.

The writer starts M requests at once; each failure starts the next untried cluster. It
returns as soon as M clusters have answered (the original client waited for all of them and
could report failure after success). Requests still running then are cancelled; one that had
already reached its cluster leaves a copy there, which is harmless for the same reason.

Generated external ids (``ExternalIds``) must not collide between writers that share a
source: two processes would otherwise mint the same identity, and a cluster would take the
second message for a duplicate of the first and drop it. Each writer takes its own run of
ids in the space of the current UTC day:

    bit 63      always 0 (ids are positive int64)
    bits 62..46 the UTC day (days since 1970; 17 bits last until the year 2328)
    bits 45..0  a random offset (46 bits from ``secrets``), then +1 per message

On the first message of each day the writer moves to that day's space at a fresh random
offset; within a writer ids only grow. Two writers' runs collide only when they share a day
and their runs overlap: with k writers (or restarts) under one source producing N generated
ids in a day, the chance that any two collide that day is about (k - 1) * N / 2**46: 6e-10
for two writers of 20,000 messages, 1e-6 for ten writers of a million each, 3e-3 for a
hundred writers of 24 million each (280 a second each, all day), 1e-2 for a million
one-message writers. A collision only matters while the first message is still in the queue.

The day comes first so that a source's ids keep growing across restarts, which keeps the
cluster's dedup on its O(1) path (an id above the highest seen for its source is new without
a look at any block); docs/replication.md compares this with a random prefix in the high
bits. A writer restarted on the day it last wrote lands below its predecessor half the time,
until the next UTC day; of writers that run at once under one source, all but the one with
the highest run are off the fast path (a source per writer avoids it).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from msgspec import UnsetType

from capella.client.async_client import AsyncClient, Save
from capella.client.message import MessageLike, to_wire
from capella.errors import CapellaError, InvalidRequest, NotEnoughReplicas
from capella.wire.messages import ProduceResult

# Bits of an external id below the day: the writer's random offset and its count.
OFFSET_BITS = 46
DAY = 86_400.0


class ExternalIds:
    """Strictly increasing external ids in a run of this writer's own (see the module).

    ``draw(n)`` gives a random integer below ``n``; the time is passed to ``next``.
    """

    def __init__(self, draw: Callable[[int], int] = secrets.randbelow) -> None:
        self._draw = draw
        self._day = -1
        self._next = 0

    def next(self, now: float) -> int:
        """The next id, at UNIX time ``now``."""
        day = int(now // DAY)
        if day > self._day:
            # A clock set back never moves the run back: it only starts a new day's run.
            self._day = day
            self._next = max(self._next, (day << OFFSET_BITS) + self._draw(1 << OFFSET_BITS))
        taken = self._next
        self._next = taken + 1
        return taken


@dataclass(frozen=True, slots=True)
class Receipt:
    """Where a batch is stored: the clusters (by URL) that acknowledged it, with their ids."""

    holders: dict[str, list[int]]
    failures: dict[str, str]
    external_ids: list[int]


class MultiWriter:
    """Write to ``required`` of the clusters at ``urls`` (async)."""

    def __init__(self, urls: Sequence[str], required: int, *, source: str, timeout: float = 10.0) -> None:
        if not urls:
            raise InvalidRequest("give at least one cluster URL")
        if not 1 <= required <= len(urls):
            raise InvalidRequest(f"required must be between 1 and {len(urls)}, got {required}")
        if not source:
            raise InvalidRequest("source must name this producer (it is half of each message's identity)")
        self.required = required
        self.source = source
        self._clients = {url: AsyncClient(url, timeout=timeout) for url in urls}
        self._ids = ExternalIds()

    async def __aenter__(self) -> MultiWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()

    async def produce(self, queue: str, messages: Iterable[MessageLike], *, save: Save = "wait") -> Receipt:
        """Store the batch on ``required`` clusters; ``NotEnoughReplicas`` when that fails."""
        wire: list[dict[str, Any]] = []
        now = time.time()
        for message in messages:
            item = to_wire(message)
            item.setdefault("source", self.source)
            # null is no id: the server would fall back to each cluster's own message id.
            if item.get("external_id") is None:
                item["external_id"] = self._ids.next(now)
            wire.append(item)
        external_ids = [int(item["external_id"]) for item in wire]
        untried = list(self._clients)
        running: dict[asyncio.Task[list[ProduceResult]], str] = {}
        holders: dict[str, list[int]] = {}
        failures: dict[str, str] = {}

        def launch() -> None:
            url = untried.pop(0)
            task = asyncio.create_task(self._clients[url].produce(queue, wire, save=save))
            running[task] = url

        for _ in range(self.required):
            launch()
        try:
            while len(holders) < self.required and running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    url = running.pop(task)
                    try:
                        results = task.result()
                    except CapellaError as exc:
                        failures[url] = f"{exc.code}: {exc.message}"
                        if untried:
                            launch()
                        continue
                    # A delayed message has no id until it is delivered.
                    holders[url] = [r.id for r in results if not isinstance(r.id, UnsetType)]
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        if len(holders) < self.required:
            raise NotEnoughReplicas(
                f"stored on {len(holders)} of the {self.required} clusters required",
                holders=sorted(holders),
                failures=failures,
            )
        return Receipt(holders=holders, failures=failures, external_ids=external_ids)
