"""The rules a message must meet before a queue stores it, with the limits from the configuration.

Every way a message comes in (each ``/v1`` form, the original protocol's ``POST /cluster``,
copies, and the ways still to come) ends in ``Queue.append`` or ``Queue.append_batch``, and
both check here, before an id is taken: a refused request stores none of its messages and uses
up no id. The front doors only decode; what they decode is held to the same limits whichever
door it came through. An error names the message's index and field in the words ``/v1`` has
always used, and each door answers it in its own shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from capella.config import ServerSettings
from capella.core.message import Draft
from capella.errors import (
    CorruptData,
    InvalidMessage,
    InvalidRequest,
    InvalidSubscriptionGroup,
    MessageHeadersTooLarge,
    PayloadTooLarge,
    SubscriptionMetadataTooLarge,
)
from capella.records.record_batch import Fields, Given, RecordBatch, decode_given, payload_sizes
from capella.wire.fields import INT64_MAX, INT64_MIN, MAX_DELAY, MAX_SOURCE_BYTES

# An external_time this far ahead of our clock is "in the future" (clocks of two clusters
# are never exactly equal, and a copy must not be refused for a few milliseconds of skew).
FUTURE_SKEW = 5.0

# What a cursor keeps beside its id (capella.core.subscription): the group that commits it and
# the metadata of its last commit, each at most this many bytes of UTF-8 (the metadata's limit
# is Kafka's default offset.metadata.max.bytes).
MAX_GROUP_BYTES = 4096
MAX_METADATA_BYTES = 4096


@dataclass(frozen=True, slots=True)
class MessageLimits:
    """What one append may hold: ``[server]``'s ``max_message_size``, ``max_batch``,
    ``max_message_headers`` and ``max_message_headers_size`` (their defaults here too)."""

    max_size: int = 1024 * 1024
    max_batch: int = 10_000
    max_headers: int = 64
    max_headers_size: int = 16 * 1024

    @classmethod
    def of(cls, server: ServerSettings) -> MessageLimits:
        return cls(
            max_size=server.max_message_size,
            max_batch=server.max_batch,
            max_headers=server.max_message_headers,
            max_headers_size=server.max_message_headers_size,
        )


def check_drafts(
    drafts: Sequence[Draft], limits: MessageLimits, now: float, segments: tuple[int, int] | None
) -> None:
    """Refuse ``drafts`` (one append) unless every one meets the rules: at most ``max_batch`` of
    them, each payload at most ``max_size`` bytes, a source of 1 to ``MAX_SOURCE_BYTES`` bytes,
    an external id and a segment in int64 (the segment in the queue's range ``segments`` too), a
    finite external time not in the future, headers within their limits, a due time at most ten
    years ahead. The common draft (a payload and nothing else) costs one length check.
    """
    check_count(len(drafts), limits)
    max_size = limits.max_size
    for index, d in enumerate(drafts):
        if len(d.payload) > max_size:
            raise too_large(index, len(d.payload), max_size)
        if (
            d.source is not None
            or d.external_id is not None
            or d.external_time is not None
            or d.segment
            or d.headers
            or d.deliver_at is not None
        ):
            _check_fields(d, index, limits, now)
    if segments is not None:
        for index, d in enumerate(drafts):
            check_segment(index, d.segment, segments)


def _check_fields(d: Draft, index: int, limits: MessageLimits, now: float) -> None:
    if d.source is not None:
        check_source(d.source, index)
    if d.external_id is not None:
        check_int64(d.external_id, index, "external_id")
    if d.external_time is not None:
        check_external_time(d.external_time, index, now)
    if d.segment:
        check_int64(d.segment, index, "segment")
    if d.headers:
        check_headers(d.headers, index, limits.max_headers, limits.max_headers_size)
    if d.deliver_at is not None and not (math.isfinite(d.deliver_at) and d.deliver_at <= now + MAX_DELAY):
        raise bad(index, "deliver_at", "more than ten years ahead")


class BatchColumns(NamedTuple):
    """What a producer's record batch gave, as ``check_batch`` read it: None where every
    message has the default (``fields`` is None for a batch of payloads alone)."""

    fields: Fields | None
    external_ids: list[int | None] | None
    external_times: list[float | None] | None


def check_batch(
    batch: RecordBatch,
    limits: MessageLimits,
    now: float,
    segments: tuple[int, int] | None,
    own: str,
    given: Given | None = None,
) -> BatchColumns:
    """``check_drafts`` for a record batch: its count, payload sizes and decoded columns.

    A batch of payloads alone (every other field the default) is checked from its payload
    lengths, never decoded. The source given is ``own`` where the batch left it to the default.
    ``given``: the batch's ``decode_given`` when the caller made it already.
    """
    fields: Fields | None = None
    external_ids: list[int | None] | None = None
    external_times: list[float | None] | None = None
    try:
        if batch.flags:
            fields, external_ids, external_times = decode_given(batch) if given is None else given
            sizes = list(map(len, fields.payloads))
        else:
            sizes = payload_sizes(batch)
    except CorruptData as exc:
        raise InvalidMessage(f"record batch: {exc.message}") from None
    check_count(len(sizes), limits)
    check_sizes(sizes, limits)
    if fields is None:
        if segments is not None:
            check_segment(0, 0, segments)
        return BatchColumns(None, None, None)
    for index, source in enumerate(fields.sources):
        if source != own:
            check_source(source, index)
    if external_times is not None:
        for index, t in enumerate(external_times):
            if t is not None:
                check_external_time(t, index, now)
    if segments is not None:
        for index, segment in enumerate(fields.segments):
            check_segment(index, segment, segments)
    for index, headers in enumerate(fields.headers):
        if headers:
            check_headers(headers, index, limits.max_headers, limits.max_headers_size)
    return BatchColumns(fields, external_ids, external_times)


def check_count(count: int, limits: MessageLimits) -> None:
    """``PayloadTooLarge`` for an append of more than ``max_batch`` messages."""
    if count > limits.max_batch:
        raise PayloadTooLarge(
            f"the batch holds {count} messages; the limit is {limits.max_batch}", limit=limits.max_batch
        )


def check_sizes(sizes: Sequence[int], limits: MessageLimits) -> None:
    """``PayloadTooLarge`` for the first payload of ``sizes`` over ``max_size``."""
    max_size = limits.max_size
    if sizes and max(sizes) > max_size:
        at = next(i for i, size in enumerate(sizes) if size > max_size)
        raise too_large(at, sizes[at], max_size)


def check_source(source: object, index: int) -> None:
    if type(source) is not str or not source:
        raise bad(index, "source", "expected a non-empty string")
    # A character is 1 to 4 bytes of UTF-8: only a long source is encoded to count them.
    if len(source) > MAX_SOURCE_BYTES // 4 and len(source.encode()) > MAX_SOURCE_BYTES:
        raise bad(index, "source", f"longer than {MAX_SOURCE_BYTES} bytes")


def check_int64(value: int, index: int, field: str) -> None:
    if not INT64_MIN <= value <= INT64_MAX:
        raise bad(index, field, "outside the signed 64-bit range")


def check_external_time(value: float, index: int, now: float) -> None:
    if not math.isfinite(value):
        raise bad(index, "external_time", "time must be finite")
    if value > now + FUTURE_SKEW:
        raise InvalidMessage(
            f"message {index}: external_time is in the future", index=index, field="external_time"
        )


def check_headers(headers: dict[str, str], index: int, max_count: int, max_size: int) -> None:
    """``MessageHeadersTooLarge`` when message ``index`` has more than ``max_count`` headers or
    more than ``max_size`` UTF-8 bytes of names and values.

    A message's headers are stored with it and sent with it to every push receiver, so a
    producer must not be able to make them arbitrarily many or large.
    """
    count = len(headers)
    if count > max_count:
        raise MessageHeadersTooLarge(
            f"message {index}: headers: {count} headers; the limit is {max_count} "
            "(server.max_message_headers)",
            index=index,
            field="headers",
            limit=max_count,
        )
    size = sum(map(len, headers)) + sum(map(len, headers.values()))
    # That counted characters; a character is 1 to 4 bytes of UTF-8, so only headers of more
    # than a quarter of the limit are encoded to count their bytes.
    if size * 4 > max_size:
        size = sum(len(name.encode()) + len(value.encode()) for name, value in headers.items())
    if size > max_size:
        raise MessageHeadersTooLarge(
            f"message {index}: headers: {size} bytes of names and values; the limit is {max_size} "
            "(server.max_message_headers_size)",
            index=index,
            field="headers",
            limit=max_size,
        )


def check_segment(index: int, segment: int, segments: tuple[int, int]) -> None:
    low, high = segments
    if not low <= segment <= high:
        raise InvalidMessage(
            f"message {index}: segment {segment} is outside the queue's range {low}-{high}",
            index=index,
            field="segment",
        )


def check_cursor(last_id: object) -> int:
    """A subscription cursor: an id from 0 to int64's largest, as every way in takes it."""
    if isinstance(last_id, bool) or not isinstance(last_id, int) or not 0 <= last_id <= INT64_MAX:
        raise InvalidRequest(
            f"last_id must be an integer from 0 to {INT64_MAX}", field="last_id", limit=INT64_MAX
        )
    return last_id


def check_group(group: object) -> str:
    """A cursor's group: text of 1 to ``MAX_GROUP_BYTES`` bytes of UTF-8, without NUL."""
    if not 0 < _utf8_size(group) <= MAX_GROUP_BYTES:
        raise InvalidSubscriptionGroup(
            f"group must be text of 1 to {MAX_GROUP_BYTES} bytes of UTF-8",
            field="group",
            limit=MAX_GROUP_BYTES,
        )
    return str(group)


def check_metadata(metadata: object) -> str:
    """A cursor commit's metadata: text of at most ``MAX_METADATA_BYTES`` bytes of UTF-8, without NUL."""
    if not 0 <= _utf8_size(metadata) <= MAX_METADATA_BYTES:
        raise SubscriptionMetadataTooLarge(
            f"metadata must be text of at most {MAX_METADATA_BYTES} bytes of UTF-8",
            field="metadata",
            limit=MAX_METADATA_BYTES,
        )
    return str(metadata)


def _utf8_size(text: object) -> int:
    """Bytes of ``text`` in UTF-8; -1 when it is not text that UTF-8 can hold (a lone surrogate),
    or holds NUL (a PostgreSQL text cannot: a shared queue's cursor keeps these there)."""
    if not isinstance(text, str) or "\x00" in text:
        return -1
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        return -1


def too_large(index: int, size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"message {index}: payload of {size} bytes is over the limit of {limit}", index=index, limit=limit
    )


def bad(index: int, field: str, reason: str) -> InvalidMessage:
    return InvalidMessage(f"message {index}: {field}: {reason}", index=index, field=field)
