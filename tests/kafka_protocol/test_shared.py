"""The Kafka listener on every node of a shared cluster (capella/kafka/nodes.py).

Three ``capella serve`` nodes on one PostgreSQL and one moto S3 (tests/support/shared.py), each
with ``[kafka]`` on a port of its own. Every node lists every live node as a broker and names
itself the leader of every partition; a group's coordinator is the node its hash picks, the
same from every node, and the others answer its calls NOT_COORDINATOR. The clients are
confluent-kafka (librdkafka) and kafka-python's protocol module for raw requests; the last test
kills the coordinator of a consuming group with -9 and checks that the group moves on.
"""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, Producer, TopicPartition
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse
from support.pg import PgServer, available
from support.servers import S3Server, free_port
from support.shared import SharedRig, toml_table
from support.wait import until_blocking

from capella.kafka.nodes import KafkaNode, coordinator_of, node_id
from capella.shared.node import LEASE, NODES_POLL

pytestmark = [pytest.mark.slow, pytest.mark.s3]

NODES = 3
TIMEOUT = 5.0
NOT_COORDINATOR = 16
UNKNOWN_MEMBER_ID = 25
# Short client timeouts: a group settles in seconds, and a lost coordinator is looked for again soon.
CLIENT = {
    "topic.metadata.refresh.interval.ms": 2000,
    "reconnect.backoff.ms": 100,
    "reconnect.backoff.max.ms": 1000,
    "socket.connection.setup.timeout.ms": 3000,
    "log_level": 2,  # librdkafka's connection errors to the killed node are expected
}
GROUP = {
    **CLIENT,
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "partition.assignment.strategy": "roundrobin",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}


@dataclass
class Shared:
    rig: SharedRig
    ports: list[int]

    def url(self, i: int) -> str:
        return self.rig.node(i).url

    def bootstrap(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    def node_id(self, i: int) -> int:
        return node_id(self.rig.node_name(i))


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer, s3_server: S3Server
) -> Iterator[Shared]:
    missing = available()
    if missing is not None:
        pytest.skip(f"shared queues need PostgreSQL: {missing}")
    rig = SharedRig(
        tmp_path_factory.mktemp("kafka-shared"), pg=pg_server, s3=s3_server, flush_interval="20ms"
    )
    ports = [free_port() for _ in range(NODES)]
    try:
        for i in range(NODES):
            rig.write_config(i, rig.config_text(i) + toml_table("kafka", {"listen": f"127.0.0.1:{ports[i]}"}))
        rig.start(NODES)
        found = Shared(rig, ports)
        # Each node reads the live nodes' addresses every second: wait until all see all.
        every = {(found.node_id(i), ports[i]) for i in range(NODES)}
        for i in range(NODES):
            until_blocking(lambda i=i: brokers(found, i) == every, 15, f"node-{i} to list every node")
        yield found
    finally:
        rig.close()


# --- raw requests ---------------------------------------------------------------------------


def call(port: int, request: Any, response: Any, version: int) -> Any:
    """One request on a connection of its own, answered (kafka-python's protocol module)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.settimeout(TIMEOUT)
        request.with_header(correlation_id=7, client_id="shared-test")
        sock.sendall(request.encode(header=True, framed=True))
        (size,) = struct.unpack(">i", recv(sock, 4))
        answer = response.decode(recv(sock, size), version=version, header=True)
    assert answer.header.correlation_id == 7
    return answer


def recv(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def metadata(shared: Shared, i: int, topics: list[str] | None = None) -> Any:
    asked = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    request = MetadataRequest(version=8, topics=asked, allow_auto_topic_creation=False)
    return call(shared.ports[i], request, MetadataResponse, 8)


def brokers(shared: Shared, i: int) -> set[tuple[int, int]]:
    return {(b.node_id, b.port) for b in metadata(shared, i, []).brokers}


def coordinator(shared: Shared, i: int, group: str) -> tuple[int, int]:
    """(node id, port) of ``group``'s coordinator, as node ``i`` answers FindCoordinator v3."""
    request = FindCoordinatorRequest(version=3, key=group, key_type=0)
    answer = call(shared.ports[i], request, FindCoordinatorResponse, 3)
    assert answer.error_code == 0
    return answer.node_id, answer.port


