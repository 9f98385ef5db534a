"""A queue's definition: block limits, save modes, segment range and mount mapping.

The shape and its rules are declared once, in ``wire/queues.py`` ``QueueDefinition``: a body
of ``PUT /v1/queues/{queue}``, a stored definition and ``[queue_defaults]`` decode straight into
it (``wire.decode``), which checks every field and names the bad one. Here is what only the
broker knows: ``apply`` lays a decoded definition over the queue's current one (fields left out
keep their values) and checks its mounts against the configured ones, giving the
``QueueSettings`` the queue reads (the definition resolved: every value set, in its plain
type: bytes, seconds, a ``SaveMode``, marks as numbers); ``to_wire`` renders it back into
the struct, for answers and for the registry. core may import wire (the layers in
pyproject.toml), so the model stays here and the shape there, each written once.

``block`` was called ``limits`` (with ``max_count`` for ``max_messages``) until the name was
found to read like retention; the old spelling is still read, in bodies, in
``[queue_defaults.limits]`` and in definitions stored before the rename, and never written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from msgspec import UNSET

from capella.config import unknown_key
from capella.core.message import SaveMode
from capella.errors import InvalidConfig, InvalidName, InvalidRequest, UnknownField
from capella.wire import fields
from capella.wire import queues as wire
from capella.wire.decode import decode

_NAME = re.compile(fields.NAME)
I64_MIN, I64_MAX = fields.INT64_MIN, fields.INT64_MAX


def check_name(name: str, what: str = "queue") -> str:
    """Names become storage keys and URL parts, so they stay in a safe alphabet."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidName(
            f"{what} name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ - . "
            "(not starting with '.' or '-')"
        )
    return name


@dataclass(frozen=True, slots=True)
class SealLimits:
    """A block is sealed when it reaches any of these. Not retention: sealed blocks stay until an
    expire handler deletes them."""

    max_messages: int = 10_000
    max_bytes: int = 8 * 1024 * 1024
    max_age: float = 3600.0


@dataclass(frozen=True, slots=True)
class QueueSettings:
    block: SealLimits = SealLimits()
    save: SaveMode = SaveMode.WAIT
    subscription_save: SaveMode = SaveMode.IMMEDIATE
    segments: tuple[int, int] | None = None
    meta_mount: str = "default"
    marks: dict[int, str] = field(default_factory=lambda: {0: "default"})
    storage: Literal["local", "shared"] = "local"  # shared: capella/shared/

    @property
    def shared(self) -> bool:
        return self.storage == "shared"

    def to_wire(self) -> wire.QueueDefinition:
        """The definition as answers show it and the registry stores it: every field set."""
        return wire.QueueDefinition(
            block=wire.BlockLimits(self.block.max_messages, self.block.max_bytes, self.block.max_age),
            save=self.save.name.lower(),
            subscription_save=self.subscription_save.name.lower(),
            segments=None if self.segments is None else wire.SegmentRange(*self.segments),
            mounts=wire.Mounts(self.meta_mount, {str(k): v for k, v in sorted(self.marks.items())}),
            storage=self.storage,
        )

    def to_dict(self) -> dict[str, Any]:
        """``to_wire`` as plain JSON values: the stored form."""
        stored: dict[str, Any] = msgspec.to_builtins(self.to_wire())
        return stored

    def mount_for_mark(self, mark: int) -> str:
        """The mount of ``mark``, or of the highest mark below it when it has none."""
        candidates = [m for m in self.marks if m <= mark]
        return self.marks[max(candidates)] if candidates else self.marks[min(self.marks)]


def default_definition(
    defaults: dict[str, Any], default_mount: str, mounts: set[str], source: str = "config"
) -> QueueSettings:
    """The definition a new queue starts from: built-ins, then ``[queue_defaults]`` of ``source``."""
    base = QueueSettings(meta_mount=default_mount, marks={0: default_mount})
    try:
        return apply(decode(defaults, wire.QueueDefinition), base, mounts)
    except UnknownField as exc:
        parent, _, key = str(exc.details["field"]).rpartition(".")
        path = f"queue_defaults.{parent}" if parent else "queue_defaults"
        raise InvalidConfig(f"{source}: {unknown_key(path, key, exc.known)}") from None
    except InvalidRequest as exc:
        raise InvalidConfig(f"{source}: queue_defaults: {exc.message}") from None


def parse_definition(data: object, base: QueueSettings, mounts: set[str]) -> QueueSettings:
    """The fields present in ``data`` (a body or a stored definition) laid over ``base``."""
    return apply(decode(data, wire.QueueDefinition), base, mounts)


def apply(body: wire.QueueDefinition, base: QueueSettings, mounts: set[str]) -> QueueSettings:
    """``body``'s fields over ``base``, its mounts checked against the configured ``mounts``."""
    messages, size, age = body.block_limits()
    block = SealLimits(
        base.block.max_messages if messages is None else messages,
        base.block.max_bytes if size is None else size,
        base.block.max_age if age is None else age,
    )
    segments = base.segments
    if body.segments is None:
        segments = None
    elif body.segments is not UNSET:
        segments = (body.segments.min, body.segments.max)
    meta, marks = base.meta_mount, base.marks
    if body.mounts is not None:
        meta = base.meta_mount if body.mounts.meta is None else body.mounts.meta
        if meta not in mounts:
            raise InvalidRequest(f"mounts.meta: unknown mount {meta!r}", field="mounts.meta")
        if body.mounts.marks is not None:
            for key, mount in body.mounts.marks.items():
                if mount not in mounts:
                    raise InvalidRequest(f"mounts.marks.{key}: unknown mount {mount!r}", field="mounts.marks")
            marks = {int(key): mount for key, mount in body.mounts.marks.items()}
    return QueueSettings(
        block=block,
        save=base.save if body.save is None else _save(body.save, "save"),
        subscription_save=(
            base.subscription_save
            if body.subscription_save is None
            else _save(body.subscription_save, "subscription_save")
        ),
        segments=segments,
        meta_mount=meta,
        marks=marks,
        storage=base.storage if body.storage is None else body.storage,
    )


def _save(value: str | int, what: str) -> SaveMode:
    mode = SaveMode.parse(value)
    if mode is SaveMode.DEFAULT:
        raise InvalidRequest(f"{what} cannot be 'default' in a queue definition", field=what)
    return mode
