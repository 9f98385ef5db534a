"""Move sealed blocks between storage tiers by age, then clean up interrupted moves.

A condition ``{mark, from_age, to_age}`` says: a sealed block whose age (time since it was
sealed) is in ``[from_age, to_age)`` belongs on the mount the queue maps ``mark`` to. The move
itself (copy, read back, switch the manifest, delete the old copy) is ``Queue.move_block``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from capella.core.base_queue import BaseQueue
from capella.core.log.blocks import BlockMeta
from capella.errors import InvalidRequest
from capella.handlers.base import Building, HandlerType, PassTally
from capella.handlers.per_queue import QueueHandler, selected
from capella.wire.upkeep import ArchiveParams


def check_marks(params: ArchiveParams, queue: BaseQueue) -> None:
    """Every condition's mark must have a mount in the queue's mapping."""
    for i, c in enumerate(params.conditions):
        if c.mark not in queue.definition.marks:
            raise InvalidRequest(
                f"params.conditions[{i}].mark: queue {queue.name} maps no mount to mark {c.mark}",
                field=f"params.conditions[{i}].mark",
            )


def moves(params: ArchiveParams, sealed: Sequence[BlockMeta], now: float) -> list[tuple[BlockMeta, int]]:
    """(block, target mark) for every sealed block that is on the wrong tier, oldest first."""
    planned = []
    for block in sealed:
        if block.state != "sealed":
            continue
        age = now - block.sealed
        # The last condition that holds wins, so a list can go from hot to cold in order.
        target = next((c.mark for c in reversed(params.conditions) if c.holds(age)), None)
        if target is not None and target != block.mark:
            planned.append((block, target))
        if len(planned) >= params.limit:
            break
    return planned


class ArchiveHandler(QueueHandler[ArchiveParams]):
    """Move sealed blocks to the tier their age calls for."""

    needs = "admin"

    async def run_queue(self, queue: BaseQueue) -> PassTally:
        check_marks(self.params, queue)
        result = PassTally()
        for block, mark in moves(self.params, queue.sealed_blocks(), queue.now()):
            result += PassTally(1, await queue.move_block(block.first_id, mark))
        await queue.clean_leftovers()
        return result


if TYPE_CHECKING:
    pass


def build(params: ArchiveParams, at: Building) -> tuple[ArchiveParams, ArchiveHandler]:
    """The ``archive`` handler type; the marks must exist on every queue named exactly."""
    for queue in selected(at.cluster, [q for q in at.queues if not any(c in q for c in "*?[")]):
        if not queue.shared:  # a shared queue is refused next, for what it is (check_shared)
            check_marks(params, queue)
    return params, ArchiveHandler(at.cluster, at.queues, params)


HANDLER = HandlerType("archive", ArchiveParams, build)