def group_coordinated_by(shared: Shared, i: int, prefix: str) -> str:
    """A group id whose coordinator is node ``i`` (asked of another node)."""
    asked = (i + 1) % NODES
    for n in range(200):
        group = f"{prefix}-{n}"
        if coordinator(shared, asked, group)[0] == shared.node_id(i):
            return group
    raise AssertionError(f"no group of 200 is coordinated by node-{i}")


# --- HTTP -----------------------------------------------------------------------------------


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


def define_shared(shared: Shared, *queues: str, nodes: tuple[int, ...] = tuple(range(NODES))) -> None:
    """Shared queues defined through the first of ``nodes``, once each of them lists them as topics."""
    for queue in queues:
        http("PUT", f"{shared.url(nodes[0])}/v1/queues/{queue}", {"storage": "shared"})
    for i in nodes:

        def listed(i: int = i) -> bool:
            return all(t.error_code == 0 for t in metadata(shared, i, list(queues)).topics)

        until_blocking(listed, 10, f"node-{i} to list {queues}")


def produce_http(shared: Shared, i: int, queue: str, texts: list[str]) -> list[int]:
    answer = http(
        "POST", f"{shared.url(i)}/v1/queues/{queue}/messages", {"messages": [{"data": t} for t in texts]}
    )
    return [r["id"] for r in answer["results"]]


