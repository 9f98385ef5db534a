"""Across protocols on one real ``capella serve`` (design note §9, K12): messages produced over
HTTP read by Kafka consumers, messages produced by Kafka producers read over HTTP, and a
group's committed offsets as the subscription ``kafka.<group>``, read and moved over HTTP.
What a Kafka consumer reads must not depend on how the messages came in (JSON, the SDK's
record batches, Kafka) nor on where they are read from (memory, sealed blocks after a restart).

Two Kafka clients nobody here wrote take each side: kafka-python 3.0.12 and confluent-kafka
2.16 (librdkafka). What the HTTP side must show is the mapping of docs/kafka.md: the reserved
headers ``kafka.key``, ``kafka.key.b64``, ``kafka.null``, ``kafka.headers.b64`` and
``kafka.time``, ids equal to offsets; ``kafka.headers.b64`` is decoded here by hand, from the
record layout of apache/kafka's ``docs/implementation.html``, not by Capella's own code.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import confluent_kafka
import kafka
import pytest
from support.kafka import KafkaServer, kafka_server
from support.wait import until_blocking

from capella.client.async_client import AsyncClient

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_MS = 10_000
SESSION_TIMEOUT_MS = 6_000
WITHIN = 20.0
CLIENTS = ["kafka-python", "confluent-kafka"]

Headers = list[tuple[str, bytes | None]]


class Record(NamedTuple):
    """One record as a Kafka consumer got it (a null header list is an empty one)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    create_time: bool
    timestamp: int


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    yield from kafka_server(tmp_path_factory.mktemp("cross"))


def call(broker: KafkaServer, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{broker.url}{path}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def queue_for(broker: KafkaServer, name: str) -> str:
    call(broker, "PUT", f"/v1/queues/{name}", {})
    return name


def stored(broker: KafkaServer, queue: str) -> list[dict[str, Any]]:
    page = call(broker, "GET", f"/v1/queues/{queue}/messages?after=0&limit=1000")
    messages: list[dict[str, Any]] = page["messages"]
    return messages


# --- Kafka clients --------------------------------------------------------------------------


def read(client: str, broker: KafkaServer, queue: str, offset: int, count: int) -> list[Record]:
    """``count`` records of partition 0 of ``queue`` from ``offset``, by ``client``, no group."""
    return READERS[client](broker, queue, offset, count)


def read_kafka_python(broker: KafkaServer, queue: str, offset: int, count: int) -> list[Record]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS, enable_auto_commit=False
    )
    got: list[Record] = []
    try:
        tp = kafka.TopicPartition(queue, 0)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + WITHIN
        while len(got) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                got += [
                    Record(r.offset, r.key, r.value, list(r.headers), r.timestamp_type == 0, r.timestamp)
                    for r in batch
                ]
    finally:
        consumer.close()
    assert len(got) == count, got
    return got


def read_confluent(broker: KafkaServer, queue: str, offset: int, count: int) -> list[Record]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "cross-assign",
            "enable.auto.commit": False,
            "socket.timeout.ms": REQUEST_TIMEOUT_MS,
        }
    )
    got: list[Record] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(queue, 0, offset)])
        deadline = time.monotonic() + WITHIN
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            kind, stamp = msg.timestamp()
            got.append(
                Record(
                    msg.offset(),
                    msg.key(),
                    msg.value(),
                    list(msg.headers() or []),
                    kind == confluent_kafka.TIMESTAMP_CREATE_TIME,
                    stamp,
                )
            )
    finally:
        consumer.close()
    assert len(got) == count, got
    return got


READERS: dict[str, Callable[[KafkaServer, str, int, int], list[Record]]] = {
    "kafka-python": read_kafka_python,
    "confluent-kafka": read_confluent,
}


