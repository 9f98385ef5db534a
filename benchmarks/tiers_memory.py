"""RSS of a server holding millions of small messages while an unload handler runs.

An unload handler (``interval`` 1 s, ``idle`` 2 s) is created on an empty queue, then 4
producers send 3,000,000 messages of 100 ASCII characters (``--quick``: 300,000) with
``save=mark`` in batches of 1000. Once every block is sealed, the scenario waits until the
handler has run two more passes and no sealed block is loaded, then reads the server's
VmRSS (now) and VmHWM (peak, which the produce phase sets).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from benchmarks.client import (
    QUEUE,
    messages_url,
    new_session,
    produce_concurrently,
    put_queue,
    queue_stats,
    text_batches,
    wait_sealed,
)
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.server import Server, running_server
from benchmarks.settings import Settings
from benchmarks.tiers import BLOCK, handler_status, put_handler

PAYLOAD = 100
BATCH = 1000
PRODUCERS = 4
PASSES = 2
HANDLER = "unload-bench"
TARGET_MB = 128.0


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(3_000_000, 300_000)
    limit = settings.pick(180, 60)
    bodies = text_batches(BATCH, PAYLOAD, count=16, seed=4)
    async with running_server(settings.data_dir("tiers-memory"), settings.log_path("tiers-memory")) as server:
        async with new_session() as session:
            await put_queue(session, server.url)
            params = {"interval": "1s", "idle": "2s"}
            await put_handler(
                session, server.url, HANDLER, {"type": "unload", "queues": [QUEUE], "params": params}
            )
            meter = Meter(server)
            meter.start()
            sent = await produce_concurrently(
                messages_url(server.url, "mark"), bodies, BATCH, total, PRODUCERS, time.perf_counter() + limit
            )
            meter.stop()
            if sent != total:
                raise BenchmarkFailed(f"stored {sent:,} of {total:,} messages within {limit:g} s")
            seal_wait = await wait_sealed(session, server.url, total // BLOCK, limit)
            rss_sealed = server.rss_mb()
            unload = await wait_unloaded(session, server, limit=60.0)
        rss, peak = server.rss_mb(), server.peak_rss_mb()
        anon, file = server.status_kb("RssAnon") / 1024, server.status_kb("RssFile") / 1024
    outcome.details = {
        "messages": total,
        "payload": f"{PAYLOAD} random ASCII chars in 'data'",
        "produce": f"save=mark, batches of {BATCH}, {PRODUCERS} producers",
        "produce_s": meter.wall,
        "produce_msgs_per_s": total / meter.wall,
        "produce_cpu": meter.to_dict(),
        "seal_wait_s": seal_wait,
        "rss_when_sealed_mb": rss_sealed,
        "unload": unload,
        "rss_mb": rss,
        "peak_rss_mb": peak,
        "rss_anon_mb": anon,
        "rss_file_mb": file,
    }
    outcome.rows += [
        Row(
            "tiers-memory",
            f"RSS, {total:,} msgs of {PAYLOAD} B, unloaded",
            rss,
            "MB",
            TARGET_MB,
            higher_is_better=False,
            note=f"{anon:.1f} MB anonymous + {file:.1f} MB libraries",
        ),
        Row(
            "tiers-memory",
            "peak RSS (VmHWM), produce included",
            peak,
            "MB",
            higher_is_better=False,
            note=f"produced at {total / meter.wall:,.0f} msg/s",
        ),
    ]
    print(
        f"  {total:,} msgs in {meter.wall:.1f} s; RSS {rss:.1f} MB (when sealed {rss_sealed:.1f})", flush=True
    )
    return outcome


async def wait_unloaded(session: aiohttp.ClientSession, server: Server, limit: float) -> dict[str, Any]:
    """Wait for ``PASSES`` more unload passes and no loaded sealed block; what they did."""
    started = time.perf_counter()
    first = await handler_status(session, server.url, HANDLER)
    while True:
        status = await handler_status(session, server.url, HANDLER)
        by_state = (await queue_stats(session, server.url))["blocks"]["by_state"]
        if status["runs"] >= first["runs"] + PASSES and by_state.get("loaded", 0) == 0:
            break
        if time.perf_counter() - started > limit:
            raise BenchmarkFailed(f"blocks still loaded after {limit:g} s: {by_state}, handler {status}")
        await asyncio.sleep(0.2)
    if status["last_error"] is not None:
        raise BenchmarkFailed(f"unload handler failed: {status['last_error']}")
    return {
        "wait_s": time.perf_counter() - started,
        "runs": status["runs"],
        "blocks_unloaded": status["items"],
        "bytes_unloaded": status["bytes"],
        "by_state": by_state,
    }
