"""The periodic save of everything not yet saved (and cursors, and blocks past their age).

The cluster's own tick saves ``mark`` writes each ``storage.flush_interval``; a flush handler
saves, for the queues it names, ``none`` writes as well, as the original's ``regularly_save``
does ("saved only by a later flush", docs/api.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from capella.core.queue import Queue
from capella.handlers.base import HandlerType, PassResult
from capella.handlers.per_queue import QueueHandler
from capella.wire.handlers import FlushParams


class FlushHandler(QueueHandler[FlushParams]):
    """Save what ``none`` and ``mark`` writes left in memory."""

    async def run_queue(self, queue: Queue) -> PassResult:
        await queue.tick()
        return PassResult(items=1, bytes=await queue.flush())


if TYPE_CHECKING:
    from capella.core.cluster import Cluster
    from capella.handlers.reach import Reach


def build(
    cluster: Cluster, queues: list[str], params: FlushParams, reach: Reach, name: str, kept: Mapping[str, Any]
) -> tuple[FlushParams, FlushHandler]:
    """The ``flush`` handler type (its registry entry is ``HANDLER``)."""
    return params, FlushHandler(cluster, queues, params)


HANDLER = HandlerType("flush", FlushParams, build)
