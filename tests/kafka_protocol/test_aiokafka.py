"""aiokafka 0.14 against a real ``capella serve``: produce with and without idempotence, assign
and seek, and a group of two consumers on a three-partition topic (design note §9, K7-K8).

aiokafka speaks only non-flexible versions (Produce 7, Fetch 11, JoinGroup 5, ...), checks
every fetched batch's CRC-32C in its own Cython parser, and asks for a producer id
(InitProducerId v0) only with ``enable_idempotence=True``. Each check is read back both ways:
what aiokafka was answered, and what the HTTP API holds for the same messages. Besides: a
transactional producer refused at start, and a group member (kafka-python, in a process of
its own) killed with -9, which only its session timeout removes.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import TransactionalIdAuthorizationFailed
from support.kafka import KafkaServer, kafka_server
from support.wait import holds, until

pytestmark = pytest.mark.slow

# Short client timeouts, so that a broken answer fails the test in seconds, not minutes.
REQUEST_TIMEOUT_MS = 10_000
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_MS = 500
WITHIN = 20.0
CLUSTER = "kafka-test"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    yield from kafka_server(tmp_path_factory.mktemp("aiokafka"))


@pytest.fixture
async def http(broker: KafkaServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(broker.url, timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def put(http: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.put(path, json=body) as resp:
        assert resp.status in (200, 201), await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


async def get(http: aiohttp.ClientSession, path: str, **params: Any) -> dict[str, Any]:
    async with http.get(path, params=params) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


async def last_id(http: aiohttp.ClientSession, queue: str) -> int:
    return int((await get(http, f"/v1/queues/{queue}"))["stats"]["last_id"])


async def stored(http: aiohttp.ClientSession, queue: str) -> list[dict[str, Any]]:
    """Every message of ``queue`` as the HTTP API shows it, oldest first."""
    found: list[dict[str, Any]] = []
    after = 0
    for _ in range(100):
        page = await get(http, f"/v1/queues/{queue}/messages", after=after, limit=1000)
        found += page["messages"]
        if not page["messages"]:
            return found
        after = page["last_id"]
    raise AssertionError(f"{queue}: more pages than a test writes")


def producer(broker: KafkaServer, **options: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS, **options
    )


def consumer(broker: KafkaServer, **options: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **options,
    )


async def records(
    reader: AIOKafkaConsumer, count: int, within: float = WITHIN
) -> list[ConsumerRecord[bytes, bytes]]:
    """``count`` records from ``getmany`` (failing when more come, or fewer within ``within``)."""
    got: list[ConsumerRecord[bytes, bytes]] = []
    deadline = time.monotonic() + within
    while len(got) < count and time.monotonic() < deadline:
        for batch in (await reader.getmany(timeout_ms=200)).values():
            got += batch
    assert len(got) == count, f"{len(got)} records of {count}"
    return got


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
async def test_produced_messages_are_read_back_from_the_beginning_with_getmany(
    broker: KafkaServer, http: aiohttp.ClientSession, idempotent: bool
) -> None:
    queue = f"aio-{'idem' if idempotent else 'plain'}"
    await put(http, f"/v1/queues/{queue}", {})
    sent = [
        (f"k{n}".encode(), f"value {n}".encode(), [("n", str(n).encode()), ("kind", b"test")])
        for n in range(200)
    ]
    writer = producer(broker, enable_idempotence=idempotent, acks="all" if idempotent else 1)
    await writer.start()
    try:
        futures = [await writer.send(queue, value, key, headers=headers) for key, value, headers in sent]
        answers = [await asyncio.wait_for(f, WITHIN) for f in futures]
    finally:
        await writer.stop()
    offsets = [a.offset for a in answers]
    assert offsets == sorted(set(offsets)) and len(offsets) == 200

    held = await stored(http, queue)
    assert [m["id"] for m in held] == offsets
    assert [m["data"] for m in held] == [value.decode() for _, value, _ in sent]
    assert [m["headers"]["kafka.key"] for m in held] == [key.decode() for key, _, _ in sent]
    sources = {m["source"] for m in held}
    if idempotent:
        # InitProducerId was served: every message carries the producer id as its identity.
        assert len(sources) == 1 and re.fullmatch(rf"{CLUSTER}/kafka/\d+", sources.pop()), sources
    else:
        assert sources == {CLUSTER}

    reader = consumer(broker)
    await reader.start()
    try:
        tp = TopicPartition(queue, 0)
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        got = await records(reader, 200)
    finally:
        await reader.stop()
    assert [r.offset for r in got] == offsets
    assert [(r.key, r.value, list(r.headers)) for r in got] == [
        (key, value, headers) for key, value, headers in sent
    ]


async def test_seek_to_end_then_one_new_message_reads_exactly_that_one(
    broker: KafkaServer, http: aiohttp.ClientSession
) -> None:
    queue = "aio-end"
    await put(http, f"/v1/queues/{queue}", {})
    writer = producer(broker)
    await writer.start()
    reader = consumer(broker)
    await reader.start()
    try:
        for n in range(20):
            await writer.send_and_wait(queue, f"old {n}".encode())
        tp = TopicPartition(queue, 0)
        reader.assign([tp])
        await reader.seek_to_end(tp)
        end = await reader.position(tp)
        assert end == await last_id(http, queue) + 1
        # Nothing past the end yet: a fetch waits and answers nothing.
        assert not await reader.getmany(tp, timeout_ms=300)
        new = await writer.send_and_wait(queue, b"the new one", key=b"new")
        got = await records(reader, 1)
        # And no second one turns up after it.
        assert not await reader.getmany(tp, timeout_ms=300)
    finally:
        await reader.stop()
        await writer.stop()
    assert new.offset == end
    assert [(r.offset, r.key, r.value) for r in got] == [(end, b"new", b"the new one")]


async def test_a_transactional_producer_is_refused_at_start_not_left_retrying(broker: KafkaServer) -> None:
    # Transactions are not supported: the transaction coordinator lookup is refused with a
    # code aiokafka gives up on (a retriable one kept start() waiting for ever).
    writer = producer(broker, transactional_id="aio-tx")
    started = time.monotonic()
    try:
        with pytest.raises(TransactionalIdAuthorizationFailed):
            await asyncio.wait_for(writer.start(), 10)
    finally:
        await writer.stop()
    assert time.monotonic() - started < 5


async def test_a_group_of_two_shares_three_partitions_and_the_survivor_takes_them_all(
    broker: KafkaServer, http: aiohttp.ClientSession
) -> None:
    topic, group = "aio-grouped", "aio-group"
    await put(http, f"/v1/topics/{topic}", {"partitions": 3})
    everything = {TopicPartition(topic, n) for n in range(3)}
    members = [
        consumer(
            broker,
            group_id=group,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            metadata_max_age_ms=2_000,
        )
        for _ in range(2)
    ]
    seen: list[list[tuple[int, int, bytes]]] = [[], []]
    stopping = [False, False]

    async def consume(index: int) -> None:
        member = members[index]
        while not stopping[index]:
            batches = await member.getmany(timeout_ms=200)
            for tp, batch in batches.items():
                seen[index] += [(tp.partition, r.offset, r.value) for r in batch]
            if batches:
                await member.commit()

    for member in members:
        await member.start()
        member.subscribe([topic])
    loops = [asyncio.create_task(consume(n)) for n in range(2)]
    writer = producer(broker)
    await writer.start()
    try:

        def settled() -> bool:
            first, second = (m.assignment() for m in members)
            return bool(first and second and not first & second and first | second == everything)

        await until(settled, WITHIN, "two members owning all three partitions between them")
        sent = set()
        for n in range(90):
            answer = await writer.send_and_wait(topic, f"m{n}".encode(), partition=n % 3)
            sent.add((answer.partition, answer.offset, f"m{n}".encode()))
        await until(lambda: len(seen[0]) + len(seen[1]) >= 90, WITHIN, "every message consumed")
        # Each consumed once, by the member owning its partition.
        assert sorted(seen[0] + seen[1]) == sorted(sent)
        for index, member in enumerate(members):
            assert {p for p, _, _ in seen[index]} <= {tp.partition for tp in member.assignment()}
        # Every commit is the group's subscription on the partition's queue.
        for n in range(3):
            queue = f"{topic}~{n}"
            last = await last_id(http, queue)
            await until(
                lambda q=queue, last=last: committed(http, q, f"kafka.{group}", last),
                WITHIN,
                f"the group's cursor on {queue} at {last}",
            )
        # And it stays settled over several heartbeats: the same owners, no new generation.
        owners = [m.assignment() for m in members]
        made = rebalances(broker, group)
        await holds(
            lambda: [m.assignment() for m in members] == owners and rebalances(broker, group) == made,
            6 * HEARTBEAT_MS / 1000,
            "the settled group",
        )

        stopping[1] = True
        await loops[1]
        stopped = time.monotonic()
        await members[1].stop()
        await until(
            lambda: members[0].assignment() == everything,
            SESSION_TIMEOUT_MS / 1000 + 5,
            "the survivor owning every partition",
        )
        taken_over = time.monotonic() - stopped
        before = len(seen[0])
        more = set()
        for n in range(30):
            answer = await writer.send_and_wait(topic, f"later {n}".encode(), partition=n % 3)
            more.add((answer.partition, answer.offset, f"later {n}".encode()))
        await until(lambda: len(seen[0]) >= before + 30, WITHIN, "the later messages consumed")
        # The survivor starts where the stopped member committed: nothing again, nothing missed.
        assert sorted(seen[0][before:]) == sorted(more)
    finally:
        stopping[0] = stopping[1] = True
        await asyncio.gather(*loops, return_exceptions=True)
        for member in members:
            await member.stop()
        await writer.stop()
    assert taken_over < SESSION_TIMEOUT_MS / 1000 + 5


def rebalances(broker: KafkaServer, group: str) -> int:
    """How many generations the broker's coordinator made for ``group`` (from its log)."""
    return len(re.findall(rf"group rebalanced group={re.escape(repr(group))} ", broker.log()))


