"""The copy handler on the wire: its params and what it adds to the status."""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, UnsetType, field

from capella.wire.fields import IntervalOrZero, NameOrDefault, Time, schema
from capella.wire.params import Batch, Params, QueueRef, SaveModeName, Segments, check_segments
from capella.wire.struct import Struct


class CopyParams(Params):
    """Copy messages from queues (or another cluster) into a queue, once each."""

    to: Annotated[QueueRef, Meta(description="the destination queue, or cluster/queue")]
    from_: (
        Annotated[QueueRef, Meta(description="the source queue when the definition names no queues")] | None
    ) = field(default=None, name="from")
    subscription: Annotated[
        NameOrDefault,
        Meta(description='the cursor on each source ("" or not given: copy-to-<to>, "/" and "~" as ".")'),
    ] = ""
    interval: Annotated[
        IntervalOrZero,
        Meta(description="pause between passes (default 0: continuous, long-polling for wait)"),
    ] = 0.0
    batch: Batch = 1000
    wait: Annotated[IntervalOrZero, Meta(description="long-poll when caught up (default 2 s; 0: none)")] = 2.0
    segments: Segments | None = None
    save: SaveModeName = "wait"
    # A lost cursor commit only sends a batch again, which dedup absorbs: no need to wait.
    commit_save: SaveModeName = "mark"

    def __post_init__(self) -> None:
        # A subscription name holds neither "/" (cluster/queue) nor "~" (a topic's partition).
        self.subscription = self.subscription or f"copy-to-{self.to.replace('/', '.').replace('~', '.')}"
        check_segments(self.segments)

    def clusters(self) -> list[str]:
        """The external clusters it reads from or writes to (``cluster/queue``)."""
        return sorted({ref.partition("/")[0] for ref in (self.from_, self.to) if ref and "/" in ref})


class CopyStatus(Struct):
    """What a copy handler adds to the status: messages each source holds past the cursor.

    A local source's lag is read from the queue and the cursor when asked; a remote source's
    is the last one seen, with the time it was seen (``lag_observed``).
    """

    lag: Annotated[
        int,
        schema(
            minimum=0,
            description="messages the sources hold past the cursors, read when asked (from another "
            "cluster: as last seen, see lag_observed)",
        ),
    ]
    lag_by_queue: Annotated[dict[str, int], Meta(description="lag by queue")]
    lag_observed: (
        Annotated[
            Time | None,
            Meta(
                description="from another cluster: when its lag was last seen (the last pass that reached "
                "it); absent where lag is read from the queue and the cursor at the moment of asking"
            ),
        ]
        | UnsetType
    ) = UNSET
