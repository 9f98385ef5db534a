"""Topics on the wire: a topic of several partitions, each partition a queue of its own.

A queue is a Kafka topic with one partition. A topic with several is this explicit
definition: its partitions are the queues ``<topic>~0`` .. ``<topic>~<partitions - 1>``
(``fields.PARTITION_SUFFIX``), all with the topic's queue definition. Partitions can be added,
never removed (as in Kafka: a key's partition would move).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from capella.wire.queues import QueueDefinition
from capella.wire.struct import Struct

MAX_PARTITIONS = 1000

Partitions = Annotated[
    int,
    Meta(ge=1, le=MAX_PARTITIONS, description="how many partitions (queues); can grow, never shrink"),
]


class TopicDefinition(Struct, forbid_unknown_fields=True):
    """A topic: its partition count and the definition of every partition's queue."""

    partitions: Partitions
    queue: (
        Annotated[
            QueueDefinition,
            Meta(
                description="every partition's queue definition, as a queue's PUT body; fields left "
                "out keep their current (or default) values. Local storage only"
            ),
        ]
        | None
    ) = None


class TopicInfo(Struct):
    """A topic: its partitions' queues in partition order, and their definition (fully resolved)."""

    name: str
    partitions: int
    queues: list[str]
    definition: QueueDefinition


class TopicList(Struct):
    """Every topic the caller may read."""

    topics: list[TopicInfo]
