"""This node's part in a shared cluster: the shared queues, their flusher, caches and listeners.

``SharedNode`` is the ``SharedHome`` the cluster asks for shared queues. At start it migrates
the schema (under a lock: nodes may start together), claims its name (a lease in
PostgreSQL: two live nodes with one name are refused), opens every shared queue defined and
listens for commits and definition changes from the other nodes. A poll every half second
stands behind NOTIFY, which is lost while the listening connection is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets as random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from capella.config import Config, SharedSettings
from capella.core.base_queue import BaseQueue
from capella.core.definition import QueueSettings, parse_definition
from capella.core.limits import MessageLimits
from capella.core.log.batch import Batch
from capella.core.loops import TaskFailures, keep_running
from capella.core.shared_home import SharedHome
from capella.core.stats import SharedStats
from capella.errors import (
    CapellaError,
    InvalidConfig,
    QueueNotFound,
    ShuttingDown,
    StorageUnavailable,
)
from capella.records import record_batch
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
from capella.shared.database import Listener, Pool
from capella.shared.flusher import Flusher, Pending
from capella.shared.queue import SharedQueue
from capella.shared.schema import migrate
from capella.storage import Storage

log = logging.getLogger(__name__)
T = TypeVar("T")

# A cursor committed on one node: the others read it again (payload "queue:name").
CURSORS_CHANNEL = "capella_shared_subs"
LEASE = 10.0  # a node's claim on its name; renewed every RENEW
RENEW = 3.0
POLL = 0.5  # the heads of watched queues, behind NOTIFY
DEFINITIONS_POLL = 5.0
# Stamped batches kept per node (their JSON and binary forms are made once), and object bytes.
BATCHES = 2048
OBJECT_CACHE = 256 * 1024 * 1024
OWN_OBJECTS_FOR = 30.0  # a node's own objects stay in memory this long: tail reads need no GET


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
        self._queues: dict[str, SharedQueue] = {}
        self._base = QueueSettings()
        self._mounts: set[str] = set()
        self.cluster_name = ""
        self._stats = SharedStats()
        self._failures = TaskFailures()
        self._catalog: Catalog | None = None
        self._flusher: Flusher | None = None
        self._listeners: list[Listener] = []
        self._pool: Pool | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[None]] = set()
        self._watched: set[str] = set()
        self._objects = ObjectCache(OBJECT_CACHE, time.monotonic)
        self._batches: OrderedDict[tuple[str, int, int], Batch] = OrderedDict()
        self._fault: str | None = None
        self.fault_since = 0.0
        self.replicas_moved = asyncio.Event()
        self._closing = False

    # --- SharedHome ---------------------------------------------------------------------------

    async def start(self, cluster_name: str, base: QueueSettings, mounts: set[str]) -> None:
        self.cluster_name = cluster_name
        self._base = base
        self._mounts = mounts
        target = database.target_of(self._settings, self._secrets)
        self._pool = pool = await database.open_pool(target)
        self._catalog = catalog = Catalog(pool)
        version = await migrate(pool)
        await self._claim(catalog)
        self._flusher = Flusher(
            self._settings,
            self._storage,
            catalog,
            own=cluster_name,
            write_timeout=self._config.storage.write_timeout,
            stats=self._stats,
            on_commit=self._committed,
            on_object=self._pin,
            clock=self._clock,
        )
        self._flusher.start()
        await self._load_definitions()
        await self._poll_heads(list(self._queues))
        for name, body in (
            ("shared-listen", self._listen_loop),
            ("shared-poll", self._poll_loop),
            ("shared-lease", self._lease_loop),
        ):
            self._tasks.append(
                asyncio.create_task(keep_running(name, body, failures=self._failures), name=name)
            )
        log.info(
            "shared node ready node=%s schema=%d queues=%d", self._settings.node, version, len(self._queues)
        )

    async def _claim(self, catalog: Catalog) -> None:
        # A node restarted after kill -9 finds its own old lease: it waits for it to run out. A
        # second live node with this name renews its lease all along, so this start is refused.
        deadline = time.monotonic() + LEASE + RENEW
        while True:
            holder = await catalog.claim_node(self._settings.node, self._token, self._url, LEASE)
            if holder is None:
                return
            if time.monotonic() >= deadline:
                raise InvalidConfig(
                    f"shared.node {self._settings.node!r} is the name of a node that is running "
                    f"({holder or 'no url'}): every node of a shared cluster needs a name of its own"
                )
            await asyncio.sleep(1.0)

    def queues(self) -> dict[str, BaseQueue]:
        return dict(self._queues)

    async def create(self, name: str, definition: QueueSettings) -> tuple[BaseQueue, bool]:
        catalog = self._need()
        created = await self._guard(catalog.create_queue(name, definition.to_dict()))
        if not created:
            await self._load_definitions()
            queue = self._queues.get(name)
            if queue is None:
                raise QueueNotFound(f"no queue {name!r}")
            return queue, False
        return self._open(name, definition), True

    async def update(self, queue: BaseQueue, definition: QueueSettings) -> None:
        if not await self._guard(self._need().update_queue(queue.name, definition.to_dict())):
            raise QueueNotFound(f"no queue {queue.name!r}")
        queue.definition = definition

    async def drop(self, name: str) -> None:
        await self._guard(self._need().drop_queue(name))
        queue = self._queues.pop(name, None)
        if queue is not None:
            await queue.close()

    @property
    def fault(self) -> str | None:
        flusher = self._flusher
        return self._fault or (None if flusher is None else flusher.fault)

    @property
    def stats(self) -> SharedStats:
        return self._stats

    async def close(self) -> None:
        self._closing = True
        if self._flusher is not None:
            await self._flusher.close()
        for task in [*self._tasks, *self._spawned]:
            task.cancel()
        for task in [*self._tasks, *self._spawned]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for queue in self._queues.values():
            await queue.close()
        catalog = self._catalog
        if catalog is not None:
            with contextlib.suppress(CapellaError):
                await catalog.release_node(self._settings.node, self._token)
            await self._close_listeners()
        if self._pool is not None:
            await self._pool.close()

    # --- what the queues ask -------------------------------------------------------------------

    @property
    def flusher(self) -> Flusher:
        if self._flusher is None or self._closing:
            raise ShuttingDown("the shared node is not running")
        return self._flusher

    async def wait_committed(self, done: asyncio.Future[Committed]) -> Committed:
        return await done

    def watch(self, queue: SharedQueue) -> None:
        """A reader waits on ``queue``: the poll behind NOTIFY includes it from now on."""
        self._watched.add(queue.name)

    async def segments_after(self, queue: str, after: int, limit: int) -> list[Segment]:
        return await self._guard(self._need().segments_after(queue, after, limit))

    async def batch_of(self, segment: Segment) -> Batch:
        """The segment's messages stamped with their ids, time and source, duplicates cut out."""
        key = (segment.key, segment.byte_offset, segment.first_id)
        batch = self._batches.get(key)
        if batch is not None:
            self._batches.move_to_end(key)
            return batch
        objects = self._objects
        before = objects.stats.fetched_bytes, objects.stats.whole_gets + objects.stats.range_gets
        # One whole-object GET serves every batch of the object, for every queue and reader on
        # this node (an object is one window of one node's writes): not one GET per read.
        data = await objects.fetch(
            segment.key,
            segment.byte_offset,
            segment.byte_size,
            self._storage,
            size=segment.object_size or None,
            whole_below=self._settings.flush_bytes * 2,
        )
        after = objects.stats
        self._stats.get_bytes += after.fetched_bytes - before[0]
        self._stats.gets += after.whole_gets + after.range_gets - before[1]
        batch = stamped(data, segment, self.cluster_name)
        self._batches[key] = batch
        if len(self._batches) > BATCHES:
            self._batches.popitem(last=False)
        return batch

    async def commit_cursor(
        self, queue: str, name: str, last_id: int | None, *, replica: bool | None, reset: bool
    ) -> tuple[SubRow, bool]:
        catalog = self._need()
        found = await self._guard(catalog.commit_cursor(queue, name, last_id, replica=replica, reset=reset))
        assert self._pool is not None
        # The other nodes poll too: a notice lost here makes them late, never wrong.
        with contextlib.suppress(StorageUnavailable):
            await self._pool.execute("select pg_notify($1, $2)", CURSORS_CHANNEL, f"{queue}:{name}")
        return found

    async def delete_subscription(self, queue: str, name: str) -> bool:
        return await self._guard(self._need().delete_subscription(queue, name))

    async def refresh_subscriptions(self, queue: SharedQueue) -> None:
        rows = await self._guard(self._need().subscriptions(queue.name))
        names = {row.name for row in rows}
        for sub in queue.subscriptions():
            if sub.name not in names:
                queue.noted(None, sub.name)
        for row in rows:
            queue.noted(row, row.name)

    # --- inside -------------------------------------------------------------------------------

    def _need(self) -> Catalog:
        if self._catalog is None:
            raise ShuttingDown("the shared node is not running")
        return self._catalog

    async def _guard(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except StorageUnavailable as exc:
            self._note_fault(exc.message)
            raise

    def _note_fault(self, message: str) -> None:
        if self._fault is None:
            self.fault_since = self._clock()
        self._fault = message

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
        stored = await self._guard(self._need().definitions())
        for name, doc in stored.items():
            try:
                definition = parse_definition(doc, self._base, self._mounts | {self._settings.mount})
            except CapellaError as exc:
                log.error("shared queue definition unreadable queue=%s: %s", name, exc.message)
                continue
            self._open(name, definition)
        for name in set(self._queues) - set(stored):
            queue = self._queues.pop(name)
            await queue.close()
        for queue in self._queues.values():
            await self.refresh_subscriptions(queue)

    async def _poll_heads(self, names: list[str]) -> None:
        if not names:
            return
        heads = await self._need().heads(names)
        for name, (first_id, next_id) in heads.items():
            queue = self._queues.get(name)
            if queue is not None:
                queue.head(first_id, next_id)

    async def _poll_loop(self) -> None:
        since_definitions = 0.0
        while True:
            await asyncio.sleep(POLL)
            since_definitions += POLL
            try:
                if since_definitions >= DEFINITIONS_POLL:
                    since_definitions = 0.0
                    await self._load_definitions()
                await self._poll_heads(sorted(self._watched & set(self._queues)))
                self._fault = None
            except StorageUnavailable as exc:
                self._note_fault(exc.message)
                self._stats.failures["poll"] = self._stats.failures.get("poll", 0) + 1

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(RENEW)
            try:
                if not await self._need().renew_node(self._settings.node, self._token, LEASE):
                    log.error(
                        "shared node name taken over node=%s: is a second node running with it?",
                        self._settings.node,
                    )
                    await self._claim(self._need())
            except StorageUnavailable as exc:
                self._note_fault(exc.message)

    async def _listen_loop(self) -> None:
        channels = {
            NOTIFY_CHANNEL: self._on_commit_notice,
            DEFINITIONS_CHANNEL: self._on_definition_notice,
            CURSORS_CHANNEL: self._on_cursor_notice,
        }
        while True:
            pool = self._pool
            assert pool is not None
            try:
                for channel, callback in channels.items():
                    self._listeners.append(await pool.listen(channel, callback))
            except StorageUnavailable as exc:
                await self._close_listeners()
                self._stats.failures["listen"] = self._stats.failures.get("listen", 0) + 1
                log.warning("shared listen failed, retrying: %s", exc.message)
                await asyncio.sleep(1.0)
                continue
            # Whatever was announced while no listener was up: the heads of every queue now.
            with contextlib.suppress(StorageUnavailable):
                await self._poll_heads(list(self._queues))
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

    async def _close_listeners(self) -> None:
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            await listener.close()

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
            await self._poll_heads([name])

    async def _refresh_quietly(self, queue: SharedQueue) -> None:
        with contextlib.suppress(StorageUnavailable):
            await self.refresh_subscriptions(queue)
        self.replicas_moved.set()
        self.replicas_moved = asyncio.Event()


def stamped(data: bytes, segment: Segment, source: str) -> Batch:
    """A stored batch (base id 0) with the ids, time and source its commit gave it, the
    positions ``skip`` names (duplicates: dead bytes) cut out."""
    batch = record_batch.framed(data)
    raw = record_batch.stamp(batch, segment.first_id, segment.time, source)
    if segment.skip:
        skip = set(segment.skip)
        keep = [i not in skip for i in range(batch.count)]
        cut = record_batch.select(record_batch.framed(raw), keep, base_id=segment.first_id)
        if cut is None:
            raise ValueError("a segment row with every message skipped")
        raw = cut
    return Batch.of_records([record_batch.framed(raw)])
