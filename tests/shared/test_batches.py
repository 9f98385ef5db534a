"""A node's stamped batches: the cache that serves repeated reads is bounded by bytes, not only
by count, and a batch it let go is stamped again from the object cache, the same."""

from __future__ import annotations

import tracemalloc

from capella.config import SharedSettings, load_config
from capella.records import record_batch
from capella.shared import node as shared_node
from capella.shared.catalog import Segment
from capella.shared.node import SharedNode
from capella.shared.object import build
from capella.storage.memory import MemoryStorage

MESSAGES = 256
PAYLOAD = 4096  # a stored batch of 1 MiB
OBJECTS = 80  # 80 MiB of batches: more than the cache may hold, fewer than its count limit
MIB = 1024 * 1024
LIMIT = 64 * MIB  # node.BATCH_BYTES


async def test_a_long_read_keeps_at_most_batch_bytes_of_stamped_batches() -> None:
    storage = MemoryStorage()
    payload = bytes(range(256)) * (PAYLOAD // 256)
    data = record_batch.encode([payload] * MESSAGES)
    segments = []
    for i in range(OBJECTS):
        body, placed = build([("q", data)])
        key = f"shared/objects/{i:04d}.cpo"
        await storage.put(key, body)
        spot = placed[0]
        first = 1 + i * MESSAGES
        segments.append(
            Segment(
                "q",
                first,
                first + MESSAGES - 1,
                key,
                spot.offset,
                spot.size,
                MESSAGES,
                (),
                1000.0 + i,
                len(body),
            )
        )
    settings = SharedSettings(node="n", mount="s3main", dsn="postgresql://u@127.0.0.1/db")
    node = SharedNode(load_config(), settings, {"s3main": storage}, None)
    node.cluster_name = "c"
    assert OBJECTS < shared_node.BATCHES

    first = [(m.id, m.time, m.source, m.payload) for m in (await node.batch_of(segments[0])).messages]
    tracemalloc.start()
    try:
        for segment in segments:
            batch = await node.batch_of(segment)
            assert list(batch.ids) == list(range(segment.first_id, segment.last_id + 1))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The objects were in memory before (the storage's); what the reads left held is the stamped
    # copies: 80 MiB of them without a bound in bytes.
    assert held <= LIMIT + 4 * MIB, f"{held / MIB:.0f} MiB held after reading {OBJECTS} MiB"
    assert shared_node.BATCH_BYTES == LIMIT
    assert LIMIT - 2 * len(data) < node.batch_bytes <= LIMIT  # it does keep what fits

    # The first batches were let go: read again, they are stamped again, message for message.
    again = [(m.id, m.time, m.source, m.payload) for m in (await node.batch_of(segments[0])).messages]
    assert again == first
    assert [m[:3] for m in first] == [(i, 1000.0, "c") for i in range(1, MESSAGES + 1)]
    assert node.batch_bytes <= shared_node.BATCH_BYTES
