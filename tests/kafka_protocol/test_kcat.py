"""kcat (librdkafka 2.0.2, Debian's kcat 1.7.1) against a real ``capella serve`` with [kafka] on.

kcat is driven as a shell script would drive it: lines on stdin, lines on stdout, its exit
code. Every run is bounded by a subprocess timeout, and librdkafka's own waits are made short
(``topic.metadata.propagation.max.ms``: how long a produce to an unknown topic keeps asking
for it, 30 s by default), so a broker that never answers fails the test instead of hanging it.
What the HTTP API shows is read with plain urllib, beside it.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.kafka import KafkaServer, kafka_server

# Longest any one kcat run may take; each finishes in well under a second against a working broker.
RUN_TIMEOUT = 30.0
# What a group member runs with: a dead member is noticed in 6 s, not librdkafka's 45.
GROUP = ["-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    yield from kafka_server(tmp_path_factory.mktemp("kcat"))


@pytest.fixture(scope="module")
def creating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A broker that creates a queue for an unknown topic a client asks for."""
    yield from kafka_server(tmp_path_factory.mktemp("kcat-auto"), kafka={"auto_create_topics": True})


def kcat(
    server: KafkaServer, *args: str, stdin: str = "", check: bool = True
) -> subprocess.CompletedProcess[str]:
    """One kcat run against ``server``; a non-zero exit fails the test unless ``check`` is off."""
    done = subprocess.run(
        ["kcat", "-b", server.bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    if check:
        assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done


def http(server: KafkaServer, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.url}{path}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def http_status(server: KafkaServer, path: str) -> int:
    try:
        with urllib.request.urlopen(f"{server.url}{path}", timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def messages(server: KafkaServer, queue: str) -> list[dict[str, Any]]:
    """Every message of ``queue`` as ``GET /v1/queues/{queue}/messages`` shows it, page by page."""
    found: list[dict[str, Any]] = []
    after = 0
    for _ in range(100):
        page = http(server, "GET", f"/v1/queues/{queue}/messages?after={after}&limit=500")
        if not page["messages"]:
            return found
        found += page["messages"]
        after = page["last_id"]
    raise AssertionError(f"{queue} did not end after 100 pages")


def consumed(out: str) -> list[tuple[int, str, str]]:
    """``-f '%o %k %s\\n'`` lines as (offset, key, value)."""
    rows = []
    for line in out.splitlines():
        offset, key, value = line.split(" ", 2)
        rows.append((int(offset), key, value))
    return rows


def keyed_lines(count: int, tag: str) -> list[tuple[str, str]]:
    # Values with spaces, colons (only the first one splits key from value) and non-ASCII text.
    return [(f"{tag}-{i}", f"value {i}: ünïcødé ✓ {'x' * (i % 50)}") for i in range(count)]


def produce_lines(server: KafkaServer, topic: str, lines: list[tuple[str, str]], *args: str) -> None:
    kcat(server, "-P", "-t", topic, "-K:", *args, stdin="".join(f"{k}:{v}\n" for k, v in lines))


# --- K1: produce and consume from the beginning ---------------------------------------------


def test_keyed_lines_come_back_in_order_at_the_ids_http_shows(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/lines", {})
    lines = keyed_lines(1000, "k")
    produce_lines(broker, "lines", lines)

    out = kcat(broker, "-C", "-t", "lines", "-o", "beginning", "-e", "-f", "%o %k %s\\n").stdout
    rows = consumed(out)

    assert [(k, v) for _, k, v in rows] == lines
    stored = messages(broker, "lines")
    assert [m["id"] for m in stored] == [offset for offset, _, _ in rows]
    assert [(m["headers"]["kafka.key"], m["data"]) for m in stored] == lines


def test_an_absolute_or_relative_start_offset_is_an_id(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/starts", {})
    lines = keyed_lines(20, "s")
    produce_lines(broker, "starts", lines)
    ids = [m["id"] for m in messages(broker, "starts")]

    at = kcat(broker, "-C", "-t", "starts", "-o", str(ids[15]), "-e", "-f", "%o %k %s\\n").stdout
    last = kcat(broker, "-C", "-t", "starts", "-o", "-3", "-e", "-f", "%o %k %s\\n").stdout

    assert [(o, k, v) for o, k, v in consumed(at)] == [
        (i, *kv) for i, kv in zip(ids[15:], lines[15:], strict=True)
    ]
    assert [o for o, _, _ in consumed(last)] == ids[-3:]


def test_offset_zero_reads_from_the_first_id_while_nothing_is_deleted(broker: KafkaServer) -> None:
    # Ids start at 1, and offset 0 is the position before the first one (as a Kafka log's
    # start is 0): kcat -o 0 reads everything, whatever auto.offset.reset says.
    http(broker, "PUT", "/v1/queues/zero", {})
    lines = keyed_lines(3, "z")
    produce_lines(broker, "zero", lines)

    from_zero = kcat(broker, "-C", "-t", "zero", "-o", "0", "-e", "-f", "%o %k %s\\n")

    assert [(k, v) for _, k, v in consumed(from_zero.stdout)] == lines
    assert [o for o, _, _ in consumed(from_zero.stdout)] == [1, 2, 3]


def test_null_keys_null_values_and_repeated_headers_round_trip(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/nulls", {})
    # -Z: an empty key or value is sent as null; -H with no '=' is a header with a null value.
    kcat(
        broker, "-P", "-t", "nulls", "-K:", "-Z", "-H", "a=1", "-H", "a=2", "-H", "b=", "-H", "c",
        stdin="k1:v1\nk2:\n:v3\n",
    )  # fmt: skip

    out = kcat(broker, "-C", "-t", "nulls", "-o", "beginning", "-e", "-Z", "-f", "%k|%K|%s|%S|%h\n").stdout

    headers = "a=1,a=2,b=,c=NULL"
    assert out.splitlines() == [
        f"k1|2|v1|2|{headers}",
        f"k2|2|NULL|-1|{headers}",
        f"NULL|-1|v3|2|{headers}",
    ]


def test_messages_produced_over_http_read_with_a_null_key_and_their_headers(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/from_http", {})
    http(
        broker,
        "POST",
        "/v1/queues/from_http/messages?save=wait",
        {"messages": [{"data": "hello", "headers": {"h": "1"}}, {"data": "world"}]},
    )

    out = kcat(broker, "-C", "-t", "from_http", "-o", "beginning", "-e", "-Z", "-f", "%o|%k|%s|%h\n").stdout

    ids = [m["id"] for m in messages(broker, "from_http")]
    assert out.splitlines() == [f"{ids[0]}|NULL|hello|h=1", f"{ids[1]}|NULL|world|"]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_lines_compressed_by_librdkafka_2_0_come_back(broker: KafkaServer, codec: str) -> None:
    topic = f"packed_{codec}"
    http(broker, "PUT", f"/v1/queues/{topic}", {})
    # Repetitive lines, so that the compressed batch is the smaller one and is what is sent.
    lines = [(f"k{i}", f"{codec} line {i} " * 10) for i in range(200)]

    produce_lines(broker, topic, lines, "-X", f"compression.codec={codec}")

    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%o %k %s\\n").stdout
    assert [(k, v) for _, k, v in consumed(out)] == lines


# --- K2: metadata -------------------------------------------------------------------------


def test_metadata_lists_the_queue_with_one_partition_led_by_the_broker(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/listed", {})

    found = json.loads(kcat(broker, "-L", "-J", "-t", "listed").stdout)

    assert found["brokers"] == [{"id": 0, "name": broker.bootstrap}]
    assert [t["topic"] for t in found["topics"]] == ["listed"]
    (partition,) = found["topics"][0]["partitions"]
    assert partition["partition"] == 0
    assert partition["leader"] == 0
    assert partition["replicas"] == [{"id": 0}] and partition["isrs"] == [{"id": 0}]


def test_metadata_of_every_topic_lists_a_defined_topic_once_with_its_partitions(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/plain", {})
    http(broker, "PUT", "/v1/topics/parted", {"partitions": 3})

    found = json.loads(kcat(broker, "-L", "-J").stdout)

    topics = {t["topic"]: [p["partition"] for p in t["partitions"]] for t in found["topics"]}
    assert topics["plain"] == [0]
    assert topics["parted"] == [0, 1, 2]
    # Its partitions' queues are the topic's partitions, not topics of their own.
    assert not [name for name in topics if name.startswith("parted~")]


def test_a_line_produced_to_a_defined_topic_with_a_partition_lands_in_its_queue(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/topics/spread", {"partitions": 3})

    kcat(broker, "-P", "-t", "spread", "-p", "2", stdin="to two\n")

    assert [m["data"] for m in messages(broker, "spread~2")] == ["to two"]
    assert messages(broker, "spread~0") == [] and messages(broker, "spread~1") == []
    out = kcat(broker, "-C", "-t", "spread", "-p", "2", "-o", "beginning", "-e", "-f", "%p %s\\n").stdout
    assert out.splitlines() == ["2 to two"]


# --- K3: a group consumer run twice -----------------------------------------------------------


def test_a_group_consumer_resumes_where_its_last_run_committed(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/grouped", {})
    lines = keyed_lines(1000, "g")
    produce_lines(broker, "grouped", lines)
    # Not `-o beginning`: in -G mode kcat sets that offset on every assignment, over the
    # committed one (kcat.c rebalance_cb), so every run would start from the beginning.
    # auto.offset.reset applies only where the group has committed nothing.
    run = ["-G", "g", *GROUP, "-X", "auto.offset.reset=earliest", "-e", "-f", "%o %k %s\\n", "grouped"]

    first = consumed(kcat(broker, *run).stdout)
    second = consumed(kcat(broker, *run).stdout)

    stored = messages(broker, "grouped")
    assert [(k, v) for _, k, v in first] == lines
    assert second == []
    cursor = http(broker, "GET", "/v1/queues/grouped/subscriptions/kafka.g")
    assert cursor["last_id"] == stored[-1]["id"]
    # And the next run starts right after it, at what came since.
    produce_lines(broker, "grouped", [("more", "after the commit")])
    third = consumed(kcat(broker, *run).stdout)
    assert third == [(messages(broker, "grouped")[-1]["id"], "more", "after the commit")]


def test_a_subscription_moved_over_http_moves_the_group(broker: KafkaServer) -> None:
    http(broker, "PUT", "/v1/queues/moved", {})
    lines = keyed_lines(10, "m")
    produce_lines(broker, "moved", lines)
    ids = [m["id"] for m in messages(broker, "moved")]
    http(broker, "PUT", "/v1/queues/moved/subscriptions/kafka.mover", {"last_id": ids[6]})

    run = ["-G", "mover", *GROUP, "-X", "auto.offset.reset=earliest", "-e", "-f", "%o %k %s\\n", "moved"]
    rows = consumed(kcat(broker, *run).stdout)

    assert rows == [(i, *kv) for i, kv in zip(ids[7:], lines[7:], strict=True)]


# --- topics that do not exist -------------------------------------------------------------------


def test_a_produce_to_an_unknown_topic_fails_at_once_without_creating_it(broker: KafkaServer) -> None:
    done = kcat(
        broker, "-P", "-t", "nowhere", "-X", "topic.metadata.propagation.max.ms=1000",
        stdin="lost\n", check=False,
    )  # fmt: skip

    assert done.returncode != 0
    assert "Unknown topic or partition" in done.stderr
    assert http_status(broker, "/v1/queues/nowhere") == 404


def test_a_produce_to_an_unknown_topic_creates_its_queue_when_configured(creating: KafkaServer) -> None:
    assert http_status(creating, "/v1/queues/fresh") == 404

    produce_lines(
        creating, "fresh", [("a", "first"), ("b", "second")], "-X", "topic.metadata.propagation.max.ms=1000"
    )

    stored = messages(creating, "fresh")
    assert [(m["headers"]["kafka.key"], m["data"]) for m in stored] == [("a", "first"), ("b", "second")]
    listed = json.loads(kcat(creating, "-L", "-J", "-t", "fresh").stdout)
    assert [len(t["partitions"]) for t in listed["topics"]] == [1]


def test_a_consumer_of_an_unknown_topic_creates_nothing(creating: KafkaServer) -> None:
    # librdkafka's consumers ask without AllowAutoTopicCreation (allow.auto.create.topics=false).
    done = kcat(creating, "-C", "-t", "unasked", "-o", "beginning", "-e", "-m", "2", check=False)

    assert done.returncode != 0
    assert "Unknown topic or partition" in done.stderr
    assert http_status(creating, "/v1/queues/unasked") == 404


# --- ids after a crash ----------------------------------------------------------------------------


def test_offsets_after_a_kill_jump_the_ids_gap_and_consumers_step_over_it(tmp_path: Path) -> None:
    server = KafkaServer(tmp_path)
    try:
        server.wait_ready()
        http(server, "PUT", "/v1/queues/gap", {})
        produce_lines(server, "gap", [("a", "before 1"), ("b", "before 2")])
        run = ["-G", "gapped", *GROUP, "-X", "auto.offset.reset=earliest", "-e", "-f", "%o %k %s\\n", "gap"]
        assert len(consumed(kcat(server, *run).stdout)) == 2
        server.kill()
        server = server.again()
        server.wait_ready()
        produce_lines(server, "gap", [("c", "after 1"), ("d", "after 2")])

        everything = consumed(
            kcat(server, "-C", "-t", "gap", "-o", "beginning", "-e", "-f", "%o %k %s\\n").stdout
        )
        resumed = consumed(kcat(server, *run).stdout)
        ids = [m["id"] for m in messages(server, "gap")]
    finally:
        server.stop()

    offsets = [o for o, _, _ in everything]
    assert offsets == ids
    # Numbering resumed past the id lease the killed process held: a gap, which Kafka
    # consumers take for offsets compacted away.
    assert offsets[2] > offsets[1] + 1
    assert [(k, v) for _, k, v in everything] == [
        ("a", "before 1"), ("b", "before 2"), ("c", "after 1"), ("d", "after 2")
    ]  # fmt: skip
    # The group's commit from before the kill holds: it reads only what came after.
    assert resumed == everything[2:]
