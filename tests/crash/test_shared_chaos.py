"""D2: kill -9 chaos on a shared cluster: three nodes, six producers, one node killed at a time.

Three ``capella serve`` nodes share one PostgreSQL and one moto bucket; two shared queues. Six
producers (two per node, each with its own source and increasing external ids, ``save=wait``)
write all along; a batch that fails or times out is sent again, with the same identities, to
another node (``tests/support/producers.py``). Every few seconds one random node gets ``kill
-9`` and is restarted on its data dir and port: it reclaims its name at once (its lease token
is in the data dir), so the campaign does not wait out the 10 s lease. Afterwards, read through
every node:

- every acknowledged identity is stored exactly once, with the id it was answered, byte-exact;
  no identity twice; ids 1, 2, ... with no gap, the same from every node;
- every segment's object exists in S3 (data goes to S3 before its commit), and no stored batch
  was committed twice;
- 0 acknowledged loss.

The short campaign (``KILLS_SHORT`` kills, well under a minute) runs in ``make test``; the full
one (``CHAOS_SHARED_KILLS``, 20 by default, a few seconds apart) in ``make chaos``. Set
``CHAOS_SEED`` to replay a schedule. The summary line gives the figures the docs quote.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from support.pg import PgServer, available
from support.producers import Producer, check_stored
from support.servers import S3Server
from support.shared import SharedRig
from support.wait import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(available() is not None, reason=f"shared queues need PostgreSQL: {available()}"),
]

NODES = 3
QUEUES = ("c0", "c1")
KILLS_SHORT = 4
KILLS_FULL = int(os.environ.get("CHAOS_SHARED_KILLS", "20"))
SEED = int(os.environ.get("CHAOS_SEED", str(int(time.time()))))
WRITE_TIMEOUT = 3.0
EXTRA = f'[storage]\nwrite_timeout = "{WRITE_TIMEOUT:g}s"\n'
REQUEST_TIMEOUT = 8.0  # the client's: a node killed mid-request answers nothing
PROGRESS = 60  # messages acknowledged between two kills, at least
SETTLE_WITHIN = 60.0


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60.0)) as session:
        yield session


async def campaign(
    root: Path,
    pg: PgServer,
    s3: S3Server,
    http: aiohttp.ClientSession,
    kills: int,
    pause: tuple[float, float],
) -> None:
    rng = random.Random(SEED)
    # The janitor's periods short enough to see it collect what killed nodes left uploaded but
    # never committed (orphan_after must outlast write_timeout and the retried commits).
    shared = {"orphan_after": "8s", "garbage_grace": "1s", "compact_interval": "500ms"}
    rig = SharedRig(root, pg=pg, s3=s3, flush_interval="50ms", extra=EXTRA, shared=shared)
    try:
        started = time.monotonic()
        urls = [node.url for node in await asyncio.to_thread(rig.start, NODES)]
        for queue in QUEUES:
            async with http.put(f"{urls[0]}/v1/queues/{queue}", json={"storage": "shared"}) as resp:
                assert resp.status == 201, await resp.text()

        async def everywhere() -> bool:
            for url in urls:
                for queue in QUEUES:
                    async with http.get(f"{url}/v1/queues/{queue}") as resp:
                        if resp.status != 200:
                            return False
            return True

        await until(everywhere, 15.0, "the queues on every node")
        producers = [
            Producer(f"p{i}", QUEUES[i % 2], home=i // 2, request_timeout=REQUEST_TIMEOUT) for i in range(6)
        ]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(p.run(http, urls, stop, random.Random(rng.random()))) for p in producers]
        restarts: list[float] = []

        def acked_total() -> int:
            return sum(len(p.acked) for p in producers)

        async def progress(what: str) -> None:
            goal = acked_total() + PROGRESS
            await until(lambda: acked_total() >= goal, 30.0, what)

        try:
            for _ in range(kills):
                await progress("progress between kills")
                await asyncio.sleep(rng.uniform(*pause))  # the schedule: a kill every few seconds
                victim = rng.randrange(NODES)
                await asyncio.to_thread(rig.kill, victim)
                at = time.monotonic()
                await asyncio.to_thread(rig.restart, victim)
                restarts.append(time.monotonic() - at)
            await progress("progress after the last kill")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        for p in producers:
            await p.settle(http, urls, within=SETTLE_WITHIN)
        campaign_seconds = time.monotonic() - started

        stored = 0
        for queue in QUEUES:
            seen = [await check_stored(http, url, queue, producers) for url in urls]
            assert all(s == seen[0] for s in seen[1:]), f"{queue}: the nodes read different messages"
            stored += len(seen[0])
        acked = acked_total()
        assert stored == acked  # every batch was settled: all that is stored was acknowledged

        referenced = set(
            rig.pg.psql(
                rig.database,
                "select distinct o.key from capella_segments s join capella_objects o using (object_id)",
            ).split()
        )
        client = s3.client()
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=rig.bucket)
            in_s3 = {item["Key"] for page in pages for item in page.get("Contents", [])}
        finally:
            client.close()
        assert referenced, "no segment rows"
        assert referenced <= in_s3, f"segments point at missing objects: {sorted(referenced - in_s3)[:5]}"
        twice = rig.pg.psql(
            rig.database,
            "select count(*) from (select object_id, byte_offset from capella_segments "
            "group by 1, 2 having count(*) > 1) d",
        )
        assert twice.strip() == "0"

        # What killed nodes uploaded but never committed is collected: every object left in S3 is
        # one a row names (a segment's, or a dead one within its grace).
        def collected() -> bool:
            known = set(rig.pg.psql(rig.database, "select key from capella_objects").split())
            client = s3.client()
            try:
                pages = client.get_paginator("list_objects_v2").paginate(Bucket=rig.bucket, Prefix="shared/")
                left = {item["Key"] for page in pages for item in page.get("Contents", [])}
            finally:
                client.close()
            return left <= known

        await until(collected, within=SETTLE_WITHIN, what="uncommitted objects collected")
        attempts = [a for p in producers for a in p.attempts]
        failed = [a for a in attempts if a.status != 200]
        unanswered = sum(a.status is None for a in failed)
        print(
            f"\nshared chaos seed={SEED} kills={kills} seconds={campaign_seconds:.1f} acked={acked} "
            f"batches={len(attempts) - len(failed)} failed_attempts={len(failed)} "
            f"(no answer {unanswered}, 503 {sum(a.status == 503 for a in failed)}) "
            f"duplicates_answered={sum(p.duplicates for p in producers)} "
            f"restart_seconds_max={max(restarts):.2f} mean={sum(restarts) / len(restarts):.2f} "
            f"objects_in_s3={len(in_s3)} referenced={len(referenced)} unreferenced={len(in_s3 - referenced)}"
        )
    finally:
        await asyncio.to_thread(rig.close)


async def test_kill_9_chaos_short(
    tmp_path: Path, pg_server: PgServer, s3_server: S3Server, http: aiohttp.ClientSession
) -> None:
    await campaign(tmp_path / "rig", pg_server, s3_server, http, KILLS_SHORT, (0.5, 1.5))


@pytest.mark.chaos
@pytest.mark.timeout(900)
async def test_kill_9_chaos_campaign(
    tmp_path: Path, pg_server: PgServer, s3_server: S3Server, http: aiohttp.ClientSession
) -> None:
    await campaign(tmp_path / "rig", pg_server, s3_server, http, KILLS_FULL, (3.0, 6.0))
