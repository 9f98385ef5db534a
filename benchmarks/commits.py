"""Cursor commits: 1 and 4 clients move subscription cursors with ``save=immediate``.

Each client is one session that commits its own subscription's cursor one id further, again
and again, each request after the previous answer. ``immediate``: every commit is saved
(a record appended to the queue's subscription change log and fsync'd) before its answer;
concurrent commits share fsyncs. The run checks that every cursor ends where its client left it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from benchmarks.client import new_session, put_queue
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.server import profiled, running_server
from benchmarks.settings import Settings

CLIENTS = (4, 1)


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(10_000, 1_000)
    for clients in CLIENTS:
        result = await _run_one(settings, total, clients)
        label = f"{clients} client{'s' if clients > 1 else ''}"
        outcome.details[label] = result
        cpu = result["cpu"]
        note = f"server CPU {cpu['server_cpu_pct']:.0f}%, client {cpu['client_cpu_pct']:.0f}%"
        outcome.rows.append(
            Row("commits", f"cursor commits, {label}, immediate", result["rate"], "req/s", note=note)
        )
        print(f"  {label}: {result['rate']:,.0f} commits/s ({note})", flush=True)
    return outcome


async def _run_one(settings: Settings, total: int, clients: int) -> dict[str, Any]:
    name = f"commits-{clients}"
    async with running_server(settings.data_dir(name), settings.log_path(name)) as server:
        async with new_session() as session:
            await put_queue(session, server.url, "feed")
        each = total // clients

        async def client(index: int) -> None:
            url = f"{server.url}/v1/queues/feed/subscriptions/reader-{index}"
            async with new_session() as session:
                for position in range(1, each + 1):
                    async with session.put(
                        url, params={"save": "immediate"}, json={"last_id": position}
                    ) as resp:
                        if resp.status not in (200, 201):
                            raise BenchmarkFailed(f"commit: HTTP {resp.status}: {await resp.text()}")
                async with session.get(url) as resp:
                    if (await resp.json())["last_id"] != each:
                        raise BenchmarkFailed(f"commit: cursor {index} did not end at {each}")

        meter = Meter(server)
        async with profiled(server, settings.profile_path(name)):
            meter.start()
            await asyncio.gather(*(client(i) for i in range(clients)))
            meter.stop()
    return {
        "commits": each * clients,
        "clients": clients,
        "seconds": meter.wall,
        "rate": each * clients / meter.wall,
        "cpu": meter.to_dict(),
    }
