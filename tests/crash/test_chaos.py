"""Chaos: randomized fault schedules against two real clusters copying both ways (``make chaos``).

Cluster A keeps its data on ``tests/support/powerfs.py``, a 32 MiB filesystem that forgets what was not
fsync'd when its power is cut; B on the ordinary disk. Each cluster copies its
queue to the other through a ``FaultProxy`` on 127.0.0.1, and one producer per cluster writes
with ``save=wait`` or ``immediate`` under its own source, resending an unanswered batch with
the same external ids. A seeded schedule then draws faults, one at a time: ``kill -9`` of
either cluster, a power cut on A (``kill -9`` and everything not fsync'd gone), a full disk on
A (a ballast file fills it, then goes), and the network between them blackholed, reset or
slowed. A reader follows A and remembers the highest id it
saw. After the campaign the faults are healed and both clusters must converge:

- every acknowledged message present exactly once on both clusters, byte-exact, with the id
  its own cluster answered, and in order per source;
- ids never reused: an id answered after a crash is above every id a reader saw before it.

Bounded: ``CYCLES`` faults of a few seconds each, every request and wait with a timeout. The
summary line is what ``docs/reliability.md`` quotes. Set ``CHAOS_SEED`` to replay a schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.faults import FaultProxy, PowerFs, powerfs
from support.http import produced, read_all
from support.servers import ServerProcess, free_port
from support.wait import eventually

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a FUSE filesystem: needs root"),
]

CYCLES = int(os.environ.get("CHAOS_CYCLES", "48"))
SEED = int(os.environ.get("CHAOS_SEED", str(int(time.time()))))
FAULTS = ("kill_a", "kill_b", "power_a", "disk_full", "blackhole", "reset", "delay")
BATCH = 10
REQUEST_TIMEOUT = 10.0
CONVERGE_WITHIN = 90.0


@dataclass
class Producer:
    """One source's writes to one cluster: what was acknowledged, with which id."""

    source: str
    queue_url: str
    next_ext: int = 1
    acked: dict[int, tuple[int, str]] = field(default_factory=dict)  # external id -> (id, text)
    unanswered: list[int] = field(default_factory=list)
    refused: int = 0
    batches: int = 0

    def text(self, ext: int) -> str:
        return f"{self.source}-{ext:07d}-" + "p" * (ext % 97)

    async def step(self, http: aiohttp.ClientSession, rng: random.Random, seen: SeenIds) -> None:
        exts = self.unanswered or list(range(self.next_ext, self.next_ext + BATCH))
        if not self.unanswered:
            self.next_ext += BATCH
        self.unanswered = exts
        save = rng.choice(("wait", "immediate"))
        messages = [{"data": self.text(e), "source": self.source, "external_id": e} for e in exts]
        self.batches += 1
        results = await produced(http, self.queue_url, messages, save, REQUEST_TIMEOUT)
        if results is None:
            self.refused += 1
            return
        for ext, result in zip(exts, results, strict=True):
            seen.saw(self.queue_url, result["id"], (self.source, ext))
            known = self.acked.get(ext)
            assert known is None or known[0] == result["id"], f"{self.source}/{ext}: id changed"
            self.acked[ext] = (result["id"], self.text(ext))
        self.unanswered = []


@dataclass
class SeenIds:
    """Which message each id a reader or a producer saw belonged to, per cluster.

    A reader sees a message before it is durable, so a crash may lose it; its id must never
    name another message afterwards.
    """

    owners: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    reused: list[tuple[str, int]] = field(default_factory=list)

    def saw(self, queue_url: str, message_id: int, identity: tuple[str, int]) -> None:
        owner = self.owners.setdefault((queue_url, message_id), identity)
        if owner != identity:
            self.reused.append((queue_url, message_id))


