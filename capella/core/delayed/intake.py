"""Delayed drafts at produce time: each gets a schedule id and waits in the schedule.

A request may mix drafts due now with drafts to deliver later. The ones due now are
appended; each delayed one takes the next id of the queue's lease as its schedule id, unless
its identity is already in the log or the schedule. The answers keep the request's order.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from capella.core.delayed.item import DelayedMessage
from capella.core.delayed.schedule import Schedule
from capella.core.log.writer import Appended, Writer
from capella.core.message import Draft


class Delayed(msgspec.Struct, frozen=True, gc=False):
    """A message that waits in the schedule; it gets its id when it is delivered.

    Rendered in a produce answer as ``{"scheduled_id", "deliver_at", "duplicate"}``.
    """

    scheduled: int = msgspec.field(name="scheduled_id")
    deliver_at: float
    duplicate: bool

    @property
    def id(self) -> int:
        return 0


async def assign_mixed(
    writer: Writer, schedule: Schedule, drafts: Sequence[Draft], later: list[int], now: float
) -> list[Appended | Delayed]:
    """Append the drafts due now and stage the ``later`` ones (indexes), holding the write lock."""
    waiting = set(later)
    at_once = [d for i, d in enumerate(drafts) if i not in waiting]
    appended = iter(await writer.assign(at_once, now))
    if writer.next_id + len(later) > writer.lease_until:
        await writer.extend_lease(len(later))
    results: list[Appended | Delayed] = []
    own, dedup = writer.own, writer.dedup
    for index, d in enumerate(drafts):
        if index not in waiting:
            results.append(next(appended))
            continue
        source = own if d.source is None else d.source
        if d.external_id is not None:
            found = await dedup.find(source, d.external_id)
            if found is not None:
                results.append(Appended(found, True))
                continue
            existing = await schedule.find((source, d.external_id))
            if existing is not None:
                results.append(Delayed(existing.sid, existing.due, True))
                continue
        # The schedule id is a message id that no message will ever get: it can stand in
        # for the external id without clashing with a message produced here.
        sid = writer.next_id
        writer.next_id = sid + 1
        assert d.deliver_at is not None
        schedule.stage(
            DelayedMessage(
                sid,
                d.deliver_at,
                now,
                source,
                d.external_id,
                d.external_time,
                d.segment,
                d.payload,
                d.headers,
            )
        )
        results.append(Delayed(sid, d.deliver_at, False))
    return results
