"""The original's bodies as typed structs, and their translation to and from Capella's model.

Field names are the original's, spelling included (``default_save_mod``, ``sbscr``,
``marker_block_mount_name``). Durations are integer nanoseconds, message payloads base64,
times RFC 3339 with nanoseconds.
"""

from __future__ import annotations

import datetime
from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from capella.core.definition import QueueSettings
from capella.core.message import Draft, LogMessage, SaveMode
from capella.errors import InvalidRequest, InvalidSaveMode
from capella.wire import queues as wire

NS = 1_000_000_000
ZERO_TIME = "0001-01-01T00:00:00Z"

T = TypeVar("T")


def decode(raw: msgspec.Raw, kind: type[T], action: str) -> T:
    """The request body as ``kind``; a wrong shape is ``InvalidRequest`` naming the action."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"the body of {action} is not valid: {exc}") from None


# --- messages ------------------------------------------------------------------------------


class OriginalMessage(msgspec.Struct):
    """A message as the original sends it: ``eid`` 0 means none, ``s_dt`` is UNIX seconds."""

    msg: bytes = b""
    eid: int = 0
    s_dt: int = 0
    src: str = ""
    sg: int = 0

    def draft(self) -> Draft:
        return Draft(
            payload=self.msg,
            source=self.src or None,
            external_id=self.eid or None,
            external_time=float(self.s_dt) if self.s_dt else None,
            segment=self.sg,
        )


class AddOne(msgspec.Struct):
    msg: OriginalMessage
    sm: int = 0


class AddList(msgspec.Struct):
    msgs: list[OriginalMessage] = []
    sm: int = 0


class _Listed(msgspec.Struct):
    msgs: list[msgspec.Raw] | None = None


LISTED = msgspec.json.Decoder(_Listed)


def listed(skimmed: _Listed) -> int:
    """How many messages an ``AddList`` body holds (skimmed as raw items by ``LISTED``)."""
    return len(skimmed.msgs or ())


class GetAfter(msgspec.Struct):
    id_start: int = 0
    cnt_limit: int = 0


class Range(msgspec.Struct):
    from_: int = msgspec.field(name="from", default=0)
    to: int = 0


class Segments(msgspec.Struct):
    s: list[Range] | None = None


class GetSegment(msgspec.Struct):
    id_start: int = 0
    cnt_limit: int = 0
    segments: Segments | None = None


class SetLast(msgspec.Struct):
    sbscr: str
    id: int
    sm: int = 0


def save_mode(number: int) -> SaveMode:
    """The original's ``sm`` (0-4) as a save mode; anything else is refused as it refuses it."""
    if not 0 <= number <= 4:
        raise InvalidSaveMode(f"save mode {number} is not allowed")
    return SaveMode(number)


class ShownMessage(msgspec.Struct):
    """A stored message in the original's shape (``msg`` is base64 on the wire)."""

    id: int
    eid: int
    s_dt: int
    dt: str
    msg: bytes
    src: str
    is_saved: bool
    sg: int


class SegmentPage(msgspec.Struct):
    """``q_get_segment``'s answer: the messages (null for none) and where the read ended."""

    msgs: list[ShownMessage] | None
    last_id: int


def message(m: LogMessage) -> ShownMessage:
    """A stored message in the original's shape."""
    return ShownMessage(
        id=m.id,
        eid=m.external_id,
        s_dt=int(m.external_time),
        dt=rfc3339(m.time),
        msg=m.payload,
        src=m.source,
        is_saved=True,
        sg=m.segment,
    )


def rfc3339(seconds: float | None) -> str:
    """UNIX seconds as Go's RFC 3339 with nanoseconds (trailing zeros dropped); None is Go's zero time."""
    if seconds is None:
        return ZERO_TIME
    ns = round(seconds * NS)
    whole, frac = divmod(ns, NS)
    text = datetime.datetime.fromtimestamp(whole, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{frac:09d}".rstrip("0")
    return f"{text}.{digits}Z" if digits else f"{text}Z"


# --- queues --------------------------------------------------------------------------------


class QueueParams(msgspec.Struct):
    cnt_limit: int = 0
    time_limit: int = 0
    len_limit: int = 0
    meta_mount_name: str = ""
    subscriber_mount_name: str = ""
    marker_block_mount_name: dict[str, str] | None = None
    segments: Segments | None = None
    default_save_mod: int = 0
    use_default_save_mod_force: bool = False


class QueueDescription(msgspec.Struct):
    name: str
    type: str = ""
    create_on_load: bool = False
    owner: str = ""
    params: QueueParams = msgspec.field(default_factory=QueueParams)


def mark_number(mark: str) -> int:
    """The original's block marks (``""``, ``"a"``... ``"z"``) as Capella's tiers 0-26."""
    if mark == "":
        return 0
    if len(mark) == 1 and "a" <= mark <= "z":
        return ord(mark) - ord("a") + 1
    raise InvalidRequest(f"block mark {mark!r}: Capella takes the marks '' and 'a' to 'z'")


def mark_name(number: int) -> str:
    return "" if number == 0 else chr(ord("a") + number - 1)


def queue_definition(params: QueueParams, mounts: set[str], default_mount: str) -> wire.QueueDefinition:
    """The definition ``PUT /v1/queues/{queue}`` takes, for the original's queue params.

    A mount the cluster does not have is taken as its default mount (the original's examples
    name ``meta``, ``fast``, ``compress``...).
    """

    def mount(name: str) -> str:
        return name if name in mounts else default_mount

    block = wire.BlockLimits(
        max_messages=params.cnt_limit or None,
        max_bytes=params.len_limit or None,
        max_age=params.time_limit / NS or None,
    )
    segments: wire.SegmentRange | UnsetType = UNSET
    if params.segments is not None and params.segments.s:
        if len(params.segments.s) > 1:
            raise InvalidRequest("a Capella queue takes one segment range; give segments.s one {from, to}")
        only = params.segments.s[0]
        segments = wire.SegmentRange(min=only.from_, max=only.to)
    marks = {str(mark_number(k)): mount(v) for k, v in (params.marker_block_mount_name or {}).items()}
    return wire.QueueDefinition(
        block=block if block != wire.BlockLimits() else UNSET,
        save=int(save_mode(params.default_save_mod)) if params.default_save_mod else "none",
        segments=segments,
        mounts=wire.Mounts(meta=mount(params.meta_mount_name or default_mount), marks=marks or None),
    )


def queue_description(name: str, d: QueueSettings) -> QueueDescription:
    """A Capella queue in the original's ``gd_q`` shape."""
    return QueueDescription(
        name=name,
        type="simple_queue",
        params=QueueParams(
            cnt_limit=d.block.max_messages,
            time_limit=round(d.block.max_age * NS),
            len_limit=d.block.max_bytes,
            meta_mount_name=d.meta_mount,
            subscriber_mount_name=d.meta_mount,
            marker_block_mount_name={mark_name(k): v for k, v in sorted(d.marks.items())},
            segments=None if d.segments is None else Segments([Range(d.segments[0], d.segments[1])]),
            default_save_mod=int(d.save),
        ),
    )
