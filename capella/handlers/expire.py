"""Delete the oldest sealed blocks past an age, or while the queue is over its size or count."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from capella.core.base_queue import BaseQueue
from capella.core.log.blocks import BlockMeta
from capella.handlers.base import Building, HandlerType, PassTally
from capella.handlers.per_queue import QueueHandler
from capella.wire.upkeep import ExpireParams


def expired(
    params: ExpireParams, sealed: Sequence[BlockMeta], messages: int, size: int, now: float
) -> list[BlockMeta]:
    """The oldest blocks to delete, given the queue's total ``messages`` and ``size``."""
    doomed: list[BlockMeta] = []
    for block in sealed:
        too_old = params.max_age is not None and now - block.sealed >= params.max_age
        too_big = params.max_bytes is not None and size > params.max_bytes
        too_many = params.max_messages is not None and messages > params.max_messages
        if not (too_old or too_big or too_many):
            break
        doomed.append(block)
        messages -= block.count
        size -= block.bytes
    return doomed


class ExpireHandler(QueueHandler[ExpireParams]):
    """Delete whole blocks from the oldest end; ids are never reused afterwards."""

    needs = "admin"

    async def run_queue(self, queue: BaseQueue) -> PassTally:
        stats = queue.stats()
        result = PassTally()
        for block in expired(
            self.params, queue.sealed_blocks(), stats["messages"], stats["bytes"], queue.now()
        ):
            result += PassTally(1, await queue.delete_block(block.first_id))
        # Objects of a delete interrupted by a crash (the manifest had already let go).
        await queue.clean_leftovers()
        return result


if TYPE_CHECKING:
    pass


def build(params: ExpireParams, at: Building) -> tuple[ExpireParams, ExpireHandler]:
    """The ``expire`` handler type (its registry entry is ``HANDLER``)."""
    return params, ExpireHandler(at.cluster, at.queues, params)


HANDLER = HandlerType("expire", ExpireParams, build)
