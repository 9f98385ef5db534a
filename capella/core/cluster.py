"""The cluster: named mounts, the queue registry, and the periodic flush tick.

Queue definitions live in one registry document on the default mount (``QUEUES`` in
``capella.storage.catalog``). Queue names cannot start with ``.``, so the registry never
collides with a queue. A drop is recorded as ``dropping`` before any key is deleted, so a
crash half-way through finishes the drop on the next start instead of resurrecting half a
queue.

Topics of several partitions (``capella.core.topic``) are a second document, ``TOPICS``; their
partitions are queues of the queue registry. A change writes the topic document first and
the queue registry after, and a start repairs the registry from the topics, so a crash
between the two leaves no partition without its topic past the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from capella.cluster_name import cluster_name
from capella.config import Config
from capella.core.base_queue import BaseQueue
from capella.core.definition import QueueSettings, apply, check_name, default_definition, parse_definition
from capella.core.limits import MessageLimits
from capella.core.loops import TaskFailures, keep_running
from capella.core.producer_ids import LocalProducerIds, ProducerIds, SharedProducerIds
from capella.core.queue import Queue
from capella.core.shared_home import SharedHome
from capella.core.stats import Histogram, ProtocolStats
from capella.core.topic import Topic, partition_names, refuse_partition, repair
from capella.errors import (
    CapellaError,
    InvalidConfig,
    InvalidRequest,
    NameTaken,
    NotReady,
    QueueNotFound,
    SharedNotConfigured,
    TopicNotFound,
)
from capella.storage import Storage, keys, open_storage
from capella.storage.catalog import QUEUES, TOPICS
from capella.wire.records import QueueEntry, QueueRegistry, TopicEntry, TopicRegistry
from capella.wire.topics import TopicDefinition

log = logging.getLogger(__name__)


class Cluster:
    """One broker's queues on its mounts. Build it with ``await Cluster.open(config)``."""

    def __init__(
        self,
        config: Config,
        mounts: dict[str, Storage],
        clock: Callable[[], float],
        shared: SharedHome | None = None,
    ) -> None:
        self.ready = False
        # The shared queues ([shared]: capella/shared/), when this node is one of a shared cluster.
        self.shared = shared
        self.flush_latency = Histogram()
        self.task_failures = TaskFailures()
        # The counters of each front door beside HTTP that is on (``"kafka"``), for the metrics.
        self.doors: dict[str, ProtocolStats] = {}
        self._config = config
        self._mounts = mounts
        self._clock = clock
        self._queues: dict[str, Queue] = {}
        # The rules every message meets, whichever way it comes in (capella.core.limits).
        self.limits = MessageLimits.of(config.server)
        self._registry: dict[str, QueueEntry] = {}
        self._topics: dict[str, TopicEntry] = {}
        self._registry_lock = asyncio.Lock()
        self._base = default_definition(
            config.queue_defaults, config.default_mount, set(mounts), config.source
        )
        try:
            self._check_meta_mount(self._base)
        except InvalidRequest as exc:
            raise InvalidConfig(
                f"{config.source}: queue_defaults / storage.default_mount: {exc.message}"
            ) from None
        # Configured, or generated at the first start and kept in the data directory (only once
        # the configuration is known to be good, so a refused start leaves nothing behind).
        self.name = cluster_name(config)
        # The source of what this node's LOCAL queues mint. Every node of a shared cluster
        # carries one cluster name (the shared queues' source, their ids unique through
        # PostgreSQL), so there each node's local queues take the node's name too: two nodes'
        # local queues never mint one identity, and a copy of both into one queue keeps both.
        self.local_source = self.name if shared is None else f"{self.name}@{shared.node}"
        # Ids for producers that number their messages (the Kafka listener's InitProducerId):
        # leased on the default mount, or on a shared node from PostgreSQL, one id space for
        # every node and for its local queues as well as the shared ones.
        self.producer_ids: ProducerIds = (
            LocalProducerIds(self.home) if shared is None else SharedProducerIds(shared)
        )
        self._ticker: asyncio.Task[None] | None = None

    @classmethod
    def create(
        cls,
        config: Config,
        clock: Callable[[], float] = time.time,
        shared: Callable[[dict[str, Storage]], SharedHome] | None = None,
    ) -> Cluster:
        """The cluster with its mounts, not yet recovered (``ready`` is False until ``start``).

        ``shared`` builds the home of the shared queues on the mounts (the server passes it
        when ``[shared]`` is configured)."""
        mounts = {name: open_storage(m.provider, m.options) for name, m in config.mounts.items()}
        return cls(config, mounts, clock, None if shared is None else shared(mounts))

    @classmethod
    async def open(cls, config: Config, clock: Callable[[], float] = time.time) -> Cluster:
        cluster = cls.create(config, clock)
        await cluster.start()
        return cluster

    async def start(self) -> None:
        """Recover every queue, then start the periodic tick and report ready."""
        started = time.perf_counter()
        await self._recover()
        if self.shared is not None:
            await self.shared.start(self.name, self._base, set(self._mounts))
        self._ticker = asyncio.create_task(
            keep_running("tick", self._tick_loop, failures=self.task_failures), name="tick"
        )
        self.ready = True
        log.info(
            "cluster ready name=%s queues=%d recovery_seconds=%.3f",
            self.name,
            len(self._queues),
            time.perf_counter() - started,
        )

    @property
    def home(self) -> Storage:
        """The default mount, which holds the cluster's own registries."""
        return self._mounts[self._config.default_mount]

    @property
    def mounts(self) -> dict[str, Storage]:
        return dict(self._mounts)

    async def _recover(self) -> None:
        self._registry = (await QUEUES.load(self.home)).queues
        self._topics = (await TOPICS.load(self.home)).topics
        # The topics are written first (capella.core.topic): the queue registry follows them.
        found = repair(
            {name: (t.partitions, t.definition) for name, t in self._topics.items()},
            {name: (e.definition, e.state) for name, e in self._registry.items()},
        )
        for name in found.orphans:
            log.warning("partition queue of no topic dropped queue=%s", name)
            self._registry[name] = msgspec.structs.replace(self._registry[name], state="dropping")
        for name in found.stale:
            self._registry[name] = QueueEntry(definition=self._topics[name.partition("~")[0]].definition)
        for name, entry in sorted(self._registry.items()):
            definition = parse_definition(entry.definition, self._base, set(self._mounts))
            if entry.state == "dropping":
                await self._finish_drop(name, definition)
                continue
            self._queues[name] = await self._open_queue(name, definition)
        for name in found.missing:
            log.info("missing partition queue created queue=%s", name)
            stored = self._topics[name.partition("~")[0]].definition
            self._registry[name] = QueueEntry(definition=stored)
            self._queues[name] = await self._open_queue(
                name, parse_definition(stored, self._base, set(self._mounts))
            )
        await self._save_registry()

    async def _open_queue(self, name: str, definition: QueueSettings) -> Queue:
        return await Queue.open(
            name,
            definition,
            self._mounts,
            cluster_name=self.local_source,
            settings=self._config.storage,
            flush_latency=self.flush_latency,
            task_failures=self.task_failures,
            clock=self._clock,
            lookup=self._lookup,
            limits=self.limits,
        )

    async def close(self) -> None:
        """Flush every queue and close the mounts; nothing written is lost."""
        self.ready = False
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for queue in list(self._queues.values()):
            try:
                await queue.close()
            except CapellaError as exc:
                log.error("queue close failed queue=%s", queue.name, exc_info=exc)
        if self.shared is not None:
            try:
                await self.shared.close()
            except CapellaError as exc:
                log.error("shared queues close failed", exc_info=exc)
        for mount in self._mounts.values():
            await mount.close()

    async def _tick_loop(self) -> None:
        """Every ``flush_interval``, each queue's periodic pass; one queue's failure spares the others."""
        interval = self._config.storage.flush_interval
        while True:
            await asyncio.sleep(interval)
            for queue in list(self._queues.values()):
                try:
                    await queue.tick()
                except CapellaError as exc:
                    self.task_failures.add(f"tick:{queue.name}")
                    log.debug("periodic pass failed queue=%s: %s", queue.name, exc.message)
                except Exception as exc:
                    self.task_failures.add(f"tick:{queue.name}")
                    queue.last_error = f"periodic pass crashed: {exc!r}"
                    log.error("periodic pass crashed queue=%s", queue.name, exc_info=exc)

    # --- queues ----------------------------------------------------------------------------

    def queue(self, name: str) -> BaseQueue:
        self._check_ready()
        found: BaseQueue | None = self._queues.get(name)
        if found is None and self.shared is not None:
            found = self.shared.queues().get(name)
            if found is None:
                raise self.shared.missing(name)
        if found is None:
            raise QueueNotFound(f"no queue {name!r}")
        return found

    def _local(self, name: str) -> Queue:
        self._check_ready()
        try:
            return self._queues[name]
        except KeyError:
            raise QueueNotFound(f"no queue {name!r}") from None

    def _lookup(self, name: str) -> Queue:
        # For queues that reach other queues (dead letters), also while the cluster recovers.
        try:
            return self._queues[name]
        except KeyError:
            raise QueueNotFound(f"no queue {name!r}") from None

    def queues(self) -> list[BaseQueue]:
        self._check_ready()
        every: dict[str, BaseQueue] = {} if self.shared is None else dict(self.shared.queues())
        every.update(self._queues)
        return [every[name] for name in sorted(every)]

    def local_queues(self) -> list[Queue]:
        """The queues on this node's own mounts (block maintenance, delayed delivery, work queues)."""
        self._check_ready()
        return [self._queues[name] for name in sorted(self._queues)]

    async def put_queue(self, name: str, data: dict[str, Any]) -> tuple[BaseQueue, bool]:
        """Create the queue, or update its definition; ``True`` when it was created."""
        self._check_ready()
        refuse_partition(name, "created or changed")
        check_name(name)
        mounts = set(self._mounts)
        async with self._registry_lock:
            if name in self._topics:
                raise NameTaken(f"a topic is named {name!r}: a queue cannot take its name")
            shared = None if self.shared is None else self.shared.queues().get(name)
            queue = self._queues.get(name)
            if shared is not None and queue is None:
                return await self._put_shared(shared, data, mounts)
            if queue is not None:
                definition = parse_definition(data, queue.definition, mounts)
                if definition.shared:
                    raise InvalidRequest(
                        f"queue {name!r} is local: its storage cannot change", field="storage"
                    )
                if definition.meta_mount != queue.definition.meta_mount:
                    raise InvalidRequest(
                        "mounts.meta cannot change on an existing queue", field="mounts.meta"
                    )
                self._registry[name] = QueueEntry(definition=definition.to_dict())
                await self._save_registry()
                queue.definition = definition
                return queue, False
            definition = parse_definition(data, self._base, mounts)
            if definition.shared:
                if self.shared is None:
                    raise SharedNotConfigured(
                        f'queue {name!r}: "storage": "shared" needs a node configured with [shared] '
                        "(a PostgreSQL and an s3 mount: docs/shared.md)",
                        field="storage",
                    )
                created, fresh = await self.shared.create(name, definition)
                if not fresh:
                    return await self._put_shared(created, data, mounts)
                log.info("shared queue created queue=%s", name)
                return created, True
            self._check_meta_mount(definition)
            self._registry[name] = QueueEntry(definition=definition.to_dict())
            await self._save_registry()
            queue = await self._open_queue(name, definition)
            self._queues[name] = queue
            log.info("queue created queue=%s", name)
            return queue, True

    async def _put_shared(
        self, queue: BaseQueue, data: dict[str, Any], mounts: set[str]
    ) -> tuple[BaseQueue, bool]:
        assert self.shared is not None
        definition = parse_definition(data, queue.definition, mounts)
        if not definition.shared:
            raise InvalidRequest(
                f"queue {queue.name!r} is shared: its storage cannot change", field="storage"
            )
        await self.shared.update(queue, definition)
        return queue, False

    async def drop_queue(self, name: str) -> None:
        """Delete the queue and all its data."""
        refuse_partition(name, "dropped")
        async with self._registry_lock:
            if name not in self._queues and self.shared is not None and name in self.shared.queues():
                await self.shared.drop(name)
                log.info("shared queue dropped queue=%s", name)
                return
            queue = self._local(name)
            self._registry[name] = msgspec.structs.replace(self._registry[name], state="dropping")
            await self._save_registry()
            del self._queues[name]
            await queue.destroy()
            del self._registry[name]
            await self._save_registry()
            log.info("queue dropped queue=%s", name)

    # --- topics ----------------------------------------------------------------------------

    def topic(self, name: str) -> Topic:
        self._check_ready()
        try:
            entry = self._topics[name]
        except KeyError:
            raise TopicNotFound(f"no topic {name!r}") from None
        return self._topic(name, entry)

    def topics(self) -> list[Topic]:
        self._check_ready()
        return [self._topic(name, self._topics[name]) for name in sorted(self._topics)]

    def _topic(self, name: str, entry: TopicEntry) -> Topic:
        return Topic(
            name, entry.partitions, parse_definition(entry.definition, self._base, set(self._mounts))
        )

    async def define_topic(self, name: str, body: TopicDefinition) -> tuple[Topic, bool]:
        """Create the topic and its partition queues, or add partitions and change their
        definition; ``True`` when it was created. Partitions are never removed."""
        self._check_ready()
        check_name(name, "topic")
        mounts = set(self._mounts)
        async with self._registry_lock:
            if name in self._queues or (self.shared is not None and name in self.shared.queues()):
                raise NameTaken(f"a queue is named {name!r}: a topic cannot take its name")
            old = self._topics.get(name)
            base = self._base if old is None else parse_definition(old.definition, self._base, mounts)
            definition = base if body.queue is None else apply(body.queue, base, mounts)
            if definition.shared:
                raise InvalidRequest(
                    f"topic {name!r}: a topic's partitions are local queues; shared ones are not supported",
                    field="queue.storage",
                )
            self._check_meta_mount(definition)
            if old is not None:
                if body.partitions < old.partitions:
                    raise InvalidRequest(
                        f"topic {name!r} has {old.partitions} partitions: partitions can be added, "
                        f"never removed (asked for {body.partitions})",
                        field="partitions",
                    )
                if definition.meta_mount != base.meta_mount:
                    raise InvalidRequest(
                        "queue.mounts.meta cannot change on an existing topic", field="queue.mounts.meta"
                    )
            stored = definition.to_dict()
            self._topics[name] = TopicEntry(partitions=body.partitions, definition=stored)
            await self._save_topics()
            # The queue registry after the topic: a crash here is repaired by the next start.
            names = partition_names(name, body.partitions)
            for queue_name in names:
                self._registry[queue_name] = QueueEntry(definition=stored)
            await self._save_registry()
            for queue_name in names:
                queue = self._queues.get(queue_name)
                if queue is None:
                    self._queues[queue_name] = await self._open_queue(queue_name, definition)
                else:
                    queue.definition = definition
            log.info("topic %s name=%s partitions=%d", "updated" if old else "created", name, body.partitions)
            return self._topic(name, self._topics[name]), old is None

    async def drop_topic(self, name: str) -> None:
        """Delete the topic, its partition queues and all their data."""
        self._check_ready()
        async with self._registry_lock:
            entry = self._topics.get(name)
            if entry is None:
                raise TopicNotFound(f"no topic {name!r}")
            del self._topics[name]
            await self._save_topics()
            # The topic first: a crash from here on leaves queues of no topic, which a start drops.
            names = [q for q in partition_names(name, entry.partitions) if q in self._registry]
            for queue_name in names:
                self._registry[queue_name] = msgspec.structs.replace(
                    self._registry[queue_name], state="dropping"
                )
            await self._save_registry()
            for queue_name in names:
                queue = self._queues.pop(queue_name, None)
                if queue is not None:
                    await queue.destroy()
                    del self._registry[queue_name]
                else:  # in the registry, never opened (its open failed): its keys only
                    definition = parse_definition(
                        self._registry[queue_name].definition, self._base, set(self._mounts)
                    )
                    await self._finish_drop(queue_name, definition)
            await self._save_registry()
            log.info("topic dropped name=%s partitions=%d", name, entry.partitions)

    async def _finish_drop(self, name: str, definition: QueueSettings) -> None:
        for mount in {definition.meta_mount, *definition.marks.values()}:
            storage = self._mounts[mount]
            for key in await storage.list(keys.within(name)):
                await storage.delete(key)
        del self._registry[name]
        log.info("unfinished drop completed queue=%s", name)

    def _check_meta_mount(self, definition: QueueSettings) -> None:
        # Journals are appended to; object stores cannot append.
        provider = self._config.mounts[definition.meta_mount].provider
        if provider not in ("file", "memory"):
            raise InvalidRequest(
                f"mounts.meta: mount {definition.meta_mount!r} ({provider}) cannot hold journals; "
                "use a file or memory mount",
                field="mounts.meta",
            )

    def _check_ready(self) -> None:
        if not self.ready:
            raise NotReady("the cluster is still recovering its queues; retry shortly")

    async def _save_registry(self) -> None:
        await QUEUES.save(self.home, QueueRegistry(queues=self._registry))

    async def _save_topics(self) -> None:
        await TOPICS.save(self.home, TopicRegistry(topics=self._topics))
