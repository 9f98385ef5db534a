"""The brokers Kafka clients see: this node alone, or every live node of a shared cluster.

A standalone broker is node 0: the leader of every partition and the coordinator of every
group. On a shared cluster every node that serves Kafka records its advertised address with its
node lease in PostgreSQL (``SharedHome.publish_kafka``). Metadata from any node lists the live
ones, and the answering node names itself the leader of every partition, since any node serves
any shared queue (its local queues are its own anyway). A group's coordinator is the live node
that wins the group's rendezvous hash (highest random weight) over the live nodes' names: every
node computes the same answer from the same list without talking to the others, and when a node
comes or goes only the groups it wins or held move. A node's Kafka id is a hash of its name,
the same on every node and across restarts.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A standalone broker's node id.
STANDALONE = 0


@dataclass(frozen=True, slots=True)
class KafkaNode:
    """One broker as Metadata and FindCoordinator answer it; ``name`` is the shared node's."""

    node_id: int
    host: str
    port: int
    name: str = ""


def node_id(name: str) -> int:
    """A shared node's Kafka node id: 31 bits of the SHA-256 of its name (Kafka's ids are
    non-negative int32s). Two names of one id are found by ``live`` and logged."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def weight(node: str, group: str) -> int:
    """Node ``node``'s weight for ``group``: the group goes to the node of the highest."""
    key = f"{len(node)}:{node}:{group}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def coordinator_of(group: str, nodes: Sequence[KafkaNode]) -> KafkaNode:
    """The node of ``nodes`` that coordinates ``group`` (``nodes`` must not be empty)."""
    return max(nodes, key=lambda n: (weight(n.name, group), n.name))


def live(rows: Sequence[tuple[str, str, int]]) -> list[KafkaNode]:
    """The brokers of the rows ``SharedHome.kafka_nodes`` answers, in the rows' order (by name).

    Two names that hash to one id would make clients send one node's requests to the other:
    the first name by order keeps the id on every node, and the other is left out (logged).
    Two nodes advertising one address are logged too: a client reaches one of them for both,
    and a group call meant for the other is answered NOT_COORDINATOR again and again.
    """
    found: dict[int, KafkaNode] = {}
    addresses: dict[tuple[str, int], str] = {}
    for name, host, port in rows:
        node = KafkaNode(node_id(name), host, port, name)
        taken = found.get(node.node_id)
        if taken is not None:
            log.error(
                "kafka node id %d of shared node %s is also %s's: %s is not listed; rename one",
                node.node_id, name, taken.name, name,
            )  # fmt: skip
            continue
        found[node.node_id] = node
        other = addresses.setdefault((host, port), name)
        if other != name:
            log.error(
                "kafka address %s:%d of shared node %s is also %s's: give each node its own "
                "[kafka] advertised address",
                host, port, name, other,
            )  # fmt: skip
    return list(found.values())
