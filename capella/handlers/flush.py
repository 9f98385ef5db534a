"""The periodic save of ``mark`` writes (and cursors, and blocks past their age).

The cluster already flushes every queue each ``storage.flush_interval``; a flush handler
adds a faster (or slower-changing) rhythm for the queues it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capella.core.cluster import Cluster
from capella.handlers.params import Params, PassResult, selected


@dataclass(frozen=True, slots=True)
class FlushParams:
    interval: float = 1.0

    @classmethod
    def parse(cls, data: object) -> FlushParams:
        params = Params(data, {"interval"})
        return cls(interval=params.duration("interval", 1.0) or 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"interval": self.interval}


class FlushHandler:
    """Save what ``mark`` writes left in memory."""

    def __init__(self, cluster: Cluster, queues: list[str], params: FlushParams) -> None:
        self._cluster = cluster
        self._queues = queues
        self.params = params
        self.interval = params.interval

    async def run_once(self) -> PassResult:
        result = PassResult()
        for queue in selected(self._cluster, self._queues):
            await queue.tick()
            result += PassResult(items=1)
        return result
