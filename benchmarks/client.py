"""The load generator's side of HTTP: sessions, pre-built bodies, and checked requests.

Bodies are built once before the clock starts, so the client spends its time sending and
receiving, not encoding JSON.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import string
import time
from typing import Any

import aiohttp
import orjson
from yarl import URL

from benchmarks.result import BenchmarkFailed

QUEUE = "bench"
JSON_HEADERS = {"Content-Type": "application/json"}
_ALPHABET = (string.ascii_letters + string.digits).encode()


def new_session(connections: int = 1) -> aiohttp.ClientSession:
    """A keep-alive session; one per producer, so each has its own connection."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, force_close=False),
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=120),
        auto_decompress=False,
    )


def messages_url(base: str, save: str | None = None, queue: str = QUEUE) -> URL:
    url = URL(f"{base}/v1/queues/{queue}/messages")
    return url if save is None else url.with_query(save=save)


def text_batches(batch: int, size: int, count: int, seed: int = 1) -> list[bytes]:
    """``count`` distinct bodies of ``batch`` messages with ``size`` random ASCII letters in ``data``."""
    rng = random.Random(seed)
    return [
        orjson.dumps({"messages": [{"data": _text(rng, size)} for _ in range(batch)]}) for _ in range(count)
    ]


def binary_batches(batch: int, size: int, count: int) -> list[bytes]:
    """``count`` bodies of ``batch`` messages with ``size`` bytes from ``os.urandom`` in ``data_b64``."""
    return [
        orjson.dumps(
            {"messages": [{"data_b64": base64.b64encode(os.urandom(size)).decode()} for _ in range(batch)]}
        )
        for _ in range(count)
    ]


def _text(rng: random.Random, size: int) -> str:
    return bytes(rng.choices(_ALPHABET, k=size)).decode()


async def put_queue(
    session: aiohttp.ClientSession, base: str, queue: str = QUEUE, definition: dict[str, Any] | None = None
) -> None:
    """Create ``queue`` with ``definition`` (the PUT body; default: the server's defaults)."""
    async with session.put(f"{base}/v1/queues/{queue}", json=definition or {}) as resp:
        if resp.status not in (200, 201):
            raise BenchmarkFailed(f"PUT queue {queue}: HTTP {resp.status}: {await resp.text()}")


async def queue_stats(session: aiohttp.ClientSession, base: str, queue: str = QUEUE) -> dict[str, Any]:
    async with session.get(f"{base}/v1/queues/{queue}") as resp:
        if resp.status != 200:
            raise BenchmarkFailed(f"GET queue {queue}: HTTP {resp.status}: {await resp.text()}")
        stats: dict[str, Any] = (await resp.json())["stats"]
        return stats


async def post_batch(session: aiohttp.ClientSession, url: URL, body: bytes, expected: int) -> None:
    """POST one batch and check that every message got an id."""
    async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
        raw = await resp.read()
        if resp.status != 200:
            raise BenchmarkFailed(f"produce: HTTP {resp.status}: {raw[:300]!r}")
    if len(orjson.loads(raw)["results"]) != expected:
        raise BenchmarkFailed(f"produce: expected {expected} results in {raw[:300]!r}")


async def produce_sequentially(
    session: aiohttp.ClientSession,
    url: URL,
    bodies: list[bytes],
    batch: int,
    requests: int,
    deadline: float,
    latencies: list[float] | None = None,
) -> int:
    """One producer: ``requests`` batches, each sent after the previous answer; messages sent."""
    sent = 0
    for i in range(requests):
        if time.perf_counter() >= deadline:
            break
        started = time.perf_counter()
        await post_batch(session, url, bodies[i % len(bodies)], batch)
        if latencies is not None:
            latencies.append(time.perf_counter() - started)
        sent += batch
    return sent


async def wait_sealed(
    session: aiohttp.ClientSession, base: str, blocks: int, within: float, queue: str = QUEUE
) -> float:
    """Poll the queue until ``blocks`` blocks are sealed and nothing is sealing; seconds waited."""
    started = time.perf_counter()
    while True:
        by_state = (await queue_stats(session, base, queue))["blocks"]["by_state"]
        if by_state.get("sealed", 0) >= blocks and by_state.get("sealing", 0) == 0:
            return time.perf_counter() - started
        if time.perf_counter() - started > within:
            raise BenchmarkFailed(f"blocks not sealed after {within:g} s: {by_state}")
        await asyncio.sleep(0.1)


async def flush_totals(session: aiohttp.ClientSession, base: str) -> tuple[int, float]:
    """The server's flush count and total flush seconds, from ``/metrics``."""
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    values = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("capella_flush_seconds_")
    )
    return int(float(values.get("capella_flush_seconds_count", "0"))), float(
        values.get("capella_flush_seconds_sum", "0")
    )


def flush_delta(before: tuple[int, float], after: tuple[int, float], wall: float) -> dict[str, float]:
    """Flushes per second, mean flush time and the share of the wall time spent flushing."""
    count, seconds = after[0] - before[0], after[1] - before[1]
    return {
        "flushes": count,
        "flushes_per_s": count / wall,
        "mean_flush_ms": 1000 * seconds / count if count else float("nan"),
        "flushing_share": seconds / wall,
    }


async def produce_concurrently(
    url: URL, bodies: list[bytes], batch: int, total: int, producers: int, deadline: float
) -> int:
    """``producers`` sessions, each sending its share of ``total`` sequentially; messages sent."""
    requests = total // batch // producers

    async def producer(index: int) -> int:
        async with new_session() as session:
            own = bodies[index::producers] or bodies
            return await produce_sequentially(session, url, own, batch, requests, deadline)

    return sum(await asyncio.gather(*(producer(i) for i in range(producers))))
