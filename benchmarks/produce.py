"""Produce throughput: batches of 100 messages, 1 and 4 producers, ``save=mark`` and ``save=wait``.

Each producer has its own session (one keep-alive connection) and sends its next batch when
the previous answer is in. Payloads are 256 random ASCII letters and digits in ``data`` (no
base64 on either side). Every combination gets a fresh server, so its peak RSS is its own.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks.client import (
    flush_delta,
    flush_totals,
    messages_url,
    new_session,
    produce_sequentially,
    put_queue,
    text_batches,
)
from benchmarks.meter import Meter
from benchmarks.result import Outcome, Row, summary
from benchmarks.server import profiled, running_server
from benchmarks.settings import Settings

BATCH = 100
PAYLOAD = 256
WARMUP_REQUESTS = 20
TARGETS = {("wait", 1): 85_000.0, ("wait", 4): 135_000.0}
RUNS = [("mark", 1), ("mark", 4), ("wait", 1), ("wait", 4)]


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(300_000, 30_000)
    limit = settings.pick(90, 20)
    bodies = text_batches(BATCH, PAYLOAD, count=32)
    peaks = []
    for save, producers in RUNS:
        result = await produce_run(settings, bodies, save, producers, total, limit)
        name = f"{save}, {producers} producer{'s' if producers > 1 else ''}"
        outcome.details[name] = result
        peaks.append(result["peak_rss_mb"])
        cpu = result["cpu"]
        note = f"server CPU {cpu['server_cpu_pct']:.0f}%, client {cpu['client_cpu_pct']:.0f}%"
        if result["timed_out"]:
            note += f", time limit hit after {result['messages']:,} msgs"
        outcome.rows.append(
            Row("produce", name, result["msgs_per_s"], "msg/s", TARGETS.get((save, producers)), note=note)
        )
        print(f"  produce {name}: {result['msgs_per_s']:,.0f} msg/s ({note})", flush=True)
    outcome.rows.append(Row("memory", "peak RSS during produce", max(peaks), "MB", higher_is_better=False))
    outcome.details["payload"] = f"{BATCH} x {PAYLOAD} random ASCII chars in 'data' per request"
    return outcome


async def produce_run(
    settings: Settings, bodies: list[bytes], save: str, producers: int, total: int, limit: float
) -> dict[str, Any]:
    name = f"produce-{save}-{producers}"
    async with running_server(settings.data_dir(name), settings.log_path(name)) as server:
        async with new_session() as session:
            await put_queue(session, server.url)
            flushes = await flush_totals(session, server.url)
        url = messages_url(server.url, save)
        requests = total // producers // BATCH
        barrier = asyncio.Barrier(producers + 1)
        latencies: list[float] = []
        starts: list[float] = []
        ends: list[float] = []

        async def producer(index: int) -> int:
            own = bodies[index::producers] or bodies
            async with new_session() as session:
                await produce_sequentially(
                    session, url, own, BATCH, WARMUP_REQUESTS, time.perf_counter() + limit
                )
                await barrier.wait()
                started = time.perf_counter()
                starts.append(started)
                sent = await produce_sequentially(
                    session, url, own, BATCH, requests, started + limit, latencies
                )
                ends.append(time.perf_counter())
            return sent

        meter = Meter(server)
        async with profiled(server, settings.profile_path(name)):
            tasks = [asyncio.create_task(producer(i)) for i in range(producers)]
            await barrier.wait()
            meter.start()
            try:
                sent = sum(await asyncio.gather(*tasks))
            finally:
                for task in tasks:
                    task.cancel()
            meter.stop()
        elapsed = max(ends) - min(starts)
        async with new_session() as session:
            flushed = flush_delta(flushes, await flush_totals(session, server.url), elapsed)
        return {
            "save": save,
            "producers": producers,
            "messages": sent,
            "seconds": elapsed,
            "msgs_per_s": sent / elapsed,
            "requests_per_s": sent / BATCH / elapsed,
            "timed_out": sent < requests * producers * BATCH,
            "request_latency_ms": summary(latencies, scale=1000),
            "cpu": meter.to_dict(),
            "flush": flushed,
            "peak_rss_mb": server.peak_rss_mb(),
            "startup_s": server.startup,
        }
