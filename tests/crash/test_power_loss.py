"""Power loss: a real server on a filesystem that forgets whatever was not fsync'd.

``tests/support/powerfs.py`` (FUSE) keeps, for every file and directory, what it holds now and what
it held at its last fsync; a power cut puts everything back to the fsync'd state, walking from
the root. The server is killed with ``kill -9`` and the power cut, several times while
producers write with ``immediate`` and ``wait`` and a consumer commits its cursor: after each
restart every acknowledged message is back byte-exact, every acknowledged cursor commit too,
and no id that anyone saw before the cut names another message afterwards. Unlike a plain
``kill -9`` test, this one fails if an fsync (file or directory) is missing or comes too late.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import aiohttp
import pytest
from support.faults import powerfs
from support.http import produced, read_all
from support.servers import ServerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a FUSE filesystem: needs root"),
]

CYCLES = 4
BATCH = 10
REQUEST_TIMEOUT = 15.0


class Writer:
    """Batches under one source with ``save``; unanswered ones are sent again, same ids."""

    def __init__(self, url: str, source: str, save: str) -> None:
        self.url = url
        self.source = source
        self.save = save
        self.acked: dict[int, tuple[int, str]] = {}  # external id -> (id, text)
        self.pending: list[int] = []
        self.next_ext = 1

    def text(self, ext: int) -> str:
        return f"{self.source}:{ext}:" + "z" * (ext % 300)

    async def run(self, http: aiohttp.ClientSession, owners: dict[int, tuple[str, int]]) -> None:
        while True:
            exts = self.pending or list(range(self.next_ext, self.next_ext + BATCH))
            if not self.pending:
                self.next_ext += BATCH
            self.pending = exts
            messages = [{"data": self.text(e), "source": self.source, "external_id": e} for e in exts]
            queue_url = f"{self.url}/v1/queues/power"
            results = await produced(http, queue_url, messages, self.save, REQUEST_TIMEOUT)
            if results is None:
                return
            for ext, result in zip(exts, results, strict=True):
                assert owners.setdefault(result["id"], (self.source, ext)) == (self.source, ext)
                self.acked[ext] = (result["id"], self.text(ext))
            self.pending = []


async def follow(
    http: aiohttp.ClientSession, url: str, owners: dict[int, tuple[str, int]], cursor: list[int]
) -> None:
    """Read after the subscription's cursor and commit it with ``save=immediate``."""
    while True:
        try:
            async with http.get(
                f"{url}/v1/queues/power/subscriptions/reader/messages",
                params={"limit": "500", "wait": "1"},
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            ) as resp:
                if resp.status != 200:
                    return
                page = await resp.json()
        except (TimeoutError, aiohttp.ClientError):
            return
        for m in page["messages"]:
            identity = (str(m["source"]), int(m["external_id"]))
            assert owners.setdefault(int(m["id"]), identity) == identity, "an id names two messages"
        if page["messages"]:
            cursor[0] = max(cursor[0], int(page["messages"][-1]["id"]))


async def test_power_cuts_keep_every_acknowledged_write_and_cursor(tmp_path: Path) -> None:
    rng = random.Random(7)
    with powerfs(tmp_path / "power") as fs:
        data = fs.mount / "data"  # created by the server itself: its first directories must be durable too
        server = ServerProcess(data)
        owners: dict[int, tuple[str, int]] = {}
        writers: list[Writer] = []
        cursor = [0]
        try:
            for cycle in range(CYCLES):
                await asyncio.to_thread(server.wait_ready)
                async with aiohttp.ClientSession() as http:
                    if cycle == 0:
                        resp = await http.put(
                            f"{server.url}/v1/queues/power", json={"block": {"max_messages": 300}}
                        )
                        assert resp.status == 201
                        writers = [Writer(server.url, "imm", "immediate"), Writer(server.url, "wait", "wait")]
                    else:
                        await check(http, server.url, writers, owners, cursor)
                    for w in writers:
                        w.url = server.url
                    tasks = [asyncio.create_task(w.run(http, owners)) for w in writers]
                    tasks.append(asyncio.create_task(follow(http, server.url, owners, cursor)))
                    await asyncio.sleep(rng.uniform(1.0, 2.5))  # the power cut lands at a random point
                    server.kill()
                    fs.cut()
                    await asyncio.gather(*tasks)
                server = ServerProcess(data, port=server.port)
            await asyncio.to_thread(server.wait_ready)
            async with aiohttp.ClientSession() as http:
                await check(http, server.url, writers, owners, cursor)
        finally:
            server.stop()
    assert sum(len(w.acked) for w in writers) > 100, "too little was written to prove anything"


async def check(
    http: aiohttp.ClientSession,
    url: str,
    writers: list[Writer],
    owners: dict[int, tuple[str, int]],
    cursor: list[int],
) -> None:
    stored = await read_all(http, f"{url}/v1/queues/power", request_timeout=REQUEST_TIMEOUT)
    by_identity = {(str(m["source"]), int(m["external_id"])): m for m in stored}  # type: ignore[call-overload]
    assert len(by_identity) == len(stored), "a message is stored twice"
    for m in stored:
        identity = (str(m["source"]), int(m["external_id"]))  # type: ignore[call-overload]
        assert owners.setdefault(int(m["id"]), identity) == identity, f"id {m['id']} was reused"  # type: ignore[call-overload]
    for w in writers:
        for ext, (message_id, text) in w.acked.items():
            m = by_identity.get((w.source, ext))
            assert m is not None, f"{w.source}/{ext} (id {message_id}) was acknowledged and lost"
            assert (m["id"], m["data"]) == (message_id, text)
    async with http.get(f"{url}/v1/queues/power/subscriptions/reader") as resp:
        assert resp.status == 200
        assert (await resp.json())["last_id"] >= cursor[0], "an acknowledged cursor commit went back"
