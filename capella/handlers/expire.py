"""Delete the oldest messages past an age, or while the queue is over its size or count.

Local queues lose whole sealed blocks, shared queues whole segments; the rule is one
(``capella.core.retention``) and each queue applies it to its own units (``BaseQueue.expire``).
"""

from __future__ import annotations

from capella.core.base_queue import BaseQueue
from capella.core.retention import Retention
from capella.handlers.base import Building, HandlerType, PassTally
from capella.handlers.per_queue import QueueHandler
from capella.wire.upkeep import ExpireParams


def retention(params: ExpireParams) -> Retention:
    return Retention(params.max_age, params.max_bytes, params.max_messages)


class ExpireHandler(QueueHandler[ExpireParams]):
    """Delete whole blocks (or segments) from the oldest end; ids are never reused afterwards."""

    needs = "admin"
    on_shared = True

    async def run_queue(self, queue: BaseQueue) -> PassTally:
        return PassTally(*await queue.expire(retention(self.params)))


def build(params: ExpireParams, at: Building) -> tuple[ExpireParams, ExpireHandler]:
    """The ``expire`` handler type (its registry entry is ``HANDLER``)."""
    return params, ExpireHandler(at.cluster, at.queues, params)


HANDLER = HandlerType("expire", ExpireParams, build)
