"""What every Kafka request is answered with: the broker (shared by all connections) and the
session (one connection's signed-in user)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from capella.auth.rule import UNRESTRICTED, Identity
from capella.config import KafkaSettings

if TYPE_CHECKING:
    from capella.auth.authenticator import Authenticator
    from capella.core.cluster import Cluster
    from capella.core.producer_ids import ProducerIds
    from capella.kafka.groups import Coordinator


@dataclass
class Broker:
    """This node as Kafka clients see it: one broker, the leader of every partition it serves,
    and the coordinator of every group."""

    cluster: Cluster
    settings: KafkaSettings
    coordinator: Coordinator
    authenticator: Authenticator | None
    # Frames after sign-in are bounded by the HTTP body limit (server.max_body_size).
    max_frame: int
    # Where InitProducerId takes producer ids (the cluster's persisted lease).
    producer_ids: ProducerIds | None = None
    node_id: int = 0
    # Where clients connect: [kafka] advertised, or the address the listener is bound to.
    host: str = "127.0.0.1"
    port: int = 9092

    @property
    def cluster_id(self) -> str:
        return self.cluster.name


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
