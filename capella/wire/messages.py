"""Messages on the wire: what a producer sends, what a reader gets, and the schedule's views."""

from __future__ import annotations

import binascii
from base64 import b64decode, b64encode
from typing import Annotated, Any, ClassVar

from msgspec import UNSET, Meta, UnsetType

from capella.errors import InvalidMessage
from capella.wire.fields import (
    MAX_SOURCE_BYTES,
    Base64,
    Base64Out,
    DateTime,
    Delay,
    Headers,
    Int64,
    MessageId,
    StoredId,
    Time,
    TimeInput,
    WholeFloat,
    exactly_one,
    schema,
)
from capella.wire.struct import Struct

Source = Annotated[
    str,
    schema(
        minLength=1,
        maxLength=MAX_SOURCE_BYTES,
        description=f"at most {MAX_SOURCE_BYTES} bytes of UTF-8; default the cluster name",
    ),
]


class Message(Struct, forbid_unknown_fields=True):
    """Exactly one of data (UTF-8 text) and data_b64 (standard base64)."""

    # And not both deliver_at and delay (null counts as not given).
    __schema_extra__: ClassVar[dict[str, Any]] = exactly_one("data", "data_b64") | {
        "not": {
            "required": ["deliver_at", "delay"],
            "properties": {name: {"not": {"type": "null"}} for name in ("deliver_at", "delay")},
        }
    }

    data: str | None = None
    data_b64: Base64 | None = None
    source: Source | None = None
    # 5.0 too, as JSON Schema's integer: the produce path reads the body straight into this.
    external_id: Int64 | WholeFloat | None = None
    external_time: (
        Annotated[
            Annotated[float, schema(minimum=0)] | DateTime,
            Meta(description="UNIX seconds or RFC 3339; not in the future"),
        ]
        | None
    ) = None
    segment: Int64 | WholeFloat | None = None
    headers: Headers | None = None
    deliver_at: (
        Annotated[
            TimeInput,
            Meta(
                description="UNIX seconds or RFC 3339: hold the message back until then (at most ten "
                "years ahead; a time in the past delivers at once)"
            ),
        ]
        | None
    ) = None
    delay: (
        Annotated[Delay, Meta(description="hold the message back this long (not with deliver_at)")] | None
    ) = None


class ProduceBody(Message, forbid_unknown_fields=True):
    """A produce request: ``{"messages": [Message, ...]}``, or one Message object on its own."""

    messages: list[Message] | None = None


class MessageBatch(Struct, forbid_unknown_fields=True):
    """Several messages in one request, stored in order."""

    messages: list[Message]


# kw_only lets the fields keep the order the server writes them in.
class ProduceResult(Struct, omit_defaults=True, kw_only=True):
    """id for a message stored now; scheduled_id and deliver_at for a delayed one (its id comes
    when it is delivered)"""

    id: MessageId | UnsetType = UNSET
    scheduled_id: MessageId | UnsetType = UNSET
    deliver_at: Time | UnsetType = UNSET
    duplicate: bool
    # A shared queue's message answered from the node's buffer (save none or mark): its id
    # comes with the flush (id 0 until then).
    pending: bool | UnsetType = UNSET


class ReplicaReceipt(Struct):
    """with replicas=N: the replica subscriptions that have the batch"""

    required: int
    count: int
    subscriptions: list[str]


class ProduceResults(Struct, omit_defaults=True):
    """One result per message, in the order sent."""

    results: list[ProduceResult]
    replicas: ReplicaReceipt | UnsetType = UNSET


# gc=False: a reader makes thousands of these a page, and the cycle collector's passes over
# them cost as much as making them (a third of the client's binary decode). Their fields are
# numbers, strings and a dict of strings, so they hold no reference cycle to collect.
class StoredMessage(Struct, omit_defaults=True, gc=False):
    """A stored message: data for UTF-8 payloads, data_b64 for any other bytes."""

    id: MessageId
    time: Time
    source: str
    external_id: Int64
    external_time: Time
    segment: Int64
    headers: Headers
    data: str | UnsetType = UNSET
    data_b64: Base64Out | UnsetType = UNSET

    # A property, not a field: it is not on the wire, so it is not in the schema either.
    @property
    def payload(self) -> bytes:
        """The payload as bytes, whichever of data and data_b64 the server chose."""
        if not isinstance(self.data, UnsetType):
            return self.data.encode()
        if isinstance(self.data_b64, UnsetType):
            raise InvalidMessage(f"message {self.id} has neither data nor data_b64")
        try:
            return b64decode(self.data_b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidMessage(f"message {self.id}: data_b64 is not valid base64") from None


def stored_of(
    id: int,
    time: float,
    source: str,
    external_id: int,
    external_time: float,
    segment: int,
    payload: bytes,
    headers: dict[str, str],
) -> StoredMessage:
    """The StoredMessage a JSON answer gives for a message decoded from a binary form:
    ``data`` for a UTF-8 payload, ``data_b64`` for any other bytes. The fields come in
    ``Message`` order (``record_batch.Fields``'s)."""
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        b64 = b64encode(payload).decode("ascii")
        return StoredMessage(id, time, source, external_id, external_time, segment, headers, data_b64=b64)
    return StoredMessage(id, time, source, external_id, external_time, segment, headers, text)


class Messages(Struct):
    """A page of messages after the cursor."""

    messages: list[StoredMessage]
    last_id: Annotated[int, Meta(description="pass as the next after")]


class Replicas(Struct):
    """The replica subscriptions that have a message."""

    id: MessageId
    count: Annotated[int, Meta(ge=0)]
    subscriptions: list[str]


class ScheduledMessage(Struct, omit_defaults=True):
    """A delayed message: what will be appended, and when."""

    scheduled_id: MessageId
    deliver_at: Time
    created: Time
    source: str
    external_id: Annotated[Int64, Meta(description="the scheduled_id when the producer gave none")]
    external_time: Time | None
    segment: Int64
    headers: Headers
    data: str | UnsetType = UNSET
    data_b64: Base64Out | UnsetType = UNSET


class ScheduledList(Struct):
    """A page of the schedule, in delivery order."""

    scheduled: list[ScheduledMessage]
    count: Annotated[int, Meta(description="everything scheduled in the queue")]
    next: Annotated[str | None, Meta(description="pass as after for the next page")]


class Reschedule(Struct, forbid_unknown_fields=True):
    """exactly one of deliver_at and delay (null counts as not given)"""

    __schema_extra__: ClassVar[dict[str, Any]] = exactly_one("deliver_at", "delay")

    deliver_at: TimeInput | None = None
    delay: Delay | None = None


class CancelScheduled(Struct, forbid_unknown_fields=True):
    """The scheduled messages to cancel."""

    ids: Annotated[list[StoredId], Meta(max_length=10_000)]


class CancelledScheduled(Struct):
    """What a cancel did."""

    cancelled: list[MessageId]
    not_cancelled: Annotated[
        list[MessageId], Meta(description="already delivered, being delivered right now, or unknown")
    ]
