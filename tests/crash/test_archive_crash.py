"""kill -9 a real broker in the middle of an archive pass to S3 (moto on loopback).

The S3 endpoint is reached through the fault proxy with added latency, so the pass is slow
enough to be interrupted at random points: between a copy and the manifest switch, between
the switch and the delete of the old copy, or in a put. After each restart every message
must be readable, and a finished pass must leave exactly one copy of every block.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.faults import FaultProxy
from support.http import read_all
from support.servers import S3Server, ServerProcess, free_port
from support.wait import until

pytestmark = [pytest.mark.s3, pytest.mark.slow]

MESSAGES = 3000
BLOCK = 150  # 20 blocks


def write_config(path: Path, s3: dict[str, object]) -> Path:
    options = ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in s3.items())
    path.write_text(
        '[cluster]\nname = "arc"\n'
        '[mounts.default]\nprovider = "file"\npath = "hot"\n'
        f'[mounts.s3]\nprovider = "s3"\n{options.replace(", ", chr(10))}\n'
    )
    return path


async def start(data_dir: Path, port: int, config: Path) -> ServerProcess:
    server = ServerProcess(data_dir, port, config)
    await asyncio.to_thread(server.wait_ready)
    return server


async def queue_stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/queues/arc") as resp:
        return dict((await resp.json())["stats"])


async def test_kill_minus_9_during_archive_to_s3_loses_nothing(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "11")))
    options = s3_server.mount_options(s3_bucket, endpoint_url=proxy.url, prefix="tier")
    config = write_config(tmp_path / "capella.toml", options)
    data_dir, port = tmp_path / "data", free_port()
    proxy.heal()
    server = await start(data_dir, port, config)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        try:
            body = {"block": {"max_messages": BLOCK}, "mounts": {"marks": {"0": "default", "1": "s3"}}}
            async with session.put(f"{server.url}/v1/queues/arc", json=body) as resp:
                assert resp.status == 201, await resp.text()
            for start_at in range(0, MESSAGES, 500):
                batch = {"messages": [{"data": f"m{i}"} for i in range(start_at, start_at + 500)]}
                async with session.post(f"{server.url}/v1/queues/arc/messages?save=wait", json=batch) as resp:
                    assert resp.status == 200

            async def all_sealed() -> bool:
                stats = await queue_stats(session, server.url)
                return bool(stats["blocks"]["by_state"]["sealed"] == MESSAGES // BLOCK)

            await until(all_sealed, every=0.05, what="every full block sealed")

            archive = {
                "type": "archive",
                "queues": ["arc"],
                "params": {"conditions": [{"mark": 1, "from_age": 0}], "interval": "1h"},
            }
            for cycle in range(3):
                proxy.add_latency(0.02)
                async with session.put(f"{server.url}/v1/handlers/tier", json=archive) as resp:
                    assert resp.status in (200, 201), await resp.text()
                await asyncio.sleep(rng.uniform(0.2, 0.9))  # the kill lands at a random point of a pass
                server.kill()
                proxy.heal()
                server = await start(data_dir, port, config)
                stored = await read_all(session, f"{server.url}/v1/queues/arc")
                assert [m["data"] for m in stored] == [f"m{i}" for i in range(MESSAGES)], f"cycle {cycle}"
                stats = await queue_stats(session, server.url)
                assert stats["blocks"]["by_state"]["quarantined"] == 0

            # Let a full pass finish: every block on S3, exactly once, nothing left behind.
            async with session.post(f"{server.url}/v1/handlers/tier/run") as resp:
                status = (await resp.json())["status"]
            assert status["last_error"] is None, status
            stats = await queue_stats(session, server.url)
            assert stats["blocks"]["by_mark"] == {"1": MESSAGES // BLOCK}
            hot = data_dir / "hot" / "arc" / "blocks"
            assert not hot.exists() or not any(hot.iterdir())
            client = s3_server.client()
            try:
                listing = client.list_objects_v2(Bucket=s3_bucket, Prefix="tier/arc/blocks/")
            finally:
                client.close()
            assert len(listing.get("Contents", [])) == MESSAGES // BLOCK
            stored = await read_all(session, f"{server.url}/v1/queues/arc")
            assert len(stored) == MESSAGES
        finally:
            server.stop()
