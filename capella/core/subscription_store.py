"""The subscriptions of one queue as stored: its named cursors and the work queues of the ack-mode ones.

The subscriptions live in a change log under ``<q>/subscriptions/`` (``capella.core.journal.changelog``):
a commit appends one small record (the subscription as it now is) and concurrent commits share
one fsync. The periodic pass writes a snapshot of them all once the log holds
``CHECKPOINT_RECORDS`` records. The snapshot is the JSON document that versions before the log
kept in ``<q>/subscriptions.json``; such a file is read at open, becomes the first snapshot and
is deleted. Each work queue keeps its own change log under ``<q>/work/<subscription>/``
(``capella.core.work.work_queue``); a message it gives up on is copied to the dead-letter queue its policy
names.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from capella.config import StorageSettings
from capella.core.definition import QueueSettings
from capella.core.journal.changelog import ChangeLog
from capella.core.message import Draft, SaveMode
from capella.core.subscription import ACK, Subscriptions, SubscriptionState
from capella.core.work.retry import RetrySettings
from capella.core.work.work_queue import MessageLog, WorkQueue
from capella.errors import (
    InvalidRequest,
    KeyNotFound,
    QueueNotFound,
    ShuttingDown,
    StorageTimeout,
    SubscriptionNotFound,
    WrongSubscriptionMode,
)
from capella.storage import Storage, keys

# Cursor changes the log holds before the periodic pass replaces them with a snapshot (at
# open, each costs a record's parse: ~2 µs).
CHECKPOINT_RECORDS = 10_000


class DeadLetterQueue(Protocol):
    """What a work queue needs from the queue its dead messages are copied to."""

    async def append(self, drafts: Sequence[Draft], save: SaveMode = ...) -> Sequence[object]: ...


class SubscriptionStore:
    """The subscriptions of one queue and their work queues, and when they are saved."""

    def __init__(
        self,
        messages: MessageLog,
        definition: QueueSettings,
        meta: Storage,
        *,
        settings: StorageSettings,
        clock: Callable[[], float],
        stopping: asyncio.Event,
        lookup: Callable[[str], DeadLetterQueue] | None,
        fault_text: Callable[[], str],
    ) -> None:
        self.definition = definition  # replaced by the queue when its definition changes
        self.committed = asyncio.Event()  # set (and replaced) on every cursor change
        self._messages = messages
        self._name = messages.name
        self._meta = meta
        self._settings = settings
        self._clock = clock
        self._stopping = stopping
        self._lookup = lookup
        self._fault_text = fault_text
        self._subs = Subscriptions()
        self._work: dict[str, WorkQueue] = {}
        self._log = ChangeLog(
            meta, keys.of(self._name, keys.SUBSCRIPTIONS), write_timeout=settings.write_timeout
        )

    async def open(self) -> None:
        """Recover the cursors and the work queues from their saved state."""
        document, records = await self._log.load()
        legacy = keys.of(self._name, keys.OLD_SUBSCRIPTIONS)
        try:
            old = await self._meta.get(legacy)
        except KeyNotFound:
            old = None
        base = document if document is not None else old
        if base is not None:
            self._subs.load(base)
        for record in records:
            self._subs.apply(record)
        if old is not None:
            if document is None:
                # Saved by a version without the log: it becomes the first snapshot.
                await self._log.checkpoint(self._subs.dump)
            await self._meta.delete(legacy)
        for sub in self._subs.all():
            if sub.mode == ACK and sub.policy is not None:
                work = self._new_work(sub.name, sub.policy)
                await work.open()
                self._work[sub.name] = work

    def _check_open(self) -> None:
        if self._stopping.is_set():
            raise ShuttingDown(f"queue {self._name} is closing")

    # --- reading ---------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._subs.all())

    def subscription(self, name: str) -> SubscriptionState:
        return self._with_floor(self._subs.get(name))

    def subscriptions(self) -> list[SubscriptionState]:
        return [self._with_floor(s) for s in self._subs.all()]

    def _with_floor(self, sub: SubscriptionState) -> SubscriptionState:
        # An ack-mode subscription's cursor is the id below which everything is finished.
        if sub.mode == ACK:
            work = self._work.get(sub.name)
            if work is not None:  # None: being defined, its work state still opening
                return dataclasses.replace(sub, last_id=work.state.floor)
        return sub

    def work(self, name: str) -> WorkQueue:
        """The work queue of an ack-mode subscription."""
        sub = self._subs.get(name)
        if sub.mode != ACK:
            raise WrongSubscriptionMode(f"subscription {name!r} is a cursor, not in ack mode")
        work = self._work.get(name)
        if work is None:
            # define_ack records the subscription, then opens its work state: a status read
            # between the two (a push handler's lag at start) finds no work queue yet.
            raise SubscriptionNotFound(f"subscription {name!r} is still being defined")
        return work

    def work_queues(self) -> list[WorkQueue]:
        return [self._work[name] for name in sorted(self._work)]

    def replicas(self, message_id: int) -> list[str]:
        return self._subs.replicas(message_id)

    async def wait_replicas(self, message_id: int, count: int, timeout: float) -> list[str]:  # noqa: ASYNC109 (API parameter)
        """The replica subscriptions past ``message_id`` once there are ``count``, or at ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(holders := self._subs.replicas(message_id)) < count and not self._stopping.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            event = self.committed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await event.wait()
        return holders

    # --- changes ---------------------------------------------------------------------------

    async def define_work(
        self, name: str, policy: RetrySettings, save: SaveMode = SaveMode.DEFAULT
    ) -> tuple[SubscriptionState, bool]:
        """Create an ack-mode subscription (a work queue) or change its retry policy."""
        self._check_open()
        if policy.dead_letter is not None:
            if policy.dead_letter == self._name:
                raise InvalidRequest("policy.dead_letter must name another queue", field="policy.dead_letter")
            try:
                if self._lookup is not None:
                    self._lookup(policy.dead_letter)
            except QueueNotFound:
                raise InvalidRequest(
                    f"policy.dead_letter: no queue {policy.dead_letter!r}", field="policy.dead_letter"
                ) from None
        sub, created = self._subs.define_ack(name, policy, now=self._clock())
        if created:
            # A subscription of this name deleted before a crash may have left its files.
            for key in await self._meta.list(keys.within(self._name, keys.WORK, name)):
                await self._meta.delete(key)
            work = self._new_work(name, policy)
            await work.open()
            self._work[name] = work
        else:
            self._work[name].policy = policy
        await self._after_change(save)
        return self._with_floor(sub), created

    def _new_work(self, name: str, policy: RetrySettings) -> WorkQueue:
        return WorkQueue(
            self._messages,
            name,
            policy,
            self._meta,
            keys.of(self._name, keys.WORK, name),
            clock=self._clock,
            dead_letter=self._dead_letter,
            default_save=lambda: self.definition.subscription_save,
            write_timeout=self._settings.write_timeout,
        )

    async def _dead_letter(self, target: str, drafts: list[Draft]) -> None:
        if self._lookup is None or not drafts:
            return
        await self._lookup(target).append(drafts, SaveMode.WAIT)

    async def commit(
        self,
        name: str,
        last_id: int | None,
        *,
        replica: bool | None = None,
        reset: bool = False,
        save: SaveMode = SaveMode.DEFAULT,
        group: str | None = None,
        metadata: str | None = None,
    ) -> tuple[SubscriptionState, bool]:
        """Move a cursor forward (or anywhere with ``reset``), creating it on first use;
        ``group`` and ``metadata`` None keep what it has."""
        self._check_open()
        sub, created = self._subs.commit(
            name, last_id, replica=replica, reset=reset, now=self._clock(), group=group, metadata=metadata
        )
        await self._after_change(save)
        return sub, created

    async def delete(self, name: str, save: SaveMode = SaveMode.DEFAULT) -> None:
        self._subs.delete(name)
        await self._after_change(save)
        work = self._work.pop(name, None)
        if work is not None:
            await work.destroy()

    async def _after_change(self, save: SaveMode) -> None:
        for record in self._subs.take_records():
            self._log.append(record)
        self.committed.set()
        self.committed = asyncio.Event()
        try:
            # The flush goes on when the writer stops waiting; a failed one keeps its records
            # for the next, and the periodic pass retries while any are left.
            await self._log.save(save.resolve(self.definition.subscription_save))
        except StorageTimeout:
            raise StorageTimeout(
                f"queue {self._name}: the cursor was not saved within {self._settings.write_timeout:g}s "
                f"({self._fault_text()}); it may still be saved"
            ) from None

    # --- saving ----------------------------------------------------------------------------

    async def save(self) -> None:
        """Make every cursor change so far durable (concurrent callers share the fsync)."""
        await self._log.flush()

    async def flush_work(self) -> None:
        for work in list(self._work.values()):
            await work.flush()

    async def tick_cursors(self) -> None:
        """The periodic pass: save cursor changes left unsaved (``mark`` mode, a failed or late
        flush), and replace a long log with a snapshot."""
        if self._log.marked or self._log.dirty:
            await self._log.flush()
        if self._log.records_since_checkpoint > CHECKPOINT_RECORDS:
            await self._log.checkpoint(self._subs.dump)

    async def tick_work(self) -> None:
        """The work queues' periodic pass: expired leases, marked changes, checkpoints."""
        for work in list(self._work.values()):
            await work.tick()

    def wake_waiters(self) -> None:
        """Closing: wake callers waiting for replicas."""
        self.committed.set()

    async def close(self) -> None:
        for work in self._work.values():
            await work.close()
        await self._log.close()
