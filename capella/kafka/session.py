"""What every Kafka request is answered with: the broker (shared by all connections) and the
session (one connection's signed-in user)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from capella.auth.rule import UNRESTRICTED, Identity
from capella.config import KafkaSettings
from capella.kafka.nodes import STANDALONE, KafkaNode, coordinator_of, live

if TYPE_CHECKING:
    from capella.auth.authenticator import Authenticator
    from capella.core.cluster import Cluster
    from capella.core.producer_ids import ProducerIds
    from capella.kafka.groups import Coordinator


@dataclass
class Broker:
    """This node as Kafka clients see it: the leader of every partition it serves, and the
    coordinator of every group, or on a shared cluster of the groups its rendezvous hash wins
    (``kafka/nodes.py``)."""

    cluster: Cluster
    settings: KafkaSettings
    coordinator: Coordinator
    authenticator: Authenticator | None
    # Frames after sign-in are bounded by the HTTP body limit (server.max_body_size).
    max_frame: int
    # Where InitProducerId takes producer ids (the cluster's persisted lease).
    producer_ids: ProducerIds | None = None
    node_id: int = STANDALONE
    # Where clients connect: [kafka] advertised, or the address the listener is bound to.
    host: str = "127.0.0.1"
    port: int = 9092
    # The live nodes as last built from the shared home's rows (rebuilt when those change).
    _rows: list[tuple[str, str, int]] | None = field(default=None, init=False, repr=False)
    _live: list[KafkaNode] = field(default_factory=list, init=False, repr=False)

    @property
    def cluster_id(self) -> str:
        return self.cluster.name

    @property
    def name(self) -> str:
        """This node's name in its shared cluster ("" for a standalone broker)."""
        return "" if self.cluster.shared is None else self.cluster.shared.node

    @property
    def me(self) -> KafkaNode:
        return KafkaNode(self.node_id, self.host, self.port, self.name)

    def live(self) -> list[KafkaNode]:
        """The live nodes of the shared cluster that serve Kafka, as PostgreSQL last listed
        them (the same list object until it changes); empty for a standalone broker."""
        shared = self.cluster.shared
        if shared is None:
            return self._live
        rows = shared.kafka_nodes()
        if rows is not self._rows:
            self._rows, self._live = rows, live(rows)
        return self._live

    def brokers(self) -> list[KafkaNode]:
        """Every broker a client may use, by name: this node at its own address, and the other
        live nodes of a shared cluster."""
        me = self.me
        others = [n for n in self.live() if n.name != me.name and n.node_id != me.node_id]
        return sorted([me, *others], key=lambda n: n.name)

    def coordinator_of(self, group: str) -> KafkaNode:
        """The node that coordinates ``group``: the live node of the shared cluster that wins
        the group's hash, or this one while none is known (a standalone broker, or a shared
        part not up yet: then this node takes every group, as a standalone one does)."""
        nodes = self.live()
        if not nodes:
            return self.me
        chosen = coordinator_of(group, nodes)
        return self.me if chosen.name == self.name else chosen

    def coordinates(self, group: str) -> bool:
        return self.coordinator_of(group).name == self.name


@dataclass
class Session:
    """One client connection: who it signed in as, and where it comes from."""

    broker: Broker
    address: str
    identity: Identity = UNRESTRICTED
    signed_in: bool = False
    # The SASL mechanism a SaslHandshake chose, until SaslAuthenticate uses it.
    mechanism: str | None = None
    # After a SaslHandshake v0 the next frame is the bare SASL token, not a request.
    raw_token: bool = False
    client_id: str | None = None
    # Set by SaslAuthenticate after a refusal: the listener closes the connection once answered.
    closing: bool = False
    groups: set[str] = field(default_factory=set)

    @property
    def needs_sign_in(self) -> bool:
        return self.broker.authenticator is not None and not self.signed_in
