"""Metadata: the brokers (this node, and on a shared cluster every live node serving Kafka) and
the topics a client may see, each partition led by the node that answers (``kafka/nodes.py``)."""

from __future__ import annotations

from typing import Any

from capella.errors import CapellaError
from capella.kafka import errors
from capella.kafka.session import Session
from capella.kafka.topics import listed, partitions

# Kafka's "authorized operations were not asked for" (INT32_MIN: the codec's None).
NOT_ASKED = None


async def metadata(session: Session, request: Any, version: int) -> dict[str, Any]:
    broker = session.broker
    identity = session.identity
    asked = request.topics
    topics: list[dict[str, Any]] = []
    # v0: an empty list means every topic; v1+: null does (and an empty list none).
    if asked is None or (version == 0 and not asked):
        # While the queues recover at start there is nothing to list yet (the client asks again).
        every = listed(broker.cluster) if broker.cluster.ready else {}
        for name, queues in sorted(every.items()):
            if any(identity.can("queue", "read", q) or identity.can("queue", "write", q) for q in queues):
                topics.append(_topic(session, name, queues))
    else:
        auto = version >= 4 and bool(request.allow_auto_topic_creation)
        for item in asked:
            topics.append(await described(session, item.name, auto=auto))
    return {
        "throttle_time_ms": 0,
        "brokers": [
            {"node_id": node.node_id, "host": node.host, "port": node.port, "rack": None}
            for node in broker.brokers()
        ],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "topics": topics,
        "authorized_operations": NOT_ASKED,
    }


async def described(session: Session, name: str, *, auto: bool) -> dict[str, Any]:
    """One asked-for topic: its partitions, or why there are none."""
    cluster = session.broker.cluster
    try:
        queues = partitions(cluster, name)
    except CapellaError as exc:  # NotReady while the queues recover: LEADER_NOT_AVAILABLE, retried
        return _error(name, errors.code_for(exc))
    identity = session.identity
    if queues is None:
        if auto and session.broker.settings.auto_create_topics:
            if not identity.can("queue", "admin", name):
                return _error(name, errors.TOPIC_AUTHORIZATION_FAILED)
            try:
                await cluster.put_queue(name, {})
            except CapellaError as exc:
                return _error(name, errors.code_for(exc))
            queues = [name]
        elif identity.can("queue", "read", name) or identity.can("queue", "write", name):
            return _error(name, errors.UNKNOWN_TOPIC_OR_PARTITION)
        else:
            # Refused as an existing one is: the answer tells nobody without a right what exists.
            return _error(name, errors.TOPIC_AUTHORIZATION_FAILED)
    if not any(identity.can("queue", "read", q) or identity.can("queue", "write", q) for q in queues):
        return _error(name, errors.TOPIC_AUTHORIZATION_FAILED)
    return _topic(session, name, queues)


def _topic(session: Session, name: str, queues: list[str]) -> dict[str, Any]:
    node = session.broker.node_id
    return {
        "error_code": errors.NONE,
        "name": name,
        "is_internal": False,
        "partitions": [
            {
                "error_code": errors.NONE,
                "partition_index": index,
                "leader_id": node,
                "leader_epoch": 0,
                "replica_nodes": [node],
                "isr_nodes": [node],
                "offline_replicas": [],
            }
            for index in range(len(queues))
        ],
        "authorized_operations": NOT_ASKED,
    }


def _error(name: str, code: int) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "is_internal": False,
        "partitions": [],
        "authorized_operations": NOT_ASKED,
    }
