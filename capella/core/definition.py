"""A queue's definition: block limits, save modes, segment range and mount mapping.

``parse_definition`` turns the JSON body of ``PUT /v1/queues/{queue}`` (or a stored
definition) into a ``QueueDefinition``, naming the bad field in every error.

``block`` was called ``limits`` (with ``max_count`` for ``max_messages``) until the name was
found to read like retention; the old spelling is still read, in bodies, in
``[queue_defaults.limits]`` and in definitions stored before the rename, and never written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from capella.config import closest, unknown_key
from capella.core.message import SaveMode
from capella.errors import InvalidConfig, InvalidName, InvalidRequest
from capella.units import parse_duration, parse_size
from capella.wire import fields

_NAME = re.compile(fields.NAME)
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
T = TypeVar("T")


def check_name(name: str, what: str = "queue") -> str:
    """Names become storage keys and URL parts, so they stay in a safe alphabet."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidName(
            f"{what} name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ - . "
            "(not starting with '.' or '-')"
        )
    return name


@dataclass(frozen=True, slots=True)
class BlockLimits:
    """A block is sealed when it reaches any of these. Not retention: sealed blocks stay until an
    expire handler deletes them."""

    max_messages: int = 10_000
    max_bytes: int = 8 * 1024 * 1024
    max_age: float = 3600.0


@dataclass(frozen=True, slots=True)
class QueueDefinition:
    block: BlockLimits = BlockLimits()
    save: SaveMode = SaveMode.WAIT
    subscription_save: SaveMode = SaveMode.IMMEDIATE
    segments: tuple[int, int] | None = None
    meta_mount: str = "default"
    marks: dict[int, str] = field(default_factory=lambda: {0: "default"})

    def to_dict(self) -> dict[str, Any]:
        return {
            "block": {
                "max_messages": self.block.max_messages,
                "max_bytes": self.block.max_bytes,
                "max_age": self.block.max_age,
            },
            "save": self.save.name.lower(),
            "subscription_save": self.subscription_save.name.lower(),
            "segments": None if self.segments is None else {"min": self.segments[0], "max": self.segments[1]},
            "mounts": {"meta": self.meta_mount, "marks": {str(k): v for k, v in sorted(self.marks.items())}},
        }

    def mount_for_mark(self, mark: int) -> str:
        """The mount of ``mark``, or of the highest mark below it when it has none."""
        candidates = [m for m in self.marks if m <= mark]
        return self.marks[max(candidates)] if candidates else self.marks[min(self.marks)]


# The fields of a definition, nested; None marks a value without keys of its own to check.
FIELDS: dict[str, Any] = {
    "block": {"max_messages": None, "max_bytes": None, "max_age": None},
    "limits": {"max_count": None, "max_bytes": None, "max_age": None},  # block's old name
    "save": None,
    "subscription_save": None,
    "segments": None,
    "mounts": {"meta": None, "marks": None},
}


def default_definition(
    defaults: dict[str, Any], default_mount: str, mounts: set[str], source: str = "config"
) -> QueueDefinition:
    """The definition a new queue starts from: built-ins, then ``[queue_defaults]`` of ``source``."""
    if found := _unknown(defaults, FIELDS, "queue_defaults"):
        raise InvalidConfig(f"{source}: {unknown_key(*found)}")
    base = QueueDefinition(meta_mount=default_mount, marks={0: default_mount})
    try:
        return parse_definition(defaults, base, mounts)
    except InvalidRequest as exc:
        raise InvalidConfig(f"{source}: queue_defaults: {exc.message}") from None


def parse_definition(data: object, base: QueueDefinition, mounts: set[str]) -> QueueDefinition:
    """Apply the fields present in ``data`` on top of ``base``."""
    if not isinstance(data, dict):
        raise InvalidRequest("queue definition must be a JSON object")
    if found := _unknown(data, FIELDS, ""):
        path, key, known = found
        prefix = f"{path}." if path else ""
        close = closest(key, known)
        hint = f" (did you mean {prefix + close!r}?)" if close else ""
        raise InvalidRequest(f"unknown field {prefix + key!r}{hint}", field=prefix + key)
    if "block" in data and "limits" in data:
        raise InvalidRequest("give block or its deprecated name limits, not both", field="limits")
    result = base
    if "block" in data:
        result = replace(result, block=_block(data["block"], base.block, "block", "max_messages"))
    elif "limits" in data:
        result = replace(result, block=_block(data["limits"], base.block, "limits", "max_count"))
    if "save" in data:
        result = replace(result, save=_save(data["save"], "save"))
    if "subscription_save" in data:
        result = replace(result, subscription_save=_save(data["subscription_save"], "subscription_save"))
    if "segments" in data:
        result = replace(result, segments=_segments(data["segments"]))
    if "mounts" in data:
        meta, marks = _mounts(data["mounts"], result, mounts)
        result = replace(result, meta_mount=meta, marks=marks)
    return result


