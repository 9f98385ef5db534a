"""kill -9 a real server while producers write with save=wait and save=immediate.

After every restart, each answered message must be readable with the same id and payload,
nothing may be stored twice (producers resend unanswered batches with the same external ids,
which dedup must absorb), and new ids must be above every id ever answered.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import aiohttp
import pytest
from support.http import produced, read_all
from support.servers import ServerProcess, free_port

pytestmark = pytest.mark.slow

CYCLES = 5
PRODUCERS = 4
BATCH = 20


async def start(data_dir: Path, port: int) -> ServerProcess:
    server = ServerProcess(data_dir, port)
    await asyncio.to_thread(server.wait_ready)
    return server


async def produce_until_killed(
    session: aiohttp.ClientSession,
    url: str,
    producer: int,
    next_seq: list[int],
    answered: dict[int, bytes],
    resend: list[list[int]],
) -> None:
    """Send batches until the server dies; remember what was answered and what was not."""
    save = "wait" if producer % 2 == 0 else "immediate"
    while True:
        if resend[producer]:
            seqs = resend[producer]
        else:
            seqs = list(range(next_seq[producer], next_seq[producer] + BATCH))
            next_seq[producer] += BATCH
        resend[producer] = seqs
        source = f"producer-{producer}"
        messages = [{"data": f"p{producer}-{seq}", "source": source, "external_id": seq} for seq in seqs]
        results = await produced(session, f"{url}/v1/queues/crash", messages, save)
        if results is None:
            return
        for seq, result in zip(seqs, results, strict=True):
            answered[result["id"]] = f"p{producer}-{seq}".encode()
        resend[producer] = []


async def test_answered_writes_survive_kill_minus_9(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "7")))
    data_dir, port = tmp_path / "data", free_port()
    server = await start(data_dir, port)
    answered: dict[int, bytes] = {}
    next_seq = [1] * PRODUCERS
    resend: list[list[int]] = [[] for _ in range(PRODUCERS)]
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            # Small blocks, so kills land during seals too.
            async with session.put(
                f"{server.url}/v1/queues/crash", json={"block": {"max_messages": 300}}
            ) as resp:
                assert resp.status == 201
            for cycle in range(CYCLES):
                producers = [
                    asyncio.create_task(
                        produce_until_killed(session, server.url, p, next_seq, answered, resend)
                    )
                    for p in range(PRODUCERS)
                ]
                await asyncio.sleep(rng.uniform(0.3, 1.2))  # the kill lands at a random point of the writes
                server.kill()
                await asyncio.wait_for(asyncio.gather(*producers), 15)
                highest_answered = max(answered, default=0)

                server = await start(data_dir, port)
                stored = await read_all(session, f"{server.url}/v1/queues/crash", limit=5000)
                by_id = {int(str(m["id"])): str(m["data"]).encode() for m in stored}
                missing = [i for i, payload in answered.items() if by_id.get(i) != payload]
                assert not missing, f"cycle {cycle}: answered messages lost or changed: {missing[:10]}"
                payloads = [m["data"] for m in stored]
                assert len(payloads) == len(set(payloads)), f"cycle {cycle}: a message is stored twice"

                async with session.post(
                    f"{server.url}/v1/queues/crash/messages?save=wait", json={"data": f"probe-{cycle}"}
                ) as resp:
                    probe = (await resp.json())["results"][0]["id"]
                assert probe > highest_answered, f"cycle {cycle}: id {probe} reused"
                answered[probe] = f"probe-{cycle}".encode()
            assert len(answered) > CYCLES * PRODUCERS * BATCH
        finally:
            server.stop()


async def test_sigterm_flushes_writes_that_were_not_yet_saved(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    server = await start(data_dir, port)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            async with session.put(f"{server.url}/v1/queues/crash", json={"save": "none"}) as resp:
                assert resp.status == 201
            for mode in ("none", "mark"):
                body = {"messages": [{"data": f"{mode}-{i}"} for i in range(50)]}
                async with session.post(
                    f"{server.url}/v1/queues/crash/messages?save={mode}", json=body
                ) as resp:
                    assert resp.status == 200
            async with session.put(
                f"{server.url}/v1/queues/crash/subscriptions/reader?save=none", json={"last_id": 42}
            ) as resp:
                assert resp.status == 201
            assert server.stop() == 0

            server = await start(data_dir, port)
            stored = await read_all(session, f"{server.url}/v1/queues/crash", limit=5000)
            assert [m["data"] for m in stored] == [
                f"{mode}-{i}" for mode in ("none", "mark") for i in range(50)
            ]
            async with session.get(f"{server.url}/v1/queues/crash/subscriptions/reader") as resp:
                assert (await resp.json())["last_id"] == 42
        finally:
            server.stop()
