"""kill -9 a real server while workers claim and ack (save=wait and immediate).

Between kills every message is handed to exactly one worker. After a restart an answered ack
is never undone (the message is not delivered again), claims that were not acked come back
once their lease runs out, and in the end every message is acked (or its ack was in flight at
a kill and took effect without an answer).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.servers import ServerProcess, free_port
from support.wait import eventually

pytestmark = pytest.mark.slow

MESSAGES = 20_000
WORKERS = 4
CYCLES = 3
Q = "/v1/queues/tasks"
W = f"{Q}/subscriptions/workers"


async def start(data_dir: Path, port: int) -> ServerProcess:
    server = ServerProcess(data_dir, port)
    await asyncio.to_thread(server.wait_ready)
    return server


class Ledger:
    """What the workers saw: claims per run of the server, and the acks that were answered."""

    def __init__(self) -> None:
        self.claims: list[Counter[int]] = [Counter()]
        self.acked: set[int] = set()
        self.redelivered_after_ack: set[int] = set()
        # Acks sent when the server died: they may or may not have been saved before the kill.
        self.unanswered: set[int] = set()


async def work_until_killed(session: aiohttp.ClientSession, url: str, worker: int, ledger: Ledger) -> None:
    save = "wait" if worker % 2 == 0 else "immediate"
    while True:
        try:
            async with session.post(f"{url}{W}/claim", params={"limit": 10, "save": save}) as resp:
                if resp.status != 200:
                    return
                claimed = (await resp.json())["messages"]
            if not claimed:
                await asyncio.sleep(0.05)  # nothing to claim now (leases still out): ask again shortly
                continue
            for m in claimed:
                ledger.claims[-1][m["id"]] += 1
                if m["id"] in ledger.acked:
                    ledger.redelivered_after_ack.add(m["id"])
        except (TimeoutError, aiohttp.ClientError):
            return
        receipts = [m["receipt"] for m in claimed]
        try:
            async with session.post(
                f"{url}{W}/ack", params={"save": save}, json={"receipts": receipts}
            ) as resp:
                results = (await resp.json())["results"] if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError):
            results = None
        if results is None:
            ledger.unanswered.update(m["id"] for m in claimed)
            return
        ledger.acked.update(r["id"] for r in results if r["ok"])


async def test_claims_and_acks_survive_kill_minus_9(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "3")))
    data_dir, port = tmp_path / "data", free_port()
    server = await start(data_dir, port)
    ledger = Ledger()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            async with session.put(f"{server.url}{Q}", json={"block": {"max_messages": 500}}) as resp:
                assert resp.status == 201
            for start_at in range(0, MESSAGES, 5000):
                body = {"messages": [{"data": f"m{i}"} for i in range(start_at, start_at + 5000)]}
                async with session.post(f"{server.url}{Q}/messages?save=wait", json=body) as resp:
                    assert resp.status == 200
            policy = {"lease": "3s", "max_attempts": 0, "backoff": "fixed", "delay": 0, "jitter": 0}
            async with session.put(f"{server.url}{W}", json={"mode": "ack", "policy": policy}) as resp:
                assert resp.status == 201

            for cycle in range(CYCLES):
                workers = [
                    asyncio.create_task(work_until_killed(session, server.url, w, ledger))
                    for w in range(WORKERS)
                ]
                await asyncio.sleep(rng.uniform(0.2, 0.6))  # the kill lands at a random point of the work
                server.kill()
                await asyncio.wait_for(asyncio.gather(*workers), 15)
                claims = ledger.claims[-1]
                assert claims, f"cycle {cycle}: nothing was claimed"
                # Within one run of the server (no lease ran out: acks came at once) a message
                # went to one worker only.
                assert max(claims.values()) == 1, f"cycle {cycle}: a message went to two workers"
                ledger.claims.append(Counter())
                server = await start(data_dir, port)

            # Finish the work: unacked claims come back once their 3 s lease has run out.
            workers = [
                asyncio.create_task(work_until_killed(session, server.url, w, ledger)) for w in range(WORKERS)
            ]
            # Done when the server says every message is finished (an ack that went unanswered
            # may have been saved, or not: then the message comes back and is acked again).
            info: dict[str, Any] = {}

            async def finished() -> bool:
                nonlocal info
                async with session.get(f"{server.url}{W}") as resp:
                    info = await resp.json()
                work = info["work"]
                return bool(info["last_id"] == MESSAGES and not work["in_flight"] + work["failed"])

            await eventually(finished, within=60.0, every=0.1)
            server.kill()
            await asyncio.wait_for(asyncio.gather(*workers), 15)
            assert not ledger.redelivered_after_ack, (
                f"acked messages came back: {sorted(ledger.redelivered_after_ack)[:10]}"
            )
            # Messages whose ack went unanswered are either acked (then never seen again) or
            # came back and were acked later; any other message must have been acked.
            missing = sorted(set(range(1, MESSAGES + 1)) - ledger.acked - ledger.unanswered)
            assert not missing, f"never acked: {len(missing)} {missing[:10]}; {info}"
            assert info["last_id"] == MESSAGES and info["work"]["in_flight"] == 0
        finally:
            server.stop()
