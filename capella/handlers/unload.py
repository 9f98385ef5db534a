"""Drop the contents of sealed blocks from memory when they are idle or old.

Reads load a dropped block again on demand, so a queue of millions of messages keeps a flat
memory profile: only block metadata, dedup summaries and the open block stay in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from capella.core.queue import Queue
from capella.handlers.base import HandlerType, PassResult
from capella.handlers.per_queue import QueueHandler
from capella.wire.handlers import UnloadParams


class UnloadHandler(QueueHandler[UnloadParams]):
    """Drop loaded block contents not read for ``idle`` seconds or sealed ``age`` seconds ago."""

    async def run_queue(self, queue: Queue) -> PassResult:
        return PassResult(*queue.unload(idle=self.params.idle, age=self.params.age))


if TYPE_CHECKING:
    from capella.core.cluster import Cluster
    from capella.handlers.reach import Reach


def build(
    cluster: Cluster,
    queues: list[str],
    params: UnloadParams,
    reach: Reach,
    name: str,
    kept: Mapping[str, Any],
) -> tuple[UnloadParams, UnloadHandler]:
    """The ``unload`` handler type (its registry entry is ``HANDLER``)."""
    return params, UnloadHandler(cluster, queues, params)


HANDLER = HandlerType("unload", UnloadParams, build)
