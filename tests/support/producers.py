"""Producers for fault tests of shared queues, and the checks of what they left stored.

A ``Producer`` writes batches of its own source with increasing external ids, ``save=wait``,
through its home node. A batch that fails (503, a connection cut by ``kill -9``, a timeout) is
sent again with the same identities to another node, a bounded number of times; one still
unanswered then is kept in ``unacked`` and sent again by ``settle`` once the faults are
healed. Every attempt's status and time is kept, so a test can say how fast failures came.

``check_stored`` reads the queue through one node and asserts what a shared queue promises:
ids 1, 2, ... with no gap, every identity at most once, every acknowledged identity present with
the id it was answered, and its payload byte-exact.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from support.http import read_all

RETRIES = 6  # other nodes tried for one batch before it waits for settle
RETRY_PAUSE = 0.2


@dataclass
class Attempt:
    at: float  # time.monotonic() when it was sent
    node: int
    status: int | None  # None: no answer (connection refused or cut, or the client's timeout)
    code: str | None
    seconds: float


@dataclass
class Producer:
    source: str
    queue: str
    home: int
    batch: int = 10
    request_timeout: float = 10.0  # the client's, per attempt
    next_ext: int = 1
    acked: dict[int, int] = field(default_factory=dict)  # external id -> id
    unacked: list[list[int]] = field(default_factory=list)  # batches never answered 200
    attempts: list[Attempt] = field(default_factory=list)
    duplicates: int = 0  # messages answered duplicate: true (a retried batch stored before)
    late: set[int] = field(default_factory=set)  # external ids settled after the run: out of order

    def data(self, ext: int) -> str:
        return f"{self.source}-{ext:07d}-" + "x" * (ext % 41)

    async def send(self, http: aiohttp.ClientSession, url: str, node: int, exts: Sequence[int]) -> bool:
        messages = [{"data": self.data(e), "source": self.source, "external_id": e} for e in exts]
        started = time.monotonic()
        status: int | None = None
        code: str | None = None
        body: dict[str, Any] | None = None
        try:
            async with http.post(
                f"{url}/v1/queues/{self.queue}/messages",
                params={"save": "wait"},
                json={"messages": messages},
                timeout=aiohttp.ClientTimeout(total=self.request_timeout),
            ) as resp:
                status = resp.status
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            pass
        if status != 200 and isinstance(body, dict):
            code = body.get("error", {}).get("code")
        self.attempts.append(Attempt(started, node, status, code, time.monotonic() - started))
        if status != 200 or body is None:
            return False
        results = body["results"]
        assert len(results) == len(exts), body
        for ext, result in zip(exts, results, strict=True):
            known = self.acked.get(ext)
            assert known is None or known == result["id"], (self.source, ext, known, result)
            self.acked[ext] = result["id"]
            self.duplicates += bool(result["duplicate"])
        return True

    async def step(self, http: aiohttp.ClientSession, urls: Sequence[str], rng: random.Random) -> None:
        """One new batch: the home node first, then other nodes, at most ``RETRIES`` more times."""
        exts = list(range(self.next_ext, self.next_ext + self.batch))
        self.next_ext += self.batch
        node = self.home
        for attempt in range(RETRIES + 1):
            if await self.send(http, urls[node], node, exts):
                return
            if attempt < RETRIES:
                others = [i for i in range(len(urls)) if i != node]
                node = rng.choice(others) if others else node
                await asyncio.sleep(RETRY_PAUSE)
        self.unacked.append(exts)

    async def run(
        self,
        http: aiohttp.ClientSession,
        urls: Sequence[str],
        stop: asyncio.Event,
        rng: random.Random,
        limit: int = 100_000,
    ) -> None:
        """Batches until ``stop`` is set (at most ``limit``)."""
        for _ in range(limit):
            if stop.is_set():
                return
            await self.step(http, urls, rng)

    async def settle(self, http: aiohttp.ClientSession, urls: Sequence[str], within: float) -> None:
        """Send every unanswered batch again until each is answered (the faults healed), for at
        most ``within`` seconds."""
        deadline = time.monotonic() + within
        node = self.home
        while self.unacked:
            exts = self.unacked[0]
            self.late.update(exts)
            if await self.send(http, urls[node], node, exts):
                self.unacked.pop(0)
                continue
            assert time.monotonic() < deadline, f"{self.source}: batch {exts[0]} unanswered after {within}s"
            node = (node + 1) % len(urls)
            await asyncio.sleep(RETRY_PAUSE)

    @property
    def sent(self) -> int:
        return self.next_ext - 1


async def check_stored(
    http: aiohttp.ClientSession, url: str, queue: str, producers: Sequence[Producer]
) -> list[dict[str, Any]]:
    """Assert the queue's contents, read through ``url``, keep every promise; answers them."""
    messages = await read_all(http, f"{url}/v1/queues/{queue}", limit=10_000, request_timeout=60.0)
    ids = [m["id"] for m in messages]
    assert ids == list(range(1, len(ids) + 1)), "ids are not 1, 2, ... without a gap"
    by_identity: dict[tuple[str, int], dict[str, Any]] = {}
    for m in messages:
        identity = (m["source"], m["external_id"])
        assert identity not in by_identity, f"identity {identity} stored twice"
        by_identity[identity] = m
    for p in producers:
        if p.queue != queue:
            continue
        for ext, answered in p.acked.items():
            found = by_identity.get((p.source, ext))
            assert found is not None, f"acknowledged {(p.source, ext)} (id {answered}) is lost"
            assert found["id"] == answered, (p.source, ext, found["id"], answered)
            assert found["data"] == p.data(ext)
        # Per source, in the order of its external ids (each batch waits for the last one's answer).
        exts = [m["external_id"] for m in messages if m["source"] == p.source]
        exts = [e for e in exts if e not in p.late]
        assert exts == sorted(exts), f"{p.source}: stored out of order"
    return messages
