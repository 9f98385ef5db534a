"""Disk faults under a real server process: full, read-only, failing and very slow disks.

Every test follows one story: writes are refused with a clear JSON error in bounded time,
reads keep working, ``/readyz`` and ``/metrics`` say the queue cannot accept writes, the
broker resumes by itself within seconds once the fault clears (no restart, no new write
needed), and after a restart (or ``kill -9``) every acknowledged message is back, byte-exact.

A full disk is a real tmpfs of a few MiB, grown while the broker runs. Read-only, EIO and slow
disks are injected with ``strace --inject`` attached to the server: Linux refuses to remount a
filesystem read-only while a file on it is open for writing (the broker keeps its journal
open, so ``mount -o remount,ro`` answers EBUSY; checked on this machine), and neither tmpfs nor
a loop device fails an fsync on demand. strace fails exactly the calls a read-only mount or a
failing disk fails, for as long as it stays attached; detaching it clears the fault.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.faults import injected
from support.servers import ServerProcess
from support.wait import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs and attaches strace: needs root"),
    pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (the Makefile installs it)"),
]

# Every request is bounded; a hang fails the test here instead of stalling the suite.
REQUEST_TIMEOUT = 15.0
# The fault clears, and the broker must take writes again within this many seconds.
RESUME_WITHIN = 5.0
MAX_FILL_BATCHES = 2_000
BATCH = 20
PAYLOAD = 1_000

# What a read-only mount or a failing disk refuses; reads (open, read) still pass.
WRITE_CALLS = "fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat,ftruncate"


class Ledger:
    """What the test sent and which of it the server acknowledged, by id."""

    def __init__(self, http: aiohttp.ClientSession, url: str, queue: str) -> None:
        self.http = http
        self.url = url
        self.queue = queue
        self.acked: dict[int, str] = {}
        self.sent: set[str] = set()
        self.cursor = 0  # the last acknowledged commit of the subscription "reader"
        self._seq = 0

    async def produce(self, count: int = BATCH) -> tuple[int, dict[str, Any], float]:
        """One batch with ``save=wait``: (status, body, seconds to the answer)."""
        texts = [f"{self._seq + i:08d}:" + "x" * PAYLOAD for i in range(count)]
        self._seq += count
        self.sent.update(texts)
        started = time.monotonic()
        async with self.http.post(
            f"{self.url}/v1/queues/{self.queue}/messages?save=wait",
            json={"messages": [{"data": t} for t in texts]},
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        ) as resp:
            body = await resp.json()
        if resp.status == 200:
            for text, result in zip(texts, body["results"], strict=True):
                self.acked[result["id"]] = text
        return resp.status, body, time.monotonic() - started

    async def commit(self, last_id: int) -> tuple[int, dict[str, Any], float]:
        """Move the subscription "reader" to ``last_id`` with ``save=immediate``."""
        started = time.monotonic()
        async with self.http.put(
            f"{self.url}/v1/queues/{self.queue}/subscriptions/reader?save=immediate",
            json={"last_id": last_id},
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        ) as resp:
            body = await resp.json()
        if resp.status in (200, 201):
            self.cursor = last_id
        return resp.status, body, time.monotonic() - started

    async def read_all(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        after = 0
        while True:
            async with self.http.get(
                f"{self.url}/v1/queues/{self.queue}/messages",
                params={"after": str(after), "limit": "1000"},
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
            ) as resp:
                assert resp.status == 200, await resp.text()
                page = await resp.json()
            out.extend((m["id"], m["data"]) for m in page["messages"])
            if not page["messages"]:
                return out
            after = page["last_id"]

    async def check_everything_acknowledged_is_there(self) -> None:
        stored = await self.read_all()
        ids = [i for i, _ in stored]
        assert ids == sorted(set(ids)), "ids must strictly increase"
        texts = [t for _, t in stored]
        assert len(texts) == len(set(texts)), "nothing may be stored twice"
        assert set(texts) <= self.sent
        by_id = dict(stored)
        missing = [i for i in self.acked if by_id.get(i) != self.acked[i]]
        assert not missing, f"{len(missing)} acknowledged messages lost or changed, first ids {missing[:5]}"
        if self.cursor:
            async with self.http.get(f"{self.url}/v1/queues/{self.queue}/subscriptions/reader") as resp:
                last_id = (await resp.json())["last_id"]
            assert last_id >= self.cursor, "an acknowledged cursor commit went back"


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def take_free_space(disk: Path) -> None:
    """Fill what is left of ``disk`` with a ballast file, down to the last byte."""
    ballast = disk / f"ballast-{time.monotonic_ns()}"
    with open(ballast, "ab", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1 << 8, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e


async def readiness(ledger: Ledger) -> tuple[int, dict[str, Any]]:
    async with ledger.http.get(f"{ledger.url}/readyz") as resp:
        return resp.status, await resp.json()


async def writable_gauge(ledger: Ledger) -> str:
    async with ledger.http.get(f"{ledger.url}/metrics") as resp:
        text = await resp.text()
    return next(
        line
        for line in text.splitlines()
        if line.startswith(f'capella_queue_writable{{queue="{ledger.queue}"}}')
    )


async def back_after_a_restart(ledger: Ledger, data: Path, config: Path) -> None:
    """Start a server on ``data`` again: every message ``ledger`` saw acknowledged is there."""
    server = await start(data, config)
    try:
        async with aiohttp.ClientSession() as http:
            ledger.http, ledger.url = http, server.url
            await ledger.check_everything_acknowledged_is_there()
    finally:
        server.stop()


async def resumes_by_itself(ledger: Ledger) -> float:
    """Seconds until /readyz is 200 again, with no write in between (at most RESUME_WITHIN)."""
    started = time.monotonic()

    async def ready() -> bool:
        return (await readiness(ledger))[0] == 200

    await until(ready, within=RESUME_WITHIN, every=0.1, what="/readyz to be 200 again")
    return time.monotonic() - started


async def start(data_dir: Path, config: Path | None = None) -> ServerProcess:
    server = ServerProcess(data_dir, config=config)
    await asyncio.to_thread(server.wait_ready)
    return server


def small_blocks_config(tmp_path: Path, **storage: str) -> Path:
    path = tmp_path / "capella.toml"
    lines = ["[storage]", *(f'{k} = "{v}"' for k, v in storage.items())]
    lines += ["[queue_defaults]", 'save = "wait"', "[queue_defaults.block]", 'max_bytes = "256KiB"']
    path.write_text("\n".join(lines) + "\n")
    return path


async def test_a_full_disk_refuses_writes_keeps_reads_and_resumes_without_a_restart(tmp_path: Path) -> None:
    config = small_blocks_config(tmp_path)
    with tmpfs(tmp_path / "disk", "3m") as disk:
        data = disk / "data"
        server = await start(data, config)
        try:
            async with aiohttp.ClientSession() as http:
                ledger = Ledger(http, server.url, "full")
                assert (await http.put(f"{server.url}/v1/queues/full", json={})).status == 201
                for _ in range(MAX_FILL_BATCHES):
                    status, body, _ = await ledger.produce()
                    if status != 200:
                        break
                assert status == 503, body
                assert body["error"]["code"] == "storage_unavailable"
                assert "No space left on device" in body["error"]["message"]
                assert len(ledger.acked) > 1000  # the disk did take a few MiB first

                # While full: every write is refused at once, reads work, readiness tells. The
                # broker may free space by itself meanwhile (a sealed block lets its journal go,
                # a failed seal removes its temporary file), so the test takes whatever is free
                # before each write; a write that lands in space freed between the two is
                # acknowledged like any other (the ledger checks it), and the test fills again.
                refused = 0
                for _ in range(10):
                    take_free_space(disk)
                    status, body, seconds = await ledger.produce()
                    if status == 200:
                        continue
                    assert (status, body["error"]["code"]) == (503, "storage_unavailable")
                    assert seconds < 5.0
                    refused += 1
                    if refused == 3:
                        break
                assert refused == 3
                status, ready = await readiness(ledger)
                assert status == 503 and ready["status"] == "not_writable"
                assert [q["queue"] for q in ready["queues"]] == ["full"]
                assert "No space left on device" in ready["queues"][0]["reason"]
                assert await writable_gauge(ledger) == 'capella_queue_writable{queue="full"} 0'
                await ledger.check_everything_acknowledged_is_there()

                subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
                await resumes_by_itself(ledger)
                assert await writable_gauge(ledger) == 'capella_queue_writable{queue="full"} 1'
                for _ in range(20):
                    status, body, _ = await ledger.produce()
                    assert status == 200, body
        finally:
            server.stop()

        await back_after_a_restart(ledger, data, config)


@pytest.mark.parametrize(
    ("error", "text"), [("EROFS", "Read-only file system"), ("EIO", "Input/output error")]
)
async def test_a_read_only_or_failing_disk_refuses_writes_and_resumes_when_it_clears(
    tmp_path: Path, error: str, text: str
) -> None:
    data = tmp_path / "data"
    server = await start(data, small_blocks_config(tmp_path))
    try:
        async with aiohttp.ClientSession() as http:
            ledger = Ledger(http, server.url, "disk")
            assert (await http.put(f"{server.url}/v1/queues/disk", json={})).status == 201
            for _ in range(5):
                assert (await ledger.produce())[0] == 200
            assert (await ledger.commit(2))[0] == 201
            acked_before = dict(ledger.acked)

            with injected(server.process.pid, WRITE_CALLS, f"error={error}"):
                for _ in range(3):
                    status, body, seconds = await ledger.produce()
                    assert (status, body["error"]["code"]) == (503, "storage_unavailable"), body
                    assert text in body["error"]["message"]
                    assert seconds < 5.0
                # A cursor commit is refused the same way (its change log's fdatasync fails).
                status, body, seconds = await ledger.commit(4)
                assert (status, body["error"]["code"]) == (503, "storage_unavailable"), body
                assert text in body["error"]["message"]
                assert seconds < 5.0
                # Nothing the failed fsyncs covered was acknowledged.
                assert ledger.acked == acked_before and ledger.cursor == 2
                status, ready = await readiness(ledger)
                assert status == 503 and text in ready["queues"][0]["reason"]
                await ledger.check_everything_acknowledged_is_there()

            await resumes_by_itself(ledger)
            for _ in range(5):
                status, body, _ = await ledger.produce()
                assert status == 200, body
            status, body, _ = await ledger.commit(6)
            assert status == 200, body
    finally:
        server.kill()  # a crash: only what was fsync'd is back

    await back_after_a_restart(ledger, data, small_blocks_config(tmp_path))


async def test_a_very_slow_disk_answers_a_timeout_not_a_hang(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = small_blocks_config(tmp_path, write_timeout="1s")
    server = await start(data, config)
    try:
        async with aiohttp.ClientSession() as http:
            ledger = Ledger(http, server.url, "slow")
            assert (await http.put(f"{server.url}/v1/queues/slow", json={})).status == 201
            assert (await ledger.produce())[0] == 200
            async with http.put(
                f"{server.url}/v1/queues/slow/subscriptions/workers", json={"mode": "ack"}
            ) as resp:
                assert resp.status == 201, await resp.text()
            with injected(server.process.pid, "fsync,fdatasync", "delay_enter=3s"):
                status, body, seconds = await ledger.produce()
                assert (status, body["error"]["code"]) == (503, "storage_timeout"), body
                assert "may still be saved" in body["error"]["message"]
                assert seconds < 2.5
                # A cursor commit is bounded the same way; reads do not wait for the disk.
                started = time.monotonic()
                async with http.put(
                    f"{server.url}/v1/queues/slow/subscriptions/billing?save=immediate", json={"last_id": 1}
                ) as resp:
                    assert (resp.status, (await resp.json())["error"]["code"]) == (503, "storage_timeout")
                assert time.monotonic() - started < 2.5
                # So are claims and acks, whose records are fsync'd by a group commit of their own.
                started = time.monotonic()
                async with http.post(
                    f"{server.url}/v1/queues/slow/subscriptions/workers/claim?limit=1&save=immediate"
                ) as resp:
                    assert (resp.status, (await resp.json())["error"]["code"]) == (503, "storage_timeout")
                assert time.monotonic() - started < 2.5
                async with http.get(f"{server.url}/v1/queues/slow/messages?after=0&limit=1") as resp:
                    assert resp.status == 200

            async def produced() -> bool:
                return (await ledger.produce())[0] == 200

            await until(produced, RESUME_WITHIN, "a write taken again", every=0)
    finally:
        server.stop()

    await back_after_a_restart(ledger, data, config)


async def test_overlapping_flushes_that_fail_lose_nothing_acknowledged_and_keep_order(tmp_path: Path) -> None:
    """Writers share overlapping group commits; every third fdatasync fails while they write.

    A failed flush fails every flush after it, whose bytes are written again in their order,
    so after ``kill -9`` the journal replays with strictly increasing ids and every
    acknowledged message is back.
    """
    data = tmp_path / "data"
    config = tmp_path / "capella.toml"  # blocks large enough that the restart replays the journal
    config.write_text('[queue_defaults]\nsave = "wait"\n')
    server = await start(data, config)
    writers, batches = 8, 12
    try:
        async with aiohttp.ClientSession() as http:
            ledger = Ledger(http, server.url, "overlap")
            assert (await http.put(f"{server.url}/v1/queues/overlap", json={})).status == 201

            async def statuses(count: int) -> set[int]:
                """Each writer sends ``count`` batches of 5, all at once: the statuses answered."""

                async def write() -> list[int]:
                    return [(await ledger.produce(5))[0] for _ in range(count)]

                return {s for w in await asyncio.gather(*(write() for _ in range(writers))) for s in w}

            with injected(server.process.pid, "fdatasync", "error=EIO:when=3+3"):
                answered = await statuses(batches)
            assert answered == {200, 503}, answered  # some flushes failed, others were answered
            await resumes_by_itself(ledger)
            assert await statuses(3) == {200}
            await ledger.check_everything_acknowledged_is_there()
    finally:
        server.kill()

    assert len(ledger.acked) >= writers * 3 * 5
    await back_after_a_restart(ledger, data, config)
