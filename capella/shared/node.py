"""This node's part in a shared cluster: the shared queues, their flusher, caches and listeners.

``SharedNode`` is the ``SharedHome`` the cluster asks for shared queues. At start it migrates
the schema (under a lock: nodes may start together), claims its name (a lease in
PostgreSQL: two live nodes with one name are refused), opens every shared queue defined and
listens for commits and definition changes from the other nodes. A poll every half second
stands behind NOTIFY, which is lost while the listening connection is down. Every
``compact_interval`` it runs a compaction pass (``compactor.py``) and a janitor pass
(``janitor.py``); advisory locks in PostgreSQL pick one node per queue, and one janitor.

PostgreSQL down at start does not stop the node: it serves its local queues, ``fault`` says
why the shared part is not up, and a supervised loop retries the migrate, claim and load with
a bounded backoff until PostgreSQL answers. Until then every call on shared queues answers
``StorageUnavailable`` (503), and so does looking up a queue this node cannot know yet.

The name lease's token is kept in the data dir (``shared-node.token``, written with
``capella.fsync``), under a lock file held for the process's life: the same node restarted
after ``kill -9`` reclaims its name at once, while another process with the same name (another
data dir, or this one while its owner still runs) holds another token and is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets as random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from capella.backoff import backoff
from capella.config import Config, SharedSettings
from capella.core.base_queue import BaseQueue
from capella.core.definition import QueueSettings, SealLimits, parse_definition
from capella.core.limits import MessageLimits
from capella.core.log.batch import Batch
from capella.core.loops import TaskFailures, keep_running
from capella.core.retention import Retention
from capella.core.shared_home import SharedHome
from capella.core.stats import SharedStats
from capella.errors import (
    CapellaError,
    CorruptData,
    InvalidConfig,
    NotFound,
    QueueNotFound,
    ShuttingDown,
    StorageTimeout,
    StorageUnavailable,
)
from capella.fsync import create_directories, open_private, write_atomic
from capella.shared import database
from capella.shared.cache import ObjectCache
from capella.shared.catalog import (
    DEFINITIONS_CHANNEL,
    NOTIFY_CHANNEL,
    Catalog,
    Committed,
    Segment,
    SubRow,
)
from capella.shared.compactor import Compactor
from capella.shared.database import Listener, Pool
from capella.shared.fault import POSTGRES, S3, Faults
from capella.shared.flusher import UNCERTAIN_FOR, Flusher, Pending
from capella.shared.janitor import Janitor
from capella.shared.queue import SharedQueue
from capella.shared.schema import migrate
from capella.shared.stamp import stamped
from capella.storage import Storage

log = logging.getLogger(__name__)
T = TypeVar("T")

# A cursor committed on one node: the others read it again (payload "queue:name").
CURSORS_CHANNEL = "capella_shared_subs"
LEASE = 10.0  # a node's claim on its name; renewed every RENEW
RENEW = 3.0
# The live nodes' Kafka addresses are read this often (while this node serves Kafka): a node
# that stopped is out of the list within this, one killed within its lease and this.
NODES_POLL = 1.0
POLL = 0.5  # the heads of watched queues, behind NOTIFY
DEFINITIONS_POLL = 2.0
# Stamped batches kept per node (their JSON and binary forms are made once), at most so many
# and so many bytes of them (a compacted block is one batch of up to its limits), and object bytes.
BATCHES = 2048
BATCH_BYTES = 256 * 1024 * 1024
OBJECT_CACHE = 256 * 1024 * 1024
OWN_OBJECTS_FOR = 30.0  # a node's own objects stay in memory this long: tail reads need no GET
# Bringing the shared part up again after PostgreSQL failed at start: 0.5 s, 1 s, ... at most 5 s.
START_RETRY_BASE = 0.25
START_RETRY_CAP = 5.0
# A failed S3 is probed this often (a GET of a key nobody writes) until it answers again.
S3_PROBE_EVERY = 1.0
PROBE_KEY = "shared-probe/none"
TOKEN_FILE = "shared-node.token"
TOKEN_LOCK = "shared-node.lock"
# A request waits for its flush at most write_timeout past the window (plus this), then 503.
ANSWER_MARGIN = 0.5
GOODBYE_WITHIN = 3.0  # what a stop gives PostgreSQL to hear the node leave


class SharedNode(SharedHome):
    def __init__(
        self,
        config: Config,
        settings: SharedSettings,
        mounts: dict[str, Storage],
        secrets: Any,
        *,
        url: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._settings = settings
        self._storage = mounts[settings.mount]
        self._secrets = secrets
        self._url = url
        self._clock = clock
        self._limits = MessageLimits.of(config.server)
        self._token = random.token_hex(16)
        self._token_lock: int | None = None
        self._queues: dict[str, SharedQueue] = {}
        self._created: dict[str, float] = {}  # when each queue was created, as PostgreSQL says
        self._base = QueueSettings()
        self._mounts: set[str] = set()
        self.cluster_name = ""
        self._stats = SharedStats()
        self._failures = TaskFailures()
        self._catalog: Catalog | None = None
        self._flusher: Flusher | None = None
        self.compactor: Compactor | None = None
        self.janitor: Janitor | None = None
        self._listeners: list[Listener] = []
        self._pool: Pool | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[None]] = set()
        self._watched: set[str] = set()
        self._objects = ObjectCache(OBJECT_CACHE, time.monotonic)
        self._batches: OrderedDict[tuple[str, int, int], tuple[Batch, int]] = OrderedDict()
        self._batch_bytes = 0
        self._faults = Faults(clock)
        self._up = False  # migrated, named, definitions loaded: the shared queues are served
        self._probe: asyncio.Task[bytes] | None = None
        self.replicas_moved = asyncio.Event()
        self._closing = False
        self._definitions_lock = asyncio.Lock()
        self._kafka: tuple[str, int] | None = None
        self._kafka_nodes: list[tuple[str, str, int]] = []

    # --- SharedHome ---------------------------------------------------------------------------

    async def start(self, cluster_name: str, base: QueueSettings, mounts: set[str]) -> None:
        self.cluster_name = cluster_name
        self._base = base
        self._mounts = mounts
        self._token, self._token_lock = await asyncio.to_thread(node_token, self._config.data_dir)
        target = database.target_of(self._settings, self._secrets)
        self._pool = pool = await database.open_pool(target)
        self._catalog = catalog = Catalog(pool)
        self._flusher = Flusher(
            self._settings,
            self._storage,
            catalog,
            own=cluster_name,
            write_timeout=self._config.storage.write_timeout,
            stats=self._stats,
            faults=self._faults,
            # An object is committed at most write_timeout + uncertain_for after its key was
            # made, well before the janitor may take it for an orphan (orphan_after after it).
            uncertain_for=min(
                UNCERTAIN_FOR, (self._settings.orphan_after - self._config.storage.write_timeout) / 2
            ),
            on_commit=self._committed,
            on_object=self._pin,
            clock=self._clock,
        )
        self._flusher.start(self._failures)
        self.compactor = Compactor(
            self._settings,
            self._storage,
            catalog,
            self._objects,
            own=cluster_name,
            stats=self._stats,
            clock=self._clock,
        )
        self.janitor = Janitor(
            self._settings, self._storage, catalog, self._objects, stats=self._stats, clock=self._clock
        )
        try:
            await self._bring_up()
        except StorageUnavailable as exc:
            # PostgreSQL is not there yet: serve the local queues and keep trying.
            self._faults.failed(POSTGRES, f"shared queues not started: {exc.message}")
            log.warning("shared node not started, retrying in the background: %s", exc.message)
            self._supervise("shared-start", self._start_loop)

    async def _bring_up(self) -> None:
        """Migrate, claim the name, listen, load the definitions, then run the node's loops."""
        catalog = self._need_catalog()
        assert self._pool is not None
        version = await migrate(self._pool)
        await self._claim(catalog)
        # Listening before the definitions are read: what another node defines from now on is
        # announced to this one, which is ready once this returns.
        await self._listen()
        await self._load_definitions()
        await self.poll_heads(list(self._queues))
        self._up = True
        self._faults.ok(POSTGRES)
        for name, body in (
            ("shared-listen", self._listen_loop),
            ("shared-poll", self._poll_loop),
            ("shared-lease", self._lease_loop),
            ("shared-compact", self._compact_loop),
            ("shared-janitor", self._janitor_loop),
            ("shared-kafka-nodes", self._kafka_nodes_loop),
        ):
            self._supervise(name, body)
        log.info(
            "shared node ready node=%s schema=%d queues=%d", self._settings.node, version, len(self._queues)
        )

    async def _start_loop(self) -> None:
        """``_bring_up`` until it works. A refusal (a name another live node holds, a schema too
        new) is shown and retried too, more slowly: nothing but the operator can end it."""
        failures = 0
        while not self._up and not self._closing:
            failures += 1
            await asyncio.sleep(backoff(failures, START_RETRY_BASE, START_RETRY_CAP))
            try:
                await self._bring_up()
            except CapellaError as exc:
                self._faults.failed(POSTGRES, f"shared queues not started: {exc.message}")
                self._stats.failures["start"] = self._stats.failures.get("start", 0) + 1
                if failures & (failures - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: a long outage logs little
                    log.warning("shared node still not started (attempt %d): %s", failures, exc.message)

    def _supervise(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        self._tasks.append(asyncio.create_task(keep_running(name, body, failures=self._failures), name=name))

    async def _claim(self, catalog: Catalog) -> None:
        # A node restarted after kill -9 finds its own old lease: it waits for it to run out. A
        # second live node with this name renews its lease all along, so this start is refused.
        deadline = time.monotonic() + LEASE + RENEW
        while True:
            holder = await catalog.claim_node(self._settings.node, self._token, self._url, LEASE, self._kafka)
            if holder is None:
                return
            if time.monotonic() >= deadline:
                raise InvalidConfig(
                    f"shared.node {self._settings.node!r} is the name of a node that is running "
                    f"({holder or 'no url'}): every node of a shared cluster needs a name of its own"
                )
            await asyncio.sleep(1.0)

    @property
    def node(self) -> str:
        return self._settings.node

    def queues(self) -> dict[str, BaseQueue]:
        return dict(self._queues)

    def publish_kafka(self, host: str, port: int) -> None:
        self._kafka = (host, port)
        if self._up:  # claimed already: renew now rather than at the next renewal
            self._spawn(self._renew_quietly())

    def kafka_nodes(self) -> list[tuple[str, str, int]]:
        return self._kafka_nodes

    async def create(self, name: str, definition: QueueSettings) -> tuple[BaseQueue, bool]:
        catalog = self._need()
        async with self._definitions_lock:
            created = await self._guard(catalog.create_queue(name, definition.to_dict()))
            if created:
                stale = self._queues.pop(name, None)  # one dropped elsewhere, not yet heard of here
                if stale is not None:
                    await stale.close()
                self._created.pop(name, None)  # the next reading of the definitions says when
                return self._open(name, definition), True
            await self._apply_definitions()
        queue = self._queues.get(name)
        if queue is None:
            raise QueueNotFound(f"no queue {name!r}")
        return queue, False

    async def update(self, queue: BaseQueue, definition: QueueSettings) -> None:
        if not await self._guard(self._need().update_queue(queue.name, definition.to_dict())):
            raise QueueNotFound(f"no queue {queue.name!r}")
        queue.definition = definition

    async def drop(self, name: str) -> None:
        await self._guard(self._need().drop_queue(name))
        self._created.pop(name, None)
        queue = self._queues.pop(name, None)
        if queue is not None:
            await queue.close()

    @property
    def fault(self) -> str | None:
        return self._faults.text

    @property
    def fault_since(self) -> float:
        return self._faults.since

    @property
    def fault_parts(self) -> list[str]:
        return self._faults.parts

    @property
    def ready(self) -> bool:
        return self._up

    def missing(self, name: str) -> CapellaError:
        if not self._up:
            return StorageUnavailable(
                f"queue {name!r}: not a local queue, and this node cannot tell whether it is a "
                f"shared one yet ({self._faults.text or 'starting'})"
            )
        return QueueNotFound(f"no queue {name!r}")

    @property
    def stats(self) -> SharedStats:
        return self._stats

    async def close(self) -> None:
        self._closing = True
        if self._flusher is not None:
            await self._flusher.close()
        if self._probe is not None:
            self._probe.cancel()
        for task in [*self._tasks, *self._spawned]:
            task.cancel()
        for task in [*self._tasks, *self._spawned]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in self._queues.values():
            await queue.close()
        listeners = list(self._listeners)
        try:
            # Bounded as a whole: a blackholed PostgreSQL must not hold the stop. The lease
            # then runs out by itself, or this node reclaims it at its next start (its token).
            async with asyncio.timeout(GOODBYE_WITHIN):
                await self._goodbye()
        except TimeoutError:
            log.warning("shared node: PostgreSQL gave no answer to the goodbye; connections dropped")
            for listener in listeners:
                listener.terminate()
            self._listeners = []
            if self._pool is not None:
                self._pool.terminate()
        if self._token_lock is not None:
            os.close(self._token_lock)
            self._token_lock = None

    # --- what the queues ask -------------------------------------------------------------------

    @property
    def flusher(self) -> Flusher:
        if self._flusher is None or self._closing:
            raise ShuttingDown("the shared node is not running")
        return self._flusher

    async def wait_committed(self, done: asyncio.Future[Committed]) -> Committed:
        """The commit of a flushed batch, or ``StorageTimeout`` once ``write_timeout`` has passed
        beyond the window (a flush before it may have held the flusher): the request is
        answered either way, and the batch may still be committed later, as with any 503."""
        within = self._config.storage.write_timeout + self._settings.flush_interval + ANSWER_MARGIN
        try:
            async with asyncio.timeout(within):
                return await asyncio.shield(done)
        except TimeoutError:
            done.add_done_callback(_forgotten)
            raise StorageTimeout(
                f"shared: the write was not confirmed within {within:g}s "
                f"({self._faults.text or 'the flush is slow'}); it may still be saved"
            ) from None

    def watch(self, queue: SharedQueue) -> None:
        """A reader waits on ``queue``: the poll behind NOTIFY includes it from now on."""
        self._watched.add(queue.name)

    async def segments_after(self, queue: str, after: int, limit: int) -> list[Segment]:
        return await self._guard(self._need().segments_after(queue, after, limit))

    async def batch_of(self, segment: Segment) -> Batch:
        """The segment's messages: a flush batch stamped with its ids, time and source,
        duplicates cut out, or a compacted block as it is (``stamp.stamped``)."""
        key = (segment.key, segment.byte_offset, segment.first_id)
        found = self._batches.get(key)
        if found is not None:
            self._batches.move_to_end(key)
            return found[0]
        objects = self._objects
        before = objects.stats.fetched_bytes, objects.stats.whole_gets + objects.stats.range_gets
        within = self._config.storage.write_timeout
        try:
            # Bounded like a write: a blackholed S3 holds no reader longer (the GET itself goes
            # on for the other readers of the object, and ends by the mount's own timeouts).
            # One whole-object GET serves every batch of the object, for every queue and reader
            # on this node (an object is one window of one node's writes): not one GET per read.
            async with asyncio.timeout(within):
                data = await objects.fetch(
                    segment.key,
                    segment.byte_offset,
                    segment.byte_size,
                    self._storage,
                    size=segment.object_size or None,
                    whole_below=self._settings.flush_bytes * 2,
                )
        except TimeoutError:
            raise StorageUnavailable(
                f"shared: S3 gave no answer within {within:g}s for {segment.key!r}"
            ) from None
        after = objects.stats
        self._stats.get_bytes += after.fetched_bytes - before[0]
        self._stats.gets += after.whole_gets + after.range_gets - before[1]
        try:
            batch = stamped(data, segment, self.cluster_name)
        except ValueError as exc:
            raise CorruptData(f"shared: segment {segment.first_id} of {segment.queue!r}: {exc}") from exc
        # Two readers that missed one segment both stamped it: one entry, its bytes counted once.
        raced = self._batches.pop(key, None)
        if raced is not None:
            self._batch_bytes -= raced[1]
        self._batches[key] = (batch, len(data))
        self._batch_bytes += len(data)
        while len(self._batches) > BATCHES or (self._batch_bytes > BATCH_BYTES and len(self._batches) > 1):
            _, (_, size) = self._batches.popitem(last=False)
            self._batch_bytes -= size
        return batch

    async def expire(self, queue: str, rule: Retention, now: float) -> tuple[int, int, int]:
        """Apply ``rule`` to ``queue``'s segments: ``(first id, segments gone, bytes freed)``."""
        catalog = self._need()
        cut = await self._guard(
            catalog.retention_cut(
                queue, before_time=rule.before(now), max_count=rule.max_messages, max_bytes=rule.max_bytes
            )
        )
        if cut <= 0:
            return 0, 0, 0
        gone = await self._guard(catalog.expire(queue, cut))
        if gone.segments:
            log.info(
                "shared queue expired queue=%s segments=%d first_id=%d", queue, gone.segments, gone.first_id
            )
        return gone.first_id, gone.segments, gone.bytes

    async def commit_cursor(
        self,
        queue: str,
        name: str,
        last_id: int | None,
        *,
        replica: bool | None,
        reset: bool,
        group: str | None = None,
        metadata: str | None = None,
    ) -> tuple[SubRow, bool]:
        catalog = self._need()
        found = await self._guard(
            catalog.commit_cursor(
                queue, name, last_id, replica=replica, reset=reset, group=group, metadata=metadata
            )
        )
        await self._announce_cursor(queue, name)
        return found

    async def take_producer_id(self) -> int:
        return await self._guard(self._need().take_producer_id())

    async def subscription_row(self, queue: str, name: str) -> SubRow | None:
        return await self._guard(self._need().subscription(queue, name))

    async def delete_subscription(self, queue: str, name: str) -> bool:
        deleted = await self._guard(self._need().delete_subscription(queue, name))
        if deleted:
            await self._announce_cursor(queue, name)
        return deleted

    async def _announce_cursor(self, queue: str, name: str) -> None:
        """Tell the other nodes a cursor of ``queue`` changed (or went): they read them again."""
        assert self._pool is not None
        # The other nodes poll too: a notice lost here makes them late, never wrong.
        with contextlib.suppress(StorageUnavailable):
            await self._pool.execute("select pg_notify($1, $2)", CURSORS_CHANNEL, f"{queue}:{name}")

    async def refresh_subscriptions(self, queue: SharedQueue) -> None:
        rows = await self._guard(self._need_catalog().subscriptions(queue.name))
        names = {row.name for row in rows}
        for sub in queue.subscriptions():
            if sub.name not in names:
                queue.noted(None, sub.name)
        for row in rows:
            queue.noted(row, row.name)

    # --- inside -------------------------------------------------------------------------------

    def _need_catalog(self) -> Catalog:
        if self._catalog is None or self._closing:
            raise ShuttingDown("the shared node is not running")
        return self._catalog

    def _need(self) -> Catalog:
        """The catalog, for calls on shared queues: only once the shared part is up."""
        catalog = self._need_catalog()
        if not self._up:
            raise StorageUnavailable(f"shared queues are not started yet: {self._faults.text or 'starting'}")
        return catalog

    async def _guard(self, call: Awaitable[T], within: float | None = None) -> T:
        """``call`` on PostgreSQL, ended after ``within`` seconds (``storage.write_timeout`` by
        default: a blackholed database holds no request longer), its outcome noted in the faults."""
        limit = self._config.storage.write_timeout if within is None else within
        try:
            async with asyncio.timeout(limit):
                found = await call
        except TimeoutError:
            where = self._pool.shown if self._pool is not None else "?"
            message = f"shared: postgres {where}: no answer within {limit:g}s"
            self._faults.failed(POSTGRES, message)
            raise StorageUnavailable(message) from None
        except StorageUnavailable as exc:
            self._faults.failed(POSTGRES, exc.message)
            raise
        self._faults.ok(POSTGRES)
        return found

    def _open(self, name: str, definition: QueueSettings) -> SharedQueue:
        queue = self._queues.get(name)
        if queue is None:
            queue = SharedQueue(name, definition, self, limits=self._limits, clock=self._clock)
            self._queues[name] = queue
        else:
            queue.definition = definition
        return queue

    def _pin(self, key: str, data: bytes) -> None:
        """This node's new object stays in memory a while: tail reads of it need no GET."""
        self._objects.pin(key, data, time.monotonic() + OWN_OBJECTS_FOR)

    def _committed(
        self, queue: str, result: Committed, pending: Pending, key: str, offset: int, object_size: int
    ) -> None:
        found = self._queues.get(queue)
        if found is not None:
            found.committed(result, pending.count, key, offset, len(pending.data), object_size)

    async def _load_definitions(self) -> None:
        # One at a time, and never across a create: a reload that read the definitions before
        # a create committed must not close the queue the create has just opened.
        async with self._definitions_lock:
            await self._apply_definitions()

    async def _apply_definitions(self) -> None:
        stored = await self._guard(self._need_catalog().defined())
        for name, (doc, created) in stored.items():
            try:
                definition = parse_definition(doc, self._base, self._mounts | {self._settings.mount})
            except CapellaError as exc:
                log.error("shared queue definition unreadable queue=%s: %s", name, exc.message)
                continue
            known = self._created.get(name)
            if known is not None and known != created and name in self._queues:
                # Dropped and created again while this node did not hear of the drop (two
                # notices read as one, or none while the LISTEN connection was down): the old
                # queue's cached segments and ids are not the new one's.
                log.info("shared queue created again queue=%s", name)
                await self._queues.pop(name).close()
            self._created[name] = created
            self._open(name, definition)
        for name in set(self._queues) - set(stored):
            queue = self._queues.pop(name)
            await queue.close()
        for name in set(self._created) - set(stored):
            del self._created[name]
        for queue in list(self._queues.values()):
            await self.refresh_subscriptions(queue)

    async def poll_heads(self, names: list[str]) -> None:
        """The named queues' ids as PostgreSQL has them now (``SharedQueue.head``)."""
        if not names:
            return
        heads = await self._guard(self._need_catalog().heads(names))
        for name, (first_id, next_id) in heads.items():
            queue = self._queues.get(name)
            if queue is not None:
                queue.head(first_id, next_id)

    async def _poll_loop(self) -> None:
        since_definitions = 0.0
        since_probe = S3_PROBE_EVERY
        while True:
            await asyncio.sleep(POLL)
            since_definitions += POLL
            since_probe += POLL
            try:
                if since_definitions >= DEFINITIONS_POLL:
                    since_definitions = 0.0
                    await self._load_definitions()
                    # Every queue's first id too: retention on another node moves it.
                    await self.poll_heads(list(self._queues))
                elif watched := sorted(self._watched & set(self._queues)):
                    await self.poll_heads(watched)
                elif POSTGRES in self._faults:
                    # Nothing to poll, but a fault to clear once PostgreSQL answers again.
                    await self._guard(self._need_catalog().heads([]), RENEW)
            except StorageUnavailable:
                self._stats.failures["poll"] = self._stats.failures.get("poll", 0) + 1
            if S3 in self._faults and since_probe >= S3_PROBE_EVERY:
                since_probe = 0.0
                await self._probe_s3()

    async def _probe_s3(self) -> None:
        """Whether S3 answers again, while no flush would tell: one GET of a missing key, one
        at a time (a blackholed GET holds its thread until the mount's own timeouts end it)."""
        flusher = self._flusher
        if flusher is None or not flusher.idle:
            return  # a flush under way says it soon enough
        if self._probe is not None and not self._probe.done():
            return
        self._probe = asyncio.create_task(self._storage.get(PROBE_KEY), name="shared-s3-probe")
        self._probe.add_done_callback(_retrieved)
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), max(1.0, self._config.storage.write_timeout))
        except NotFound:
            pass
        except (StorageUnavailable, TimeoutError):
            return
        if flusher.idle:
            self._faults.ok(S3)

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(RENEW)
            try:
                renewal = self._need().renew_node(self._settings.node, self._token, LEASE, self._kafka)
                if not await self._guard(renewal, min(RENEW, self._config.storage.write_timeout)):
                    log.error(
                        "shared node name taken over node=%s: is a second node running with it?",
                        self._settings.node,
                    )
                    await self._claim(self._need())
            except StorageUnavailable:
                self._stats.failures["lease"] = self._stats.failures.get("lease", 0) + 1

    async def _renew_quietly(self) -> None:
        with contextlib.suppress(StorageUnavailable):
            await self._guard(self._need().renew_node(self._settings.node, self._token, LEASE, self._kafka))
            await self._read_kafka_nodes()

    async def _read_kafka_nodes(self) -> None:
        found = await self._guard(
            self._need().kafka_nodes(), min(NODES_POLL, self._config.storage.write_timeout)
        )
        # The same list while nothing changed: the listener looks at its groups again only
        # when the list is another one.
        if found != self._kafka_nodes:
            self._kafka_nodes = found

    async def _kafka_nodes_loop(self) -> None:
        while True:
            if self._kafka is not None:
                try:
                    await self._read_kafka_nodes()
                except StorageUnavailable:
                    # The last list read stays: the groups stay where they are until it is read again.
                    self._stats.failures["kafka-nodes"] = self._stats.failures.get("kafka-nodes", 0) + 1
            await asyncio.sleep(NODES_POLL)

    def block_limits(self) -> dict[str, SealLimits]:
        """Each shared queue's block limits: what one compacted block of it holds at most."""
        return {name: queue.definition.block for name, queue in self._queues.items()}

    async def _compact_loop(self) -> None:
        compactor = self.compactor
        assert compactor is not None
        while True:
            await asyncio.sleep(self._settings.compact_interval)
            await compactor.run_once(self.block_limits())

    async def _janitor_loop(self) -> None:
        janitor = self.janitor
        assert janitor is not None
        while True:
            await asyncio.sleep(self._settings.compact_interval)
            await janitor.run_once()

    async def _listen(self) -> None:
        """LISTEN on every channel (``StorageUnavailable`` when PostgreSQL does not answer)."""
        channels = {
            NOTIFY_CHANNEL: self._on_commit_notice,
            DEFINITIONS_CHANNEL: self._on_definition_notice,
            CURSORS_CHANNEL: self._on_cursor_notice,
        }
        pool = self._pool
        assert pool is not None
        try:
            for channel, callback in channels.items():
                self._listeners.append(await pool.listen(channel, callback))
        except BaseException:
            await self._close_listeners()
            raise

    async def _listen_loop(self) -> None:
        while True:
            if not self._listeners:
                try:
                    await self._listen()
                except StorageUnavailable as exc:
                    self._stats.failures["listen"] = self._stats.failures.get("listen", 0) + 1
                    log.warning("shared listen failed, retrying: %s", exc.message)
                    await asyncio.sleep(1.0)
                    continue
            # Whatever was announced while no listener was up: definitions and heads, read now.
            with contextlib.suppress(StorageUnavailable):
                await self._load_definitions()
                await self.poll_heads(list(self._queues))
            lost = [asyncio.ensure_future(listener.lost.wait()) for listener in self._listeners]
            try:
                await asyncio.wait(lost, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in lost:
                    waiter.cancel()
            self._stats.failures["listen"] = self._stats.failures.get("listen", 0) + 1
            log.warning("shared listen connection lost: listening again")
            await self._close_listeners()
            await asyncio.sleep(0.2)

    async def _goodbye(self) -> None:
        """Release the name, close the listeners and the pool."""
        catalog = self._catalog
        if catalog is not None and self._up:
            with contextlib.suppress(CapellaError):
                await self._guard(catalog.release_node(self._settings.node, self._token), RENEW)
        await self._close_listeners()
        if self._pool is not None:
            await self._pool.close()

    async def _close_listeners(self) -> None:
        listeners, self._listeners = self._listeners, []
        await asyncio.gather(*(listener.close() for listener in listeners))

    def _on_commit_notice(self, payload: str) -> None:
        self._stats.notifications += 1
        name, _, next_id = payload.rpartition(":")
        queue = self._queues.get(name)
        if queue is not None and next_id.isdigit():
            queue.moved(int(next_id))

    def _on_definition_notice(self, payload: str) -> None:
        self._spawn(self._reload_quietly(payload))

    def _on_cursor_notice(self, payload: str) -> None:
        name, _, _ = payload.partition(":")
        queue = self._queues.get(name)
        if queue is not None:
            self._spawn(self._refresh_quietly(queue))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Work a notice starts: kept until done (a task nobody holds may be collected), its
        failure logged."""
        task = asyncio.get_running_loop().create_task(work)
        self._spawned.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._spawned.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._stats.failures["notice"] = self._stats.failures.get("notice", 0) + 1
            log.error("shared notice handling failed", exc_info=exc)

    async def _reload_quietly(self, name: str) -> None:
        # A queue dropped and created again starts over at id 1: its heads tell (SharedQueue.head).
        with contextlib.suppress(StorageUnavailable):
            await self._load_definitions()
            await self.poll_heads([name])

    async def _refresh_quietly(self, queue: SharedQueue) -> None:
        with contextlib.suppress(StorageUnavailable):
            await self.refresh_subscriptions(queue)
        self.replicas_moved.set()
        self.replicas_moved = asyncio.Event()


def node_token(data_dir: Path) -> tuple[str, int | None]:
    """This node's lease token and the lock that makes it this process's: the token kept in
    ``data_dir`` (made and fsync'd the first time), or a fresh one that is kept nowhere when
    another live process holds the data dir's lock (then its lease refuses this one)."""
    create_directories(data_dir)
    fd = open_private(data_dir / TOKEN_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return random.token_hex(16), None
    path = data_dir / TOKEN_FILE
    try:
        token = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        token = ""
    if len(token) != 32 or any(c not in "0123456789abcdef" for c in token):
        token = random.token_hex(16)
        write_atomic(path, token.encode())
    return token, fd


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A probe's outcome is read by whoever still waits for it; nobody else needs it."""
    if not task.cancelled():
        task.exception()


def _forgotten(done: asyncio.Future[Committed]) -> None:
    """A batch whose caller stopped waiting (503): what its flush decided is only logged."""
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.debug("a shared write answered 503 failed later too: %s", exc)
