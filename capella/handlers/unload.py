"""Drop the contents of sealed blocks from memory when they are idle or old.

Reads load a dropped block again on demand, so a queue of millions of messages keeps a flat
memory profile: only block metadata, dedup summaries and the open block stay in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capella.core.base_queue import BaseQueue
from capella.handlers.base import Building, HandlerType, PassTally
from capella.handlers.per_queue import QueueHandler
from capella.wire.upkeep import UnloadParams


class UnloadHandler(QueueHandler[UnloadParams]):
    """Drop loaded block contents not read for ``idle`` seconds or sealed ``age`` seconds ago."""

    async def run_queue(self, queue: BaseQueue) -> PassTally:
        return PassTally(*queue.unload(idle=self.params.idle, age=self.params.age))


if TYPE_CHECKING:
    pass


def build(params: UnloadParams, at: Building) -> tuple[UnloadParams, UnloadHandler]:
    """The ``unload`` handler type (its registry entry is ``HANDLER``)."""
    return params, UnloadHandler(at.cluster, at.queues, params)


HANDLER = HandlerType("unload", UnloadParams, build)
