"""Handlers that work queue by queue: which queues they select, and the per-queue pass.

A handler names its queues by name or fnmatch pattern; a pass goes through the queues that
match at that moment (so queues created later are picked up). One queue's failure does not
stop the pass for the others; the pass still fails, naming each queue that failed.
"""

from __future__ import annotations

import abc
import fnmatch
from typing import Generic, Protocol, TypeVar

from capella.core.base_queue import BaseQueue
from capella.core.cluster import Cluster
from capella.errors import CapellaError, Forbidden, StorageUnavailable, SubscriptionNotFound
from capella.handlers.base import Handler, PassTally


class HasInterval(Protocol):
    @property
    def interval(self) -> float: ...


P = TypeVar("P", bound=HasInterval)


class QueueHandler(Handler, abc.ABC, Generic[P]):
    """One pass = ``run_queue`` for every selected queue the handler's user may work on."""

    # What the handler's user needs on each queue.
    needs = "write"

    def __init__(self, cluster: Cluster, queues: list[str], params: P) -> None:
        self._cluster = cluster
        self._queues = queues
        self.params = params
        self.interval = params.interval

    async def run_once(self) -> PassTally:
        result = PassTally()
        errors: list[tuple[str, CapellaError]] = []
        for queue in selected(self._cluster, self._queues):
            if queue.shared and not self.on_shared:
                continue  # matched by a pattern: this type works on local queues only
            if not self.identity.can("queue", self.needs, queue.name):
                # A queue matched by a pattern is skipped, as a listing would skip it; a queue
                # named outright is an error the status shows.
                if queue.name in self._queues:
                    refused = Forbidden(f"user {self.identity.name!r} may not {self.needs} it")
                    errors.append((queue.name, refused))
                continue
            try:
                result += await self.run_queue(queue)
            except CapellaError as exc:
                errors.append((queue.name, exc))
        if errors:
            text = "; ".join(f"{name}: {exc.message}" for name, exc in errors)
            # Raised from the first failure: the status shows its code (unreachable, forbidden...).
            raise StorageUnavailable(f"{type(self).__name__}: {text}") from errors[0][1]
        return result

    @abc.abstractmethod
    async def run_queue(self, queue: BaseQueue) -> PassTally:
        """This handler's work on one queue."""


def selected(cluster: Cluster, patterns: list[str]) -> list[BaseQueue]:
    """The queues a handler works on right now (queues created later match too)."""
    return [q for q in cluster.queues() if any(fnmatch.fnmatchcase(q.name, p) for p in patterns)]


def cursor_lag(cluster: Cluster, patterns: list[str], subscription: str) -> dict[str, int]:
    """By selected queue, the messages past cursor ``subscription`` now (all, before it exists).

    Read from the queue and the cursor when asked, not remembered from the last pass: with the
    far side down the cursor stands still while the queue grows, and this number says so.
    """
    lag: dict[str, int] = {}
    for queue in selected(cluster, patterns):
        try:
            cursor = queue.subscription(subscription).last_id
        except SubscriptionNotFound:
            cursor = 0
        lag[queue.name] = max(0, queue.last_id - cursor)
    return lag
