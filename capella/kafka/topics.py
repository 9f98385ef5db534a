"""Topics and partitions as queues: a queue is a topic with one partition (0); a topic defined
with several (``PUT /v1/topics/{topic}``) has the queues ``<topic>~<n>`` as its partitions."""

from __future__ import annotations

from capella.core.base_queue import BaseQueue
from capella.core.cluster import Cluster
from capella.core.topic import partition_names, partition_of
from capella.errors import QueueNotFound, TopicNotFound, UnknownPartition


def partitions(cluster: Cluster, topic: str) -> list[str] | None:
    """The queue names of ``topic``'s partitions in order, or None when there is no such topic."""
    try:
        defined = cluster.topic(topic)
    except TopicNotFound:
        pass
    else:
        return partition_names(defined.name, defined.partitions)
    try:
        cluster.queue(topic)
    except QueueNotFound:
        return None
    return [topic]


def listed(cluster: Cluster) -> dict[str, list[str]]:
    """Every topic and its partitions' queue names: the queues that are no partition, and the
    defined topics."""
    found = {q.name: [q.name] for q in cluster.queues() if partition_of(q.name) is None}
    for topic in cluster.topics():
        found[topic.name] = partition_names(topic.name, topic.partitions)
    return found


def partition_queue(cluster: Cluster, topic: str, partition: int) -> BaseQueue:
    """The queue of one partition (``QueueNotFound`` / ``UnknownPartition``)."""
    names = partitions(cluster, topic)
    if names is None:
        raise QueueNotFound(f"no topic {topic!r}")
    if not 0 <= partition < len(names):
        raise UnknownPartition(f"topic {topic!r} has no partition {partition}")
    return cluster.queue(names[partition])
