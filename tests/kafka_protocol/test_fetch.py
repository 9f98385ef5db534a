"""How much of a queue a Kafka fetch reads (capella/kafka/fetch.py), on an in-process cluster."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.clock import Clock
from support.configs import file_config
from support.wait import sealed, until

from capella.config import KafkaSettings
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.kafka import fetch
from capella.kafka.groups import Coordinator
from capella.kafka.session import Broker, Session

# kafka-python 3.0.12 loads its protocol schemas with importlib.resources.read_text, deprecated.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import FetchRequest
    from kafka.record.memory_records import MemoryRecords


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


# --- fetch.min.bytes and fetch.max.wait.ms --------------------------------------------------


def fetch_request(offset: int, *, min_bytes: int, max_wait_ms: int, max_bytes: int = 1 << 20) -> Any:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=offset,
        log_start_offset=-1,
        partition_max_bytes=max_bytes,
    )
    return FetchRequest(
        version=11,
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic="t", partitions=[partition])],
        forgotten_topics_data=[],
        rack_id="",
    )


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[Session]:
    cluster = await Cluster.open(file_config(tmp_path))
    await cluster.put_queue("t", {})
    broker = Broker(cluster, KafkaSettings(), Coordinator(), None, max_frame=1 << 20)
    yield Session(broker, "127.0.0.1")
    await cluster.close()


def offsets(answer: dict[str, Any]) -> list[int]:
    (topic,) = answer["responses"]
    (partition,) = topic["partitions"]
    assert partition["error_code"] == 0
    batches = MemoryRecords(partition["records"])
    found: list[int] = []
    while (batch := batches.next_batch()) is not None:
        found += [r.offset for r in batch]
    return found


async def append_later(session: Session, delays: list[float]) -> None:
    q = session.broker.cluster.queue("t")
    for delay in delays:
        await asyncio.sleep(delay)
        await q.append([Draft(payload=b"x" * 100)], SaveMode.WAIT)


async def test_a_fetch_waits_for_min_bytes_reading_on_as_messages_come(session: Session) -> None:
    q = session.broker.cluster.queue("t")
    await q.append([Draft(payload=b"x" * 100)], SaveMode.WAIT)
    # One message is about 180 bytes as a Kafka batch: 500 bytes wants three.
    later = asyncio.create_task(append_later(session, [0.2, 0.2]))
    started = time.monotonic()
    answer = await fetch.fetch(session, fetch_request(1, min_bytes=500, max_wait_ms=10_000), 11)
    took = time.monotonic() - started
    await later
    assert offsets(answer) == [1, 2, 3]
    assert 0.3 < took < 5.0  # answered when the third came, long before max_wait


async def test_a_fetch_below_min_bytes_answers_what_it_has_at_max_wait(session: Session) -> None:
    q = session.broker.cluster.queue("t")
    await q.append([Draft(payload=b"x" * 100)], SaveMode.WAIT)
    later = asyncio.create_task(append_later(session, [0.1]))
    started = time.monotonic()
    answer = await fetch.fetch(session, fetch_request(1, min_bytes=1 << 20, max_wait_ms=700), 11)
    took = time.monotonic() - started
    await later
    assert offsets(answer) == [1, 2]
    assert 0.65 < took < 5.0


async def test_a_fetch_with_min_bytes_one_answers_at_once_and_a_full_partition_does_not_wait(
    session: Session,
) -> None:
    q = session.broker.cluster.queue("t")
    await q.append([Draft(payload=b"x" * 100) for _ in range(3)], SaveMode.WAIT)
    started = time.monotonic()
    answer = await fetch.fetch(session, fetch_request(1, min_bytes=1, max_wait_ms=10_000), 11)
    assert offsets(answer) == [1, 2, 3] and time.monotonic() - started < 2.0
    # Its byte limit full (one batch of three, over it), a partition is answered at once,
    # whatever min_bytes asks: nothing more could be added to it.
    started = time.monotonic()
    answer = await fetch.fetch(
        session, fetch_request(1, min_bytes=1 << 20, max_wait_ms=10_000, max_bytes=1), 11
    )
    assert offsets(answer) == [1, 2, 3] and time.monotonic() - started < 2.0
    # At the end, with nothing coming, it waits max_wait and answers empty.
    started = time.monotonic()
    answer = await fetch.fetch(session, fetch_request(4, min_bytes=1, max_wait_ms=300), 11)
    assert offsets(answer) == [] and 0.25 < time.monotonic() - started < 5.0


async def test_a_partition_whose_next_batch_does_not_fit_is_answered_at_once(session: Session) -> None:
    q = session.broker.cluster.queue("t")
    for _ in range(4):  # four batches of about 180 bytes
        await q.append([Draft(payload=b"x" * 100)], SaveMode.WAIT)
    started = time.monotonic()
    answer = await fetch.fetch(
        session, fetch_request(1, min_bytes=1 << 20, max_wait_ms=10_000, max_bytes=400), 11
    )
    # Two fit; the third cannot, so nothing after it can be answered either: no waiting on.
    assert offsets(answer) == [1, 2] and time.monotonic() - started < 2.0
