"""Drop the contents of sealed blocks from memory when they are idle or old.

Reads load a dropped block again on demand, so a queue of millions of messages keeps a flat
memory profile: only block metadata, dedup summaries and the open block stay in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capella.core.queue import Queue
from capella.errors import InvalidRequest
from capella.handlers.base import HandlerParams, HandlerType, PassResult
from capella.handlers.params import Params
from capella.handlers.queues import QueueHandler


@dataclass(frozen=True, slots=True)
class UnloadParams(HandlerParams):
    interval: float = 10.0
    idle: float | None = 60.0
    age: float | None = None

    @classmethod
    def parse(cls, data: object) -> UnloadParams:
        params = Params(data, {"interval", "idle", "age"})
        idle = params.duration("idle")
        age = params.duration("age")
        if idle is None and age is None:
            if params.has("idle") or params.has("age"):
                raise InvalidRequest("params: give idle or age", field="params.idle")
            idle = 60.0
        return cls(interval=params.duration("interval", 10.0) or 10.0, idle=idle, age=age)

    def to_dict(self) -> dict[str, Any]:
        return {"interval": self.interval, "idle": self.idle, "age": self.age}


class UnloadHandler(QueueHandler[UnloadParams]):
    """Drop loaded block contents not read for ``idle`` seconds or sealed ``age`` seconds ago."""

    async def run_queue(self, queue: Queue) -> PassResult:
        return PassResult(*queue.unload(idle=self.params.idle, age=self.params.age))


if TYPE_CHECKING:
    from capella.core.cluster import Cluster
    from capella.handlers.reach import Reach


def build(
    cluster: Cluster, queues: list[str], raw: object, reach: Reach, name: str
) -> tuple[UnloadParams, UnloadHandler]:
    """The ``unload`` handler type (its registry entry is ``HANDLER``)."""
    params = UnloadParams.parse(raw)
    return params, UnloadHandler(cluster, queues, params)


HANDLER = HandlerType("unload", UnloadParams, build)
