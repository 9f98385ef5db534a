"""Claims, acks and cursor commits that share fsyncs, against a real server: power cuts and failing fsyncs.

Many workers claim and ack concurrently (their records share the work log's fsyncs) while
readers commit cursors. On ``tests/support/powerfs.py`` (a filesystem that forgets what was not
fsync'd) the server is killed and the power cut: after the restart no answered ack is undone
(the message is never handed out again), no answered claim is lost (its message is not handed
out again while the lease runs), and no answered cursor commit went back. With ``strace``
failing every fdatasync for a moment, the requests those fsyncs covered fail with the storage
error, the server keeps serving, and later acks succeed and survive a ``kill -9``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.faults import powerfs
from support.servers import ServerProcess

from crash.test_disk_faults import injected

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts FUSE and attaches strace: needs root"),
]

Q = "/v1/queues/jobs"
W = f"{Q}/subscriptions/w"
MESSAGES = 3_000
LEASE = "10m"  # longer than the test: a claimed message may come back only if its claim was lost
TIMEOUT = aiohttp.ClientTimeout(total=15.0)


class Ledger:
    """What the server answered: claims, acks and cursor commits."""

    def __init__(self) -> None:
        self.claimed: set[int] = set()
        self.acked: set[int] = set()
        self.cursors: dict[str, int] = {}
        self.failures: list[dict[str, Any]] = []


async def setup(http: aiohttp.ClientSession, url: str) -> None:
    assert (await http.put(f"{url}{Q}", json={})).status == 201
    for start in range(0, MESSAGES, 1000):
        body = {"messages": [{"data": f"task {i}"} for i in range(start, start + 1000)]}
        assert (await http.post(f"{url}{Q}/messages?save=immediate", json=body)).status == 200
    assert (await http.put(f"{url}{W}", json={"mode": "ack"})).status == 201


async def worker(http: aiohttp.ClientSession, url: str, ledger: Ledger, save: str) -> None:
    """Claim 10, ack them, again, until the server stops answering or nothing is left."""
    while True:
        try:
            async with http.post(
                f"{url}{W}/claim", params={"limit": 10, "lease": LEASE, "save": save}, timeout=TIMEOUT
            ) as resp:
                body = await resp.json()
                if resp.status != 200:
                    ledger.failures.append(body)
                    continue
            claimed = body["messages"]
            if not claimed:
                return
            ids = [m["id"] for m in claimed]
            assert not ledger.claimed.intersection(ids), "a message was handed out twice"
            assert not ledger.acked.intersection(ids), "an acked message was handed out again"
            ledger.claimed.update(ids)
            receipts = {"receipts": [m["receipt"] for m in claimed]}
            async with http.post(
                f"{url}{W}/ack", params={"save": save}, json=receipts, timeout=TIMEOUT
            ) as resp:
                body = await resp.json()
                if resp.status != 200:
                    ledger.failures.append(body)
                    continue
            ledger.acked.update(r["id"] for r in body["results"] if r["ok"])
        except (TimeoutError, aiohttp.ClientError):
            return


async def committer(http: aiohttp.ClientSession, url: str, ledger: Ledger, name: str, save: str) -> None:
    position = ledger.cursors.get(name, 0)
    while position < MESSAGES:
        position += 1
        try:
            async with http.put(
                f"{url}{Q}/subscriptions/{name}",
                params={"save": save},
                json={"last_id": position},
                timeout=TIMEOUT,
            ) as resp:
                if resp.status not in (200, 201):
                    ledger.failures.append(await resp.json())
                    continue
        except (TimeoutError, aiohttp.ClientError):
            return
        ledger.cursors[name] = position


async def check(http: aiohttp.ClientSession, url: str, ledger: Ledger) -> None:
    """Nothing answered before the cut is undone; then the rest of the work is finished."""
    for name, position in ledger.cursors.items():
        async with http.get(f"{url}{Q}/subscriptions/{name}") as resp:
            assert (await resp.json())["last_id"] >= position, f"cursor {name} went back"
    await asyncio.gather(*(worker(http, url, ledger, "immediate") for _ in range(4)))


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
async def test_power_cuts_keep_every_answered_claim_ack_and_commit(tmp_path: Path) -> None:
    ledger = Ledger()
    with powerfs(tmp_path / "power") as fs:
        server = ServerProcess(fs.mount / "data")
        try:
            for cycle in range(3):
                await asyncio.to_thread(server.wait_ready)
                async with aiohttp.ClientSession() as http:
                    if cycle == 0:
                        await setup(http, server.url)
                    else:
                        for name, position in ledger.cursors.items():
                            async with http.get(f"{server.url}{Q}/subscriptions/{name}") as resp:
                                assert (await resp.json())["last_id"] >= position, f"cursor {name} went back"
                    tasks = [
                        *(
                            asyncio.create_task(worker(http, server.url, ledger, s))
                            for s in ["immediate", "wait"] * 3
                        ),
                        *(
                            asyncio.create_task(committer(http, server.url, ledger, f"c{i}", "immediate"))
                            for i in range(2)
                        ),
                        asyncio.create_task(committer(http, server.url, ledger, "cw", "wait")),
                    ]
                    await asyncio.sleep(0.6 + 0.4 * cycle)  # the work runs a while before the power cut
                    server.kill()
                    fs.cut()
                    await asyncio.gather(*tasks)
                server = ServerProcess(fs.mount / "data", port=server.port)
            await asyncio.to_thread(server.wait_ready)
            async with aiohttp.ClientSession() as http:
                await check(http, server.url, ledger)
        finally:
            server.stop()
    assert ledger.acked, "nothing was acked: the test proved nothing"
    assert ledger.failures == []
    # Claims answered before a cut but never acked are leased for 10 minutes: only those are left.
    assert len(ledger.claimed) <= MESSAGES and ledger.acked <= ledger.claimed


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (the Makefile installs it)")
async def test_a_failing_fsync_fails_the_claims_and_acks_it_covered_and_later_ones_work(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    server = ServerProcess(data)
    await asyncio.to_thread(server.wait_ready)
    ledger = Ledger()
    try:
        async with aiohttp.ClientSession() as http:
            await setup(http, server.url)
            async with http.post(f"{server.url}{W}/claim", params={"limit": 40, "lease": LEASE}) as resp:
                held = (await resp.json())["messages"]
            ledger.claimed.update(m["id"] for m in held)
            with injected(server.process.pid, "fdatasync", "error=EIO"):
                answers = await asyncio.gather(
                    *(
                        http.post(f"{server.url}{W}/ack", json={"receipts": [m["receipt"]]}, timeout=TIMEOUT)
                        for m in held[:20]
                    ),
                    *(
                        http.post(f"{server.url}{W}/claim", params={"limit": 5}, timeout=TIMEOUT)
                        for _ in range(5)
                    ),
                )
                for resp in answers:
                    body = await resp.json()
                    assert resp.status == 503, body
                    assert body["error"]["code"] == "storage_unavailable", body
                    assert "journal" in body["error"]["message"], body
            # The disk works again: acks succeed without a restart, the failed ones too.
            for m in held:
                async with http.post(f"{server.url}{W}/ack", json={"receipts": [m["receipt"]]}) as resp:
                    assert resp.status == 200, await resp.text()
                    assert (await resp.json())["results"][0]["ok"]
                ledger.acked.add(m["id"])
    finally:
        server.kill()  # a crash: only what was fsync'd is back
    server = ServerProcess(data, port=server.port)
    await asyncio.to_thread(server.wait_ready)
    try:
        async with aiohttp.ClientSession() as http:
            await check(http, server.url, ledger)
            # Claims that failed may have been saved after all (their records were kept and
            # written by the next flush); they come back when their default lease runs out.
            assert len(ledger.claimed) >= MESSAGES - 5 * 5
    finally:
        server.stop()
