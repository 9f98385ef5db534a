"""Delete the oldest sealed blocks past an age, or while the queue is over its size or count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capella.core.log.blocks import BlockMeta
from capella.core.queue import Queue
from capella.errors import InvalidRequest
from capella.handlers.base import HandlerParams, HandlerType, PassResult
from capella.handlers.params import Params
from capella.handlers.queues import QueueHandler


@dataclass(frozen=True, slots=True)
class ExpireParams(HandlerParams):
    interval: float = 60.0
    max_age: float | None = None
    max_bytes: int | None = None
    max_messages: int | None = None

    @classmethod
    def parse(cls, data: object) -> ExpireParams:
        params = Params(data, {"interval", "max_age", "max_bytes", "max_messages"})
        parsed = cls(
            interval=params.duration("interval", 60.0) or 60.0,
            max_age=params.duration("max_age"),
            max_bytes=params.size("max_bytes"),
            max_messages=params.integer("max_messages"),
        )
        if parsed.max_age is None and parsed.max_bytes is None and parsed.max_messages is None:
            raise InvalidRequest("params: give max_age, max_bytes or max_messages", field="params.max_age")
        return parsed

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval": self.interval,
            "max_age": self.max_age,
            "max_bytes": self.max_bytes,
            "max_messages": self.max_messages,
        }

    def expired(self, sealed: Sequence[BlockMeta], messages: int, size: int, now: float) -> list[BlockMeta]:
        """The oldest blocks to delete, given the queue's total ``messages`` and ``size``."""
        doomed: list[BlockMeta] = []
        for block in sealed:
            too_old = self.max_age is not None and now - block.sealed >= self.max_age
            too_big = self.max_bytes is not None and size > self.max_bytes
            too_many = self.max_messages is not None and messages > self.max_messages
            if not (too_old or too_big or too_many):
                break
            doomed.append(block)
            messages -= block.count
            size -= block.bytes
        return doomed


class ExpireHandler(QueueHandler[ExpireParams]):
    """Delete whole blocks from the oldest end; ids are never reused afterwards."""

    needs = "admin"

    async def run_queue(self, queue: Queue) -> PassResult:
        stats = queue.stats()
        result = PassResult()
        for block in self.params.expired(
            queue.sealed_blocks(), stats["messages"], stats["bytes"], queue.now()
        ):
            result += PassResult(1, await queue.delete_block(block.first_id))
        # Objects of a delete interrupted by a crash (the manifest had already let go).
        await queue.clean_leftovers()
        return result


if TYPE_CHECKING:
    from capella.core.cluster import Cluster
    from capella.handlers.reach import Reach


def build(
    cluster: Cluster, queues: list[str], raw: object, reach: Reach, name: str
) -> tuple[ExpireParams, ExpireHandler]:
    """The ``expire`` handler type (its registry entry is ``HANDLER``)."""
    params = ExpireParams.parse(raw)
    return params, ExpireHandler(cluster, queues, params)


HANDLER = HandlerType("expire", ExpireParams, build)
