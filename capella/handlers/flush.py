"""The periodic save of everything not yet saved (and cursors, and blocks past their age).

The cluster's own tick saves ``mark`` writes each ``storage.flush_interval``; a flush handler
saves, for the queues it names, ``none`` writes as well, as the original's ``regularly_save``
does ("saved only by a later flush", docs/api.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capella.core.base_queue import BaseQueue
from capella.handlers.base import Building, HandlerType, PassTally
from capella.handlers.per_queue import QueueHandler
from capella.wire.upkeep import FlushParams


class FlushHandler(QueueHandler[FlushParams]):
    """Save what ``none`` and ``mark`` writes left in memory."""

    async def run_queue(self, queue: BaseQueue) -> PassTally:
        await queue.tick()
        return PassTally(items=1, bytes=await queue.flush())


if TYPE_CHECKING:
    pass


def build(params: FlushParams, at: Building) -> tuple[FlushParams, FlushHandler]:
    """The ``flush`` handler type (its registry entry is ``HANDLER``)."""
    return params, FlushHandler(at.cluster, at.queues, params)


HANDLER = HandlerType("flush", FlushParams, build)
