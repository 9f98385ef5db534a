"""A message as the queue stores it (and as the API shows it), and the save modes a write can ask for."""

from __future__ import annotations

import base64
import enum
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec

from capella.errors import InvalidSaveMode
from capella.records import record_batch

EMPTY_HEADERS: dict[str, str] = {}


class LogMessage(msgspec.Struct, gc=False):
    """One stored message. ``id`` is assigned by the queue; times are UNIX seconds.

    Never changed after it is built. Not tracked by the garbage collector (it holds no other
    object that could point back to it): a queue keeps tens of thousands of messages in
    memory, and every full collection walked each of them again (measured: ~1.5 µs per
    produced message went to those walks). Building one costs ~0.1 µs.
    """

    id: int
    time: float
    source: str
    external_id: int
    external_time: float
    segment: int
    payload: bytes
    headers: dict[str, str] = {}

    @property
    def key(self) -> tuple[str, int]:
        """The message's global identity."""
        return (self.source, self.external_id)


class Draft(msgspec.Struct, gc=False):
    """A message as a producer sends it, before the queue gives it an id.

    ``None`` means "use the default": the cluster name for ``source``, the new id for
    ``external_id``, the receive time for ``external_time``. ``deliver_at`` (UNIX seconds)
    holds the message back until then (delayed delivery); ``None`` delivers it at once.
    One is built per produced message, so it is a Struct (cheaper to build than a slotted
    dataclass); the hot path passes ``EMPTY_HEADERS`` rather than have an empty dict made.
    """

    payload: bytes
    source: str | None = None
    external_id: int | None = None
    external_time: float | None = None
    segment: int = 0
    headers: dict[str, str] = {}
    deliver_at: float | None = None


def stored_message(m: LogMessage) -> dict[str, Any]:
    """``m`` as the StoredMessage JSON object of the API (``capella.wire.messages``): ``data``
    for a UTF-8 payload, ``data_b64`` for any other bytes."""
    shown: dict[str, Any] = {
        "id": m.id,
        "time": m.time,
        "source": m.source,
        "external_id": m.external_id,
        "external_time": m.external_time,
        "segment": m.segment,
        "headers": m.headers,
    }
    try:
        shown["data"] = m.payload.decode()
    except UnicodeDecodeError:
        shown["data_b64"] = base64.b64encode(m.payload).decode("ascii")
    return shown


class SaveMode(enum.IntEnum):
    """How durable a write is before it is answered (see docs/api.md)."""

    NONE = 0
    IMMEDIATE = 1
    MARK = 2
    WAIT = 3
    DEFAULT = 4

    @classmethod
    def parse(cls, value: str | int | None) -> SaveMode:
        if value is None or value == "":
            return cls.DEFAULT
        if isinstance(value, int) and not isinstance(value, bool):
            if 0 <= value <= 4:
                return cls(value)
        elif isinstance(value, str):
            text = value.strip().lower()
            if text.isdigit() and 0 <= int(text) <= 4:
                return cls(int(text))
            try:
                return cls[text.upper()]
            except KeyError:
                pass
        raise InvalidSaveMode(f"unknown save mode {value!r}: use none, immediate, mark, wait, default or 0-4")

    def resolve(self, default: SaveMode) -> SaveMode:
        return default if self is SaveMode.DEFAULT else self


_DRAFT_COLUMNS = tuple(
    attrgetter(name) for name in ("payload", "source", "external_id", "external_time", "segment", "headers")
)


def drafts_batch(
    drafts: Sequence[Draft], *, base_id: int = 0, base_time: float = 0.0, source: str = ""
) -> bytes:
    """``drafts`` as one record batch (``capella.records.record_batch``): a field a draft leaves
    ``None`` stays the batch's default (the id, the batch's time, its source)."""
    payloads, sources, external_ids, external_times, segments, headers = (
        list(map(get, drafts)) for get in _DRAFT_COLUMNS
    )
    return record_batch.encode(
        payloads,
        sources=sources,
        external_ids=external_ids,
        external_times=external_times,
        segments=segments,
        headers=headers,
        base_id=base_id,
        base_time=base_time,
        source=source,
    )
