"""Copy messages from queues into another queue, keeping order, identity and exactly-once.

For each source queue the handler keeps a replica subscription as its cursor: read after the
cursor, append to the destination as a dedup insert (each message keeps its ``source``,
``external_id``, ``external_time``, ``segment`` and headers), then commit the cursor. A crash
between the append and the commit copies the batch again and dedup absorbs it, so transfer
is at least once and the destination holds each message exactly once. Two copy handlers in
opposite directions cannot loop: a message that comes back is recognised by its identity.

When there is a backlog a pass copies at full speed for up to ``PASS_SECONDS``; when caught
up it long-polls the source for ``wait`` seconds instead of sleeping a fixed time. Between
clusters the messages travel as record batches (docs/format.md): a remote source is read in
batch pages (the client's default) and a remote destination gets one batch per pass step,
every message with its origin's source, external id and external time given explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

import msgspec

from capella.client import AsyncClient
from capella.core.base_queue import BaseQueue
from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.core.message import Draft, SaveMode, drafts_batch
from capella.errors import (
    CapellaError,
    ClusterNotFound,
    InvalidRequest,
    QueueNotFound,
    StorageUnavailable,
    SubscriptionNotFound,
)
from capella.handlers.base import Building, HandlerType, PassTally, queue_patterns
from capella.handlers.per_queue import QueueHandler, cursor_lag
from capella.links.registry import Links
from capella.wire.copy import CopyParams, CopyStatus
from capella.wire.fields import MIN_PERIOD
from capella.wire.handlers import Definition

# A pass with a long backlog ends after this long, so the status shows progress.
PASS_SECONDS = 5.0


class CopyHandler(QueueHandler[CopyParams]):
    """Copy every selected queue (or ``params.from`` on an external cluster) into ``params.to``."""

    on_shared = True

    needs = "read"

    def __init__(self, cluster: Cluster, queues: list[str], params: CopyParams, links: Links) -> None:
        super().__init__(cluster, queues, params)
        if params.interval == 0 and params.wait == 0:
            # Neither a pause nor a long poll: the floor between passes, not a busy loop.
            self.interval = MIN_PERIOD
        self._links = links
        # A remote source's lag as last seen (its last id minus the cursor), and when.
        self._remote_lag: dict[str, int] = {}
        self._remote_observed: float | None = None
        # The params show the modes by name; the queue takes them as SaveMode.
        self.save = SaveMode.parse(params.save)

    def status(self) -> CopyStatus:
        if self.params.from_ is not None and "/" in self.params.from_:
            lag = dict(self._remote_lag)
            return CopyStatus(sum(lag.values()), lag, self._remote_observed)
        lag = cursor_lag(self._cluster, self._queues, self.params.subscription)
        return CopyStatus(sum(lag.values()), lag)

    def links(self) -> list[str]:
        return self.params.clusters()

    async def run_once(self) -> PassTally:
        # A cluster's credentials are the cluster owner's: only a user granted the cluster may use them.
        for cluster in self.params.clusters():
            self.identity.check("external_cluster", "write", cluster)
        if self.params.from_ is not None and "/" in self.params.from_:
            cluster, _, name = self.params.from_.partition("/")
            try:
                with self.interruptible_step():
                    client = await self._links.checked_client(cluster)
                return await self._copy(_RemoteSource(client, name, self.params))
            except CapellaError as exc:
                # From the error: the status shows its code (unreachable, forbidden...).
                raise StorageUnavailable(
                    f"CopyHandler: {self.params.from_}: {exc.code}: {exc.message}"
                ) from exc
        return await super().run_once()

    async def run_queue(self, queue: BaseQueue) -> PassTally:
        return await self._copy(_LocalSource(queue, self.params))

    async def _copy(self, source: _Source) -> PassTally:
        params = self.params
        target = self._destination()
        if isinstance(source, _LocalSource) and target == ("", source.queue.name):
            raise InvalidRequest(f"queue {source.queue.name} cannot be copied into itself")
        if not target[0]:
            self.identity.check("queue", "write", target[1])
        if isinstance(source, _LocalSource):
            self.identity.check("subscription", "write", f"{source.queue.name}/{params.subscription}")
        # A remote source's calls may be cut short by a stop: read again, committed again.
        remote = self.interruptible_step if isinstance(source, _RemoteSource) else contextlib.nullcontext
        with remote():
            cursor = await source.cursor()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PASS_SECONDS
        result = PassTally()
        waited = False
        while loop.time() < deadline and not self.stopping:
            with remote():
                drafts, last_id, source_last = await source.read(cursor, wait=0.0)
            if not drafts and last_id <= cursor and not waited and params.wait > 0:
                if self.stopping:
                    break  # caught up, and stopping: no wait to sit out
                # Caught up: long-poll the source instead of sleeping a fixed time, within the
                # pass (a "run now" answers when its pass ends). A stop cancels the wait at once.
                wait = min(params.wait, max(0.0, deadline - loop.time()))
                with self.interruptible_step():
                    drafts, last_id, source_last = await source.read(cursor, wait=wait)
                waited = True
            if drafts:
                stored = await self._append(target, drafts)
                result += PassTally(len(stored), sum(len(d.payload) for d in stored))
            if last_id > cursor:
                with remote():
                    await source.commit(last_id)
                cursor = last_id
            if isinstance(source, _RemoteSource):
                self._remote_lag[source.name] = max(0, source_last - cursor)
                self._remote_observed = time.time()
            if last_id <= cursor and not drafts and waited:
                break
            if not drafts and last_id <= cursor and params.wait <= 0:
                break
        return result

    def _destination(self) -> tuple[str, str]:
        cluster, _, name = self.params.to.rpartition("/")
        return cluster, name

    async def _append(self, target: tuple[str, str], drafts: list[Draft]) -> list[Draft]:
        """Append as a dedup insert; answers the drafts the destination stored (not repeats)."""
        cluster, name = target
        if not cluster:
            queue = self._cluster.queue(name)
            # The queue holds every message to its rules; a read of more than one append may
            # hold (``server.max_batch``) goes in as several, in order.
            step = queue.limits.max_batch
            stored: list[Draft] = []
            for start in range(0, len(drafts), step):
                chunk = drafts[start : start + step]
                answers = await queue.append(chunk, self.save)
                stored += [d for d, a in zip(chunk, answers, strict=True) if not a.duplicate]
            return stored
        try:
            # A far side with our name is refused (checked once per client, not per batch). A
            # stop may cut this short: the next pass sends the batch again and dedup absorbs it.
            with self.interruptible_step():
                client = await self._links.checked_client(cluster)
                results = await client.produce_batch(name, _batch(drafts), save=self.params.save)
        except CapellaError as exc:
            raise StorageUnavailable(f"{self.params.to}: {exc.code}: {exc.message}") from exc
        return [d for d, r in zip(drafts, results, strict=True) if not r.duplicate]


class _Source(Protocol):
    name: str

    async def cursor(self) -> int: ...

    async def read(self, after: int, *, wait: float) -> tuple[list[Draft], int, int]:
        """(drafts after ``after``, the id to continue after, the source's last id)."""
        ...

    async def commit(self, last_id: int) -> None: ...


class _LocalSource:
    def __init__(self, queue: BaseQueue, params: CopyParams) -> None:
        self.queue = queue
        self.name = queue.name
        self._params = params
        self._commit_save = SaveMode.parse(params.commit_save)

    async def cursor(self) -> int:
        try:
            cursor = self.queue.subscription(self._params.subscription).last_id
        except SubscriptionNotFound:
            cursor = 0
        # The cursor is a replica subscription, so producers can ask for receipts.
        await self.queue.commit(self._params.subscription, cursor, replica=True, save=self._commit_save)
        return cursor

    async def read(self, after: int, *, wait: float) -> tuple[list[Draft], int, int]:
        if wait > 0:
            await self.queue.wait_for(after, wait)
        page = await self.queue.read_after(after, self._params.batch, self._params.segments)
        drafts = [
            Draft(m.payload, m.source, m.external_id, m.external_time, m.segment, m.headers)
            for m in page.messages
        ]
        return drafts, page.last_id, self.queue.last_id

    async def commit(self, last_id: int) -> None:
        await self.queue.commit(self._params.subscription, last_id, save=self._commit_save)


class _RemoteSource:
    def __init__(self, client: AsyncClient, queue: str, params: CopyParams) -> None:
        self._client = client
        self._queue = queue
        self.name = params.from_ or queue
        self._params = params

    async def cursor(self) -> int:
        try:
            cursor = (await self._client.subscription(self._queue, self._params.subscription)).last_id
        except SubscriptionNotFound:
            cursor = 0
        await self._client.commit(
            self._queue,
            self._params.subscription,
            cursor,
            replica=True,
            save=self._params.commit_save,
        )
        return cursor

    async def read(self, after: int, *, wait: float) -> tuple[list[Draft], int, int]:
        segments = None if self._params.segments is None else list(self._params.segments)
        page = await self._client.read(
            self._queue, after=after, limit=self._params.batch, segments=segments, wait=wait or None
        )
        drafts = [
            Draft(m.payload, m.source, m.external_id, m.external_time, m.segment, m.headers)
            for m in page.messages
        ]
        return drafts, page.last_id, page.last_id

    async def commit(self, last_id: int) -> None:
        await self._client.commit(
            self._queue, self._params.subscription, last_id, save=self._params.commit_save
        )


def _batch(drafts: list[Draft]) -> bytes:
    """The drafts as one record batch, each with its origin's identity and time given explicitly."""
    return drafts_batch(drafts)


def build(params: CopyParams, at: Building) -> tuple[CopyParams, CopyHandler]:
    """The ``copy`` handler type; its queues and links must exist when it is defined."""
    check_name(params.subscription, "subscription")
    # Shown by name, as the stored definition keeps them.
    params = msgspec.structs.replace(
        params, save=_mode_name(params.save), commit_save=_mode_name(params.commit_save)
    )
    for cluster in params.clusters():
        # Checked as the definer too, so a refused definition is a 403 now, not a failing pass.
        at.reach.by.check("external_cluster", "write", cluster)
    for ref, what in ((params.to, "to"), (params.from_, "from")):
        if ref is None:
            continue
        cluster, _, queue = ref.rpartition("/")
        try:
            at.reach.links.link(cluster) if cluster else at.cluster.queue(queue)
        except (QueueNotFound, ClusterNotFound) as exc:
            raise InvalidRequest(f"params.{what}: {exc.message}", field=f"params.{what}") from None
    return params, CopyHandler(at.cluster, at.queues, params, at.reach.links)


def _mode_name(mode: str | int) -> str:
    return SaveMode.parse(mode).name.lower()


def selects(definition: Definition, cluster: Cluster) -> list[str]:
    """Its queues: ``queues`` (or ``queue``), by default its source ``params.from``."""
    source = definition.params.from_ if isinstance(definition.params, CopyParams) else None
    if definition.named_queues() is not None or source is None:
        return queue_patterns(definition, cluster)
    if "/" in source:
        # The source is on an external cluster: no local queue is selected.
        return [source]
    return queue_patterns(msgspec.structs.replace(definition, queues=[source]), cluster)


HANDLER = HandlerType("copy", CopyParams, build, status=CopyStatus, queues=selects)
