"""Read-from-start throughput: one reader pages through the queue with ``limit=1000``.

The queue is seeded with text messages (256 ASCII characters, so answers carry ``data``,
not base64), its blocks are left to seal, and the server is restarted: the first pass reads
blocks from disk (cold), the second reads what the first left in memory (warm). The reader
waits for each page before asking for the next and takes ``last_id`` from the tail of the
body instead of parsing the whole page, so the client adds little to the wall time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
from yarl import URL

from benchmarks.client import (
    messages_url,
    new_session,
    produce_sequentially,
    put_queue,
    text_batches,
    wait_sealed,
)
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.server import Server, profiled, running_server
from benchmarks.settings import Settings

PAGE = 1000
PAYLOAD = 256
SEED_BATCH = 1000
SEED_PRODUCERS = 2
BLOCK = 10_000  # the default block limit (block.max_messages)
TARGET = 600_000.0
_LAST_ID = b'"last_id":'


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(300_000, 30_000)
    limit = settings.pick(120, 30)
    data_dir = settings.data_dir("read")
    log = settings.log_path("read")

    async with running_server(data_dir, log) as server:
        seeded = time.perf_counter()
        async with new_session() as session:
            await put_queue(session, server.url)
            await seed(server, total, limit)
            sealed_wait = await wait_sealed(session, server.url, total // BLOCK, limit)
        outcome.details["seed"] = {
            "messages": total,
            "seconds": time.perf_counter() - seeded,
            "seal_wait_s": sealed_wait,
            "peak_rss_mb": server.peak_rss_mb(),
        }
        outcome.details["seed"]["stop_s"] = await server.stop()

    async with running_server(data_dir, log) as server:
        outcome.details["startup_with_data_s"] = server.startup
        outcome.rows.append(
            Row(
                "startup",
                f"spawn → /readyz, {total:,} stored msgs",
                server.startup,
                "s",
                higher_is_better=False,
            )
        )
        for name in ("cold", "warm"):
            async with profiled(server, settings.profile_path(f"read-{name}")):
                result = await read_all(server, total, limit)
            outcome.details[name] = result
            note = f"{result['mb_per_s']:.0f} MB/s, server CPU {result['cpu']['server_cpu_pct']:.0f}%"
            outcome.rows.append(
                Row(
                    "read",
                    f"from start, pages of {PAGE}, {name}",
                    result["msgs_per_s"],
                    "msg/s",
                    TARGET,
                    note=note,
                )
            )
            print(f"  read {name}: {result['msgs_per_s']:,.0f} msg/s ({note})", flush=True)
        outcome.details["peak_rss_mb"] = server.peak_rss_mb()
    return outcome


async def seed(server: Server, total: int, limit: float) -> None:
    url = messages_url(server.url, "mark")
    bodies = text_batches(SEED_BATCH, PAYLOAD, count=8, seed=2)
    requests = total // SEED_BATCH // SEED_PRODUCERS
    deadline = time.perf_counter() + limit

    async def producer(index: int) -> int:
        async with new_session() as session:
            return await produce_sequentially(
                session, url, bodies[index::SEED_PRODUCERS], SEED_BATCH, requests, deadline
            )

    sent = sum(await asyncio.gather(*(producer(i) for i in range(SEED_PRODUCERS))))
    if sent != total:
        raise BenchmarkFailed(f"seeding stored {sent} of {total} messages within {limit:g} s")


async def read_all(server: Server, total: int, limit: float) -> dict[str, Any]:
    """Page from id 0 to ``total``; the first page is checked in full."""
    base = messages_url(server.url)
    after = 0
    received = 0
    body_bytes = 0
    latencies: list[float] = []
    meter = Meter(server)
    async with new_session() as session:
        meter.start()
        deadline = time.perf_counter() + limit
        while after < total and time.perf_counter() < deadline:
            started = time.perf_counter()
            raw = await _page(session, base.with_query(after=after, limit=PAGE))
            latencies.append(time.perf_counter() - started)
            if after == 0:
                _check_page(raw)
            last_id = int(raw[raw.rindex(_LAST_ID) + len(_LAST_ID) :].rstrip(b"}\n "))
            if last_id <= after:
                raise BenchmarkFailed(f"read stalled at after={after}")
            received += last_id - after
            body_bytes += len(raw)
            after = last_id
        meter.stop()
    return {
        "messages": received,
        "seconds": meter.wall,
        "msgs_per_s": received / meter.wall,
        "mb_per_s": body_bytes / meter.wall / 1e6,
        "bytes_per_message": body_bytes / max(received, 1),
        "timed_out": received < total,
        "page_latency_ms": summary(latencies, scale=1000),
        "cpu": meter.to_dict(),
    }


async def _page(session: aiohttp.ClientSession, url: URL) -> bytes:
    async with session.get(url) as resp:
        raw = await resp.read()
        if resp.status != 200:
            raise BenchmarkFailed(f"read: HTTP {resp.status}: {raw[:300]!r}")
        return raw


def _check_page(raw: bytes) -> None:
    page = orjson.loads(raw)
    ids = [m["id"] for m in page["messages"]]
    if ids != list(range(1, PAGE + 1)) or any(len(m["data"]) != PAYLOAD for m in page["messages"]):
        raise BenchmarkFailed(f"read: the first page is not messages 1..{PAGE} with {PAYLOAD}-char data")
