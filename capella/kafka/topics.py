"""Topics and partitions as queues: a queue is a topic with one partition (0)."""

from __future__ import annotations

from capella.core.base_queue import BaseQueue
from capella.core.cluster import Cluster
from capella.errors import QueueNotFound, UnknownPartition


def partitions(cluster: Cluster, topic: str) -> list[str] | None:
    """The queue names of ``topic``'s partitions in order, or None when there is no such topic."""
    try:
        cluster.queue(topic)
    except QueueNotFound:
        return None
    return [topic]


def listed(cluster: Cluster) -> dict[str, list[str]]:
    """Every topic and its partitions' queue names."""
    return {queue.name: [queue.name] for queue in cluster.queues()}


def partition_queue(cluster: Cluster, topic: str, partition: int) -> BaseQueue:
    """The queue of one partition (``QueueNotFound`` / ``UnknownPartition``)."""
    names = partitions(cluster, topic)
    if names is None:
        raise QueueNotFound(f"no topic {topic!r}")
    if not 0 <= partition < len(names):
        raise UnknownPartition(f"topic {topic!r} has no partition {partition}")
    return cluster.queue(names[partition])