class Sent(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int | None = None


def write(client: str, broker: KafkaServer, queue: str, sent: list[Sent]) -> list[int]:
    """Produce ``sent`` to ``queue`` in order with ``client``; the offsets each was answered."""
    return WRITERS[client](broker, queue, sent)


def write_kafka_python(broker: KafkaServer, queue: str, sent: list[Sent]) -> list[int]:
    producer = kafka.KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        max_block_ms=REQUEST_TIMEOUT_MS,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        delivery_timeout_ms=2 * REQUEST_TIMEOUT_MS,
    )
    try:
        futures = [
            producer.send(queue, key=s.key, value=s.value, headers=s.headers, timestamp_ms=s.timestamp)
            for s in sent
        ]
        return [f.get(timeout=WITHIN).offset for f in futures]
    finally:
        producer.close(timeout=5)


def write_confluent(broker: KafkaServer, queue: str, sent: list[Sent]) -> list[int]:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 2 * REQUEST_TIMEOUT_MS,
        }
    )
    reports: dict[int, tuple[Any, int]] = {}
    for n, s in enumerate(sent):

        def report(err: Any, msg: Any, n: int = n) -> None:
            reports[n] = (err, msg.offset())

        producer.produce(
            queue, key=s.key, value=s.value, headers=s.headers, timestamp=s.timestamp or 0, on_delivery=report
        )
    assert producer.flush(WITHIN) == 0
    assert all(err is None for err, _ in reports.values()), reports
    return [reports[n][1] for n in range(len(sent))]


WRITERS: dict[str, Callable[[KafkaServer, str, list[Sent]], list[int]]] = {
    "kafka-python": write_kafka_python,
    "confluent-kafka": write_confluent,
}


def decoded_headers(text: str) -> Headers:
    """``kafka.headers.b64``: a record's header list (a zigzag varint count, then each name
    and nullable value with a zigzag varint length, -1 for null)."""
    raw = base64.b64decode(text)
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            byte = raw[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)

    def chunk() -> bytes | None:
        nonlocal pos
        size = varint()
        if size < 0:
            return None
        pos += size
        return raw[pos - size : pos]

    headers: Headers = []
    for _ in range(varint()):
        name = chunk()
        assert name is not None
        headers.append((name.decode(), chunk()))
    assert pos == len(raw)
    return headers


# --- HTTP produce, Kafka consume --------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_messages_produced_over_http_read_over_kafka(broker: KafkaServer, client: str) -> None:
    queue = queue_for(broker, f"http-to-{client}")
    binary = bytes(range(256))
    answer = call(
        broker,
        "POST",
        f"/v1/queues/{queue}/messages?save=wait",
        {
            "messages": [
                {
                    "data": "with headers",
                    "headers": {"trace": "abc", "kind": "order"},
                    "external_time": 1.7e9 + 0.123,
                },
                {"data_b64": base64.b64encode(binary).decode()},
                {"data": "", "headers": {"empty": ""}},
            ]
        },
    )
    ids = [r["id"] for r in answer["results"]]
    times = [m["time"] for m in stored(broker, queue)]
    got = read(client, broker, queue, ids[0], 3)
    assert [r.offset for r in got] == ids
    # HTTP messages have no key; their headers are Kafka headers, their CreateTime the
    # producer's external time, or else the receive time.
    assert [r.key for r in got] == [None, None, None]
    assert [r.value for r in got] == [b"with headers", binary, b""]
    assert [r.headers for r in got] == [[("trace", b"abc"), ("kind", b"order")], [], [("empty", b"")]]
    assert all(r.create_time for r in got)
    assert [r.timestamp for r in got] == [1_700_000_000_123, round(times[1] * 1000), round(times[2] * 1000)]


