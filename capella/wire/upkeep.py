"""The params of the handlers that look after a queue's blocks: flush, unload, archive, expire."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import Meta

from capella.errors import InvalidRequest
from capella.wire.fields import INT64_MAX, Bytes, Interval, PositiveSeconds, Seconds
from capella.wire.params import Params
from capella.wire.struct import Struct


class FlushParams(Params):
    """Flush the queues' open blocks every interval."""

    interval: Interval = 1.0


class UnloadParams(Params):
    """with neither idle nor age, idle is 60 s"""

    interval: Interval = 10.0
    idle: Annotated[PositiveSeconds, Meta(description="unload blocks not read for this long")] | None = None
    age: Annotated[PositiveSeconds, Meta(description="unload blocks older than this")] | None = None

    def __post_init__(self) -> None:
        if self.idle is None and self.age is None:
            self.idle = 60.0


class ArchiveCondition(Struct, forbid_unknown_fields=True):
    """Blocks whose age is in [from_age, to_age) move to mark."""

    mark: Annotated[int, Meta(ge=0, le=255, description="a mark the queue maps to a mount")]
    from_age: Seconds = 0.0
    to_age: Annotated[PositiveSeconds | None, Meta(description="null: no upper bound")] = None

    def holds(self, age: float) -> bool:
        return self.from_age <= age and (self.to_age is None or age < self.to_age)


class ArchiveParams(Params):
    """Move blocks between tiers by age."""

    conditions: Annotated[list[ArchiveCondition], Meta(min_length=1)]
    interval: Interval = 60.0
    limit: Annotated[int, Meta(ge=1, le=INT64_MAX, description="blocks moved per pass")] = 100

    def __post_init__(self) -> None:
        for i, c in enumerate(self.conditions):
            if c.to_age is not None and c.to_age <= c.from_age:
                where = f"params.conditions[{i}].to_age"
                raise InvalidRequest(f"{where} must be greater than from_age", field=where)


class ExpireParams(Params):
    """at least one of max_age, max_bytes and max_messages"""

    # Given and not null, as the server reads them.
    __schema_extra__: ClassVar[dict[str, Any]] = {
        "anyOf": [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
            for name in ("max_age", "max_bytes", "max_messages")
        ]
    }

    interval: Interval = 60.0
    max_age: PositiveSeconds | None = None
    max_bytes: Bytes | None = None
    max_messages: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None

    def __post_init__(self) -> None:
        if self.max_age is None and self.max_bytes is None and self.max_messages is None:
            raise InvalidRequest("params: give max_age, max_bytes or max_messages", field="params.max_age")
