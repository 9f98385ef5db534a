"""kill -9 after a flush handler ran: ``save=none`` writes are saved by its next pass."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.servers import ServerProcess
from support.wait import eventually

pytestmark = pytest.mark.slow

MESSAGES = 1000


async def test_a_flush_handler_saves_none_writes_before_a_kill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir)
    await asyncio.to_thread(server.wait_ready)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.put(f"{server.url}/v1/queues/loose", json={}) as resp:
                assert resp.status == 201
            flush = {"type": "flush", "queues": ["loose"], "params": {"interval": "200ms"}}
            async with session.put(f"{server.url}/v1/handlers/saver", json=flush) as resp:
                assert resp.status in (200, 201)
            async with session.post(f"{server.url}/v1/handlers/saver/start") as resp:
                assert resp.status == 200
            body = {"messages": [{"data": f"m{i}"} for i in range(MESSAGES)]}
            async with session.post(f"{server.url}/v1/queues/loose/messages?save=none", json=body) as resp:
                assert resp.status == 200
            # Wait for a pass that wrote bytes (each pass runs every 200 ms).
            status: dict[str, Any] = {}

            async def wrote() -> bool:
                nonlocal status
                async with session.get(f"{server.url}/v1/handlers/saver") as resp:
                    status = (await resp.json())["status"]
                return bool(status.get("bytes", 0) > 0)

            await eventually(wrote, every=0.1)
            assert status.get("bytes", 0) > 0, status
        server.kill()
        server = ServerProcess(data_dir, server.port)
        await asyncio.to_thread(server.wait_ready)
        async with aiohttp.ClientSession() as session:
            params = {"after": "0", "limit": str(MESSAGES + 10)}
            async with session.get(f"{server.url}/v1/queues/loose/messages", params=params) as resp:
                page = await resp.json()
        assert [m["data"] for m in page["messages"]] == [f"m{i}" for i in range(MESSAGES)]
    finally:
        server.kill()
