"""Topics of several partitions: names, the start's repair, and the cluster's define/grow/drop.

The cluster tests run on a file mount and reopen it, as a restart does; the crash tests write
the registries as a kill -9 between two steps would have left them, then start again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.configs import file_config

from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.core.topic import Repair, partition_names, partition_of, repair
from capella.errors import InvalidName, InvalidRequest, NameTaken, QueueNotFound, TopicNotFound
from capella.storage.catalog import QUEUES, TOPICS
from capella.wire.decode import decode
from capella.wire.topics import TopicDefinition

# --- names and the repair: pure ------------------------------------------------------------


def test_a_partition_name_reads_back_as_its_topic_and_number() -> None:
    assert partition_names("orders", 3) == ["orders~0", "orders~1", "orders~2"]
    assert partition_of("orders~2") == ("orders", 2)
    assert partition_of("a.b-c~9999") == ("a.b-c", 9999)


@pytest.mark.parametrize(
    "name", ["orders", "orders~", "orders~01", "orders~10000", "~1", "a~1~2", "orders~-1"]
)
def test_only_topic_tilde_number_is_a_partition(name: str) -> None:
    assert partition_of(name) is None


DEFINITION = {"save": "wait"}
OTHER = {"save": "mark"}


def test_repair_of_registries_that_agree_is_nothing() -> None:
    queues = {"orders": (DEFINITION, "active"), "t~0": (DEFINITION, "active"), "t~1": (DEFINITION, "active")}
    assert repair({"t": (2, DEFINITION)}, queues) == Repair()


def test_repair_creates_what_a_topic_names_and_the_registry_lacks() -> None:
    # A define or an increase cut short after the topic document was written.
    found = repair({"t": (3, DEFINITION)}, {"t~0": (DEFINITION, "active")})
    assert found == Repair(missing=["t~1", "t~2"])


def test_repair_drops_partitions_of_no_topic_and_past_the_count() -> None:
    # A drop cut short after the topic document lost the topic; a plain queue is never touched.
    queues = {"gone~0": (DEFINITION, "active"), "t~0": (DEFINITION, "active"), "t~1": (DEFINITION, "active")}
    queues["plain"] = (DEFINITION, "active")
    assert repair({"t": (1, DEFINITION)}, queues) == Repair(orphans=["gone~0", "t~1"])


def test_repair_gives_a_partition_its_topics_definition() -> None:
    queues = {"t~0": (DEFINITION, "active"), "t~1": (OTHER, "active")}
    assert repair({"t": (2, DEFINITION)}, queues) == Repair(stale=["t~1"])


def test_a_partition_being_dropped_is_created_again_when_its_topic_names_it() -> None:
    queues = {"t~0": (OTHER, "dropping"), "gone~0": (DEFINITION, "dropping")}
    assert repair({"t": (1, DEFINITION)}, queues) == Repair(missing=["t~0"])


# --- the cluster --------------------------------------------------------------------------


def body(partitions: int, queue: dict[str, Any] | None = None) -> TopicDefinition:
    return decode({"partitions": partitions, **({} if queue is None else {"queue": queue})}, TopicDefinition)


async def started(tmp_path: Path) -> Cluster:
    return await Cluster.open(file_config(tmp_path))


async def test_define_creates_its_partition_queues_then_grows(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    try:
        topic, created = await cluster.define_topic("orders", body(2, {"save": "mark"}))
        assert created and topic.queues == ["orders~0", "orders~1"]
        assert [q.name for q in cluster.queues()] == ["orders~0", "orders~1"]
        assert cluster.queue("orders~1").definition.save is SaveMode.MARK

        topic, created = await cluster.define_topic("orders", body(3))
        assert not created and topic.partitions == 3
        # Fields left out keep the topic's values, in the new partition as in the old ones.
        assert {cluster.queue(q).definition.save for q in topic.queues} == {SaveMode.MARK}
        await cluster.define_topic("orders", body(3, {"save": "immediate"}))
        assert {cluster.queue(q).definition.save for q in topic.queues} == {SaveMode.IMMEDIATE}
        assert [t.name for t in cluster.topics()] == ["orders"]
    finally:
        await cluster.close()


async def test_partitions_are_never_removed(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    try:
        await cluster.define_topic("orders", body(3))
        with pytest.raises(InvalidRequest, match="never removed") as refused:
            await cluster.define_topic("orders", body(2))
        assert refused.value.details["field"] == "partitions"
        assert cluster.topic("orders").partitions == 3
        assert cluster.queue("orders~2").name == "orders~2"
    finally:
        await cluster.close()


async def test_a_shared_topic_is_refused(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    try:
        with pytest.raises(InvalidRequest, match="local queues") as refused:
            await cluster.define_topic("orders", body(2, {"storage": "shared"}))
        assert refused.value.details["field"] == "queue.storage"
        assert cluster.topics() == [] and cluster.queues() == []
    finally:
        await cluster.close()


async def test_drop_deletes_every_partition_and_its_data(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    try:
        await cluster.define_topic("orders", body(2))
        await cluster.queue("orders~1").append([Draft(payload=b"x")], SaveMode.IMMEDIATE)
        await cluster.drop_topic("orders")
        assert cluster.topics() == [] and cluster.queues() == []
        assert await cluster.home.list("orders~1/") == []
        with pytest.raises(TopicNotFound):
            cluster.topic("orders")
        with pytest.raises(TopicNotFound):
            await cluster.drop_topic("orders")
        # The name is free again, with no message of the old topic.
        await cluster.define_topic("orders", body(2))
        assert cluster.queue("orders~1").stats()["last_id"] == 0
    finally:
        await cluster.close()


async def test_a_topic_and_a_queue_never_share_a_name(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    try:
        await cluster.put_queue("orders", {})
        with pytest.raises(NameTaken, match="a queue is named 'orders'"):
            await cluster.define_topic("orders", body(2))
        await cluster.define_topic("events", body(2))
        with pytest.raises(NameTaken, match="a topic is named 'events'"):
            await cluster.put_queue("events", {})
        assert NameTaken.code == "name_taken"
    finally:
        await cluster.close()


async def test_a_partition_queue_is_neither_created_nor_dropped_as_a_queue(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    try:
        with pytest.raises(InvalidName, match="partition queues come from a topic definition"):
            await cluster.put_queue("orders~0", {})
        await cluster.define_topic("orders", body(1))
        with pytest.raises(InvalidName, match="topic definition"):
            await cluster.put_queue("orders~0", {"save": "mark"})
        with pytest.raises(InvalidName, match="topic definition"):
            await cluster.drop_queue("orders~0")
        with pytest.raises(InvalidName):
            await cluster.put_queue("orders~01", {})
        assert [q.name for q in cluster.queues()] == ["orders~0"]
    finally:
        await cluster.close()


async def test_a_restart_brings_back_topics_and_their_messages(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    await cluster.define_topic("orders", body(2, {"save": "mark"}))
    await cluster.queue("orders~1").append([Draft(payload=b"kept")], SaveMode.IMMEDIATE)
    await cluster.close()

    cluster = await started(tmp_path)
    try:
        topic = cluster.topic("orders")
        assert (topic.partitions, topic.definition.save) == (2, SaveMode.MARK)
        page = await cluster.queue("orders~1").read_after(0, 10)
        assert [m.payload for m in page.messages] == [b"kept"]
    finally:
        await cluster.close()


async def test_a_start_creates_the_partitions_a_crash_left_out(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    await cluster.define_topic("orders", body(2))
    # As a kill -9 after an increase wrote the topic document, before the queue registry.
    topics = await TOPICS.load(cluster.home)
    topics.topics["orders"] = msgspec.structs.replace(topics.topics["orders"], partitions=4)
    await TOPICS.save(cluster.home, topics)
    await cluster.close()

    cluster = await started(tmp_path)
    try:
        assert [q.name for q in cluster.queues()] == ["orders~0", "orders~1", "orders~2", "orders~3"]
        assert set((await QUEUES.load(cluster.home)).queues) == set(cluster.topic("orders").queues)
    finally:
        await cluster.close()


async def test_a_start_drops_partitions_whose_topic_a_crash_removed(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    await cluster.put_queue("plain", {})
    await cluster.define_topic("orders", body(2))
    await cluster.queue("orders~0").append([Draft(payload=b"x")], SaveMode.IMMEDIATE)
    # As a kill -9 during a drop, after the topic document lost the topic.
    topics = await TOPICS.load(cluster.home)
    del topics.topics["orders"]
    await TOPICS.save(cluster.home, topics)
    await cluster.close()

    cluster = await started(tmp_path)
    try:
        assert [q.name for q in cluster.queues()] == ["plain"]
        assert list((await QUEUES.load(cluster.home)).queues) == ["plain"]
        assert await cluster.home.list("orders~0/") == []
        with pytest.raises(QueueNotFound):
            cluster.queue("orders~0")
    finally:
        await cluster.close()


async def test_a_start_gives_partitions_the_definition_a_crash_did_not_reach(tmp_path: Path) -> None:
    cluster = await started(tmp_path)
    await cluster.define_topic("orders", body(2))
    topics = await TOPICS.load(cluster.home)
    entry = topics.topics["orders"]
    topics.topics["orders"] = msgspec.structs.replace(entry, definition={**entry.definition, "save": "none"})
    await TOPICS.save(cluster.home, topics)
    await cluster.close()

    cluster = await started(tmp_path)
    try:
        assert {cluster.queue(q).definition.save for q in ("orders~0", "orders~1")} == {SaveMode.NONE}
    finally:
        await cluster.close()