async def committed(http: aiohttp.ClientSession, queue: str, name: str, last_id: int) -> bool:
    async with http.get(f"/v1/queues/{queue}/subscriptions/{name}") as resp:
        return resp.status == 200 and (await resp.json())["last_id"] == last_id


# A kafka-python group member in a process of its own, writing its assignment after each poll.
MEMBER = """
import json, sys
from kafka import KafkaConsumer
bootstrap, topic, group, out = sys.argv[1:5]
consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=6000,
                         heartbeat_interval_ms=500, request_timeout_ms=10000, enable_auto_commit=False)
while True:
    consumer.poll(timeout_ms=200)
    with open(out + ".tmp", "w") as f:
        json.dump(sorted(tp.partition for tp in consumer.assignment()), f)
    __import__("os").replace(out + ".tmp", out)
"""


async def test_a_member_killed_without_leaving_expires_and_the_other_takes_its_partitions(
    broker: KafkaServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # One group, two clients: aiokafka here, kafka-python in a process killed with -9, which
    # sends no LeaveGroup: only its session timeout ends its membership.
    topic, group = "aio-killed", "aio-killed-group"
    await put(http, f"/v1/topics/{topic}", {"partitions": 3})
    survivor = consumer(
        broker, group_id=group, session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS
    )
    await survivor.start()
    survivor.subscribe([topic])
    out = tmp_path / "assignment.json"
    other = subprocess.Popen(
        [sys.executable, "-c", MEMBER, broker.bootstrap, topic, group, str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    stopping = False

    async def consume() -> None:
        while not stopping:
            await survivor.getmany(timeout_ms=200)

    loop = asyncio.create_task(consume())
    try:

        def shared() -> bool:
            assert other.poll() is None, "the kafka-python member exited"
            theirs = set(json.loads(out.read_text())) if out.exists() else set()
            ours = {tp.partition for tp in survivor.assignment()}
            return bool(ours and theirs and not ours & theirs and ours | theirs == {0, 1, 2})

        await until(shared, WITHIN, "both members owning partitions")
        other.send_signal(signal.SIGKILL)
        other.wait(10)
        killed = time.monotonic()
        await until(
            lambda: {tp.partition for tp in survivor.assignment()} == {0, 1, 2},
            SESSION_TIMEOUT_MS / 1000 + 5,
            "the survivor owning every partition",
        )
        taken_over = time.monotonic() - killed
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(10)
        stopping = True
        await asyncio.gather(loop, return_exceptions=True)
        await survivor.stop()
    assert taken_over < SESSION_TIMEOUT_MS / 1000 + 5
    assert re.search(rf"member session expired group={re.escape(repr(group))} ", broker.log())
