"""A produce request's body → ``Draft``s: JSON, NDJSON or raw bytes with query metadata.

This is the hot half of produce: a JSON body decodes straight into ``wire`` structs (one
msgspec pass, unknown fields refused) and each becomes a ``Draft`` in a short loop. A
record-batch body (``application/vnd.capella.batch``) is parsed batch by batch
(``record_batches``: lengths, checksums, flags; ``batch_drafts``: columns). This module only
decodes: the rules a message must meet (sizes, the batch's count, source, headers, times,
segments) are the queue's, checked by ``Queue.append`` for every way in
(``capella.core.limits``). The one bound applied here is the model's count, before a body
that could hold more messages than ``server.max_batch`` is decoded into them
(``count_before_decoding``). Every error names the message's index and field, in the words
the API has always used.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from capella import wire
from capella.core.limits import MessageLimits, check_count
from capella.core.message import EMPTY_HEADERS, Draft
from capella.errors import CorruptData, InvalidBatch, InvalidMessage, InvalidRequest
from capella.records import record_batch
from capella.records.record_batch import RecordBatch
from capella.units import parse_duration
from capella.wire import fields
from capella.wire import messages as wire_messages
from capella.wire.batch_page import BATCH_MEDIA_TYPE
from capella.wire.decode import Finding, unknown_field

HEADER_PREFIX = "capella-header-"
# How far ahead a delayed message may be scheduled (ten years).
MAX_DELAY = float(fields.MAX_DELAY)


# curl -d sends this type; a JSON document sent with it is taken as JSON, as users expect.
FORM = "application/x-www-form-urlencoded"


def body_kind(content_type: str | None) -> str:
    """``json``, ``form`` (JSON sent as curl -d sends it), ``ndjson``, ``octet`` or ``batch``."""
    if content_type is None:
        return "json"
    mime = content_type.partition(";")[0].strip().lower()
    if mime in ("application/json", "") or mime.endswith("+json"):
        return "json"
    if mime == FORM:
        return "form"
    if mime in ("application/x-ndjson", "application/jsonl", "application/x-jsonlines"):
        return "ndjson"
    if mime == "application/octet-stream":
        return "octet"
    if mime == BATCH_MEDIA_TYPE:
        return "batch"
    raise InvalidRequest(
        f"Content-Type {mime!r} is not supported: use application/json, "
        f"application/x-ndjson, application/octet-stream or {BATCH_MEDIA_TYPE}"
    )


_BODY = msgspec.json.Decoder(wire_messages.ProduceBody)
_ONE = msgspec.json.Decoder(wire_messages.Message)
# A message in a JSON list takes at least 3 bytes (``{}`` and a comma).
_MIN_ITEM_BYTES = 3


class _Items(msgspec.Struct):
    messages: list[msgspec.Raw] | None = None


_ITEMS = msgspec.json.Decoder(_Items)


def count_before_decoding(
    body: bytes, decoder: msgspec.json.Decoder[Any], counted: Callable[[Any], int], limits: MessageLimits
) -> None:
    """The model's batch bound (``check_count``) on a JSON body, before its messages are built.

    msgspec builds a whole list before a length bound applies, so a small gzip body that
    inflates to 300,000 tiny messages would be built first and refused after. A body short
    enough that it cannot hold more than ``max_batch`` messages (each takes at least 3
    bytes) costs nothing here; a longer one is skimmed once as raw items (no message is
    built) and counted with ``counted``. A body that does not parse is left to the decode.
    """
    if len(body) <= _MIN_ITEM_BYTES * limits.max_batch:
        return
    try:
        skimmed = decoder.decode(body)
    except msgspec.DecodeError:  # the real decode says what is wrong, in its words
        return
    check_count(counted(skimmed), limits)


def json_drafts(body: bytes, limits: MessageLimits, now: float = 0.0, *, form: bool = False) -> list[Draft]:
    """The drafts of a JSON body: ``{"messages": [...]}`` or one message object.

    With ``form``, the body came as ``application/x-www-form-urlencoded`` (curl -d): it is
    still read as JSON, and an error says so rather than "not valid JSON" alone.
    """
    count_before_decoding(body, _ITEMS, lambda items: len(items.messages or ()), limits)
    try:
        decoded = _BODY.decode(body)
    except msgspec.ValidationError as exc:
        raise _decode_error(str(exc), 0, batch=b'"messages"' in body) from None
    except msgspec.DecodeError as exc:
        if form:
            raise InvalidRequest(
                f"body is not valid JSON ({exc}): with Content-Type {FORM} (what curl -d sends) "
                "the body must still be a JSON document; form fields are not supported"
            ) from None
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    items: list[wire_messages.Message]
    if decoded.messages is not None:
        if extra := [f for f in wire_messages.Message.__struct_fields__ if getattr(decoded, f) is not None]:
            raise unknown_field(extra[0], ("messages",))
        items = decoded.messages
    else:
        items = [decoded]
    return _drafts(items, now)


def ndjson_drafts(body: bytes, limits: MessageLimits, now: float = 0.0) -> list[Draft]:
    lines = [line for line in body.split(b"\n") if line.strip()]
    check_count(len(lines), limits)  # the model's bound, before a line is decoded
    items = []
    for i, line in enumerate(lines):
        try:
            items.append(_ONE.decode(line))
        except msgspec.ValidationError as exc:
            raise _decode_error(str(exc), i, batch=False) from None
        except msgspec.DecodeError as exc:
            raise InvalidMessage(f"message {i}: not valid JSON: {exc}", index=i) from None
    return _drafts(items, now)


def record_batches(body: bytes) -> list[RecordBatch]:
    """The record batches of an ``application/vnd.capella.batch`` body, their heads checked.

    Bytes that do not parse (a length, a checksum, a flag, the count) are ``InvalidBatch``: a
    400, never a 500, and nothing is stored. A producer leaves the head's source empty: the
    server writes its own there. ``batch_drafts`` checks the bodies.
    """
    batches: list[RecordBatch] = []
    pos = 0
    try:
        # Not ``read_all``: a producer's batches all have base id 0 until the server stamps them.
        while pos < len(body):
            batch = record_batch.read(body, pos)
            if batch.source:
                raise CorruptData(
                    f"record batch at offset {pos}: the head's source is the server's to write; "
                    f"a producer leaves it empty (got {batch.source!r})"
                )
            batches.append(batch)
            pos = batch.end
    except CorruptData as exc:
        raise InvalidBatch(f"body: {exc.message}") from None
    return batches


# A base id no external id (an i64) can equal, and a time no external time can be (NaN is
# the batch's time on the wire): stamped on a copy of a batch, they tell which external ids
# and times the producer gave (a default resolves to the id or the time, a given one never).
_PROBE_ID = 1 << 63
_PROBE_TIME = math.nan
_GIVEN = record_batch.FLAG_EXTERNAL_IDS | record_batch.FLAG_EXTERNAL_TIMES


def batch_drafts(batches: list[RecordBatch], limits: MessageLimits) -> list[Draft]:
    """The messages of a body's batches as drafts (the queue checks them as it appends them): a
    body whose columns do not parse is ``InvalidBatch``; the batches' heads hold more messages
    than ``server.max_batch`` is ``PayloadTooLarge`` before a draft is built (a batch's columns
    cannot claim more messages than its bytes hold: they do not parse)."""
    try:
        columns = [
            (
                batch.flags,
                record_batch.read(record_batch.stamp(batch, _PROBE_ID, _PROBE_TIME, "")).fields()
                if batch.flags & _GIVEN
                else batch.fields(),
            )
            for batch in batches
        ]
    except CorruptData as exc:
        raise InvalidBatch(f"body: {exc.message}") from None
    check_count(sum(batch.count for batch in batches), limits)
    drafts: list[Draft] = []
    for flags, f in columns:
        if not flags:
            # Payloads and nothing else, the common batch.
            drafts += [Draft(p, None, None, None, 0, EMPTY_HEADERS) for p in f.payloads]
            continue
        for mid, source, external_id, external_time, segment, payload, headers in zip(
            f.ids, f.sources, f.external_ids, f.external_times, f.segments, f.payloads, f.headers, strict=True
        ):
            drafts.append(
                Draft(
                    payload,
                    source or None,
                    None if external_id == mid else external_id,
                    None if external_time != external_time else external_time,
                    segment,
                    headers or EMPTY_HEADERS,
                )
            )
    return drafts


def _drafts(items: list[wire_messages.Message], now: float) -> list[Draft]:
    """Drafts of decoded messages. This loop runs once per produced message: the common one,
    a text payload and nothing else, is handled inline (a call per message costs ~10 %)."""
    drafts = []
    for index, item in enumerate(items):
        data = item.data
        if (
            data is not None
            and item.data_b64 is None
            and item.source is None
            and item.external_id is None
            and item.external_time is None
            and item.segment is None
            and item.headers is None
            and item.deliver_at is None
            and item.delay is None
        ):
            drafts.append(Draft(data.encode(), None, None, None, 0, EMPTY_HEADERS))
        else:
            drafts.append(draft_of(item, index, now))
    return drafts


def draft_of(item: wire_messages.Message, index: int, now: float = 0.0) -> Draft:
    """One decoded message → Draft, or ``InvalidMessage`` naming the index and the field.

    ``now`` (the queue's clock) turns a relative ``delay`` into ``deliver_at``.
    """
    payload = _payload(item.data, item.data_b64, index)
    source, external_time, segment, headers = item.source, item.external_time, item.segment, item.headers
    return Draft(
        payload,
        source,
        None if item.external_id is None else int(item.external_id),
        None if external_time is None else _time(external_time, index),
        0 if segment is None else int(segment),
        EMPTY_HEADERS if headers is None else headers,
        None
        if item.deliver_at is None and item.delay is None
        else _due(item.deliver_at, item.delay, index, now),
    )


_GOT = {"bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string"}
_GOT |= {"array": "an array", "object": "an object", "null": "null"}
_EXPECTED = {
    "data": "expected a string (use data_b64 for bytes)",
    "data_b64": "expected a base64 string",
    "source": "expected a non-empty string",
    "external_id": "expected a 64-bit integer",
    "segment": "expected a 64-bit integer",
    "headers": "expected an object of string values",
    "external_time": "expected a number or an RFC 3339 string",
    "deliver_at": "expected a number or an RFC 3339 string",
    "delay": 'expected seconds or a duration such as "10m"',
}


def _decode_error(text: str, index: int, *, batch: bool) -> InvalidRequest:
    """Today's error for what msgspec found: the message's index and field, in our words."""
    found = Finding.of(text)
    problem, unknown = found.problem, found.unknown
    position, field, inside = _located(found.location)
    if position is not None:
        index = int(position)
    elif batch and field in (None, "messages"):
        if field == "messages" and unknown is None:
            return InvalidRequest("messages: expected a list of message objects")
        if unknown is not None:
            return unknown_field(unknown, ("messages",))
    if field is None or field == "messages":
        if unknown is not None:
            return _bad(index, unknown, "unknown field")
        if position is None and not batch:
            return InvalidRequest('the body must be {"messages": [...]} or a single message object')
        return InvalidMessage(f"message {index}: expected a JSON object", index=index)
    reason = _EXPECTED.get(field, problem)
    if field == "headers" and inside:
        reason = "a header value is not a string"
    elif field in ("external_id", "segment") and ("<=" in problem or ">=" in problem):
        reason = "outside the signed 64-bit range"
    elif (got := found.got) is not None:
        reason = f"{reason}, got {_GOT.get(got, got)}"
    elif field == "source" and "length" in problem:
        reason = "expected a non-empty string"
    return _bad(index, field, reason)


def _located(location: str) -> tuple[str | None, str | None, str]:
    """Where msgspec says a value went wrong (``.messages[3].external_id``, ``.headers[...]``):
    the message's index (in a batch), the message's field, and what is below the field."""
    position = None
    end = location.find("]")
    if location.startswith(".messages[") and location[10:end].isdigit():
        position, location = location[10:end], location[end + 1 :]
    name = 1
    while name < len(location) and (location[name].isalnum() or location[name] == "_"):
        name += 1
    if not location.startswith(".") or name == 1:
        return position, None, location
    return position, location[1:name], location[name:]


def _due(deliver_at: object, delay: object, index: int, now: float) -> float:
    """The delivery time from ``deliver_at`` (a time) or ``delay`` (a duration), not both (the
    queue holds it to at most ten years ahead)."""
    if deliver_at is not None and delay is not None:
        raise _bad(index, "delay", "give either deliver_at or delay, not both")
    if delay is not None:
        try:
            due = now + parse_duration(delay)
        except ValueError as exc:
            raise _bad(index, "delay", str(exc)) from None
    else:
        try:
            due = wire.parse_time(deliver_at)
        except ValueError as exc:
            raise _bad(index, "deliver_at", str(exc)) from None
    return due


def raw_draft(
    body: bytes, query: Mapping[str, str], http_headers: Mapping[str, str], now: float = 0.0
) -> Draft:
    """An ``application/octet-stream`` body: metadata from the query and Capella-Header-* headers."""
    source = query.get("source")
    external_id = query.get("external_id")
    external_time = query.get("external_time")
    segment = query.get("segment")
    deliver_at, delay = query.get("deliver_at"), query.get("delay")
    headers = {
        name[len(HEADER_PREFIX) :]: value
        for name, value in http_headers.items()
        if name.lower().startswith(HEADER_PREFIX) and len(name) > len(HEADER_PREFIX)
    }
    return Draft(
        body,
        source,
        None if external_id is None else _query_int(external_id, "external_id"),
        None if external_time is None else _time(_query_time(external_time), 0),
        0 if segment is None else _query_int(segment, "segment"),
        headers or EMPTY_HEADERS,
        None
        if deliver_at is None and delay is None
        else _due(None if deliver_at is None else _query_time(deliver_at), delay, 0, now),
    )


def _payload(data: object, data_b64: object, index: int) -> bytes:
    if data is not None and data_b64 is None:
        if type(data) is not str:
            raise _bad(index, "data", "expected a string (use data_b64 for bytes)")
        return data.encode()
    if data_b64 is not None and data is None:
        if type(data_b64) is not str:
            raise _bad(index, "data_b64", "expected a base64 string")
        try:
            return base64.b64decode(data_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(index, "data_b64", "not valid base64") from None
    if data is None:
        raise _bad(index, "data", "a message needs data or data_b64")
    raise _bad(index, "data", "give either data or data_b64, not both")


def _time(value: object, index: int) -> float:
    try:
        return wire.parse_time(value)
    except ValueError as exc:
        raise _bad(index, "external_time", str(exc)) from None


def _query_int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidMessage(
            f"message 0: {name}: expected an integer, got {text!r}", index=0, field=name
        ) from None


def _query_time(text: str) -> object:
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _bad(index: int, field: str, reason: str) -> InvalidMessage:
    return InvalidMessage(f"message {index}: {field}: {reason}", index=index, field=field)
