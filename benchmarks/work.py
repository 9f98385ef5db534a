"""Work queue throughput: 4 workers (and 1, to show how they scale) claim and ack 100,000 tasks.

The tasks are produced first (``save=mark``, not timed). Each worker is one session that
claims a batch, acks every receipt in one request, and claims again, with the subscription's
default save mode (``immediate``: every claim and ack is fsync'd before its answer; the
workers share fsyncs). The run checks that every task was handed out exactly once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from benchmarks.client import JSON_HEADERS, new_session, put_queue
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.server import profiled, running_server
from benchmarks.settings import Settings

SEED_BATCH = 5000
# (workers, claim limit): the 1-worker rows show how far concurrent workers share fsyncs.
RUNS = ((4, 100), (1, 100), (4, 10), (1, 10))


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(100_000, 10_000)
    for workers, limit in RUNS:
        result = await _run_one(settings, total, workers, limit)
        label = f"{workers} worker{'s' if workers > 1 else ''}, claims of {limit}"
        outcome.details[label] = result
        cpu = result["cpu"]
        note = f"server CPU {cpu['server_cpu_pct']:.0f}%, client {cpu['client_cpu_pct']:.0f}%"
        outcome.rows.append(Row("work", f"claim+ack, {label}", result["rate"], "msg/s", note=note))
        print(f"  {label}: {result['rate']:,.0f} msg/s ({note})", flush=True)
    return outcome


async def _run_one(settings: Settings, total: int, workers: int, limit: int) -> dict[str, Any]:
    name = f"work-{workers}x{limit}"
    async with running_server(settings.data_dir(name), settings.log_path(name)) as server:
        async with new_session() as session:
            await put_queue(session, server.url, "jobs")
            body = orjson.dumps({"messages": [{"data": f"task {i}"} for i in range(SEED_BATCH)]})
            for _ in range(total // SEED_BATCH):
                async with session.post(
                    f"{server.url}/v1/queues/jobs/messages?save=mark", data=body, headers=JSON_HEADERS
                ) as resp:
                    if resp.status != 200:
                        raise BenchmarkFailed(f"seed: HTTP {resp.status}")
            async with session.put(
                f"{server.url}/v1/queues/jobs/subscriptions/w", json={"mode": "ack"}
            ) as resp:
                if resp.status != 201:
                    raise BenchmarkFailed(f"subscription: HTTP {resp.status}: {await resp.text()}")
        base = f"{server.url}/v1/queues/jobs/subscriptions/w"
        seen: list[int] = []

        async def worker() -> int:
            acked = 0
            async with new_session() as session:
                while True:
                    async with session.post(f"{base}/claim", params={"limit": limit}) as resp:
                        claimed = (await resp.json())["messages"]
                        if resp.status != 200:
                            raise BenchmarkFailed(f"claim: HTTP {resp.status}")
                    if not claimed:
                        return acked
                    seen.extend(m["id"] for m in claimed)
                    receipts = {"receipts": [m["receipt"] for m in claimed]}
                    async with session.post(f"{base}/ack", json=receipts) as resp:
                        results = (await resp.json())["results"]
                        if resp.status != 200 or not all(r["ok"] for r in results):
                            raise BenchmarkFailed(f"ack: HTTP {resp.status}: {str(results)[:300]}")
                    acked += len(results)

        meter = Meter(server)
        async with profiled(server, settings.profile_path(name)):
            meter.start()
            acked = sum(await asyncio.gather(*(worker() for _ in range(workers))))
            meter.stop()
        if acked != total or len(set(seen)) != total or len(seen) != total:
            raise BenchmarkFailed(f"work: {acked} acked, {len(seen)} claims of {len(set(seen))} tasks")
    return {
        "tasks": total,
        "workers": workers,
        "claim_limit": limit,
        "seconds": meter.wall,
        "rate": acked / meter.wall,
        "cpu": meter.to_dict(),
    }
