"""How much of a queue a Kafka fetch reads (capella/kafka/fetch.py), on an in-process cluster."""

from __future__ import annotations

from pathlib import Path

from support.clock import Clock
from support.configs import file_config
from support.wait import sealed, until

from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.kafka import fetch


async def test_a_fetch_loads_no_block_past_what_its_byte_limit_takes(tmp_path: Path, clock: Clock) -> None:
    # A fetch used to read a page of 10,000 messages whatever its byte limit: it loaded (and
    # rendered) every block of that page, ~100 ms per block in the benchmark, for messages it
    # did not answer. Now: the block it answers from, and the next one, prefetched.
    config = file_config(tmp_path, block={"max_messages": 2000})
    cluster = await Cluster.open(config, clock=clock)
    q, _ = await cluster.put_queue("t", {})
    for n in range(100):  # five blocks of 20 batches of 100
        await q.append([Draft(payload=b"m%d" % n) for _ in range(100)], SaveMode.WAIT)
    await sealed(q, 5)
    await cluster.close()
    cluster = await Cluster.open(config, clock=clock)
    try:
        q = cluster.queue("t")
        assert not q._store.loaded
        part = fetch._Partition("t", 0, offset=1, max_bytes=1, queue=q)
        await fetch._read(part, 1 << 20, first=True)
        assert len(part.chunks) == 1  # one whole batch, over the limit (KIP-74)
        await until(lambda: not q._store._loading, what="the loads in flight")
        assert sorted(q._store.loaded) == [1, 2001]
        # A fetch with room for everything answers every batch, in order.
        whole = fetch._Partition("t", 0, offset=5, max_bytes=1 << 20, queue=q)
        await fetch._read(whole, 1 << 20, first=True)
        assert [chunk[:8] for chunk in whole.chunks] == [n.to_bytes(8, "big") for n in range(1, 10_001, 100)]
    finally:
        await cluster.close()