def requests_served(shared: Shared, i: int, api: str) -> int:
    with urllib.request.urlopen(f"{shared.url(i)}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    prefix = f'capella_protocol_requests_total{{protocol="kafka",api="{api}"}} '
    return sum(int(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


# --- tests ----------------------------------------------------------------------------------


def test_metadata_from_every_node_lists_every_node_and_names_the_answering_node_leader(
    shared: Shared,
) -> None:
    define_shared(shared, "listed")
    every = {(shared.node_id(i), "127.0.0.1", shared.ports[i]) for i in range(NODES)}
    for i in range(NODES):
        answer = metadata(shared, i)
        assert {(b.node_id, b.host, b.port) for b in answer.brokers} == every
        assert answer.controller_id == shared.node_id(i)
        (topic,) = [t for t in answer.topics if t.name == "listed"]
        assert [(p.partition_index, p.leader_id, p.replica_nodes) for p in topic.partitions] == [
            (0, shared.node_id(i), [shared.node_id(i)])
        ]


def test_a_local_queue_of_a_shared_node_is_a_topic_of_that_node_only(shared: Shared) -> None:
    http("PUT", f"{shared.url(0)}/v1/queues/local-0", {})
    (topic,) = metadata(shared, 0, ["local-0"]).topics
    assert (topic.error_code, [p.leader_id for p in topic.partitions]) == (0, [shared.node_id(0)])
    (elsewhere,) = metadata(shared, 1, ["local-0"]).topics
    assert elsewhere.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION: node 1 has no such queue


def test_find_coordinator_answers_the_same_node_from_every_node_and_spreads_the_groups(
    shared: Shared,
) -> None:
    groups = [f"spread-{n}" for n in range(30)]
    answers = {group: {coordinator(shared, i, group) for i in range(NODES)} for group in groups}
    assert all(len(found) == 1 for found in answers.values()), answers
    chosen = {next(iter(found)) for found in answers.values()}
    assert chosen <= {(shared.node_id(i), shared.ports[i]) for i in range(NODES)}
    assert len(chosen) == NODES  # 30 groups on one or two of three nodes: not a hash


def test_a_group_call_at_another_node_is_answered_not_coordinator(shared: Shared) -> None:
    group = group_coordinated_by(shared, 1, "calls")
    heartbeat = HeartbeatRequest(
        version=3, group_id=group, generation_id=1, member_id="m", group_instance_id=None
    )
    at_coordinator = call(shared.ports[1], heartbeat, HeartbeatResponse, 3)
    assert at_coordinator.error_code == UNKNOWN_MEMBER_ID  # taken there: no such member yet
    for i in (0, 2):
        assert call(shared.ports[i], heartbeat, HeartbeatResponse, 3).error_code == NOT_COORDINATOR
        join = JoinGroupRequest(
            version=5,
            group_id=group,
            session_timeout_ms=6000,
            rebalance_timeout_ms=6000,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
        )
        joined = call(shared.ports[i], join, JoinGroupResponse, 5)
        assert (joined.error_code, joined.generation_id) == (NOT_COORDINATOR, -1)
        topic = OffsetCommitRequest.OffsetCommitRequestTopic(
            name="listed",
            partitions=[
                OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata=None
                )
            ],
        )
        commit = OffsetCommitRequest(
            version=7, group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            topics=[topic],
        )  # fmt: skip
        committed = call(shared.ports[i], commit, OffsetCommitResponse, 7)
        assert [p.error_code for t in committed.topics for p in t.partitions] == [NOT_COORDINATOR]


def test_producer_ids_are_one_space_for_every_node(shared: Shared) -> None:
    taken = []
    for i in (0, 1, 2, 0, 2, 1):
        request = InitProducerIdRequest(version=4, transactional_id=None, transaction_timeout_ms=-1,
                                        producer_id=-1, producer_epoch=-1)  # fmt: skip
        answer = call(shared.ports[i], request, InitProducerIdResponse, 4)
        assert answer.error_code == 0
        taken.append(answer.producer_id)
    assert len(set(taken)) == len(taken)


def test_an_idempotent_producer_through_one_node_is_read_through_another(shared: Shared) -> None:
    define_shared(shared, "orders")
    fetches_before = requests_served(shared, 1, "Fetch")
    producer = Producer({**CLIENT, "bootstrap.servers": shared.bootstrap(0), "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5})  # fmt: skip
    reports: list[tuple[Any, int]] = []
    count = 2000
    for n in range(count):
        producer.produce(
            "orders",
            key=f"k{n % 37}".encode(),
            value=f"v{n}".encode(),
            headers=[("h", b"1"), ("h", None)],
            on_delivery=lambda err, msg: reports.append((err, msg.offset())),
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert [err for err, _ in reports if err is not None] == []
    offsets = [offset for _, offset in reports]
    assert offsets == sorted(offsets) and len(set(offsets)) == count

    consumer = Consumer({**CLIENT, "bootstrap.servers": shared.bootstrap(1), "group.id": "unused-reader"})
    try:
        consumer.assign([TopicPartition("orders", 0, OFFSET_BEGINNING)])
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg)
    finally:
        consumer.close()
    assert [m.value() for m in got] == [f"v{n}".encode() for n in range(count)]
    assert [m.key() for m in got] == [f"k{n % 37}".encode() for n in range(count)]
    assert [m.offset() for m in got] == offsets
    assert all(m.headers() == [("h", b"1"), ("h", None)] for m in got)
    assert requests_served(shared, 1, "Fetch") > fetches_before
    # Over HTTP on the third node: the same ids, each message once.
    page = http("GET", f"{shared.url(2)}/v1/queues/orders/messages?after=0&limit={count + 10}")
    assert [m["id"] for m in page["messages"]] == offsets


class Member:
    """A confluent-kafka group member that commits each message it is given, synchronously."""

    def __init__(self, shared: Shared, i: int, group: str, topics: list[str]) -> None:
        self.consumer = Consumer({**GROUP, "bootstrap.servers": shared.bootstrap(i), "group.id": group})
        self.consumer.subscribe(topics)
        self.seen: list[tuple[str, int, bytes]] = []
        self.failed_commits = 0

    def poll(self) -> None:
        msg = self.consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            return
        self.seen.append((msg.topic(), msg.offset(), msg.value()))
        try:
            self.consumer.commit(message=msg, asynchronous=False)
        except KafkaException:
            self.failed_commits += 1  # the coordinator is gone or moving: redelivered later

    def assigned(self) -> set[str]:
        return {tp.topic for tp in self.consumer.assignment()}

    def close(self) -> None:
        self.consumer.close()


def settle(members: list[Member], topics: list[str], within: float) -> None:
    """Poll until the members' assignments are disjoint, each non-empty, covering ``topics``."""

    def settled() -> bool:
        for member in members:
            member.poll()
        owned = [member.assigned() for member in members]
        return all(owned) and sum(len(o) for o in owned) == len(topics) and set().union(*owned) == set(topics)

    until_blocking(settled, within, "the group to settle", every=0.0)


def consume(members: list[Member], count: int, within: float) -> Counter[tuple[str, int]]:
    def everything() -> bool:
        for member in members:
            member.poll()
        return len({(t, o) for m in members for t, o, _ in m.seen}) >= count

    until_blocking(everything, within, f"{count} messages", every=0.0)
    return Counter((t, o) for m in members for t, o, _ in m.seen)


def last_id(shared: Shared, i: int, queue: str, subscription: str) -> int:
    return int(http("GET", f"{shared.url(i)}/v1/queues/{queue}/subscriptions/{subscription}")["last_id"])


def test_a_group_of_two_members_on_two_nodes_shares_the_work_at_a_third(shared: Shared) -> None:
    topics = ["work-a", "work-b", "work-c"]
    define_shared(shared, *topics)
    group = group_coordinated_by(shared, 2, "work")
    members = [Member(shared, 0, group, topics), Member(shared, 1, group, topics)]
    try:
        settle(members, topics, 30)
        assert members[0].assigned().isdisjoint(members[1].assigned())
        ids = {topic: produce_http(shared, 2, topic, [f"{topic}-{n}" for n in range(30)]) for topic in topics}
        seen = consume(members, 90, 30)
        assert set(seen) == {(topic, i) for topic in topics for i in ids[topic]}
        assert set(seen.values()) == {1}
        for topic in topics:  # the members only touch the topics they own
            owner = [m for m in members if topic in m.assigned()]
            assert len(owner) == 1 and {t for t, _, _ in owner[0].seen} <= owner[0].assigned()
        for topic in topics:
            assert last_id(shared, 0, topic, f"kafka.{group}") == ids[topic][-1]
    finally:
        for member in members:
            member.close()


def test_the_coordinator_killed_the_group_moves_and_consumes_on(shared: Shared) -> None:
    topics = ["moving-a", "moving-b", "moving-c"]
    define_shared(shared, *topics)
    group = group_coordinated_by(shared, 2, "moving")
    members = [Member(shared, 0, group, topics), Member(shared, 1, group, topics)]
    try:
        settle(members, topics, 30)
        first = {topic: produce_http(shared, 0, topic, [f"1-{n}" for n in range(20)]) for topic in topics}
        consume(members, 60, 30)
        for topic in topics:
            until_blocking(
                lambda topic=topic: last_id(shared, 0, topic, f"kafka.{group}") == first[topic][-1], 10
            )
        shared.rig.kill(2)
        killed_at = time.monotonic()
        second = {topic: produce_http(shared, 0, topic, [f"2-{n}" for n in range(20)]) for topic in topics}

        def moved() -> bool:
            for member in members:
                member.poll()
            return coordinator(shared, 0, group)[0] != shared.node_id(2)

        # Within the killed node's lease, and a read of the live nodes after it ran out.
        until_blocking(moved, LEASE + 2 * NODES_POLL + 1, "the group to leave node-2", every=0.0)
        moved_after = time.monotonic() - killed_at
        seen = consume(members, 120, 60)
        consumed_after = time.monotonic() - killed_at
        # Everything read; what was committed before the kill is never read again.
        assert set(seen) == {(t, i) for t in topics for i in first[t] + second[t]}
        assert all(seen[(t, i)] == 1 for t in topics for i in first[t])
        # The group is at a live node now, the same from both, and commits go on there.
        moved = {coordinator(shared, i, group) for i in (0, 1)}
        assert len(moved) == 1 and moved.pop() in {(shared.node_id(i), shared.ports[i]) for i in (0, 1)}
        assert brokers(shared, 0) == {(shared.node_id(i), shared.ports[i]) for i in (0, 1)}
        for topic in topics:

            def committed(topic: str = topic) -> bool:
                for member in members:
                    member.poll()
                return last_id(shared, 1, topic, f"kafka.{group}") == second[topic][-1]

            until_blocking(committed, 20, f"the commits of {topic} at the new coordinator", every=0.0)
        print(f"group moved {moved_after:.1f}s and consumed everything {consumed_after:.1f}s after the kill")
    finally:
        for member in members:
            member.close()


def test_a_node_back_takes_its_groups_back_and_their_members_follow(shared: Shared) -> None:
    if shared.rig.running(2):  # when run alone: the test before leaves node 2 killed
        shared.rig.kill(2)
    two = {(shared.node_id(i), shared.ports[i]) for i in (0, 1)}
    until_blocking(lambda: brokers(shared, 0) == brokers(shared, 1) == two, 20, "node-2 to be gone")
    topics = ["back-a", "back-b", "back-c"]
    define_shared(shared, *topics, nodes=(0, 1))
    everyone = [KafkaNode(shared.node_id(i), "127.0.0.1", shared.ports[i], f"node-{i}") for i in range(NODES)]
    group = next(g for g in (f"back-{n}" for n in range(200)) if coordinator_of(g, everyone).name == "node-2")
    members = [Member(shared, 0, group, topics), Member(shared, 1, group, topics)]
    try:
        settle(members, topics, 30)
        (interim,) = {coordinator(shared, i, group) for i in (0, 1)}
        first = {topic: produce_http(shared, 0, topic, [f"1-{n}" for n in range(20)]) for topic in topics}
        consume(members, 60, 30)
        shared.rig.restart(2)
        every = {(shared.node_id(i), shared.ports[i]) for i in range(NODES)}
        until_blocking(lambda: all(brokers(shared, i) == every for i in range(NODES)), 15, "node-2 listed")
        second = {topic: produce_http(shared, 1, topic, [f"2-{n}" for n in range(20)]) for topic in topics}
        seen = consume(members, 120, 60)
        assert set(seen) == {(t, i) for t in topics for i in first[t] + second[t]}
        assert all(seen[(t, i)] == 1 for t in topics for i in first[t])
        assert {coordinator(shared, i, group) for i in range(NODES)} == {(shared.node_id(2), shared.ports[2])}
        for topic in topics:

            def committed(topic: str = topic) -> bool:
                for member in members:
                    member.poll()
                return last_id(shared, 2, topic, f"kafka.{group}") == second[topic][-1]

            until_blocking(committed, 20, f"the commits of {topic} at node-2", every=0.0)
        # The interim coordinator let the group go rather than wait for its members to time out.
        interim_node = next(i for i in (0, 1) if shared.ports[i] == interim[1])
        assert f"kafka group moved group={group!r} node=node-2" in shared.rig.node(interim_node).log()
    finally:
        for member in members:
            member.close()


def test_an_idempotent_producer_whose_node_is_killed_goes_on_through_another_exactly_once(
    shared: Shared,
) -> None:
    if not shared.rig.running(2):
        shared.rig.restart(2)
    define_shared(shared, "failover")
    producer = Producer({**CLIENT, "bootstrap.servers": shared.bootstrap(2), "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5})  # fmt: skip
    reports: dict[bytes, tuple[Any, int]] = {}

    def delivered(err: Any, msg: Message) -> None:
        reports[msg.value()] = (err, msg.offset())

    count, killed = 3000, False
    for n in range(count):
        producer.produce("failover", value=f"m{n}".encode(), on_delivery=delivered)
        producer.poll(0)
        if n % 100 == 99:
            producer.poll(0.05)  # a steady stream: batches in flight when the node goes
        if not killed and len(reports) >= 1000:
            shared.rig.kill(2)
            killed = True
    assert killed
    assert producer.flush(60) == 0
    assert [err for err, _ in reports.values() if err is not None] == []
    # Through node 0: every message once, at the offset its delivery report gave (a batch sent
    # again after the kill is found by its identity and answered with its first offsets).
    page = http("GET", f"{shared.url(0)}/v1/queues/failover/messages?after=0&limit={count + 100}")
    stored = [(m["data"].encode(), m["id"]) for m in page["messages"]]
    assert sorted(value for value, _ in stored) == sorted(f"m{n}".encode() for n in range(count))
    assert {value: offset for value, offset in stored} == {
        value: offset for value, (_, offset) in reports.items()
    }