def test_what_kafka_reads_is_the_same_from_memory_and_after_a_restart(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Three ways in (JSON, the SDK's record batches, Kafka), blocks of two messages so most are
    # sealed: read over Kafka from what was just written, then again from disk after restarts.
    server = KafkaServer(tmp_path_factory.mktemp("restarted"))
    try:
        server.wait_ready()
        call(server, "PUT", "/v1/queues/mixed", {"block": {"max_messages": 2}})
        call(
            server,
            "POST",
            "/v1/queues/mixed/messages?save=wait",
            {
                "messages": [
                    {"data": "json", "headers": {"a": "1"}, "external_time": 1.5e9},
                    {"data": "plain"},
                ]
            },
        )

        async def sdk() -> None:
            client = AsyncClient(server.url, timeout=10)
            try:
                sent = [{"data": "sdk", "headers": {"b": "2"}, "external_time": 1.6e9}, b"\x00\x01binary"]
                await client.produce("mixed", sent, save="wait")
            finally:
                await client.close()

        asyncio.run(sdk())
        write(
            "kafka-python",
            server,
            "mixed",
            [
                Sent(b"\xff", None, [("h", b"1"), ("h", b"2")], 1_650_000_000_000),
                Sent(b"k", b"v", [("c", b"3")]),
                Sent(None, b"last", []),
            ],
        )
        first = read("kafka-python", server, "mixed", 1, 7)
        assert [r.value for r in first] == [b"json", b"plain", b"sdk", b"\x00\x01binary", None, b"v", b"last"]
        assert [r.offset for r in first] == list(range(1, 8))
        server.stop()
        server = server.again()
        server.wait_ready()
        assert read("kafka-python", server, "mixed", 1, 7) == first
        server.kill()
        server = server.again()
        server.wait_ready()
        assert read("kafka-python", server, "mixed", 1, 7) == first
    finally:
        server.stop()


# --- Kafka produce, HTTP read -----------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_messages_produced_over_kafka_read_over_http_with_the_reserved_headers(
    broker: KafkaServer, client: str
) -> None:
    queue = queue_for(broker, f"{client}-to-http")
    now_ms = int(time.time() * 1000)
    ahead_ms = now_ms + 3_600_000  # an hour past the clock skew allowance
    # kafka-python refuses null header values (its send wants bytes); librdkafka sends them.
    nil: bytes | None = b"" if client == "kafka-python" else None
    sent = [
        Sent(b"k1", b"plain", [("h", b"x")], 1_600_000_000_123),
        Sent(b"k2", None, []),
        Sent(b"\xff\x00k", b"binary key", []),
        Sent(None, b"repeated", [("h", b"1"), ("h", b"2"), ("nil", nil)]),
        Sent(None, b"reserved name", [("kafka.key", b"not the key")]),
        Sent(b"k6", b"not utf-8 header", [("bin", b"\xff")]),
        Sent(None, b"from the future", [], ahead_ms),
    ]
    offsets = write(client, broker, queue, sent)
    before = time.time()
    held = stored(broker, queue)
    assert [m["id"] for m in held] == offsets
    assert [m.get("data", m.get("data_b64")) for m in held] == [
        "plain",
        "",
        "binary key",
        "repeated",
        "reserved name",
        "not utf-8 header",
        "from the future",
    ]
    headers = [m["headers"] for m in held]
    assert headers[0] == {"kafka.key": "k1", "h": "x"}
    assert held[0]["external_time"] == pytest.approx(1_600_000_000.123, abs=1e-6)
    assert headers[1] == {"kafka.key": "k2", "kafka.null": "1"}
    assert headers[2] == {"kafka.key.b64": base64.b64encode(b"\xff\x00k").decode()}
    assert set(headers[3]) == {"kafka.headers.b64"}
    assert decoded_headers(headers[3]["kafka.headers.b64"]) == [("h", b"1"), ("h", b"2"), ("nil", nil)]
    assert set(headers[4]) == {"kafka.headers.b64"}
    assert decoded_headers(headers[4]["kafka.headers.b64"]) == [("kafka.key", b"not the key")]
    assert set(headers[5]) == {"kafka.key", "kafka.headers.b64"}
    assert decoded_headers(headers[5]["kafka.headers.b64"]) == [("bin", b"\xff")]
    # A CreateTime beyond the clock skew allowance is clamped to a few seconds ahead, and the
    # original is kept.
    assert headers[6] == {"kafka.time": str(ahead_ms)}
    assert held[6]["time"] < held[6]["external_time"] <= before + 6
    # Read back over Kafka, everything is as it was sent.
    got = read(client, broker, queue, offsets[0], len(sent))
    assert [r.offset for r in got] == offsets
    assert [(r.key, r.value, r.headers) for r in got] == [(s.key, s.value, s.headers) for s in sent]
    assert got[0].timestamp == 1_600_000_000_123 and got[6].timestamp == ahead_ms


# --- Group offsets as subscriptions -----------------------------------------------------------


def group_consumer(broker: KafkaServer, group: str) -> kafka.KafkaConsumer:
    return kafka.KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=500,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )


