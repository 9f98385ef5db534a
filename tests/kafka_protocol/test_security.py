"""The Kafka door's security against real ``capella serve`` processes with ``[auth]`` on.

Two brokers per module: ``tls_broker`` serves SASL/PLAIN over TLS (SASL_SSL) to unmodified
kcat, confluent-kafka, aiokafka and kafka-python clients; ``broker`` serves SASL_PLAINTEXT on
loopback with small limits (frames before sign-in, the sign-in deadline, connections in all and
per address) and takes the attacks, sent as raw frames built by kafka-python's protocol module
(what a client nobody here wrote would send, or a hostile one). The rights tests also send the
same request where the user has the right, so a refusal is the right's and not a broken call.
Start-up refusals run ``capella serve`` once each; the listener beyond loopback runs in a
network namespace of its own, with an address on its loopback device, so no traffic leaves the
machine.

Failed logins spend a budget per client address, shared with HTTP Basic: the tests that fail a
login on ``broker`` connect from addresses of their own in 127.0.0.0/8, so the budget of
127.0.0.1 (which the other tests sign in from) stays whole; the connection-limit tests use
addresses of their own too.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder
from support.kafka import KafkaServer, kafka_server, toml
from support.pki import Pki, make_pki
from support.servers import free_port
from support.wait import until_blocking

pytestmark = pytest.mark.slow

TIMEOUT = 5.0
# Where the listener beyond loopback is bound, inside its own network namespace (TEST-NET-2:
# no machine has it, so a refusal test cannot bind it by mistake either).
OUTSIDE = "198.51.100.7"
PASSWORDS = {
    "admin": "admin-password",
    "limited": "limited-password",
    "alice": "alice-password",
    "bob": "bob-password",
    "victim": "victim-password",
}
RULES = {
    # May read ro-*, write wo-*, do anything to own-* (creating them too), and use groups lim-*.
    "limited": [
        "allow:queue:read:ro-*",
        "allow:queue:write:wo-*",
        "allow:queue:*:own-*",
        "allow:group:read:lim-*",
    ],
    "alice": ["allow:queue:*:shared-*", "allow:group:read:alice-*"],
    "bob": ["allow:queue:*:shared-*"],
    "victim": ["allow:queue:read:own-*"],
}
QUEUES = ["ro-q", "wo-q", "own-q", "hidden-q", "shared-q"]
MAX_FRAME_BEFORE_SIGN_IN = 4096
MAX_BODY = 1 << 20
MAX_CONNECTIONS = 12
MAX_CONNECTIONS_PER_ADDRESS = 8
FAILED_LOGINS = 3  # per address, per window, on ``broker``
SIGN_IN_TIMEOUT = 2.0
# On ``tls_broker``: long enough that "closed at once" is told apart from "at the deadline".
TLS_SIGN_IN_TIMEOUT = 4.0
# A loaded CI machine (2 cores, several test runs) may add this much to any deadline.
SLACK = 2.0


# --- servers -------------------------------------------------------------------------------


@dataclass
class Door:
    """A running broker with auth on: its HTTP API as the admin (or anyone) and raw Kafka sockets."""

    server: KafkaServer
    pki: Pki | None = None

    def http(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        user: str = "admin",
        password: str | None = None,
        source: str = "127.0.0.1",
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection(
            "127.0.0.1", self.server.port, timeout=TIMEOUT * 4, source_address=(source, 0)
        )
        password = PASSWORDS[user] if password is None else password
        credentials = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers = {"Authorization": f"Basic {credentials}", "Content-Type": "application/json"}
        try:
            connection.request(method, path, None if body is None else json.dumps(body), headers)
            answer = connection.getresponse()
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else None
        finally:
            connection.close()

    def messages(self, queue: str) -> list[dict[str, Any]]:
        status, body = self.http("GET", f"/v1/queues/{queue}/messages?after=0&limit=1000")
        assert status == 200, body
        return list(body["messages"])

    def wire(self, source: str = "127.0.0.1") -> Wire:
        sock = socket.create_connection(
            ("127.0.0.1", self.server.kafka_port), timeout=TIMEOUT, source_address=(source, 0)
        )
        if self.pki is not None:
            sock = self.pki.client_context().wrap_socket(sock, server_hostname="localhost")
        sock.settimeout(TIMEOUT)
        return Wire(sock)

    def signed_in(self, user: str = "limited", source: str = "127.0.0.1") -> Wire:
        wire = self.wire(source)
        answer = wire.sign_in(user, PASSWORDS[user])
        assert answer.error_code == 0, answer
        return wire

    def open_connections(self) -> int:
        status, _ = self.http("GET", "/v1/me")
        assert status == 200
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=TIMEOUT * 4)
        credentials = base64.b64encode(f"admin:{PASSWORDS['admin']}".encode()).decode()
        try:
            connection.request("GET", "/metrics", headers={"Authorization": f"Basic {credentials}"})
            text = connection.getresponse().read().decode()
        finally:
            connection.close()
        for line in text.splitlines():
            if line.startswith('capella_protocol_open_connections{protocol="kafka"}'):
                return int(line.split()[-1])
        raise AssertionError("no Kafka connection gauge in /metrics")


class Wire:
    """One raw Kafka connection: requests built by kafka-python, answers decoded by it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.client_id = "security"
        self._correlation = 0

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def send(self, request: Any) -> None:
        self._correlation += 1
        request.with_header(correlation_id=self._correlation, client_id=self.client_id)
        self.sock.sendall(request.encode(header=True, framed=True))

    def ask(self, request: Any, response: Any) -> Any:
        self.send(request)
        answer = response.decode(self.read_frame(), version=request.version, header=True)
        assert answer.header.correlation_id == self._correlation
        return answer

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._exactly(4))
        return self._exactly(size)

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError(f"closed after {len(data)} of {size} bytes")
            data += chunk
        return data

    def closed(self) -> bool:
        """Whether the server closes the connection (EOF or reset) within the timeout, sending
        nothing more."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return True
        except TimeoutError:
            return False

    def sign_in(self, user: str, password: str, authzid: str = "") -> Any:
        shake = self.ask(SaslHandshakeRequest(version=1, mechanism="PLAIN"), SaslHandshakeResponse)
        assert shake.error_code == 0, shake
        return self.authenticate(f"{authzid}\0{user}\0{password}".encode())

    def authenticate(self, token: bytes) -> Any:
        return self.ask(SaslAuthenticateRequest(version=2, auth_bytes=token), SaslAuthenticateResponse)

    def api_versions(self, software: str = "security") -> Any:
        request = ApiVersionsRequest(version=3, client_software_name=software, client_software_version="1")
        return self.ask(request, ApiVersionsResponse)

    def metadata(self, topics: list[str] | None, *, create: bool = False) -> Any:
        asked = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
        request = MetadataRequest(version=8, topics=asked, allow_auto_topic_creation=create)
        return self.ask(request, MetadataResponse)

    def produce(self, topic: str, records: bytes) -> Any:
        """The partition answer to one Produce of ``records`` (a batch) with acks=all."""
        answer = self.ask(produce_request(topic, records), ProduceResponse)
        return answer.responses[0].partition_responses[0]


def produce_request(topic: str, records: bytes, acks: int = -1) -> Any:
    partition = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[partition])
    return ProduceRequest(version=8, transactional_id=None, acks=acks, timeout_ms=5000, topic_data=[data])


def batch(*values: bytes, producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """A record batch v2 as kafka-python's producer builds it (idempotent with ``producer``:
    producer id, epoch, base sequence)."""
    builder = DefaultRecordBatchBuilder(2, 0, False, *producer, batch_size=1 << 20)
    for i, value in enumerate(values):
        assert builder.append(i, int(time.time() * 1000), None, value, []) is not None
    return bytes(builder.build())


def fetch_request(topic: str, offset: int = 1) -> Any:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=offset,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    return FetchRequest(
        version=11,
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
        forgotten_topics_data=[],
        rack_id="",
    )


def list_offsets_request(topic: str) -> Any:
    partition = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=-1
    )
    return ListOffsetsRequest(
        version=5,
        replica_id=-1,
        isolation_level=0,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[partition])],
    )


def commit_request(group: str, topic: str, offset: int) -> Any:
    partition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
    )
    return OffsetCommitRequest(
        version=7,
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[partition])],
    )


def users_and_queues(door: Door) -> None:
    for user, rules in RULES.items():
        status, body = door.http("PUT", f"/v1/users/{user}", {"password": PASSWORDS[user], "rules": rules})
        assert status == 201, body
    for queue in QUEUES:
        status, body = door.http("PUT", f"/v1/queues/{queue}", {})
        assert status == 201, body
        status, body = door.http(
            "POST", f"/v1/queues/{queue}/messages", {"messages": [{"data": "one"}, {"data": "two"}]}
        )
        assert status in (200, 201), body


def auth_table(**limits: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "bootstrap_user": "admin",
        "bootstrap_password_env": "CAPELLA_ADMIN_PASSWORD",
        **limits,
    }


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), ("127.0.0.1", OUTSIDE))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    """SASL_PLAINTEXT on loopback, with small limits for the attacks to meet."""
    for server in kafka_server(
        tmp_path_factory.mktemp("broker"),
        kafka={
            "auto_create_topics": True,
            "max_frame_before_sign_in": MAX_FRAME_BEFORE_SIGN_IN,
            "max_connections": MAX_CONNECTIONS,
            "max_connections_per_address": MAX_CONNECTIONS_PER_ADDRESS,
            "sign_in_timeout": f"{SIGN_IN_TIMEOUT}s",
        },
        tables={
            "server": {"max_body_size": MAX_BODY},
            "auth": auth_table(max_failed_logins_per_address=FAILED_LOGINS, failed_login_window="60s"),
        },
        env={"CAPELLA_ADMIN_PASSWORD": PASSWORDS["admin"]},
    ):
        door = Door(server)
        users_and_queues(door)
        yield door


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Door]:
    """SASL/PLAIN over TLS; failed logins may come from 127.0.0.1 here (a large budget)."""
    for server in kafka_server(
        tmp_path_factory.mktemp("tls-broker"),
        kafka={
            "sign_in_timeout": f"{TLS_SIGN_IN_TIMEOUT}s",
            "max_connections_per_address": MAX_CONNECTIONS_PER_ADDRESS,
        },
        tables={
            "kafka.tls": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
            "auth": auth_table(max_failed_logins_per_address=10_000, max_failed_logins_per_user=10_000),
        },
        env={"CAPELLA_ADMIN_PASSWORD": PASSWORDS["admin"]},
    ):
        door = Door(server, pki)
        users_and_queues(door)
        yield door


# --- K14: where the listener may bind ------------------------------------------------------


def refused_start(root: Path, tables: dict[str, dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    config = root / "capella.toml"
    config.write_text(toml({"cluster": {"name": "refused"}, **tables}))
    command = [sys.executable, "-m", "capella", "serve", "--config", str(config)]
    command += ["--data-dir", str(root / "data"), "--listen", f"127.0.0.1:{free_port()}"]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "CAPELLA_ADMIN_PASSWORD": PASSWORDS["admin"]},
    )


def test_a_listener_beyond_loopback_without_auth_is_refused_at_start(tmp_path: Path) -> None:
    done = refused_start(tmp_path, {"kafka": {"listen": f"{OUTSIDE}:9092"}})
    assert done.returncode != 0
    assert f"refusing to listen for Kafka clients on {OUTSIDE}:9092 without authentication" in done.stderr


def test_a_listener_beyond_loopback_without_tls_is_refused_at_start(tmp_path: Path) -> None:
    done = refused_start(tmp_path, {"auth": auth_table(), "kafka": {"listen": f"{OUTSIDE}:9092"}})
    assert done.returncode != 0
    assert f"refusing to listen for Kafka clients on {OUTSIDE}:9092 without TLS" in done.stderr


# Run inside a network namespace of its own: the address beyond loopback is put on that
# namespace's loopback device, so the server binds a non-loopback address and the client
# reaches it without a packet leaving the machine.
NAMESPACED = textwrap.dedent(
    """
    import json, subprocess, sys, time, urllib.request
    config, data, ca, address, port, http_port = sys.argv[1:7]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", address + "/32", "dev", "lo"], check=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "capella", "serve", "--config", config, "--data-dir", data,
         "--listen", "127.0.0.1:" + http_port],
        stdout=open(data + ".log", "wb"), stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(400):
            try:
                urllib.request.urlopen("http://127.0.0.1:" + http_port + "/readyz", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit("capella serve exited with %s" % server.returncode)
                time.sleep(0.05)
        import confluent_kafka
        errors = []
        conf = {
            "bootstrap.servers": address + ":" + port,
            "security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN",
            "sasl.username": "admin", "sasl.password": sys.stdin.read().strip(),
            "ssl.ca.location": ca, "message.timeout.ms": 10000,
            "error_cb": lambda e: errors.append(str(e)),
        }
        producer = confluent_kafka.Producer(conf)
        reports = []
        producer.produce("outside", b"beyond loopback",
                         on_delivery=lambda e, m: reports.append((str(e) if e else None, m.offset())))
        producer.flush(15)
        topics = sorted(producer.list_topics(timeout=10).topics)
        print(json.dumps({"reports": reports, "topics": topics, "errors": errors}))
    finally:
        server.terminate()
        server.wait(10)
    """
)


def test_with_auth_and_tls_a_listener_beyond_loopback_serves_sasl_ssl(tmp_path: Path, pki: Pki) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a network namespace of its own (unshare -n, as root)")
    port = free_port()
    config = tmp_path / "capella.toml"
    config.write_text(
        toml(
            {
                "cluster": {"name": "outside"},
                "auth": auth_table(),
                "kafka": {"listen": f"{OUTSIDE}:{port}", "auto_create_topics": True},
                "kafka.tls": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
            }
        )
    )
    arguments = [str(config), str(tmp_path / "data"), str(pki.ca), OUTSIDE, str(port), str(free_port())]
    script = tmp_path / "namespaced.py"
    script.write_text(NAMESPACED)
    done = subprocess.run(
        [unshare, "-n", sys.executable, str(script), *arguments],
        input=PASSWORDS["admin"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CAPELLA_ADMIN_PASSWORD": PASSWORDS["admin"]},
    )
    log = (tmp_path / "data.log").read_text(errors="replace") if (tmp_path / "data.log").exists() else ""
    assert done.returncode == 0, done.stderr + log
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["reports"] == [[None, 1]], (found, log)
    assert "outside" in found["topics"]
    assert f"kafka listening on {OUTSIDE}:{port}" in log


# --- SASL/PLAIN with real clients ----------------------------------------------------------


def rdkafka_conf(door: Door, user: str, password: str | None = None, **more: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": door.server.bootstrap,
        "security.protocol": "SASL_PLAINTEXT" if door.pki is None else "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user] if password is None else password,
        "topic.metadata.refresh.interval.ms": 1000,
        **more,
    }
    if door.pki is not None:
        conf["ssl.ca.location"] = str(door.pki.ca)
    return conf


def rdkafka_round_trip(door: Door, user: str, topic: str, group: str, count: int = 20) -> list[int]:
    """Produce ``count`` messages as ``user`` with confluent-kafka, consume them in ``group``;
    the offsets the delivery reports gave."""
    import confluent_kafka

    errors: list[str] = []
    producer = confluent_kafka.Producer(
        rdkafka_conf(door, user, **{"enable.idempotence": True, "acks": "all", "error_cb": errors.append})
    )
    reports: list[tuple[Any, int]] = []
    for i in range(count):
        producer.produce(
            topic, f"{user}-{i}".encode(), key=b"k", on_delivery=lambda e, m: reports.append((e, m.offset()))
        )
    assert producer.flush(20) == 0
    assert [e for e, _ in reports] == [None] * count, (reports, errors)
    consumer = confluent_kafka.Consumer(
        rdkafka_conf(
            door,
            user,
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            },
        )
    )
    try:
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < count + 2 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    # The two messages the admin wrote over HTTP, then this user's, in order.
    assert got == [b"one", b"two"] + [f"{user}-{i}".encode() for i in range(count)]
    return [offset for _, offset in reports]


def test_confluent_kafka_produces_and_consumes_over_sasl_ssl(tls_broker: Door) -> None:
    offsets = rdkafka_round_trip(tls_broker, "alice", "shared-q", "alice-g")
    stored = tls_broker.messages("shared-q")
    # The offsets are the ids HTTP shows, and the messages are alice's idempotent producer's.
    assert offsets == [m["id"] for m in stored[2:]]
    assert {m["source"].split("/kafka/")[1].split("/")[0] for m in stored[2:]} == {"alice"}
    status, cursor = tls_broker.http("GET", "/v1/queues/shared-q/subscriptions/kafka.alice-g")
    assert status == 200 and cursor["last_id"] == offsets[-1], cursor


async def test_aiokafka_produces_and_consumes_over_sasl_ssl(tls_broker: Door) -> None:
    import aiokafka

    assert tls_broker.pki is not None
    options: dict[str, Any] = {
        "bootstrap_servers": tls_broker.server.bootstrap,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "bob",
        "sasl_plain_password": PASSWORDS["bob"],
        "ssl_context": tls_broker.pki.client_context(),
    }
    assert tls_broker.http("PUT", "/v1/queues/shared-aio", {})[0] == 201
    producer = aiokafka.AIOKafkaProducer(**options, enable_idempotence=True)
    await producer.start()
    try:
        sent = [(await producer.send_and_wait("shared-aio", f"bob-{i}".encode())).offset for i in range(5)]
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer(**options, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partition = aiokafka.TopicPartition("shared-aio", 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        found = await consumer.getmany(partition, timeout_ms=5000)
    finally:
        await consumer.stop()
    assert [m.value for m in found[partition]] == [f"bob-{i}".encode() for i in range(5)]
    assert sent == [m["id"] for m in tls_broker.messages("shared-aio")]


def test_kafka_python_produces_and_consumes_over_sasl_ssl(tls_broker: Door) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    assert tls_broker.pki is not None
    options: dict[str, Any] = {
        "bootstrap_servers": tls_broker.server.bootstrap,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORDS["alice"],
        "ssl_cafile": str(tls_broker.pki.ca),
    }
    assert tls_broker.http("PUT", "/v1/queues/shared-kpy", {})[0] == 201
    producer = KafkaProducer(**options)  # its defaults: idempotent, acks=all
    try:
        sent = [producer.send("shared-kpy", f"kpy-{i}".encode()).get(10).offset for i in range(5)]
    finally:
        producer.close(5)
    consumer = KafkaConsumer(**options, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        partition = TopicPartition("shared-kpy", 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        got = [next(consumer).value for _ in range(5)]
    finally:
        consumer.close()
    assert got == [f"kpy-{i}".encode() for i in range(5)]
    assert sent == [m["id"] for m in tls_broker.messages("shared-kpy")]


@pytest.mark.parametrize(("user", "password"), [("alice", "not-her-password"), ("nobody", "any-password")])
def test_confluent_kafka_reports_a_refused_sign_in_and_gets_no_answer(
    tls_broker: Door, user: str, password: str
) -> None:
    import confluent_kafka

    errors: list[Any] = []
    producer = confluent_kafka.Producer(
        rdkafka_conf(tls_broker, "alice", password, **{"message.timeout.ms": 2000, "error_cb": errors.append})
        | {"sasl.username": user}
    )
    reports: list[Any] = []
    producer.produce("shared-q", b"must not be stored", on_delivery=lambda e, m: reports.append(e))
    producer.flush(10)
    failed = [e for e in errors if e.code() == confluent_kafka.KafkaError._AUTHENTICATION]
    assert failed, errors
    # Unknown user and wrong password read the same: nothing tells whether the user exists.
    assert "SASL authentication error: wrong user name or password" in failed[0].str()
    assert [r.code() for r in reports] == [confluent_kafka.KafkaError._MSG_TIMED_OUT]
    assert b"must not be stored" not in [m["data"].encode() for m in tls_broker.messages("shared-q")]


async def test_aiokafka_reports_error_58_for_a_wrong_password(
    tls_broker: Door, caplog: pytest.LogCaptureFixture
) -> None:
    import aiokafka
    from aiokafka.errors import KafkaConnectionError

    assert tls_broker.pki is not None
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=tls_broker.server.bootstrap,
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_plain_username="bob",
        sasl_plain_password="not-his-password",
        ssl_context=tls_broker.pki.client_context(),
        request_timeout_ms=3000,
    )
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        try:
            await producer.start()
        finally:
            await producer.stop()
    assert "[Error 58] SaslAuthenticationFailed: wrong user name or password" in caplog.text


@pytest.mark.parametrize(("user", "password"), [("alice", "not-her-password"), ("nobody", "any-password")])
def test_a_refused_sign_in_is_answered_58_then_the_connection_is_closed(
    tls_broker: Door, user: str, password: str
) -> None:
    with tls_broker.wire() as wire:
        answer = wire.sign_in(user, password)
        assert (answer.error_code, answer.error_message) == (58, "wrong user name or password")
        assert wire.closed()
    # Signed in with the right password, the same client is served.
    with tls_broker.signed_in("alice") as wire:
        assert wire.metadata(["shared-q"]).topics[0].error_code == 0


def test_sasl_plaintext_serves_a_loopback_listener_without_tls(broker: Door) -> None:
    offsets = rdkafka_round_trip(broker, "limited", "own-q", "lim-plain")
    assert offsets == [m["id"] for m in broker.messages("own-q")[2:]]


# --- the failed-login budget ---------------------------------------------------------------


def test_spent_failed_logins_refuse_even_the_right_password_from_that_address_as_over_http(
    broker: Door,
) -> None:
    # Two wrong passwords over Kafka and one over HTTP spend one budget: the address's.
    source = "127.0.0.2"
    for _ in range(FAILED_LOGINS - 1):
        with broker.wire(source) as wire:
            assert wire.sign_in("victim", "wrong-password").error_code == 58
            assert wire.closed()
    status, _ = broker.http("GET", "/v1/me", user="victim", password="wrong-password", source=source)
    assert status == 401
    # Now the right password from that address is refused over Kafka, without a check...
    with broker.wire(source) as wire:
        answer = wire.sign_in("victim", PASSWORDS["victim"])
        assert answer.error_code == 58
        assert answer.error_message.startswith("too many failed logins from this address")
        assert wire.closed()
    # ... and over HTTP: 429, as a spent budget is answered there.
    status, body = broker.http("GET", "/v1/me", user="victim", source=source)
    assert (status, body["error"]["code"]) == (429, "too_many_failed_logins"), body
    # An address that has not been failing signs in as the same user.
    with broker.signed_in("victim", source="127.0.0.1") as wire:
        assert wire.metadata(["own-q"]).topics[0].error_code == 0


# --- a limited user's attacks --------------------------------------------------------------


def test_a_produce_to_a_queue_the_user_may_not_write_is_refused_and_stores_nothing(broker: Door) -> None:
    with broker.signed_in() as wire:
        refused = wire.produce("ro-q", batch(b"forbidden"))
        allowed = wire.produce("wo-q", batch(b"allowed"))
    assert (refused.error_code, refused.base_offset) == (29, -1)
    assert [m["data"] for m in broker.messages("ro-q")] == ["one", "two"]
    # The same request where the user may write is stored: the refusal is the right's.
    assert allowed.error_code == 0
    assert [m["data"] for m in broker.messages("wo-q")][-1] == "allowed"


def test_fetch_and_list_offsets_of_a_queue_the_user_may_not_read_are_refused(broker: Door) -> None:
    with broker.signed_in() as wire:
        refused = wire.ask(fetch_request("wo-q"), FetchResponse).responses[0].partitions[0]
        allowed = wire.ask(fetch_request("ro-q"), FetchResponse).responses[0].partitions[0]
        listed = wire.ask(list_offsets_request("wo-q"), ListOffsetsResponse).topics[0].partitions[0]
        readable = wire.ask(list_offsets_request("ro-q"), ListOffsetsResponse).topics[0].partitions[0]
    assert (refused.error_code, bytes(refused.records or b"")) == (29, b"")
    assert (allowed.error_code, b"two" in bytes(allowed.records)) == (0, True)
    assert (listed.error_code, listed.offset) == (29, -1)
    assert (readable.error_code, readable.offset) == (0, 3)


def test_metadata_lists_only_queues_the_user_may_read_or_write(broker: Door) -> None:
    with broker.signed_in() as wire:
        everything = wire.metadata(None)
        hidden = wire.metadata(["hidden-q"]).topics[0]
        writable = wire.metadata(["wo-q"]).topics[0]
    names = {t.name for t in everything.topics}
    assert {"ro-q", "wo-q", "own-q"} <= names
    assert not names & {"hidden-q", "shared-q"}
    assert (hidden.error_code, list(hidden.partitions)) == (29, [])
    assert (writable.error_code, len(writable.partitions)) == (0, 1)


def join_request(group: str, member_id: str = "") -> Any:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")
    return JoinGroupRequest(
        version=5,
        group_id=group,
        session_timeout_ms=6000,
        rebalance_timeout_ms=6000,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[protocol],
    )


def fetch_offsets_request(group: str, topic: str) -> Any:
    topics = [OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])]
    return OffsetFetchRequest(version=5, group_id=group, topics=topics)


def test_group_calls_without_the_group_right_are_refused(broker: Door) -> None:
    with broker.signed_in() as wire:
        find = wire.ask(FindCoordinatorRequest(version=2, key="other-g", key_type=0), FindCoordinatorResponse)
        join = wire.ask(join_request("other-g"), JoinGroupResponse)
        commit = wire.ask(commit_request("other-g", "ro-q", 2), OffsetCommitResponse)
        fetched = wire.ask(fetch_offsets_request("other-g", "ro-q"), OffsetFetchResponse)
        # With the right, the same calls are served.
        found = wire.ask(FindCoordinatorRequest(version=2, key="lim-g", key_type=0), FindCoordinatorResponse)
        joined = wire.ask(join_request("lim-g"), JoinGroupResponse)
    assert (find.error_code, find.node_id, find.port) == (30, -1, -1)
    assert (join.error_code, join.generation_id, list(join.members)) == (30, -1, [])
    assert commit.topics[0].partitions[0].error_code == 30
    assert fetched.error_code == 30
    assert (found.error_code, found.port) == (0, broker.server.kafka_port)
    # JoinGroup v4+ first hands a new member its id (MEMBER_ID_REQUIRED): past the right's check.
    assert joined.error_code == 79
    status, cursors = broker.http("GET", "/v1/queues/ro-q/subscriptions")
    assert status == 200 and "kafka.other-g" not in json.dumps(cursors)


def test_a_commit_with_the_group_right_but_no_read_right_creates_and_moves_no_subscription(
    broker: Door,
) -> None:
    # The admin's cursor of group lim-moved on wo-q, at id 1.
    status, body = broker.http("PUT", "/v1/queues/wo-q/subscriptions/kafka.lim-moved", {"last_id": 1})
    assert status in (200, 201), body
    with broker.signed_in() as wire:
        created = wire.ask(commit_request("lim-new", "wo-q", 2), OffsetCommitResponse)
        moved = wire.ask(commit_request("lim-moved", "wo-q", 3), OffsetCommitResponse)
        offsets = wire.ask(fetch_offsets_request("lim-moved", "wo-q"), OffsetFetchResponse)
        readable = wire.ask(commit_request("lim-new", "ro-q", 2), OffsetCommitResponse)
    assert created.topics[0].partitions[0].error_code == 29
    assert moved.topics[0].partitions[0].error_code == 29
    assert offsets.topics[0].partitions[0].error_code == 29
    assert broker.http("GET", "/v1/queues/wo-q/subscriptions/kafka.lim-new")[0] == 404
    status, cursor = broker.http("GET", "/v1/queues/wo-q/subscriptions/kafka.lim-moved")
    assert (status, cursor["last_id"]) == (200, 1)
    # Where the user may read, the same commit makes the group's subscription.
    assert readable.topics[0].partitions[0].error_code == 0
    status, cursor = broker.http("GET", "/v1/queues/ro-q/subscriptions/kafka.lim-new")
    assert (status, cursor["last_id"]) == (200, 1)


def test_a_topic_is_auto_created_only_for_a_user_with_admin_on_it(broker: Door) -> None:
    with broker.signed_in() as wire:
        refused = wire.metadata(["sneaky-new"], create=True).topics[0]
        created = wire.metadata(["own-new"], create=True).topics[0]
    assert (refused.error_code, list(refused.partitions)) == (29, [])
    assert broker.http("GET", "/v1/queues/sneaky-new")[0] == 404
    assert (created.error_code, len(created.partitions)) == (0, 1)
    assert broker.http("GET", "/v1/queues/own-new")[0] == 200


def test_a_forged_producer_id_cannot_drop_another_users_messages(broker: Door) -> None:
    with broker.signed_in("alice") as alice, broker.signed_in("bob") as bob:
        init = InitProducerIdRequest(version=1, transactional_id=None, transaction_timeout_ms=60000)
        pid = alice.ask(init, InitProducerIdResponse).producer_id
        assert pid >= 0
        first = alice.produce("shared-q", batch(b"alice-0", producer=(pid, 0, 0)))
        # Bob names alice's producer id and the sequences she will send next.
        forged = bob.produce("shared-q", batch(b"bob-1", b"bob-2", producer=(pid, 0, 1)))
        later = alice.produce("shared-q", batch(b"alice-1", b"alice-2", producer=(pid, 0, 1)))
        again = alice.produce("shared-q", batch(b"alice-1", b"alice-2", producer=(pid, 0, 1)))
    assert [first.error_code, forged.error_code, later.error_code, again.error_code] == [0, 0, 0, 0]
    # Alice's later messages are stored, after bob's: not taken for his duplicates.
    assert later.base_offset == forged.base_offset + 2
    # Her own retry is still found by dedup, with the offsets first given.
    assert again.base_offset == later.base_offset
    stored = {m["data"]: m for m in broker.messages("shared-q")}
    assert {"alice-0", "alice-1", "alice-2", "bob-1", "bob-2"} <= set(stored)
    assert [m["data"] for m in broker.messages("shared-q")].count("alice-1") == 1
    own = stored["alice-1"]["source"]
    assert own.endswith(f"/kafka/alice/{pid}") and stored["bob-1"]["source"].endswith(f"/kafka/bob/{pid}")


@pytest.mark.parametrize("api", ["Metadata", "Produce", "InitProducerId"])
def test_a_request_before_sign_in_closes_the_connection(broker: Door, api: str) -> None:
    before = len(broker.messages("own-q"))
    with broker.wire() as wire:
        assert wire.api_versions().error_code == 0  # ApiVersions is served before sign-in
        if api == "Metadata":
            wire.send(MetadataRequest(version=8, topics=None, allow_auto_topic_creation=False))
        elif api == "Produce":
            wire.send(produce_request("own-q", batch(b"anonymous"), acks=1))
        else:
            wire.send(InitProducerIdRequest(version=1, transactional_id=None, transaction_timeout_ms=60000))
        assert wire.closed()
    assert len(broker.messages("own-q")) == before


def test_a_frame_over_the_sign_in_limit_closes_the_connection_and_is_served_after_sign_in(
    broker: Door,
) -> None:
    # An ApiVersions (served before sign-in) larger than max_frame_before_sign_in.
    large = "x" * (MAX_FRAME_BEFORE_SIGN_IN + 100)
    with broker.wire() as wire:
        wire.send(ApiVersionsRequest(version=3, client_software_name=large, client_software_version="1"))
        assert wire.closed()
    with broker.signed_in() as wire:
        assert wire.api_versions(large).error_code == 0
        # After sign-in a frame is bounded by server.max_body_size: refused on its size alone.
        wire.sock.sendall(struct.pack(">i", MAX_BODY + 1))
        assert wire.closed()


def test_nobody_signs_in_as_another_user_by_the_plain_authorization_id(broker: Door) -> None:
    with broker.wire() as wire:
        answer = wire.sign_in("limited", PASSWORDS["limited"], authzid="admin")
        assert (answer.error_code, answer.error_message) == (58, "signing in as another user is not allowed")
        assert wire.closed()
    # An authorization id that names the user signing in is theirs (RFC 4616).
    with broker.wire() as wire:
        assert wire.sign_in("limited", PASSWORDS["limited"], authzid="limited").error_code == 0
        assert wire.metadata(["hidden-q"]).topics[0].error_code == 29  # still limited's rights


def test_sasl_authenticate_without_a_handshake_is_refused_and_closes(broker: Door) -> None:
    with broker.wire() as wire:
        answer = wire.authenticate(f"\0limited\0{PASSWORDS['limited']}".encode())
        assert answer.error_code == 34  # ILLEGAL_SASL_STATE
        assert wire.closed()


def test_a_second_sasl_authenticate_is_refused_and_closes(broker: Door) -> None:
    with broker.signed_in() as wire:
        again = wire.authenticate(f"\0admin\0{PASSWORDS['admin']}".encode())
        assert again.error_code == 34  # ILLEGAL_SASL_STATE
        assert wire.closed()
    # A second handshake too: no re-authentication (the session lifetime answered is 0).
    with broker.signed_in() as wire:
        shake = wire.ask(SaslHandshakeRequest(version=1, mechanism="PLAIN"), SaslHandshakeResponse)
        assert shake.error_code == 34
        assert wire.closed()


def test_one_connection_over_max_connections_is_closed_at_once(broker: Door) -> None:
    until_blocking(lambda: broker.open_connections() == 0, 10, "earlier tests' connections to close")
    # Signed in (the sign-in deadline closes no slot while the test runs), from two addresses
    # (each under max_connections_per_address).
    sources = ["127.0.0.10", "127.0.0.11"]
    wires = [broker.signed_in(source=sources[i % 2]) for i in range(MAX_CONNECTIONS)]
    try:
        with broker.wire("127.0.0.12") as extra:
            started = time.monotonic()
            assert extra.closed()
            assert time.monotonic() - started < 2.0
        wires.pop().sock.close()
        until_blocking(lambda: broker.open_connections() == MAX_CONNECTIONS - 1, 10, "a slot to free")
        with broker.wire("127.0.0.12") as wire:
            assert wire.api_versions().error_code == 0
    finally:
        for wire in wires:
            wire.sock.close()


def test_one_connection_over_max_connections_per_address_is_closed_and_others_are_served(
    broker: Door,
) -> None:
    until_blocking(lambda: broker.open_connections() == 0, 10, "earlier tests' connections to close")
    wires = [broker.signed_in(source="127.0.0.20") for _ in range(MAX_CONNECTIONS_PER_ADDRESS)]
    try:
        with broker.wire("127.0.0.20") as extra:
            started = time.monotonic()
            assert extra.closed()
            assert time.monotonic() - started < 2.0
        # Another address is served while that one holds its share.
        with broker.signed_in(source="127.0.0.21") as other:
            assert other.metadata(["own-q"]).topics[0].error_code == 0
        wires.pop().sock.close()
        until_blocking(
            lambda: broker.open_connections() == MAX_CONNECTIONS_PER_ADDRESS - 1, 10, "a slot to free"
        )
        with broker.wire("127.0.0.20") as again:
            assert again.api_versions().error_code == 0
    finally:
        for wire in wires:
            wire.sock.close()


def test_a_name_the_user_has_no_right_on_is_refused_whether_or_not_it_exists(broker: Door) -> None:
    # As over HTTP (403 before any lookup): a refusal tells nothing of what exists.
    with broker.signed_in() as wire:
        for name in ("hidden-q", "no-such-q"):
            assert wire.metadata([name]).topics[0].error_code == 29, name
            assert wire.produce(name, batch(b"probe")).error_code == 29, name
            assert wire.ask(fetch_request(name), FetchResponse).responses[0].partitions[0].error_code == 29
            listed = wire.ask(list_offsets_request(name), ListOffsetsResponse)
            assert listed.topics[0].partitions[0].error_code == 29, name
            committed = wire.ask(commit_request("lim-probe", name, 1), OffsetCommitResponse)
            assert committed.topics[0].partitions[0].error_code == 29, name
            fetched = wire.ask(fetch_offsets_request("lim-probe", name), OffsetFetchResponse)
            assert fetched.topics[0].partitions[0].error_code == 29, name
        # A name the user may use is told missing (and a clients retries or creates it).
        assert wire.metadata(["own-nothing"]).topics[0].error_code == 3
        assert wire.produce("own-nothing", batch(b"probe")).error_code == 3
    assert broker.http("GET", "/v1/queues/own-nothing")[0] == 404


def test_offset_fetch_of_every_topic_names_none_the_user_may_not_read(broker: Door) -> None:
    # The group's cursor on hidden-q (the admin's doing), and one where the user may read.
    status, body = broker.http("PUT", "/v1/queues/hidden-q/subscriptions/kafka.lim-all", {"last_id": 1})
    assert status in (200, 201), body
    status, body = broker.http("PUT", "/v1/queues/ro-q/subscriptions/kafka.lim-all", {"last_id": 2})
    assert status in (200, 201), body
    with broker.signed_in() as wire:
        answer = wire.ask(OffsetFetchRequest(version=5, group_id="lim-all", topics=None), OffsetFetchResponse)
    assert answer.error_code == 0
    assert [
        (t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in answer.topics
    ] == [("ro-q", [(0, 3)])]


def test_a_user_name_cannot_forge_a_line_of_the_servers_log(broker: Door) -> None:
    forged = "1999-01-01 00:00:00,000 INFO capella.kafka.sasl: kafka signed in user=admin"
    with broker.wire("127.0.0.4") as wire:
        assert wire.sign_in(f"mallory\n{forged}", "wrong-password").error_code == 58
        assert wire.closed()
    log = broker.server.log()
    assert "kafka sign-in refused address=127.0.0.4 user='mallory\\n1999-01-01" in log
    assert not [line for line in log.splitlines() if line.startswith("1999-01-01")]


def test_a_group_or_client_id_cannot_forge_a_line_of_the_servers_log(broker: Door) -> None:
    forged = "1999-01-01 00:00:00,000 INFO capella.kafka.groups: group rebalanced group=lim-g"
    with broker.signed_in() as wire:
        wire.client_id = f"client\n{forged}"
        group = f"lim-forge\n{forged}"
        first = wire.ask(join_request(group), JoinGroupResponse)
        assert first.error_code == 79  # MEMBER_ID_REQUIRED: the member's id holds the client id
        joined = wire.ask(join_request(group, first.member_id), JoinGroupResponse)
        assert joined.error_code == 0
    log = broker.server.log()
    assert "group rebalancing group='lim-forge\\n1999-01-01" in log
    assert not [line for line in log.splitlines() if line.startswith("1999-01-01")]


def test_a_connection_that_does_not_sign_in_is_closed_at_the_deadline(broker: Door) -> None:
    with broker.wire() as idle, broker.wire() as trickle, broker.signed_in() as signed:
        opened = time.monotonic()
        assert idle.api_versions().error_code == 0  # served, but no sign-in follows
        # A frame that arrives a byte at a time does not push the deadline back (slowloris).
        trickle.sock.sendall(struct.pack(">i", 100))
        for _ in range(3):
            time.sleep(0.4)
            trickle.sock.sendall(b"\0")
        for wire in (idle, trickle):
            wire.sock.settimeout(SIGN_IN_TIMEOUT + SLACK)
            assert wire.closed(), "still open past the sign-in deadline"
            assert SIGN_IN_TIMEOUT - 0.5 <= time.monotonic() - opened <= SIGN_IN_TIMEOUT + SLACK
        # A signed-in connection idles past it and is served.
        assert signed.metadata(["own-q"]).topics[0].error_code == 0


def test_a_tls_handshake_that_never_comes_is_closed_at_the_sign_in_deadline(tls_broker: Door) -> None:
    with socket.create_connection(("127.0.0.1", tls_broker.server.kafka_port), timeout=TIMEOUT) as sock:
        started = time.monotonic()
        sock.settimeout(TLS_SIGN_IN_TIMEOUT + SLACK + 5)
        with contextlib.suppress(ConnectionResetError):  # closed, by a FIN or a reset
            assert sock.recv(1) == b""
        assert TLS_SIGN_IN_TIMEOUT - 0.1 <= time.monotonic() - started <= TLS_SIGN_IN_TIMEOUT + SLACK


# --- SaslHandshake v0 (kcat's librdkafka 2.0.2 needs it advertised) -------------------------


def kcat_sasl(door: Door, user: str, *args: str, data: str | None = None) -> subprocess.CompletedProcess[str]:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("needs kcat (make install-test-tools)")
    protocol = "SASL_PLAINTEXT" if door.pki is None else "SASL_SSL"
    sasl = ["-X", f"security.protocol={protocol}", "-X", "sasl.mechanisms=PLAIN"]
    sasl += ["-X", f"sasl.username={user}", "-X", f"sasl.password={PASSWORDS[user]}"]
    if door.pki is not None:
        sasl += ["-X", f"ssl.ca.location={door.pki.ca}"]
    return subprocess.run(
        [kcat, "-b", door.server.bootstrap, *sasl, *args],
        input=data,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_kcat_signs_in_with_sasl_plain_produces_and_consumes(broker: Door) -> None:
    # librdkafka before 2.10 signs in only when SaslHandshake v0 is advertised (then sends v1).
    produced = kcat_sasl(broker, "limited", "-P", "-t", "own-q", data="kcat-1\nkcat-2\n")
    assert produced.returncode == 0, produced.stderr
    consumed = kcat_sasl(broker, "limited", "-C", "-t", "own-q", "-o", "-2", "-e", "-f", "%o %s\n")
    assert consumed.returncode == 0, consumed.stderr
    ids = [m["id"] for m in broker.messages("own-q") if m["data"].startswith("kcat-")]
    assert consumed.stdout.splitlines() == [f"{ids[0]} kcat-1", f"{ids[1]} kcat-2"]
    refused = kcat_sasl(broker, "limited", "-P", "-t", "ro-q", data="not allowed\n")
    assert refused.returncode != 0
    assert "Topic authorization failed" in refused.stderr
    assert "not allowed" not in [m["data"] for m in broker.messages("ro-q")]


def test_sasl_handshake_v0_then_a_raw_plain_token_signs_in(broker: Door) -> None:
    with broker.wire() as wire:
        shake = wire.ask(SaslHandshakeRequest(version=0, mechanism="PLAIN"), SaslHandshakeResponse)
        assert (shake.error_code, list(shake.mechanisms)) == (0, ["PLAIN"])
        # v0: the token follows as a bare size-prefixed frame, answered by an empty one.
        token = f"\0limited\0{PASSWORDS['limited']}".encode()
        wire.sock.sendall(struct.pack(">i", len(token)) + token)
        assert wire.read_frame() == b""
        assert wire.metadata(["own-q"]).topics[0].error_code == 0
    with broker.wire("127.0.0.5") as wire:
        wire.ask(SaslHandshakeRequest(version=0, mechanism="PLAIN"), SaslHandshakeResponse)
        token = b"\0limited\0wrong-password"
        wire.sock.sendall(struct.pack(">i", len(token)) + token)
        assert wire.closed()  # v0 has no error answer: the connection is closed


def test_kcat_signs_in_over_tls(tls_broker: Door) -> None:
    produced = kcat_sasl(tls_broker, "alice", "-P", "-t", "shared-q", data="kcat over tls\n")
    assert produced.returncode == 0, produced.stderr
    listed = kcat_sasl(tls_broker, "alice", "-L", "-t", "shared-q")
    assert listed.returncode == 0 and 'topic "shared-q" with 1 partitions' in listed.stdout, listed
    assert tls_broker.messages("shared-q")[-1]["data"] == "kcat over tls"


def closed_by_error(door: Door) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", door.server.port, timeout=TIMEOUT * 4)
    credentials = base64.b64encode(f"admin:{PASSWORDS['admin']}".encode()).decode()
    try:
        connection.request("GET", "/metrics", headers={"Authorization": f"Basic {credentials}"})
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    for line in text.splitlines():
        if line.startswith('capella_protocol_closed_by_error_total{protocol="kafka"}'):
            return int(line.split()[-1])
    raise AssertionError("no Kafka closed-by-error counter in /metrics")


def test_a_flood_of_bad_frames_is_a_few_log_lines_not_one_each(broker: Door) -> None:
    before, lines = closed_by_error(broker), len(broker.server.log().splitlines())
    for _ in range(20):
        with broker.wire("127.0.0.30") as wire:
            wire.sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # 'GET ' announces a 1.1 GB frame
            assert wire.closed()
    until_blocking(lambda: closed_by_error(broker) == before + 20, 10, "20 connections closed by error")
    # Each was closed for its frame; the log says so in one line per window, with the count.
    added = broker.server.log().splitlines()[lines:]
    assert not [line for line in added if "127.0.0.30" in line], added
    assert len([line for line in added if "kafka connections closed" in line]) <= 1, added


def test_connections_still_in_their_tls_handshake_count_against_the_limits(tls_broker: Door) -> None:
    # Connections that never start the handshake hold the address's share...
    server = ("127.0.0.1", tls_broker.server.kafka_port)
    idle = [
        socket.create_connection(server, source_address=("127.0.0.40", 0))
        for _ in range(MAX_CONNECTIONS_PER_ADDRESS)
    ]
    try:
        until_blocking(
            lambda: tls_broker.open_connections() >= MAX_CONNECTIONS_PER_ADDRESS,
            10,
            "the handshakes to count",
        )
        # ... so one more is closed at once, not at the handshake's deadline.
        timeout = TLS_SIGN_IN_TIMEOUT + SLACK
        with socket.create_connection(server, timeout=timeout, source_address=("127.0.0.40", 0)) as extra:
            started = time.monotonic()
            with contextlib.suppress(ConnectionResetError):
                assert extra.recv(1) == b""
            assert time.monotonic() - started < TLS_SIGN_IN_TIMEOUT / 2
        # Another address completes its handshake and signs in.
        with tls_broker.signed_in("alice", source="127.0.0.41") as wire:
            assert wire.metadata(["shared-q"]).topics[0].error_code == 0
    finally:
        for sock in idle:
            sock.close()
