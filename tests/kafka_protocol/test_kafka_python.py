"""kafka-python 3.0.12 against a real ``capella serve``: its default producer and a group of two
(design note §9, K9-K10).

kafka-python 3 is idempotent with ``acks=all`` by default, so it asks for a producer id
(InitProducerId) before its first batch: a broker that does not serve one fails every send.
It is also the client whose follower rejoined after each SyncGroup when a broker rebalanced on
a known member's JoinGroup (design note §3 item 9), so the group test counts generations in the
broker's log, where each rebalance is written with the generation it made, and checks that a
settled group stays so over several heartbeats. Besides: assign and seek into a batch, a
transactional producer refused at once, and acks=0 produces sent as raw frames (built with
kafka-python's protocol and record modules), where a failure must close the connection.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import TransactionalIdAuthorizationFailedError
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder
from support.kafka import KafkaServer, kafka_server
from support.wait import holds_blocking, until_blocking

pytestmark = pytest.mark.slow

CLUSTER = "kafka-test"
REQUEST_TIMEOUT_MS = 10_000
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_MS = 500
WITHIN = 20.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    yield from kafka_server(tmp_path_factory.mktemp("kafka-python"))


def call(broker: KafkaServer, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{broker.url}{path}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def cursor_at(broker: KafkaServer, path: str) -> int | None:
    """A subscription's ``last_id``; None while it does not exist."""
    try:
        return int(call(broker, "GET", path)["last_id"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def stored(broker: KafkaServer, queue: str) -> list[dict[str, Any]]:
    """Every message of ``queue`` as the HTTP API shows it, oldest first."""
    found: list[dict[str, Any]] = []
    after = 0
    for _ in range(100):
        page = call(broker, "GET", f"/v1/queues/{queue}/messages?after={after}&limit=1000")
        if not page["messages"]:
            return found
        found += page["messages"]
        after = page["last_id"]
    raise AssertionError(f"{queue}: more pages than a test writes")


def default_producer(broker: KafkaServer) -> KafkaProducer:
    # Only timeouts are set (so that a broken broker fails in seconds): idempotence, acks and
    # everything else are kafka-python's defaults.
    return KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        max_block_ms=REQUEST_TIMEOUT_MS,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        delivery_timeout_ms=2 * REQUEST_TIMEOUT_MS,
    )


def test_the_default_producer_is_idempotent_and_every_send_succeeds(broker: KafkaServer) -> None:
    queue = "kpy-default"
    call(broker, "PUT", f"/v1/queues/{queue}", {})
    producers = [default_producer(broker), default_producer(broker)]
    try:
        for p in producers:
            assert p.config["enable_idempotence"] is True and p.config["acks"] == -1
        futures = [
            (n, producers[n % 2].send(queue, key=f"k{n}".encode(), value=f"v{n}".encode()))
            for n in range(200)
        ]
        answers = {n: future.get(timeout=WITHIN) for n, future in futures}
    finally:
        for p in producers:
            p.close(timeout=5)
    held = {m["id"]: m for m in stored(broker, queue)}
    assert sorted(held) == sorted(a.offset for a in answers.values())
    sources: list[set[str]] = [set(), set()]
    for n, answer in answers.items():
        message = held[answer.offset]
        assert (message["headers"]["kafka.key"], message["data"]) == (f"k{n}", f"v{n}")
        sources[n % 2].add(message["source"])
    # InitProducerId was served: each producer's messages carry its own producer id, and the
    # two producers were given different ones.
    assert all(len(s) == 1 for s in sources), sources
    first, second = sources[0].pop(), sources[1].pop()
    assert re.fullmatch(rf"{CLUSTER}/kafka/\d+", first) and re.fullmatch(rf"{CLUSTER}/kafka/\d+", second)
    assert first != second
    # Epoch 0 and sequences from 0: the external ids are each producer's 0..99, in send order.
    for source in (first, second):
        ids = [held[i]["external_id"] for i in sorted(held) if held[i]["source"] == source]
        assert ids == list(range(100))


def test_the_default_producer_keeps_a_sequence_per_partition(broker: KafkaServer) -> None:
    topic = "kpy-keyed"
    call(broker, "PUT", f"/v1/topics/{topic}", {"partitions": 3})
    producer = default_producer(broker)
    try:
        futures = [producer.send(topic, key=f"k{n % 7}".encode(), value=f"v{n}".encode()) for n in range(300)]
        answers = [f.get(timeout=WITHIN) for f in futures]
    finally:
        producer.close(timeout=5)
    # Keys spread the messages by kafka-python's murmur2 partitioner; each partition is a queue
    # with the producer's own sequence: external ids 0, 1, 2, ... under one source.
    assert {a.partition for a in answers} == {0, 1, 2}
    sources = set()
    for n in range(3):
        held = stored(broker, f"{topic}~{n}")
        assert [m["id"] for m in held] == [a.offset for a in answers if a.partition == n]
        assert [m["external_id"] for m in held] == list(range(len(held)))
        sources |= {m["source"] for m in held}
    assert len(sources) == 1 and re.fullmatch(rf"{CLUSTER}/kafka/\d+", sources.pop())


def test_a_transactional_producer_is_refused_at_once(broker: KafkaServer) -> None:
    # Transactions are not supported: init_transactions() fails with the broker's reason rather
    # than retrying the transaction coordinator lookup until max_block_ms.
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        transactional_id="kpy-tx",
        max_block_ms=REQUEST_TIMEOUT_MS,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    started = time.monotonic()
    try:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            producer.init_transactions()
    finally:
        producer.close(timeout=5)
    assert time.monotonic() - started < 5


def generations(broker: KafkaServer, group: str) -> list[int]:
    """The generations the broker's coordinator made for ``group``, from its log."""
    made = re.findall(rf"group rebalanced group={re.escape(repr(group))} generation=(\d+)", broker.log())
    return [int(g) for g in made]


@pytest.mark.parametrize("start", ["together", "staggered"])
def test_a_group_of_two_settles_within_three_generations_and_consumes_everything(
    broker: KafkaServer, start: str
) -> None:
    topic, group = f"kpy-grouped-{start}", f"kpy-group-{start}"
    call(broker, "PUT", f"/v1/topics/{topic}", {"partitions": 3})
    stop = threading.Event()
    lock = threading.Lock()
    seen: list[tuple[int, int, bytes]] = []
    assigned: list[set[int]] = [set(), set()]
    first_assigned: list[float | None] = [None, None]
    failures: list[BaseException] = []

    def member(index: int) -> None:
        try:
            consumer = KafkaConsumer(
                topic,
                bootstrap_servers=broker.bootstrap,
                group_id=group,
                client_id=f"member-{index}",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
                request_timeout_ms=REQUEST_TIMEOUT_MS,
                metadata_max_age_ms=2_000,
            )
            try:
                while not stop.is_set():
                    batches = consumer.poll(timeout_ms=200)
                    with lock:
                        assigned[index] = {tp.partition for tp in consumer.assignment()}
                        if assigned[index] and first_assigned[index] is None:
                            first_assigned[index] = time.monotonic()
                        for tp, batch in batches.items():
                            seen.extend((tp.partition, r.offset, r.value) for r in batch)
                    if batches:
                        consumer.commit()
            finally:
                consumer.close()
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    threads = [threading.Thread(target=member, args=(n,), daemon=True) for n in range(2)]
    producer = default_producer(broker)
    try:
        threads[0].start()
        if start == "staggered":
            # The second member joins a stable group, whose leader must rejoin for it.
            until_blocking(lambda: assigned[0] == {0, 1, 2}, 10.0, "the first member owning all", every=0.05)
        started = time.monotonic()
        threads[1].start()

        def settled() -> bool:
            assert not failures, failures
            with lock:
                first, second = assigned
                return bool(first and second and not first & second and first | second == {0, 1, 2})

        until_blocking(settled, 10.0, "both members owning partitions", every=0.05)
        assert all(t is not None and t - started < 10.0 for t in first_assigned)

        sent = set()
        futures = [(n, producer.send(topic, value=f"m{n}".encode(), partition=n % 3)) for n in range(150)]
        for n, future in futures:
            answer = future.get(timeout=WITHIN)
            sent.add((answer.partition, answer.offset, f"m{n}".encode()))

        def consumed() -> bool:
            assert not failures, failures
            with lock:
                return len(seen) >= len(sent)

        until_blocking(consumed, WITHIN, "every message consumed", every=0.05)
        with lock:
            assert sorted(seen) == sorted(sent)
        # Each member commits after handing its records over: the cursors follow shortly.
        for n in range(3):
            path = f"/v1/queues/{topic}~{n}/subscriptions/kafka.{group}"
            last = max(o for p, o, _ in sent if p == n)
            until_blocking(
                lambda path=path, last=last: cursor_at(broker, path) == last,
                WITHIN,
                f"the group's cursor at {last} ({path})",
            )
        # Settled means it stays so: over several heartbeats (a member told to rejoin, or a
        # rejoin that rebalances, shows here), the same owners and no new generation.
        with lock:
            owners = [set(a) for a in assigned]
        settled_at = generations(broker, group)
        holds_blocking(
            lambda: [set(a) for a in assigned] == owners and generations(broker, group) == settled_at,
            6 * HEARTBEAT_MS / 1000,
            "the settled group",
        )
    finally:
        stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join(15)
        producer.close(timeout=5)
    assert not failures, failures
    made = generations(broker, group)
    # Both in one generation when they start together (the initial rebalance delay), or the
    # first alone and then both; three at most if the second joined while the first was still
    # syncing. A follower that rejoined after each SyncGroup made one more after every sync.
    assert made and made == sorted(made) and max(made) <= 3, made


def test_a_consumer_without_a_group_reads_from_an_offset_inside_a_batch(broker: KafkaServer) -> None:
    queue = "kpy-assigned"
    call(broker, "PUT", f"/v1/queues/{queue}", {})
    # Sent together, the ten land in one batch: a fetch from the fifth answers the whole
    # batch, and the client skips the four before it.
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap, linger_ms=200, max_block_ms=REQUEST_TIMEOUT_MS
    )
    try:
        futures = [producer.send(queue, value=f"v{n}".encode()) for n in range(10)]
        producer.flush(timeout=WITHIN)
        offsets = [f.get(timeout=WITHIN).offset for f in futures]
    finally:
        producer.close(timeout=5)
    assert offsets == list(range(offsets[0], offsets[0] + 10))
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS, enable_auto_commit=False
    )
    try:
        tp = TopicPartition(queue, 0)
        consumer.assign([tp])
        assert consumer.beginning_offsets([tp])[tp] == offsets[0]
        assert consumer.end_offsets([tp])[tp] == offsets[-1] + 1
        consumer.seek(tp, offsets[4])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + WITHIN
        while len(got) < 6 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                got += [(r.offset, r.value) for r in batch]
    finally:
        consumer.close()
    assert got == [(o, f"v{n}".encode()) for n, o in enumerate(offsets) if n >= 4]


