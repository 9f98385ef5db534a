"""D6: PostgreSQL restarted in the middle of the load (``pg_ctl stop -m immediate``, then start),
with fsync and ``synchronous_commit`` on.

Two nodes, four producers (two per node, each its own source and increasing external ids,
``save=wait``; a failed batch is sent again with the same identities, to another node). While
PostgreSQL is down every write answers 503 (``storage_unavailable`` or ``storage_timeout``)
within ``storage.write_timeout`` plus the window; once it is back, every producer's writes go
through again without anyone touching the nodes; every acknowledged identity is stored exactly
once with the id it was answered; and no commit was applied twice (a commit whose answer the
restart cut off is retried under the same object key: one segment row per stored batch).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from support.producers import Attempt, Producer, check_stored
from support.shared import SharedRig
from support.wait import until

pytestmark = pytest.mark.slow

WRITE_TIMEOUT = 2.0
WINDOW = 0.05
ANSWER_SLACK = 2.5  # the request's own way through server and client on 2 busy cores
EXTRA = f'[storage]\nwrite_timeout = "{WRITE_TIMEOUT:g}s"\n'
FAILED_WRITES = 6  # 503 answers seen while PostgreSQL is down before it starts again


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        yield session


def acked(producers: list[Producer]) -> list[int]:
    return [len(p.acked) for p in producers]


@pytest.mark.shared_rig(durable=True, flush_interval="50ms", extra=EXTRA)
async def test_postgres_restarted_mid_load_answers_503_in_time_then_resumes_losing_nothing(
    shared_rig: SharedRig, http: aiohttp.ClientSession
) -> None:
    rig = shared_rig
    urls = [node.url for node in await asyncio.to_thread(rig.start, 2)]
    async with http.put(f"{urls[0]}/v1/queues/q", json={"storage": "shared"}) as resp:
        assert resp.status == 201, await resp.text()

    async def everywhere() -> bool:
        for url in urls:
            async with http.get(f"{url}/v1/queues/q") as resp:
                if resp.status != 200:
                    return False
        return True

    await until(everywhere, 10.0, "queue q on both nodes")
    producers = [Producer(f"p{i}", "q", home=i % 2, request_timeout=10.0) for i in range(4)]
    rng = random.Random(6)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(p.run(http, urls, stop, rng)) for p in producers]
    try:
        await until(lambda: min(acked(producers)) >= 30, 20.0, "every producer writing")

        down_at = time.monotonic()
        await asyncio.to_thread(rig.pg.stop, "immediate")

        def failed_since(at: float) -> list[Attempt]:
            return [a for p in producers for a in p.attempts if a.at >= at and a.status != 200]

        await until(
            lambda: len(failed_since(down_at)) >= FAILED_WRITES, 30.0, "503s while PostgreSQL is down"
        )
        await asyncio.to_thread(rig.pg.start)
        before = acked(producers)
        # Nothing told the nodes: their pools reconnect, their flushes commit again.
        await until(
            lambda: all(n > b for n, b in zip(acked(producers), before, strict=True)),
            30.0,
            "every producer acknowledged again after the restart",
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    for p in producers:
        await p.settle(http, urls, within=30.0)

    failures = [a for p in producers for a in p.attempts if a.status != 200]
    assert failures, "the outage showed no failure"
    for a in failures:
        assert a.status == 503, a
        assert a.code in ("storage_unavailable", "storage_timeout"), a
        assert a.seconds <= WRITE_TIMEOUT + WINDOW + ANSWER_SLACK, a
    for url in urls:
        await check_stored(http, url, "q", producers)
    twice = rig.pg.psql(
        rig.database,
        "select count(*) from (select object_id, byte_offset from capella_segments "
        "group by 1, 2 having count(*) > 1) d",
    )
    assert twice.strip() == "0"
    next_id = rig.pg.psql(rig.database, "select next_id from capella_queues where name = 'q'")
    assert int(next_id) - 1 == sum(len(p.acked) for p in producers)
    print(
        f"\nD6: acked={sum(len(p.acked) for p in producers)} failed_writes={len(failures)} "
        f"slowest_failure={max(a.seconds for a in failures):.2f}s "
        f"duplicates_answered={sum(p.duplicates for p in producers)}"
    )
