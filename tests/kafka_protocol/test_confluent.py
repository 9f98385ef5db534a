"""confluent-kafka (librdkafka 2.16) against a real ``capella serve`` with [kafka] on.

Producers, assigned consumers and group members are confluent-kafka's own classes with short
timeouts (a member is declared dead after 6 s, a message fails after 10 s), so a broker that
does not answer fails a test within seconds instead of hanging it; every poll loop has a
deadline. What the HTTP API shows is read with plain urllib, beside it. The broker without
cramjam is a real server started with a ``cramjam`` module on its path that cannot be
imported: what a machine without the package gives it.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from support.kafka import KafkaServer, kafka_server
from support.wait import until_blocking

SESSION_TIMEOUT = 6.0
# What every client here runs with: errors come back in seconds, not librdkafka's minutes.
CLIENT = {
    "socket.timeout.ms": 5000,
    "topic.metadata.refresh.interval.ms": 1000,
}
PRODUCER = {**CLIENT, "message.timeout.ms": 10000, "linger.ms": 5}
MEMBER = {
    **CLIENT,
    "session.timeout.ms": int(SESSION_TIMEOUT * 1000),
    "heartbeat.interval.ms": 500,
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    # Every batch this broker renders is checked against its CRC-32C, as librdkafka can.
    "check.crcs": True,
}
# How long a poll loop may run before the test fails.
DEADLINE = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    yield from kafka_server(tmp_path_factory.mktemp("confluent"))


@pytest.fixture(scope="module")
def without_cramjam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A broker on which ``import cramjam`` fails, as where the package is not installed."""
    root = tmp_path_factory.mktemp("no-cramjam")
    shadow = root / "shadow"
    shadow.mkdir()
    (shadow / "cramjam.py").write_text('raise ImportError("no cramjam on this machine")\n')
    path = os.pathsep.join(p for p in (str(shadow), os.environ.get("PYTHONPATH", "")) if p)
    yield from kafka_server(root / "server", env={"PYTHONPATH": path})


def http(
    server: KafkaServer, method: str, path: str, body: Any = None, user: tuple[str, str] | None = None
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.url}{path}", data=data, method=method)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(user).encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def messages(server: KafkaServer, queue: str) -> list[dict[str, Any]]:
    """Every message of ``queue`` as ``GET /v1/queues/{queue}/messages`` shows it, page by page."""
    found: list[dict[str, Any]] = []
    after = 0
    for _ in range(100):
        page = http(server, "GET", f"/v1/queues/{queue}/messages?after={after}&limit=10000")
        if not page["messages"]:
            return found
        found += page["messages"]
        after = page["last_id"]
    raise AssertionError(f"{queue} did not end after 100 pages")


class Reports:
    """The delivery reports of one producer, by the index each message was sent with."""

    def __init__(self) -> None:
        self.by_index: dict[int, tuple[KafkaError | None, Message]] = {}

    def callback(self, index: int) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            self.by_index[index] = (err, msg)

        return report


def produce_all(producer: Producer, topic: str, items: list[dict[str, Any]], reports: Reports) -> None:
    """Send ``items`` (``Producer.produce`` keywords), waiting for room when the queue is full,
    then for every delivery report."""
    for index, item in enumerate(items):
        for _ in range(1000):
            try:
                producer.produce(topic, on_delivery=reports.callback(index), **item)
                break
            except BufferError:
                producer.poll(0.05)
        else:
            raise AssertionError("the producer's queue never drained")
        producer.poll(0)
    assert producer.flush(DEADLINE) == 0, "delivery reports still outstanding"
    assert len(reports.by_index) == len(items)


def read_back(server: KafkaServer, topic: str, count: int, partition: int = 0) -> list[Message]:
    """``count`` messages of one partition from the beginning, by assignment (no group)."""
    consumer = Consumer({**MEMBER, "bootstrap.servers": server.bootstrap, "group.id": "reader"})
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        deadline = time.monotonic() + DEADLINE
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                assert msg.error() is None, msg.error()
                got.append(msg)
    finally:
        consumer.close()
    return got


# --- K4: an idempotent producer and everything a record holds ------------------------------


