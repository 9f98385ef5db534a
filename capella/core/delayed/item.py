"""A delayed message and its binary form, shared by the schedule's log records and chunk files.

An item is the message as it will be appended, plus when (``due``); its ``sid`` is its
schedule id, which stands in for a missing external id. The encoding is the message body of
``capella.core.log.codec`` behind the due time and two flags, so an item without an external id
or an external time reads back without one.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from capella.core.log.codec import message_body, message_from_body
from capella.core.message import Draft, LogMessage
from capella.errors import CorruptData

_ITEM = struct.Struct("<dB")
_HAS_EXTERNAL_ID = 1
_HAS_EXTERNAL_TIME = 2


@dataclass(slots=True)
class DelayedMessage:
    """One message waiting for its time. Replaced, never changed, once it is registered."""

    sid: int
    due: float
    created: float
    source: str
    external_id: int | None  # None: the sid stands in for it
    external_time: float | None
    segment: int
    payload: bytes
    headers: dict[str, str]
    chunk: int = 0  # the chunk file that holds it; 0 while it is only in the log

    @property
    def identity(self) -> tuple[str, int]:
        return (self.source, self.sid if self.external_id is None else self.external_id)

    @property
    def key(self) -> tuple[float, int]:
        return (self.due, self.sid)

    def draft(self) -> Draft:
        source, external_id = self.identity
        return Draft(self.payload, source, external_id, self.external_time, self.segment, self.headers)


def encode_item(item: DelayedMessage) -> bytes:
    flags = (_HAS_EXTERNAL_ID if item.external_id is not None else 0) | (
        _HAS_EXTERNAL_TIME if item.external_time is not None else 0
    )
    message = LogMessage(
        item.sid,
        item.created,
        item.source,
        0 if item.external_id is None else item.external_id,
        0.0 if item.external_time is None else item.external_time,
        item.segment,
        item.payload,
        item.headers,
    )
    return _ITEM.pack(item.due, flags) + message_body(message)


def decode_item(data: bytes, start: int = 0, chunk: int = 0) -> DelayedMessage:
    try:
        due, flags = _ITEM.unpack_from(data, start)
    except struct.error:
        raise CorruptData("scheduled item is too short") from None
    m = message_from_body(data, start + _ITEM.size)
    return DelayedMessage(
        m.id,
        due,
        m.time,
        m.source,
        m.external_id if flags & _HAS_EXTERNAL_ID else None,
        m.external_time if flags & _HAS_EXTERNAL_TIME else None,
        m.segment,
        m.payload,
        m.headers,
        chunk,
    )


def identity_hash(source: str, external_id: int) -> int:
    """A stable 64-bit hash of an identity (the same in every process)."""
    digest = hashlib.blake2b(source.encode() + external_id.to_bytes(8, "little", signed=True), digest_size=8)
    return int.from_bytes(digest.digest(), "little", signed=True)
