"""Queues on the wire: the definition a client sends, and the info and stats it gets back."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from msgspec import UNSET, Meta, UnsetType

from capella.wire.fields import (
    DefinitionSaveMode,
    Int64,
    PositiveDuration,
    SizeText,
    Time,
    schema,
)
from capella.wire.struct import Struct

BlockMessages = Annotated[int, schema(minimum=1, maximum=10_000_000)]
BlockBytes = Annotated[
    Annotated[int, schema(minimum=1024, maximum=1024**3)] | SizeText, Meta(description="from 1 KiB to 1 GiB")
]
BlockAge = Annotated[PositiveDuration, Meta(description="greater than 0")]


class BlockLimits(Struct, forbid_unknown_fields=True):
    """a block is sealed when it reaches any of these (not retention: they do not limit what the
    queue keeps)"""

    max_messages: BlockMessages | None = None
    max_bytes: BlockBytes | None = None
    max_age: BlockAge | None = None


class LegacyBlockLimits(Struct, forbid_unknown_fields=True):
    """the old name of block, with max_count for max_messages; not with block"""

    max_count: BlockMessages | None = None
    max_bytes: BlockBytes | None = None
    max_age: BlockAge | None = None


class SegmentRange(Struct, forbid_unknown_fields=True):
    """min must not be greater than max; null removes the range"""

    min: Int64
    max: Int64


class Mounts(Struct, forbid_unknown_fields=True):
    """names of configured mounts; meta cannot change on an existing queue"""

    meta: str | None = None
    marks: (
        Annotated[
            dict[Annotated[str, schema(pattern="^[0-9]{1,3}$")], str],
            schema(required=["0"], description="mark (0-255) → mount; must map mark 0"),
        ]
        | None
    ) = None


class QueueDefinition(Struct, forbid_unknown_fields=True):
    """A queue's definition; fields left out keep their current (or default) values."""

    __schema_extra__: ClassVar[dict[str, Any]] = {"not": {"required": ["block", "limits"]}}

    block: BlockLimits | None = None
    # Left out (UNSET) rather than null when not given: an answer never has it.
    limits: Annotated[LegacyBlockLimits, schema(deprecated=True)] | UnsetType | None = UNSET
    save: DefinitionSaveMode | None = None
    subscription_save: DefinitionSaveMode | None = None
    segments: SegmentRange | None = None
    mounts: Mounts | None = None


class BlockCounts(Struct):
    """Blocks by tier mark and by state."""

    total: int
    by_mark: dict[str, int]
    by_state: dict[str, int]


class ScheduleCounts(Struct):
    """The queue's delayed messages."""

    count: int
    in_memory: int
    chunks: int
    next_due: Time | None


class Gap(Struct):
    """Ids lost to a quarantined block."""

    from_id: int
    to_id: int


class RecoveryReport(Struct):
    """What the last start found on disk and repaired."""

    truncated_bytes: int
    quarantined_blocks: list[str]
    gaps: list[Gap]


class Fault(Struct):
    """A write step that fails, its last error, and since when."""

    step: Literal["journal", "seal", "state"]
    error: str
    since: Time


class QueueStats(Struct):
    """What a queue holds now, and whether it accepts writes."""

    first_id: int
    last_id: int
    messages: int
    bytes: int
    blocks: BlockCounts
    subscriptions: int
    scheduled: ScheduleCounts
    recovery: RecoveryReport
    writable: Annotated[bool, Meta(description="Whether the queue accepts writes now")]
    faults: Annotated[
        list[Fault], Meta(description="What stops writes: the failing step, its last error, since when")
    ]
    last_error: str | None


class QueueInfo(Struct):
    """A queue: its name, definition (fully resolved) and stats."""

    name: str
    definition: QueueDefinition
    stats: QueueStats


class QueueList(Struct):
    """Every queue the caller may read."""

    queues: list[QueueInfo]


class Block(Struct):
    """A block of a queue: its id range, size, storage tier (mark) and state."""

    first_id: int
    last_id: int
    count: int
    bytes: int
    mark: Annotated[int, Meta(description="the storage tier (the queue's mounts.marks); 0 until sealed")]
    state: Literal["open", "sealing", "sealed", "quarantined"]
    loaded: Annotated[bool, Meta(description="its contents are in memory")]
    sealed: Annotated[Time | None, Meta(description="when it was sealed; null while open or sealing")]


class BlockList(Struct):
    """A queue's blocks in id order, a page at a time."""

    blocks: list[Block]
    next_after: Annotated[int | None, Meta(description="pass as after for the next page; null on the last")]