def random_records(count: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    now_ms = int(time.time() * 1000)
    records = []
    for i in range(count):
        key = rnd.choice([None, b"", rnd.randbytes(rnd.randint(1, 40)), f"key-{i}".encode(), "ключ".encode()])
        value = rnd.choice([None, b"", rnd.randbytes(rnd.randint(1, 300)), f"value {i} ✓".encode()])
        headers = rnd.choice(
            [
                [],
                [("trace", b"t-1"), ("trace", b"t-2"), ("empty", b""), ("null", None)],
                [("only", rnd.randbytes(8))],
                [("b", b"2"), ("a", b"1"), ("b", None)],
                [("kafka.looks.reserved", b"but is not")],
            ]
        )
        # 0 lets the client stamp the time of sending; the rest are CreateTimes from 1970 on
        # and up to a day ahead of the broker's clock (kept exactly, however far ahead).
        timestamp = rnd.choice([0, rnd.randint(1, now_ms), now_ms + rnd.randint(1, 86_400_000)])
        records.append({"key": key, "value": value, "headers": headers, "timestamp": timestamp})
    return records


def test_ten_thousand_idempotent_records_come_back_identical(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/exact", {})
    records = random_records(10_000, seed=4)
    producer = Producer(
        {**PRODUCER, "bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    reports = Reports()

    produce_all(producer, "exact", records, reports)

    failed = [(i, err) for i, (err, _) in reports.by_index.items() if err is not None]
    assert failed == []
    offsets = [reports.by_index[i][1].offset() for i in range(len(records))]
    assert all(a < b for a, b in itertools.pairwise(offsets))
    sent_times = [reports.by_index[i][1].timestamp() for i in range(len(records))]
    assert {kind for kind, _ in sent_times} == {TIMESTAMP_CREATE_TIME}

    got = read_back(broker, "exact", len(records))

    assert [m.offset() for m in got] == offsets
    assert [m.key() for m in got] == [r["key"] for r in records]
    assert [m.value() for m in got] == [r["value"] for r in records]
    # No headers read back as None, not [].
    assert [m.headers() or [] for m in got] == [r["headers"] for r in records]
    assert [m.timestamp() for m in got] == sent_times
    stored = messages(broker, "exact")
    # Stored once each, at the offsets reported, under the one producer's source, its
    # sequence numbers in the external ids.
    assert [m["id"] for m in stored] == offsets
    (source,) = {m["source"] for m in stored}
    assert source.startswith("kafka-test/kafka/")
    assert [m["external_id"] & 0xFFFF_FFFF for m in stored] == list(range(len(records)))


def test_watermarks_are_the_ids_http_shows(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/marks", {})
    http(
        broker,
        "POST",
        "/v1/queues/marks/messages?save=wait",
        {"messages": [{"data": str(i)} for i in range(5)]},
    )
    consumer = Consumer({**MEMBER, "bootstrap.servers": broker.bootstrap, "group.id": "marks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition("marks", 0), timeout=10)
    finally:
        consumer.close()

    stats = http(broker, "GET", "/v1/queues/marks")["stats"]
    assert (low, high) == (stats["first_id"], stats["last_id"] + 1)


def test_every_topic_is_listed_however_many_short_names_there_are(broker: KafkaServer) -> None:
    # librdkafka sizes its parse buffer for a Metadata answer at 4 times the answer's bytes; a
    # compact (flexible, v9) answer for one-partition topics with names of a few letters is
    # smaller than that needs, and the whole answer is dropped as malformed.
    names = [f"s{i}" for i in range(40)]
    for name in names:
        http(broker, "PUT", f"/v1/queues/{name}", {})
    admin = AdminClient({**CLIENT, "bootstrap.servers": broker.bootstrap})

    listed = admin.list_topics(timeout=10)

    assert set(names) <= set(listed.topics)
    assert all(len(listed.topics[name].partitions) == 1 for name in names)


def test_a_transactional_producer_is_refused_at_once(broker: KafkaServer) -> None:
    producer = Producer({**PRODUCER, "bootstrap.servers": broker.bootstrap, "transactional.id": "tx"})
    start = time.monotonic()

    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(DEADLINE)

    # Refused, not retried until the timeout: without one, init_transactions() waits forever.
    assert time.monotonic() - start < 5
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@pytest.mark.parametrize("acks", ["0", "1"])
def test_acks_zero_and_one_store_every_message(broker: KafkaServer, acks: str) -> None:
    topic = f"acks{acks}"
    http(broker, "PUT", f"/v1/queues/{topic}", {})
    producer = Producer({**PRODUCER, "bootstrap.servers": broker.bootstrap, "acks": acks})
    reports = Reports()

    produce_all(producer, topic, [{"value": f"{acks}-{i}".encode()} for i in range(100)], reports)

    assert [err for err, _ in reports.by_index.values() if err is not None] == []

    def all_stored() -> bool:
        return len(messages(broker, topic)) == 100

    until_blocking(all_stored, 10, f"100 messages in {topic}")
    stored = messages(broker, topic)
    assert [m["data"] for m in stored] == [f"{acks}-{i}" for i in range(100)]
    if acks == "1":
        # Answered: each report has its offset. acks=0 is never answered, so has none.
        assert sorted(msg.offset() for _, msg in reports.by_index.values()) == [m["id"] for m in stored]


def test_a_message_over_the_partition_fetch_size_is_still_fetched(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/large", {})
    producer = Producer({**PRODUCER, "bootstrap.servers": broker.bootstrap})
    reports = Reports()
    big = random.Random(1).randbytes(600_000)
    produce_all(producer, "large", [{"value": b"small"}, {"value": big}, {"value": b"after"}], reports)
    assert [err for err, _ in reports.by_index.values()] == [None, None, None]
    consumer = Consumer(
        {
            **MEMBER,
            "bootstrap.servers": broker.bootstrap,
            "group.id": "large",
            "max.partition.fetch.bytes": 10_000,
        }
    )
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition("large", 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + DEADLINE
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value())
    finally:
        consumer.close()

    # A batch larger than the limit is answered anyway (KIP-74), or the consumer is stuck.
    assert got == [b"small", big, b"after"]


def test_a_batch_over_the_server_s_batch_limit_is_refused_whole(broker: KafkaServer) -> None:
    # librdkafka's batch.num.messages defaults to server.max_batch (10,000); raised past it,
    # a batch is refused as too large, every message in it, at once. (The record count is
    # checked from the batch's head: tests/kafka_protocol/test_frames.py.)
    http(broker, "PUT", "/v1/queues/crowded", {})
    producer = Producer(
        {
            **PRODUCER,
            "bootstrap.servers": broker.bootstrap,
            # All 20,000 in one batch: room enough, and time enough to queue them all before
            # the flush sends them (a linger of 2 s was not, once, on a loaded CI machine: a
            # first batch of under 10,000 went out while the rest were still being queued).
            "batch.num.messages": 100_000,
            "batch.size": 10_000_000,
            "linger.ms": 5000,
        }
    )
    reports = Reports()
    start = time.monotonic()

    produce_all(producer, "crowded", [{"value": b"x"} for _ in range(20_000)], reports)

    assert time.monotonic() - start < 15  # answered at once, not retried to a timeout
    codes = {err.code() if err is not None else None for err, _ in reports.by_index.values()}
    assert codes == {KafkaError.MSG_SIZE_TOO_LARGE}
    assert messages(broker, "crowded") == []


def test_a_key_counts_against_the_message_header_limits(broker: KafkaServer) -> None:
    # A key is kept as a header (kafka.key or kafka.key.b64), so it is one of
    # server.max_message_headers (64) and within server.max_message_headers_size (16 KiB).
    http(broker, "PUT", "/v1/queues/limited", {})
    unique = [(f"h{i}", b"1") for i in range(63)]
    items = [
        {"key": b"k", "value": b"fits", "headers": unique},
        {"key": b"k", "value": b"one header too many", "headers": [*unique, ("h63", b"1")]},
        {"key": b"k" * 17_000, "value": b"key too large"},
    ]
    outcomes = []
    for item in items:
        producer = Producer({**PRODUCER, "bootstrap.servers": broker.bootstrap})
        reports = Reports()
        produce_all(producer, "limited", [item], reports)
        (err, _), *_ = reports.by_index.values()
        outcomes.append(None if err is None else err.code())

    assert outcomes == [None, KafkaError.INVALID_RECORD, KafkaError.INVALID_RECORD]
    assert [m["data"] for m in messages(broker, "limited")] == ["fits"]


# --- K5: a group of two on three partitions ------------------------------------------------


class Member:
    """A group member and what it consumed (partition, offset, value), committing after each poll."""

    def __init__(self, server: KafkaServer, group: str, topic: str, **conf: Any) -> None:
        self.consumer = Consumer({**MEMBER, "bootstrap.servers": server.bootstrap, "group.id": group, **conf})
        self.consumer.subscribe([topic])
        self.seen: list[tuple[int, int, bytes]] = []
        self.open = True

    def poll(self) -> None:
        batch = self.consumer.consume(500, 0.05)
        for msg in batch:
            assert msg.error() is None, msg.error()
            self.seen.append((msg.partition(), msg.offset(), msg.value()))
        if batch:
            self.consumer.commit(asynchronous=False)

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def close(self) -> None:
        if self.open:
            self.open = False
            self.consumer.close()


def pump(members: list[Member], condition: Callable[[], bool], within: float, what: str) -> float:
    """Poll every open member until ``condition`` holds; the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > within:
            raise AssertionError(f"not within {within}s: {what}")
        for member in members:
            if member.open:
                member.poll()
    return time.monotonic() - start


def split(one: Member, other: Member) -> bool:
    a, b = one.partitions(), other.partitions()
    return bool(a) and bool(b) and not a & b and a | b == {0, 1, 2}


def produce_keyed(server: KafkaServer, topic: str, values: list[bytes]) -> None:
    producer = Producer({**PRODUCER, "bootstrap.servers": server.bootstrap, "enable.idempotence": True})
    reports = Reports()
    produce_all(producer, topic, [{"key": v, "value": v} for v in values], reports)
    assert [err for err, _ in reports.by_index.values() if err is not None] == []
    # The keys spread the messages over every partition.
    assert {msg.partition() for _, msg in reports.by_index.values()} == {0, 1, 2}


def test_a_commit_with_metadata_is_kept_and_read_back(broker: KafkaServer) -> None:
    # confluent-kafka sends a TopicPartition's metadata as its C string, NUL included.
    http(broker, "PUT", "/v1/queues/noted", {})
    http(
        broker,
        "POST",
        "/v1/queues/noted/messages?save=wait",
        {"messages": [{"data": str(i)} for i in range(5)]},
    )
    ids = [m["id"] for m in messages(broker, "noted")]
    consumer = Consumer({**MEMBER, "bootstrap.servers": broker.bootstrap, "group.id": "noting"})
    try:
        consumer.commit(
            offsets=[TopicPartition("noted", 0, ids[3], metadata="where I was")], asynchronous=False
        )
        (committed,) = consumer.committed([TopicPartition("noted", 0)], timeout=10)
    finally:
        consumer.close()

    assert (committed.offset, committed.metadata) == (ids[3], "where I was")
    cursor = http(broker, "GET", "/v1/queues/noted/subscriptions/kafka.noting")
    assert (cursor["last_id"], cursor["metadata"]) == (ids[2], "where I was")


@pytest.mark.parametrize("strategy", ["range,roundrobin", "cooperative-sticky"])
def test_two_members_share_three_partitions_and_one_takes_over(broker: KafkaServer, strategy: str) -> None:
    name = "coop" if strategy.startswith("cooperative") else "eager"
    topic, group = f"shared_{name}", f"pair_{name}"
    http(broker, "PUT", f"/v1/topics/{topic}", {"partitions": 3})
    one = Member(broker, group, topic, **{"partition.assignment.strategy": strategy})
    other = Member(broker, group, topic, **{"partition.assignment.strategy": strategy})
    members = [one, other]
    try:
        pump(members, lambda: split(one, other), DEADLINE, "disjoint assignments covering {0, 1, 2}")
        first = [f"m{i}".encode() for i in range(2000)]
        produce_keyed(broker, topic, first)

        pump(members, lambda: len(one.seen) + len(other.seen) >= len(first), DEADLINE, "every message")

        # Each member read only its own partitions; together, every message exactly once.
        assert {p for p, _, _ in one.seen} <= one.partitions()
        assert {p for p, _, _ in other.seen} <= other.partitions()
        assert sorted(v for _, _, v in one.seen + other.seen) == sorted(first)
        one.close()
        took = pump(members, lambda: other.partitions() == {0, 1, 2}, SESSION_TIMEOUT + 5, "the takeover")
        assert took < SESSION_TIMEOUT + 5
        # The partitions it took over start at the commits the closed member made.
        second = [f"n{i}".encode() for i in range(300)]
        before = len(other.seen)
        produce_keyed(broker, topic, second)
        pump(members, lambda: len(other.seen) - before >= len(second), DEADLINE, "the second round")
        assert sorted(v for _, _, v in other.seen[before:]) == sorted(second)
    finally:
        for member in members:
            member.close()
    # Committed offsets are subscriptions: each partition's cursor is at its last id.
    for index in range(3):
        queue = f"{topic}~{index}"
        cursor = http(broker, "GET", f"/v1/queues/{queue}/subscriptions/kafka.{group}")
        assert cursor["last_id"] == messages(broker, queue)[-1]["id"]


def test_a_killed_member_s_partitions_move_within_the_session_timeout(broker: KafkaServer) -> None:
    topic, group = "orphaned", "survivors"
    http(broker, "PUT", f"/v1/topics/{topic}", {"partitions": 3})
    survivor = Member(broker, group, topic)
    # The other member is another process (kcat, librdkafka 2.0.2), killed with -9: it sends
    # no LeaveGroup, so the coordinator has only the session timeout to go by.
    doomed = subprocess.Popen(
        [
            "kcat", "-b", broker.bootstrap, "-G", group,
            "-X", f"session.timeout.ms={int(SESSION_TIMEOUT * 1000)}", "-X", "heartbeat.interval.ms=500",
            topic,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        pump([survivor], lambda: 0 < len(survivor.partitions()) < 3, DEADLINE, "a share of the partitions")
        doomed.kill()
        doomed.wait(10)
        took = pump(
            [survivor], lambda: survivor.partitions() == {0, 1, 2}, SESSION_TIMEOUT + 5, "the takeover"
        )
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(10)
        survivor.close()

    assert took < SESSION_TIMEOUT + 5


# --- K6: compression ----------------------------------------------------------------------------

CODECS = ["gzip", "zstd", "lz4", "snappy"]


def compressed_produce(
    server: KafkaServer, topic: str, codec: str, count: int
) -> tuple[list[bytes], Reports]:
    # Repetitive values, so that the compressed batch is the smaller one and is what is sent.
    values = [f"{codec} message {i} ".encode() * 20 for i in range(count)]
    producer = Producer({**PRODUCER, "bootstrap.servers": server.bootstrap, "compression.type": codec})
    reports = Reports()
    produce_all(
        producer, topic, [{"key": str(i).encode(), "value": v} for i, v in enumerate(values)], reports
    )
    return values, reports


@pytest.mark.parametrize("codec", CODECS)
def test_every_compression_type_round_trips(broker: KafkaServer, codec: str) -> None:
    topic = f"packed_{codec}"
    http(broker, "PUT", f"/v1/queues/{topic}", {})

    values, reports = compressed_produce(broker, topic, codec, 500)

    assert [err for err, _ in reports.by_index.values() if err is not None] == []
    assert [m.value() for m in read_back(broker, topic, len(values))] == values
    assert [m["data"] for m in messages(broker, topic)] == [v.decode() for v in values]


@pytest.mark.parametrize("codec", ["lz4", "snappy"])
def test_without_cramjam_lz4_and_snappy_are_answered_unsupported(
    without_cramjam: KafkaServer, codec: str
) -> None:
    topic = f"refused_{codec}"
    http(without_cramjam, "PUT", f"/v1/queues/{topic}", {})
    start = time.monotonic()

    _, reports = compressed_produce(without_cramjam, topic, codec, 50)

    # Answered at once with the code, not retried until message.timeout.ms (as after a drop).
    assert time.monotonic() - start < 5
    codes = {err.code() if err is not None else None for err, _ in reports.by_index.values()}
    assert codes == {KafkaError.UNSUPPORTED_COMPRESSION_TYPE}
    assert messages(without_cramjam, topic) == []


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_without_cramjam_gzip_and_zstd_still_work(without_cramjam: KafkaServer, codec: str) -> None:
    topic = f"kept_{codec}"
    http(without_cramjam, "PUT", f"/v1/queues/{topic}", {})

    values, reports = compressed_produce(without_cramjam, topic, codec, 100)

    assert [err for err, _ in reports.by_index.values() if err is not None] == []
    assert [m["data"] for m in messages(without_cramjam, topic)] == [v.decode() for v in values]


# --- SASL/PLAIN -----------------------------------------------------------------------------

ADMIN = ("admin", "admin-password-1")
READER = ("reader", "reader-password-1")
# Whose name the wrong password is tried for: the failed-login limits it may reach are its own.
CARELESS = ("careless", "careless-password-1")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A broker with [auth] on (loopback, so without TLS): an admin, and a user who may only read."""
    auth = {"enabled": True, "bootstrap_user": ADMIN[0], "bootstrap_password_env": "KAFKA_TEST_ADMIN"}
    for server in kafka_server(
        tmp_path_factory.mktemp("sasl"), tables={"auth": auth}, env={"KAFKA_TEST_ADMIN": ADMIN[1]}
    ):
        rules = ["allow:queue:read:*", "allow:group:read:*"]
        for name, password in (READER, CARELESS):
            http(server, "PUT", f"/v1/users/{name}", {"password": password, "rules": rules}, user=ADMIN)
        http(server, "PUT", "/v1/queues/guarded", {}, user=ADMIN)
        yield server


def signed_in(user: tuple[str, str]) -> dict[str, Any]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user[0],
        "sasl.password": user[1],
    }


def test_a_signed_in_user_produces_and_consumes(guarded: KafkaServer) -> None:
    producer = Producer(
        {**PRODUCER, **signed_in(ADMIN), "bootstrap.servers": guarded.bootstrap, "enable.idempotence": True}
    )
    reports = Reports()
    produce_all(producer, "guarded", [{"key": b"k", "value": b"signed"}], reports)
    assert [err for err, _ in reports.by_index.values()] == [None]

    consumer = Consumer(
        {**MEMBER, **signed_in(READER), "bootstrap.servers": guarded.bootstrap, "group.id": "readers"}
    )
    got = None
    try:
        consumer.subscribe(["guarded"])
        deadline = time.monotonic() + DEADLINE
        while got is None and time.monotonic() < deadline:
            got = consumer.poll(0.5)
    finally:
        consumer.close()

    assert got is not None and got.error() is None, got and got.error()
    assert (got.key(), got.value()) == (b"k", b"signed")


def test_a_wrong_password_is_refused_and_nothing_is_stored(guarded: KafkaServer) -> None:
    errors: list[KafkaError] = []
    producer = Producer(
        {
            **PRODUCER,
            **signed_in((CARELESS[0], "not-the-password")),
            "bootstrap.servers": guarded.bootstrap,
            "message.timeout.ms": 3000,
            "error_cb": errors.append,
        }
    )
    reports = Reports()
    before = len(http(guarded, "GET", "/v1/queues/guarded/messages?limit=10000", user=ADMIN)["messages"])

    produce_all(producer, "guarded", [{"value": b"never"}], reports)

    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}
    assert [err.code() for err, _ in reports.by_index.values() if err is not None] == [
        KafkaError._MSG_TIMED_OUT
    ]
    after = len(http(guarded, "GET", "/v1/queues/guarded/messages?limit=10000", user=ADMIN)["messages"])
    assert after == before


def test_a_user_who_may_only_read_is_refused_a_produce(guarded: KafkaServer) -> None:
    producer = Producer({**PRODUCER, **signed_in(READER), "bootstrap.servers": guarded.bootstrap})
    reports = Reports()
    start = time.monotonic()

    produce_all(producer, "guarded", [{"value": b"not allowed"}], reports)

    assert time.monotonic() - start < 5
    codes = [err.code() if err is not None else None for err, _ in reports.by_index.values()]
    assert codes == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
