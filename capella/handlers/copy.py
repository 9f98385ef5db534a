"""Copy messages from queues into another queue, keeping order, identity and exactly-once.

For each source queue the handler keeps a replica subscription as its cursor: read after the
cursor, append to the destination as a dedup insert (each message keeps its ``source``,
``external_id``, ``external_time``, ``segment`` and headers), then commit the cursor. A crash
between the append and the commit copies the batch again and dedup absorbs it, so transfer
is at least once and the destination holds each message exactly once. Two copy handlers in
opposite directions cannot loop: a message that comes back is recognised by its identity.

When there is a backlog a pass copies at full speed for up to ``PASS_SECONDS``; when caught
up it long-polls the source for ``wait`` seconds instead of sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.core.message import Draft, SaveMode
from capella.core.queue import Queue
from capella.errors import InvalidRequest, SubscriptionNotFound
from capella.handlers.params import Params
from capella.handlers.queues import PassResult, QueueHandler

# A pass with a long backlog ends after this long, so the status shows progress.
PASS_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class CopyParams:
    to: str
    subscription: str
    interval: float = 0.0
    batch: int = 1000
    wait: float = 2.0
    segments: tuple[tuple[int, int], ...] | None = None
    save: SaveMode = SaveMode.WAIT
    commit_save: SaveMode = SaveMode.WAIT

    @classmethod
    def parse(cls, data: object) -> CopyParams:
        params = Params(
            data,
            {"from", "to", "subscription", "interval", "batch", "wait", "segments", "save", "commit_save"},
        )
        to = params.raw("to")
        if not isinstance(to, str) or not to:
            raise InvalidRequest("params.to must name the destination queue", field="params.to")
        if "/" in to or "/" in str(params.raw("from") or ""):
            raise InvalidRequest(
                "params.to: copying to or from an external cluster (cluster/queue) is not available yet",
                field="params.to",
            )
        subscription = params.raw("subscription") or f"copy-to-{to}"
        check_name(str(subscription), "subscription")
        return cls(
            to=to,
            subscription=str(subscription),
            interval=params.duration("interval", 0.0, positive=False) or 0.0,
            batch=params.integer("batch", 1000) or 1000,
            wait=params.duration("wait", 2.0, positive=False) or 0.0,
            segments=_segments(params.raw("segments")),
            save=_save(params.raw("save"), "params.save"),
            commit_save=_save(params.raw("commit_save"), "params.commit_save"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "to": self.to,
            "subscription": self.subscription,
            "interval": self.interval,
            "batch": self.batch,
            "wait": self.wait,
            "segments": None if self.segments is None else [list(s) for s in self.segments],
            "save": self.save.name.lower(),
            "commit_save": self.commit_save.name.lower(),
        }


@dataclass(slots=True)
class _Progress:
    lag: dict[str, int] = field(default_factory=dict)


class CopyHandler(QueueHandler[CopyParams]):
    """Copy every selected queue into ``params.to``."""

    def __init__(self, cluster: Cluster, queues: list[str], params: CopyParams) -> None:
        super().__init__(cluster, queues, params)
        self._progress = _Progress()

    def status(self) -> dict[str, Any]:
        """Extra status: messages each source still has beyond the cursor."""
        return {"lag": sum(self._progress.lag.values()), "lag_by_queue": dict(self._progress.lag)}

    async def run_queue(self, queue: Queue) -> PassResult:
        params = self.params
        target = self._cluster.queue(params.to)
        if target is queue:
            raise InvalidRequest(f"queue {queue.name} cannot be copied into itself")
        try:
            cursor = queue.subscription(params.subscription).last_id
        except SubscriptionNotFound:
            cursor = 0
        # The cursor is a replica subscription, so producers can ask for receipts.
        await queue.commit(params.subscription, cursor, replica=True, save=params.commit_save)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PASS_SECONDS
        result = PassResult()
        waited = False
        while loop.time() < deadline:
            page = await queue.read_after(cursor, params.batch, params.segments)
            if page.messages:
                drafts = [
                    Draft(m.payload, m.source, m.external_id, m.external_time, m.segment, m.headers)
                    for m in page.messages
                ]
                answers = await target.append(drafts, params.save)
                # Count what the destination stored; repeats (dedup) are not copies.
                stored = [m for m, a in zip(page.messages, answers, strict=True) if not a.duplicate]
                result += PassResult(len(stored), sum(len(m.payload) for m in stored))
            if page.last_id > cursor:
                await queue.commit(params.subscription, page.last_id, save=params.commit_save)
                cursor = page.last_id
                self._progress.lag[queue.name] = queue.last_id - cursor
                continue
            self._progress.lag[queue.name] = queue.last_id - cursor
            if waited or params.wait <= 0:
                break
            await queue.wait_for(cursor, params.wait)
            waited = True
        return result


def _segments(value: object) -> tuple[tuple[int, int], ...] | None:
    if value is None:
        return None
    field_name = "params.segments"
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"{field_name} must be a non-empty list of [lo, hi] pairs", field=field_name)
    ranges = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            or item[0] > item[1]
        ):
            raise InvalidRequest(f"{field_name}: {item!r} is not a [lo, hi] pair", field=field_name)
        ranges.append((item[0], item[1]))
    return tuple(ranges)


def _save(value: object, field_name: str) -> SaveMode:
    if value is None:
        return SaveMode.WAIT
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise InvalidRequest(f"{field_name} must be a save mode", field=field_name)
    return SaveMode.parse(value)
