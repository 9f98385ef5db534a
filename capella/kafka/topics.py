"""Topics and partitions as queues: a queue is a topic with one partition (0); a topic defined
with several (``PUT /v1/topics/{topic}``) has the queues ``<topic>~<n>`` as its partitions.

A partition is looked up for a caller with ``authorized_queue``: as HTTP answers 403 before it
looks anything up, a caller without the right is refused whether or not the topic exists, and
only one who may use the name learns that it does not.
"""

from __future__ import annotations

from capella.auth.rule import Identity
from capella.core.base_queue import BaseQueue
from capella.core.cluster import Cluster
from capella.core.topic import partition_names, partition_of
from capella.errors import Forbidden, QueueNotFound, TopicNotFound, UnknownPartition


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


def authorized_queue(
    identity: Identity, cluster: Cluster, topic: str, partition: int, action: str
) -> BaseQueue:
    """The queue of one partition if ``identity`` may ``action`` it (``Forbidden`` otherwise);
    ``QueueNotFound`` / ``UnknownPartition`` only to a caller with the right on the name or on
    one of the topic's partitions."""
    names = partitions(cluster, topic)
    if names is not None and 0 <= partition < len(names):
        if identity.can("queue", action, names[partition]):
            return cluster.queue(names[partition])
    elif identity.can("queue", action, topic) or any(identity.can("queue", action, n) for n in names or ()):
        return partition_queue(cluster, topic, partition)  # raises: no such topic or partition
    raise Forbidden(f"may not {action} topic {topic!r}")
