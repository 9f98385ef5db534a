"""M-of-K writes: store a batch on at least M of K clusters, and say which ones hold it.

Every message gets a stable identity (``source`` plus an ``external_id`` from a strictly
increasing counter) before the first attempt, so writing it to several clusters, or again
after a failure, can never create two different messages: each cluster's dedup, and the
copy handlers between them, see one identity.

The writer starts M requests at once; each failure starts the next untried cluster. It
returns as soon as M clusters have answered (the original client waited for all of them and
could report failure after success). Requests still running then are cancelled; one that had
already reached its cluster leaves a copy there, which is harmless for the same reason.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from msgspec import UnsetType

from capella.client.async_client import AsyncClient, Save
from capella.client.message import MessageLike, to_wire
from capella.errors import CapellaError, InvalidRequest, NotEnoughReplicas
from capella.wire.messages import ProduceResult


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
        # Microseconds since the epoch at start, then +1 per message: increasing across restarts
        # as long as a process does not produce a million messages a second for long.
        self._ids = itertools.count(time.time_ns() // 1000)

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
        for message in messages:
            item = to_wire(message)
            item.setdefault("source", self.source)
            item.setdefault("external_id", next(self._ids))
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