class Node:
    """A cluster process that the campaign kills and restarts on the same port and data."""

    def __init__(self, name: str, data_dir: Path, config: Path) -> None:
        self.name = name
        self.data_dir = data_dir
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ServerProcess | None = None
        self.kills = 0

    async def start(self) -> None:
        self.server = ServerProcess(self.data_dir, self.port, self.config)
        await asyncio.to_thread(self.server.wait_ready)

    async def kill_and_restart(self, power: PowerFs | None = None) -> None:
        assert self.server is not None
        self.server.kill()
        if power is not None:
            power.cut()
        self.kills += 1
        await self.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def fill(disk: Path) -> Path:
    """A ballast file that takes every free byte of ``disk``."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (1 << 20, 1 << 12):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    return ballast


async def test_two_clusters_copying_both_ways_survive_a_random_fault_schedule(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"\nchaos seed={SEED} (CHAOS_SEED={SEED} replays this schedule)")
    config = tmp_path / "capella.toml"
    config.write_text('[queue_defaults]\nsave = "wait"\n[queue_defaults.block]\nmax_messages = 500\n')
    counts = dict.fromkeys(FAULTS, 0)
    with powerfs(tmp_path / "disk-a", capacity=32 << 20) as fs:
        disk = fs.mount
        a = Node("a", disk / "data", config)
        b = Node("b", tmp_path / "b" / "data", config)
        b.data_dir.parent.mkdir()
        to_a, to_b = FaultProxy(a.url), FaultProxy(b.url)
        to_a.start()
        to_b.start()
        try:
            await a.start()
            await b.start()
            async with aiohttp.ClientSession() as http:
                for node, other, proxy in ((a, b, to_b), (b, a, to_a)):
                    definition = {"url": proxy.url, "connect_timeout": 2, "timeout": 5}
                    assert (
                        await http.put(f"{node.url}/v1/clusters/{other.name}", json=definition)
                    ).status in (
                        200,
                        201,
                    )
                    assert (await http.put(f"{node.url}/v1/queues/events", json={})).status == 201
                for node, other in ((a, b), (b, a)):
                    copy = {
                        "type": "copy",
                        "queues": ["events"],
                        "params": {"to": f"{other.name}/events", "wait": 1},
                    }
                    resp = await http.put(f"{node.url}/v1/handlers/to-{other.name}", json=copy)
                    assert resp.status == 201, await resp.text()

                seen = SeenIds()
                producers = [
                    Producer("pa", f"{a.url}/v1/queues/events"),
                    Producer("pb", f"{b.url}/v1/queues/events"),
                ]
                stop = asyncio.Event()

                async def produce(p: Producer) -> None:
                    while not stop.is_set():
                        await p.step(http, rng, seen)
                        await asyncio.sleep(0.02)  # paced: a steady stream, not a flood

                async def follow(queue_url: str) -> None:
                    after = 0
                    while not stop.is_set():
                        try:
                            async with http.get(
                                f"{queue_url}/messages",
                                params={"after": str(after), "limit": "1000", "wait": "1"},
                                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
                            ) as resp:
                                page = await resp.json() if resp.status == 200 else None
                        except (TimeoutError, aiohttp.ClientError):
                            page = None
                        if page is None:
                            await asyncio.sleep(0.2)  # the node is down or cut off: ask again shortly
                            continue
                        for m in page["messages"]:
                            seen.saw(queue_url, int(m["id"]), (str(m["source"]), int(m["external_id"])))
                        after = page["last_id"]

                workers = [asyncio.create_task(produce(p)) for p in producers]
                workers += [asyncio.create_task(follow(p.queue_url)) for p in producers]
                started = time.monotonic()
                try:
                    for _ in range(CYCLES):
                        fault = rng.choice(FAULTS)
                        counts[fault] += 1
                        hold = rng.uniform(1.0, 3.0)
                        if fault == "kill_a":
                            await a.kill_and_restart()
                        elif fault == "kill_b":
                            await b.kill_and_restart()
                        elif fault == "power_a":
                            await a.kill_and_restart(power=fs)
                        elif fault == "disk_full":
                            ballast = await asyncio.to_thread(fill, disk)
                            await asyncio.sleep(hold)
                            ballast.unlink()
                        else:
                            for proxy in (to_a, to_b):
                                if fault == "blackhole":
                                    proxy.blackhole()
                                elif fault == "reset":
                                    proxy.reset_all()
                                else:
                                    proxy.add_latency(0.5)
                            await asyncio.sleep(hold)
                            to_a.heal()
                            to_b.heal()
                        await asyncio.sleep(rng.uniform(0.5, 2.0))  # a quiet spell between faults
                finally:
                    stop.set()
                    await asyncio.gather(*workers, return_exceptions=True)
                campaign = time.monotonic() - started

                # Healed: the last unanswered batches go through, then both sides converge.
                for p in producers:

                    async def answered(p: Producer = p) -> bool:
                        if p.unanswered:
                            await p.step(http, rng, seen)
                        return not p.unanswered

                    await eventually(answered, 30, every=0)
                    assert not p.unanswered, f"{p.source}: writes still refused after the faults healed"
                expected = {(p.source, ext): text for p in producers for ext, (_, text) in p.acked.items()}
                views: list[list[dict[str, Any]]] = []

                async def converged() -> bool:
                    nonlocal views
                    views = [
                        await read_all(http, f"{n.url}/v1/queues/events", request_timeout=REQUEST_TIMEOUT)
                        for n in (a, b)
                    ]
                    keys = [{(str(m["source"]), int(m["external_id"])) for m in view} for view in views]
                    return all(set(expected) <= k for k in keys)

                await eventually(converged, within=CONVERGE_WITHIN, every=1.0)

                losses = 0
                for node, view in zip((a, b), views, strict=True):
                    identities = [(str(m["source"]), int(m["external_id"])) for m in view]  # type: ignore[call-overload]
                    assert len(identities) == len(set(identities)), f"{node.name}: a message is stored twice"
                    by_identity = {(str(m["source"]), int(m["external_id"])): m for m in view}  # type: ignore[call-overload]
                    for key, text in expected.items():
                        m = by_identity.get(key)
                        if m is None or m["data"] != text:
                            losses += 1
                    for p in producers:
                        exts = [e for s, e in identities if s == p.source]
                        moved = next((i for i, e in enumerate(exts) if i and e < exts[i - 1]), None)
                        assert moved is None, (
                            f"{node.name}: {p.source} out of order at index {moved}: "
                            f"{exts[moved - 2 : moved + 3]} (seed {SEED})"
                        )
                    # Each acknowledged message kept the id its own cluster answered.
                    own = producers[0] if node is a else producers[1]
                    for ext, (message_id, _) in own.acked.items():
                        assert by_identity[(own.source, ext)]["id"] == message_id
                    for m in view:
                        seen.saw(
                            f"{node.url}/v1/queues/events",
                            int(m["id"]),
                            (str(m["source"]), int(m["external_id"])),
                        )  # type: ignore[call-overload]

                summary = (
                    f"chaos seed={SEED} cycles={CYCLES} seconds={campaign:.0f} "
                    + " ".join(f"{k}={v}" for k, v in counts.items())
                    + f" acknowledged={len(expected)} refused_batches={sum(p.refused for p in producers)}"
                    + f" stored_a={len(views[0])} stored_b={len(views[1])} losses={losses}"
                    + f" ids_reused={len(seen.reused)}"
                )
                print(f"\n{summary}")
                assert losses == 0, summary
                assert not seen.reused, seen.reused[:5]
        finally:
            a.stop()
            b.stop()
            to_a.stop()
            to_b.stop()