def acks0_produce(sock: socket.socket, topic: str, partition: int, value: bytes, correlation_id: int) -> None:
    """A Produce with acks=0 (built by kafka-python's protocol and record modules)."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=None, key=None, value=value)
    builder.close()
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=builder.buffer())
    request = ProduceRequest(
        version=7,
        transactional_id=None,
        acks=0,
        timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[part])],
    )
    request.with_header(correlation_id=correlation_id, client_id="acks0")
    sock.sendall(request.encode(header=True, framed=True))


def metadata_answered(sock: socket.socket, correlation_id: int) -> bool:
    """Whether the connection still answers (a Metadata request)."""
    request = MetadataRequest(version=4, topics=None, allow_auto_topic_creation=False)
    request.with_header(correlation_id=correlation_id, client_id="acks0")
    try:
        sock.sendall(request.encode(header=True, framed=True))
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return False
        frame = sock.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
    except (ConnectionError, TimeoutError):
        return False
    answer = MetadataResponse.decode(frame, version=4, header=True)
    return bool(answer.header.correlation_id == correlation_id)


@pytest.mark.parametrize(
    ("partition", "value"),
    [(1, b"no such partition"), (0, b"x" * 2_000_000)],
    ids=["unknown-partition", "too-large"],
)
def test_an_acks0_produce_that_fails_closes_the_connection(
    broker: KafkaServer, partition: int, value: bytes
) -> None:
    # Kafka answers nothing to acks=0; when a partition fails it closes the connection instead,
    # so the producer notices (it reconnects and refreshes its metadata) rather than losing
    # every later message in silence.
    queue = "kpy-acks0"
    call(broker, "PUT", f"/v1/queues/{queue}", {})
    before = len(stored(broker, queue))
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=5) as sock:
        acks0_produce(sock, queue, 0, b"fine", 1)
        assert metadata_answered(sock, 2)
        until_blocking(lambda: len(stored(broker, queue)) == before + 1, WITHIN, "the acks=0 message")
        acks0_produce(sock, queue, partition, value, 3)
        assert not metadata_answered(sock, 4)
    assert [m["data"] for m in stored(broker, queue)[before:]] == ["fine"]


def test_a_seek_to_offset_zero_reads_from_the_first_message(broker: KafkaServer) -> None:
    # A Kafka partition starts at offset 0, so user code seeks there to replay everything. Ids
    # start at 1: were 0 out of range, the default auto_offset_reset (latest) would jump to the
    # end and skip every message without a word.
    queue = "kpy-zero"
    call(broker, "PUT", f"/v1/queues/{queue}", {})
    body = {"messages": [{"data": "first"}, {"data": "second"}]}
    ids = [r["id"] for r in call(broker, "POST", f"/v1/queues/{queue}/messages", body)["results"]]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    try:
        assert consumer.config["auto_offset_reset"] == "latest"
        tp = TopicPartition(queue, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + WITHIN
        while len(got) < 2 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                got += [(r.offset, r.value) for r in batch]
    finally:
        consumer.close()
    assert got == [(ids[0], b"first"), (ids[1], b"second")]
