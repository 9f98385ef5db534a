"""Topics of several partitions: their partition queues' names, and what a start repairs.

A queue is a Kafka topic with one partition. A topic with several is an explicit definition
(``wire.topics.TopicDefinition``, kept in the topic registry, ``catalog.TOPICS``): its
partitions are queues of the queue registry named ``<topic>~<n>``. No queue name holds ``~``
(``wire.fields.NAME``), so nothing else can take a partition's name; only the topic creates,
changes and drops its partitions.

The two registries are two documents, so a change writes them in an order that a kill -9
between the two cannot turn into a lasting difference: the topic document first, the queue
registry after. A start then repairs what the queue registry lacks or has too much
(``repair``): a partition the topic names but the registry lacks is created (a define or an
increase cut short), a ``~`` queue no topic names is dropped (a topic drop cut short), and a
partition whose definition is not its topic's takes the topic's (an update cut short).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capella.core.definition import QueueSettings
from capella.errors import InvalidName
from capella.wire import fields

_PARTITION = re.compile(f"({fields.NAME})({fields.PARTITION_SUFFIX})")


def partition_name(topic: str, partition: int) -> str:
    return f"{topic}~{partition}"


def partition_names(topic: str, partitions: int) -> list[str]:
    """The queues of ``topic``'s partitions, in partition order."""
    return [partition_name(topic, n) for n in range(partitions)]


def partition_of(queue: str) -> tuple[str, int] | None:
    """``(topic, partition)`` when ``queue`` names a topic's partition (``orders~2``), else None."""
    match = _PARTITION.fullmatch(queue)
    return None if match is None else (match.group(1), int(match.group(2)[1:]))


def refuse_partition(name: str, doing: str) -> None:
    """A queue named with ``~`` is a topic's partition: only its topic may ``doing`` it."""
    if "~" not in name:
        return
    found = partition_of(name)
    topic = name.partition("~")[0] if found is None else found[0]
    raise InvalidName(
        f"queue name {name!r}: '~' names a partition of a topic; partition queues come from a topic "
        f"definition and cannot be {doing} on their own (PUT or DELETE /v1/topics/{topic})"
    )


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic as the cluster holds it: its partition count and its partitions' definition."""

    name: str
    partitions: int
    definition: QueueSettings

    @property
    def queues(self) -> list[str]:
        return partition_names(self.name, self.partitions)


@dataclass(frozen=True, slots=True)
class Repair:
    """What a start changes in the queue registry so that it agrees with the topics."""

    missing: list[str] = field(default_factory=list)  # partitions to create (with their topic's definition)
    orphans: list[str] = field(default_factory=list)  # ``~`` queues of no topic: to drop
    stale: list[str] = field(default_factory=list)  # partitions to give their topic's definition


def repair(
    topics: Mapping[str, tuple[int, dict[str, Any]]], queues: Mapping[str, tuple[dict[str, Any], str]]
) -> Repair:
    """``topics`` (name → partitions, stored definition) against the queue registry's entries
    (name → stored definition, state). A partition being dropped is never stale, and missing
    when its topic names it (the cluster finishes every drop before it creates)."""
    result = Repair()
    for name, (definition, state) in sorted(queues.items()):
        found = partition_of(name)
        if found is None:
            continue
        topic, partition = found
        if topic not in topics or partition >= topics[topic][0]:
            if state != "dropping":
                result.orphans.append(name)
        elif state != "dropping" and definition != topics[topic][1]:
            result.stale.append(name)
    for topic, (partitions, _) in sorted(topics.items()):
        # One being dropped is created again once its drop is finished.
        result.missing.extend(
            name
            for name in partition_names(topic, partitions)
            if name not in queues or queues[name][1] == "dropping"
        )
    return result