def consumed(consumer: kafka.KafkaConsumer, count: int) -> list[int]:
    offsets: list[int] = []
    deadline = time.monotonic() + WITHIN
    while len(offsets) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            offsets += [r.offset for r in batch]
    return offsets


def test_a_group_commit_is_its_subscription_and_moving_that_moves_the_group(broker: KafkaServer) -> None:
    queue, group = queue_for(broker, "grouped"), "movers"
    answer = call(
        broker, "POST", f"/v1/queues/{queue}/messages", {"messages": [{"data": f"m{n}"} for n in range(20)]}
    )
    ids = [r["id"] for r in answer["results"]]
    tp = kafka.TopicPartition(queue, 0)

    first = group_consumer(broker, group)
    try:
        first.subscribe([queue])
        assert consumed(first, 20) == ids
        first.commit()
        assert first.committed(tp) == ids[-1] + 1
    finally:
        first.close()
    # Committed offset o is the cursor last_id = o - 1: the last id consumed.
    cursor = call(broker, "GET", f"/v1/queues/{queue}/subscriptions/kafka.{group}")
    assert cursor["last_id"] == ids[-1] and cursor["lag"] == 0

    # Moved back over HTTP (a commit with reset), the group starts after it.
    back = ids[4]
    moved = call(
        broker, "PUT", f"/v1/queues/{queue}/subscriptions/kafka.{group}", {"last_id": back, "reset": True}
    )
    assert moved["last_id"] == back
    second = group_consumer(broker, group)
    try:
        second.subscribe([queue])
        assert consumed(second, 15) == ids[5:]
        assert second.committed(tp) == back + 1
        second.commit()
    finally:
        second.close()
    until_blocking(
        lambda: call(broker, "GET", f"/v1/queues/{queue}/subscriptions/kafka.{group}")["last_id"] == ids[-1],
        WITHIN,
        "the second consumer's commit in the subscription",
    )

    # Moved forward over HTTP (no reset needed), past messages the group never read.
    more = call(
        broker, "POST", f"/v1/queues/{queue}/messages", {"messages": [{"data": f"n{n}"} for n in range(5)]}
    )
    later = [r["id"] for r in more["results"]]
    call(broker, "PUT", f"/v1/queues/{queue}/subscriptions/kafka.{group}", {"last_id": later[2]})
    third = group_consumer(broker, group)
    try:
        third.subscribe([queue])
        assert consumed(third, 2) == later[3:]
    finally:
        third.close()


def test_a_commit_of_offset_zero_is_the_cursor_before_the_first_id(broker: KafkaServer) -> None:
    # Kafka accepts any offset from 0; ids start at 1, so offset 0 is the same place as the
    # first id: nothing before it read. A tool resetting a group to 0 must not be refused.
    queue, group = queue_for(broker, "committed-zero"), "zero"
    body = {"messages": [{"data": "a"}, {"data": "b"}]}
    ids = [r["id"] for r in call(broker, "POST", f"/v1/queues/{queue}/messages", body)["results"]]
    tp = kafka.TopicPartition(queue, 0)
    consumer = group_consumer(broker, group)
    try:
        consumer.assign([tp])
        consumer.commit({tp: kafka.OffsetAndMetadata(0, "", -1)})
        assert consumer.committed(tp) == ids[0]
    finally:
        consumer.close()
    assert call(broker, "GET", f"/v1/queues/{queue}/subscriptions/kafka.{group}")["last_id"] == 0
    again = group_consumer(broker, group)
    try:
        again.subscribe([queue])
        assert consumed(again, 2) == ids
    finally:
        again.close()
