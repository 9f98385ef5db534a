"""A Kafka client asking while the queues still recover at start: Metadata answers, retriably.

In process: a real cluster created and not yet started (``ready`` is False, as between the
listener's bind and the end of recovery), and a Metadata request decoded by kafka-python's
protocol module as a client sends it.
"""

from __future__ import annotations

from pathlib import Path

from kafka.protocol.metadata import MetadataRequest
from support.configs import file_config

from capella.config import KafkaSettings
from capella.core.cluster import Cluster
from capella.kafka import errors
from capella.kafka.groups import Coordinator
from capella.kafka.metadata import metadata
from capella.kafka.session import Broker, Session


def recovering(tmp_path: Path) -> Session:
    cluster = Cluster.create(file_config(tmp_path))
    assert not cluster.ready
    broker = Broker(cluster, KafkaSettings(), Coordinator(), None, max_frame=1 << 20)
    return Session(broker, "127.0.0.1")


async def test_metadata_for_a_named_topic_is_leader_not_available_while_queues_recover(
    tmp_path: Path,
) -> None:
    request = MetadataRequest(
        version=8,
        topics=[MetadataRequest.MetadataRequestTopic(name="orders")],
        allow_auto_topic_creation=False,
    )
    answer = await metadata(recovering(tmp_path), request, 8)
    assert [(t["name"], t["error_code"]) for t in answer["topics"]] == [
        ("orders", errors.LEADER_NOT_AVAILABLE)
    ]
    assert [b["port"] for b in answer["brokers"]] == [9092]


async def test_metadata_for_every_topic_lists_none_while_queues_recover(tmp_path: Path) -> None:
    request = MetadataRequest(version=8, topics=None, allow_auto_topic_creation=False)
    answer = await metadata(recovering(tmp_path), request, 8)
    assert answer["topics"] == []