def _unknown(data: object, fields: dict[str, Any], path: str) -> tuple[str, str, list[str]] | None:
    """The first key in ``data`` that ``fields`` lacks: (the dotted path to its table, the key,
    the keys that table takes); a value of the wrong kind is left for its parser to name."""
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        if key not in fields:
            return path, key, list(fields)
        inner = f"{path}.{key}" if path else key
        if fields[key] is not None and (found := _unknown(value, fields[key], inner)):
            return found
    return None


def _block(value: object, base: BlockLimits, name: str, count: str) -> BlockLimits:
    """``block`` (``count`` = ``max_messages``), or the old ``limits`` (``count`` = ``max_count``)."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be an object", field=name)
    block = base
    if count in value:
        messages = value[count]
        if isinstance(messages, bool) or not isinstance(messages, int) or not 1 <= messages <= 10_000_000:
            raise InvalidRequest(
                f"{name}.{count} must be an integer from 1 to 10000000", field=f"{name}.{count}"
            )
        block = replace(block, max_messages=messages)
    if "max_bytes" in value:
        size = _unit(parse_size, value["max_bytes"], f"{name}.max_bytes")
        if not 1024 <= size <= 1024**3:
            raise InvalidRequest(f"{name}.max_bytes must be from 1 KiB to 1 GiB", field=f"{name}.max_bytes")
        block = replace(block, max_bytes=size)
    if "max_age" in value:
        age = _unit(parse_duration, value["max_age"], f"{name}.max_age")
        if age <= 0:
            raise InvalidRequest(f"{name}.max_age must be greater than 0", field=f"{name}.max_age")
        block = replace(block, max_age=age)
    return block


def _unit(parse: Callable[[object], T], value: object, what: str) -> T:
    try:
        return parse(value)
    except ValueError as exc:
        raise InvalidRequest(f"{what}: {exc}", field=what) from None


def _save(value: object, what: str) -> SaveMode:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise InvalidRequest(f"{what} must be a save mode name or number", field=what)
    mode = SaveMode.parse(value)
    if mode is SaveMode.DEFAULT:
        raise InvalidRequest(f"{what} cannot be 'default' in a queue definition", field=what)
    return mode


def _segments(value: object) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"min", "max"}:
        raise InvalidRequest('segments must be null or {"min": LO, "max": HI}', field="segments")
    lo, hi = value["min"], value["max"]
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, int) or not I64_MIN <= v <= I64_MAX:
            raise InvalidRequest("segments.min and segments.max must be 64-bit integers", field="segments")
    if lo > hi:
        raise InvalidRequest("segments.min must not be greater than segments.max", field="segments")
    return (lo, hi)


def _mounts(value: object, current: QueueDefinition, mounts: set[str]) -> tuple[str, dict[int, str]]:
    if not isinstance(value, dict):
        raise InvalidRequest("mounts must be an object", field="mounts")
    meta = value.get("meta", current.meta_mount)
    if not isinstance(meta, str) or meta not in mounts:
        raise InvalidRequest(f"mounts.meta: unknown mount {meta!r}", field="mounts.meta")
    marks = dict(current.marks)
    if "marks" in value:
        raw = value["marks"]
        if not isinstance(raw, dict) or not raw:
            raise InvalidRequest("mounts.marks must be a non-empty object", field="mounts.marks")
        marks = {}
        for key, mount in raw.items():
            if not str(key).isdigit() or int(key) > 255:
                raise InvalidRequest(f"mounts.marks: mark {key!r} must be 0-255", field="mounts.marks")
            if not isinstance(mount, str) or mount not in mounts:
                raise InvalidRequest(f"mounts.marks.{key}: unknown mount {mount!r}", field="mounts.marks")
            marks[int(key)] = mount
        if 0 not in marks:
            raise InvalidRequest("mounts.marks must map mark 0 (new blocks)", field="mounts.marks")
    return str(meta), marks
