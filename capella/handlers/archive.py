"""Move sealed blocks between storage tiers by age, then clean up interrupted moves.

A condition ``{mark, from_age, to_age}`` says: a sealed block whose age (time since it was
sealed) is in ``[from_age, to_age)`` belongs on the mount the queue maps ``mark`` to. The move
itself (copy, read back, switch the manifest, delete the old copy) is ``Queue.move_block``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capella.core.log.blocks import BlockMeta
from capella.core.queue import Queue
from capella.errors import InvalidRequest
from capella.handlers.base import HandlerParams, HandlerType, PassResult
from capella.handlers.params import Params, duration
from capella.handlers.queues import QueueHandler, selected


@dataclass(frozen=True, slots=True)
class Condition:
    mark: int
    from_age: float
    to_age: float | None

    def holds(self, age: float) -> bool:
        return self.from_age <= age and (self.to_age is None or age < self.to_age)


@dataclass(frozen=True, slots=True)
class ArchiveParams(HandlerParams):
    conditions: tuple[Condition, ...]
    interval: float = 60.0
    limit: int = 100

    @classmethod
    def parse(cls, data: object) -> ArchiveParams:
        params = Params(data, {"interval", "conditions", "limit"})
        raw = params.raw("conditions")
        if not isinstance(raw, list) or not raw:
            raise InvalidRequest("params.conditions must be a non-empty list", field="params.conditions")
        conditions = []
        for i, item in enumerate(raw):
            where = f"params.conditions[{i}]"
            if not isinstance(item, dict) or "mark" not in item:
                raise InvalidRequest(f"{where} must be an object with a mark", field=where)
            if unknown := sorted(set(item) - {"mark", "from_age", "to_age"}):
                raise InvalidRequest(f"{where}.{unknown[0]}: unknown field", field=f"{where}.{unknown[0]}")
            mark = item["mark"]
            if isinstance(mark, bool) or not isinstance(mark, int) or not 0 <= mark <= 255:
                raise InvalidRequest(f"{where}.mark must be an integer 0-255", field=f"{where}.mark")
            from_age = duration(item.get("from_age", 0), f"{where}.from_age", positive=False)
            to_age = None if item.get("to_age") is None else duration(item["to_age"], f"{where}.to_age")
            if to_age is not None and to_age <= from_age:
                raise InvalidRequest(f"{where}.to_age must be greater than from_age", field=f"{where}.to_age")
            conditions.append(Condition(mark, from_age, to_age))
        return cls(
            conditions=tuple(conditions),
            interval=params.duration("interval", 60.0) or 60.0,
            limit=params.integer("limit", 100) or 100,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval": self.interval,
            "limit": self.limit,
            "conditions": [
                {"mark": c.mark, "from_age": c.from_age, "to_age": c.to_age} for c in self.conditions
            ],
        }

    def check_marks(self, queue: Queue) -> None:
        """Every condition's mark must have a mount in the queue's mapping."""
        for i, c in enumerate(self.conditions):
            if c.mark not in queue.definition.marks:
                raise InvalidRequest(
                    f"params.conditions[{i}].mark: queue {queue.name} maps no mount to mark {c.mark}",
                    field=f"params.conditions[{i}].mark",
                )

    def moves(self, sealed: Sequence[BlockMeta], now: float) -> list[tuple[BlockMeta, int]]:
        """(block, target mark) for every sealed block that is on the wrong tier, oldest first."""
        planned = []
        for block in sealed:
            if block.state != "sealed":
                continue
            age = now - block.sealed
            # The last condition that holds wins, so a list can go from hot to cold in order.
            target = next((c.mark for c in reversed(self.conditions) if c.holds(age)), None)
            if target is not None and target != block.mark:
                planned.append((block, target))
            if len(planned) >= self.limit:
                break
        return planned


class ArchiveHandler(QueueHandler[ArchiveParams]):
    """Move sealed blocks to the tier their age calls for."""

    needs = "admin"

    async def run_queue(self, queue: Queue) -> PassResult:
        self.params.check_marks(queue)
        result = PassResult()
        for block, mark in self.params.moves(queue.sealed_blocks(), queue.now()):
            result += PassResult(1, await queue.move_block(block.first_id, mark))
        await queue.clean_leftovers()
        return result


if TYPE_CHECKING:
    from capella.core.cluster import Cluster
    from capella.handlers.reach import Reach


def build(
    cluster: Cluster, queues: list[str], raw: object, reach: Reach, name: str
) -> tuple[ArchiveParams, ArchiveHandler]:
    """The ``archive`` handler type; the marks must exist on every queue named exactly."""
    params = ArchiveParams.parse(raw)
    for queue in selected(cluster, [q for q in queues if not any(c in q for c in "*?[")]):
        params.check_marks(queue)
    return params, ArchiveHandler(cluster, queues, params)


HANDLER = HandlerType("archive", ArchiveParams, build)
