"""Where a cluster's shared queues live: the face ``capella.shared`` shows the cluster.

The cluster holds its local queues itself and asks a ``SharedHome`` for the shared ones; the
server builds the home (``capella.shared.node.SharedNode``) only when ``[shared]`` is configured,
so core never imports ``capella.shared``. A shared queue's definition lives in PostgreSQL: one
created, changed or dropped on any node shows up in every node's ``queues()``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from capella.core.base_queue import BaseQueue
from capella.core.definition import QueueSettings
from capella.core.stats import SharedStats
from capella.errors import CapellaError


class SharedHome(ABC):
    @property
    @abstractmethod
    def node(self) -> str:
        """This node's name among the nodes of its shared cluster (``[shared] node``)."""

    @abstractmethod
    async def start(self, cluster_name: str, base: QueueSettings, mounts: set[str]) -> None:
        """Migrate the schema, claim this node's name, open every shared queue defined."""

    @abstractmethod
    def queues(self) -> dict[str, BaseQueue]:
        """The shared queues defined now, by name (kept current from PostgreSQL)."""

    @abstractmethod
    async def create(self, name: str, definition: QueueSettings) -> tuple[BaseQueue, bool]:
        """Define the queue, or answer the one defined already (``False``)."""

    @abstractmethod
    async def update(self, queue: BaseQueue, definition: QueueSettings) -> None: ...

    @abstractmethod
    async def drop(self, name: str) -> None: ...

    @abstractmethod
    async def take_producer_id(self) -> int:
        """A producer id no node of the shared cluster ever answered (``core/producer_ids.py``),
        durable before it is answered; ``StorageUnavailable`` while the shared part is down."""

    @abstractmethod
    def publish_kafka(self, host: str, port: int) -> None:
        """Where this node serves Kafka clients (its advertised address): recorded with its
        node lease, at the claim or the next renewal, so every node lists it (``kafka_nodes``).
        The listener binds before the shared part may be up: this only keeps the address."""

    @abstractmethod
    def kafka_nodes(self) -> list[tuple[str, str, int]]:
        """``(node, host, port)`` of the live nodes serving Kafka clients, by node name, as last
        read from PostgreSQL (every second once an address is published), so no request waits
        for PostgreSQL; the same list object until it changes. Empty until first read."""

    @property
    @abstractmethod
    def fault(self) -> str | None:
        """Why shared queues cannot take writes now (PostgreSQL or S3 unreachable, or the
        shared part not started yet), or None."""

    @property
    @abstractmethod
    def fault_since(self) -> float:
        """UNIX seconds of the first failure of the faults ``fault`` names."""

    @property
    @abstractmethod
    def fault_parts(self) -> list[str]:
        """What fails: ``"postgres"``, ``"s3"`` (none when ``fault`` is None)."""

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Whether the shared part is up (it may start later than the node, when PostgreSQL
        was down at start)."""

    @abstractmethod
    def missing(self, name: str) -> CapellaError:
        """The error for ``name``, found neither among the local nor the shared queues:
        ``QueueNotFound``, or ``StorageUnavailable`` while the shared queues are not known yet."""

    @property
    @abstractmethod
    def stats(self) -> SharedStats:
        """The node's shared-queue counters (``capella.metrics`` renders them)."""

    @abstractmethod
    async def close(self) -> None:
        """Flush what is buffered, release the node's name, close the connections."""
