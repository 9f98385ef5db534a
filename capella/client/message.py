"""Messages between Python values and the wire shape of docs/api.md.

A message to produce is a wire dict (``data`` or ``data_b64`` plus optional metadata), a
``str`` (sent as ``data``) or ``bytes`` (sent as ``data_b64``); ``to_batch`` encodes a batch of
them as one record batch (docs/format.md), the client's default produce body. A message read back is the
``capella.wire.messages.StoredMessage`` struct, whose ``payload`` property is the payload as
``bytes``, so a caller never has to look at which of ``data`` and ``data_b64`` the server chose.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

from capella import wire
from capella.errors import InvalidMessage
from capella.records import record_batch
from capella.wire.fields import MAX_SOURCE_BYTES

MessageLike: TypeAlias = Mapping[str, Any] | str | bytes
"""What ``produce`` accepts for one message."""

Segments: TypeAlias = str | Iterable[int | tuple[int, int]]
"""A segment filter: ``"0-9,20-29"``, or ints and inclusive ``(lo, hi)`` ranges."""


def to_wire(message: MessageLike) -> dict[str, Any]:
    """The wire dict for one message to produce."""
    if isinstance(message, str):
        return {"data": message}
    if isinstance(message, bytes | bytearray | memoryview):
        return {"data_b64": base64.b64encode(message).decode("ascii")}
    if isinstance(message, Mapping):
        return dict(message)
    raise InvalidMessage(f"a message is a dict, str or bytes, not {type(message).__name__}")


# The fields a record batch carries; a message with any other (deliver_at, delay, a typo) goes
# as JSON, so that the server schedules it or names what is wrong in its own words.
_BATCH_FIELDS = frozenset(
    {"data", "data_b64", "source", "external_id", "external_time", "segment", "headers"}
)


class _NotBatchable(Exception):
    """A message the batch form cannot carry as the JSON form would: send JSON instead."""


def to_batch(messages: Sequence[MessageLike]) -> bytes | None:
    """``messages`` as one record batch, or None when they must go as JSON.

    None for an empty list, a delayed message, or anything the server would refuse: the JSON
    form then carries it and the answer is the one the API has always given.
    """
    n = len(messages)
    if not 0 < n <= record_batch.MAX_COUNT:
        return None
    payloads: list[bytes] = []
    sources: list[str | None] = []
    external_ids: list[int | None] = []
    external_times: list[float | None] = []
    segments: list[int] = []
    headers: list[dict[str, str]] = []
    try:
        for message in messages:
            if isinstance(message, str):
                payloads.append(message.encode())
            elif isinstance(message, bytes | bytearray | memoryview):
                payloads.append(bytes(message))
            elif isinstance(message, Mapping):
                fields = _batch_fields(message)
                payloads.append(fields[0])
                sources.append(fields[1])
                external_ids.append(fields[2])
                external_times.append(fields[3])
                segments.append(fields[4])
                headers.append(fields[5])
                continue
            else:
                return None
            sources.append(None)
            external_ids.append(None)
            external_times.append(None)
            segments.append(0)
            headers.append({})
        return record_batch.encode(
            payloads,
            sources=sources,
            external_ids=external_ids,
            external_times=external_times,
            segments=segments,
            headers=headers,
        )
    except (_NotBatchable, InvalidMessage, UnicodeEncodeError):
        return None


def _batch_fields(
    message: Mapping[str, Any],
) -> tuple[bytes, str | None, int | None, float | None, int, dict[str, str]]:
    given = {k: v for k, v in message.items() if v is not None}
    if not given.keys() <= _BATCH_FIELDS:
        raise _NotBatchable
    data, data_b64 = given.get("data"), given.get("data_b64")
    if isinstance(data, str) and data_b64 is None:
        payload = data.encode()
    elif isinstance(data_b64, str) and data is None:
        try:
            payload = base64.b64decode(data_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _NotBatchable from None
    else:
        raise _NotBatchable
    source = given.get("source")
    if source is not None and (
        not isinstance(source, str) or not source or len(source.encode()) > MAX_SOURCE_BYTES
    ):
        raise _NotBatchable
    external_id = _int64(given.get("external_id"))
    segment = _int64(given.get("segment"))
    external_time = given.get("external_time")
    if external_time is not None:
        try:
            external_time = wire.parse_time(external_time)
        except ValueError:
            raise _NotBatchable from None
        if not math.isfinite(external_time):
            raise _NotBatchable
    headers = given.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise _NotBatchable
    return payload, source, external_id, external_time, segment or 0, headers


def _int64(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not wire.INT64_MIN <= value <= wire.INT64_MAX:
        raise _NotBatchable
    return value


def segments_param(segments: Segments) -> str:
    """The ``segments=`` query value: ``"0-9,20-29"``."""
    if isinstance(segments, str):
        return segments
    parts = []
    for item in segments:
        if isinstance(item, tuple):
            low, high = item
            parts.append(f"{int(low)}-{int(high)}")
        else:
            parts.append(str(int(item)))
    return ",".join(parts)
