"""Queues on the wire: the definition a client sends, and the info and stats it gets back."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_args

from msgspec import UNSET, Meta, UnsetType

from capella.errors import InvalidRequest
from capella.units import parse_duration, parse_size
from capella.wire.fields import (
    DefinitionSaveMode,
    Int64,
    PositiveDuration,
    Time,
    schema,
    size_between,
)
from capella.wire.struct import Struct

T = TypeVar("T")

MIN_BLOCK_MESSAGES, MAX_BLOCK_MESSAGES = 1, 10_000_000
MIN_BLOCK_BYTES, MAX_BLOCK_BYTES = 1024, 1024**3
MAX_MARK = 255
# "0" to "255", with up to three digits ("007" too).
MARK_PATTERN = r"^(0{0,2}[0-9]|0?[1-9][0-9]|1[0-9]{2}|2[0-4][0-9]|25[0-5])$"
_MARK = re.compile(MARK_PATTERN)

BlockMessages = Annotated[int, schema(minimum=MIN_BLOCK_MESSAGES, maximum=MAX_BLOCK_MESSAGES)]
BlockBytes = Annotated[
    Annotated[int, schema(minimum=MIN_BLOCK_BYTES, maximum=MAX_BLOCK_BYTES)]
    | Annotated[str, schema(**size_between(MIN_BLOCK_BYTES, MAX_BLOCK_BYTES))],
    Meta(description="from 1 KiB to 1 GiB"),
]
BlockAge = Annotated[PositiveDuration, Meta(description="greater than 0")]
# A name or a number, in any case ("WAIT"); not "default" (4), which would point back at the
# definition itself. Read by SaveMode.parse, whose error is invalid_save_mode.
QueueSaveMode = (
    Annotated[str, schema(enum=list(get_args(DefinitionSaveMode)))]
    | Annotated[int, schema(minimum=0, maximum=3)]
)
Mark = Annotated[str, schema(pattern=MARK_PATTERN)]
# One of the server's configured mounts ([mounts.NAME]); the built-in configuration has one,
# default, and the document cannot list another server's; none is named "" (config.py).
MountName = Annotated[str, schema(minLength=1, examples=["default"])]


class BlockLimits(Struct, forbid_unknown_fields=True):
    """a block is sealed when it reaches any of these (not retention: they do not limit what the
    queue keeps)"""

    max_messages: BlockMessages | None = None
    max_bytes: BlockBytes | None = None
    max_age: BlockAge | None = None

    def parsed(self, name: str, count: str) -> tuple[int | None, int | None, float | None]:
        """The messages, bytes and seconds given (None: not given), or ``InvalidRequest`` naming
        ``name.field`` (``count`` is what ``max_messages`` is called there)."""
        messages = self.max_messages
        if messages is not None and not MIN_BLOCK_MESSAGES <= messages <= MAX_BLOCK_MESSAGES:
            raise InvalidRequest(
                f"{name}.{count} must be an integer from {MIN_BLOCK_MESSAGES} to {MAX_BLOCK_MESSAGES}",
                field=f"{name}.{count}",
            )
        size = None if self.max_bytes is None else _unit(parse_size, self.max_bytes, f"{name}.max_bytes")
        if size is not None and not MIN_BLOCK_BYTES <= size <= MAX_BLOCK_BYTES:
            raise InvalidRequest(f"{name}.max_bytes must be from 1 KiB to 1 GiB", field=f"{name}.max_bytes")
        age = None if self.max_age is None else _unit(parse_duration, self.max_age, f"{name}.max_age")
        if age is not None and age <= 0:
            raise InvalidRequest(f"{name}.max_age must be greater than 0", field=f"{name}.max_age")
        return messages, size, age


class LegacyBlockLimits(Struct, forbid_unknown_fields=True):
    """the old name of block, with max_count for max_messages; not with block"""

    max_count: BlockMessages | None = None
    max_bytes: BlockBytes | None = None
    max_age: BlockAge | None = None


class SegmentRange(Struct, forbid_unknown_fields=True):
    """min must not be greater than max; null removes the range"""

    min: Int64
    max: Int64

    def __post_init__(self) -> None:
        if self.min > self.max:
            raise InvalidRequest("segments.min must not be greater than segments.max", field="segments")


class Mounts(Struct, forbid_unknown_fields=True):
    """names of configured mounts; meta cannot change on an existing queue"""

    meta: MountName | None = None
    marks: (
        Annotated[
            dict[Mark, MountName],
            schema(required=["0"], description="mark (0-255) → mount; must map mark 0"),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        if self.marks is None:
            return
        for key in self.marks:
            if not _MARK.fullmatch(key):
                raise InvalidRequest(f"mounts.marks: mark {key!r} must be 0-{MAX_MARK}", field="mounts.marks")
        if not any(int(key) == 0 for key in self.marks):
            raise InvalidRequest("mounts.marks must map mark 0 (new blocks)", field="mounts.marks")


class QueueDefinition(Struct, forbid_unknown_fields=True):
    """A queue's definition; fields left out (or null) keep their current (or default) values,
    except segments, where null removes the range.

    Decoded (``wire.decode``), it holds only values the rules below allow; ``core/definition.py``
    applies it to a queue's current definition, which it renders back into this struct.
    """

    __schema_extra__: ClassVar[dict[str, Any]] = {"not": {"required": ["block", "limits"]}}

    # Left out (UNSET) when not given, unlike null: block and limits are not both given, and a
    # null segments removes the range. Answers have every field but limits.
    block: BlockLimits | UnsetType | None = UNSET
    limits: Annotated[LegacyBlockLimits, schema(deprecated=True)] | UnsetType | None = UNSET
    save: QueueSaveMode | None = None
    subscription_save: QueueSaveMode | None = None
    segments: SegmentRange | UnsetType | None = UNSET
    mounts: Mounts | None = None
    # "shared": the queue's bytes live in S3 objects and its order in PostgreSQL, written and
    # read through every node of the shared cluster (docs/shared.md). Fixed at creation.
    storage: Literal["local", "shared"] | None = None

    def __post_init__(self) -> None:
        if self.block is not UNSET and self.limits is not UNSET:
            raise InvalidRequest("give block or its deprecated name limits, not both", field="limits")

    def block_limits(self) -> tuple[int | None, int | None, float | None]:
        """``block`` (or the old ``limits``): the messages, bytes and seconds given."""
        if self.block:
            return self.block.parsed("block", "max_messages")
        if self.limits:
            old = self.limits
            return BlockLimits(old.max_count, old.max_bytes, old.max_age).parsed("limits", "max_count")
        return None, None, None


def _unit(parse: Callable[[object], T], value: object, what: str) -> T:
    try:
        return parse(value)
    except ValueError as exc:
        raise InvalidRequest(f"{what}: {exc}", field=what) from None


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

    step: Literal["journal", "seal", "state", "shared"]
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
