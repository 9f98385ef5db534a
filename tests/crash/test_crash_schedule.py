"""kill -9 a real server while producers schedule delayed messages and the server delivers them.

After each restart every answered schedule (save=wait or immediate) must be delivered, overdue
ones at once, and no message may be delivered twice: not the ones whose release was cut short
by the kill, and not those without an external id (their schedule id is their identity).
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import aiohttp
import pytest
from support.http import produced
from support.servers import ServerProcess, free_port
from support.wait import until

pytestmark = pytest.mark.slow

CYCLES = 3
PRODUCERS = 4
BATCH = 50
Q = "/v1/queues/later"


async def start(data_dir: Path, port: int) -> ServerProcess:
    server = ServerProcess(data_dir, port)
    await asyncio.to_thread(server.wait_ready)
    return server


async def schedule_until_killed(
    session: aiohttp.ClientSession, url: str, producer: int, seq: list[int], answered: set[str]
) -> None:
    save = "wait" if producer % 2 == 0 else "immediate"
    rng = random.Random(producer)
    while True:
        first = seq[producer]
        seq[producer] += BATCH
        messages = []
        for n in range(first, first + BATCH):
            message: dict[str, object] = {"data": f"p{producer}-{n}", "delay": rng.uniform(0.05, 1.0)}
            if producer < 2:  # half with an identity of their own, half identified by schedule id
                message |= {"source": f"producer-{producer}", "external_id": n}
            messages.append(message)
        results = await produced(session, f"{url}{Q}", messages, save)
        if results is None:
            return
        assert all("scheduled_id" in r for r in results)
        answered.update(str(m["data"]) for m in messages)


async def delivered(session: aiohttp.ClientSession, url: str) -> list[str]:
    out: list[str] = []
    after = 0
    while True:
        async with session.get(f"{url}{Q}/messages", params={"after": after, "limit": 5000}) as resp:
            page = await resp.json()
        if not page["messages"]:
            return out
        out.extend(m["data"] for m in page["messages"])
        after = page["last_id"]


async def wait_until_nothing_is_scheduled(session: aiohttp.ClientSession, url: str) -> None:
    async def nothing_scheduled() -> bool:
        async with session.get(f"{url}{Q}") as resp:
            return bool((await resp.json())["stats"]["scheduled"]["count"] == 0)

    await until(
        nothing_scheduled, within=20, every=0.1, what="scheduled messages delivered after the restart"
    )


async def test_scheduled_messages_survive_kill_minus_9_and_are_delivered_once(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "11")))
    data_dir, port = tmp_path / "data", free_port()
    server = await start(data_dir, port)
    answered: set[str] = set()
    seq = [0] * PRODUCERS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            async with session.put(f"{server.url}{Q}", json={"block": {"max_messages": 500}}) as resp:
                assert resp.status == 201
            for cycle in range(CYCLES):
                producers = [
                    asyncio.create_task(schedule_until_killed(session, server.url, p, seq, answered))
                    for p in range(PRODUCERS)
                ]
                # Long enough for releases to run while producers still schedule.
                await asyncio.sleep(rng.uniform(0.6, 1.5))
                server.kill()
                await asyncio.wait_for(asyncio.gather(*producers), 15)

                server = await start(data_dir, port)
                await wait_until_nothing_is_scheduled(session, server.url)
                stored = await delivered(session, server.url)
                assert len(stored) == len(set(stored)), f"cycle {cycle}: a message was delivered twice"
                missing = answered - set(stored)
                assert not missing, f"cycle {cycle}: answered schedules lost: {sorted(missing)[:10]}"
            assert len(answered) >= CYCLES * PRODUCERS * BATCH
        finally:
            server.stop()
