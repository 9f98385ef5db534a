"""Messages: produce (JSON, NDJSON, raw bytes), read after an id (long-poll), and the SSE tail.

The produce and read paths are hot: a JSON body decodes straight into ``wire`` structs (one
msgspec pass, unknown fields refused) and each becomes a ``Draft`` in a short loop; an answer
is one ``orjson.dumps`` of a list of plain dicts.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import orjson
from aiohttp import web

from capella import wire
from capella.api.openapi import (
    ACCEPT,
    AFTER,
    DURATION,
    INT64,
    LIMIT,
    MESSAGES_ANSWER,
    SAVE,
    SEGMENTS,
    SSE_EVENT,
    TIME_TEXT_PATTERN,
    WAIT,
    answer,
    param,
    ref,
)
from capella.api.request import (
    CLUSTER,
    SETTINGS,
    STOPPING,
    int_param,
    json_response,
    limit_param,
    read_body,
    save_param,
    segments_param,
    wait_param,
)
from capella.api.route import Route, on_queue
from capella.config import ServerSettings
from capella.core.message import Draft, Message
from capella.core.queue import Appended, Delayed, Queue, ReadResult
from capella.errors import InvalidMessage, InvalidRequest, PayloadTooLarge, QueueNotFound
from capella.units import parse_duration
from capella.wire import messages as wire_messages

# Seconds between SSE comment lines that keep proxies from closing an idle stream.
HEARTBEAT = web.AppKey("heartbeat", float)
HEARTBEAT_SECONDS = 15.0
# How long a produce with ``replicas=N`` waits for them when it names no ``replica_timeout``.
REPLICA_TIMEOUT = 10.0
STREAM_BATCH = 1000
HEADER_PREFIX = "capella-header-"
MAX_SOURCE_BYTES = 255
# How far ahead a delayed message may be scheduled (ten years).
MAX_DELAY = 10 * 365 * 86_400.0

_INT64_MIN = wire.INT64_MIN
_INT64_MAX = wire.INT64_MAX
_NO_HEADERS: dict[str, str] = {}


# --- produce --------------------------------------------------------------------------------


async def produce(request: web.Request) -> web.Response:
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    save = save_param(request)
    settings = request.app[SETTINGS]
    kind = _body_kind(request.headers.get("Content-Type"))
    body = await read_body(request)
    now = queue.now()
    if kind == "octet":
        drafts = [raw_draft(body, request.query, request.headers, settings, now)]
    elif kind == "ndjson":
        drafts = ndjson_drafts(body, settings, now)
    else:
        drafts = json_drafts(body, settings, now)
    replicas = int_param(request, "replicas", 0, low=0, high=1000)
    replica_wait = wait_param(request, "replica_timeout", REPLICA_TIMEOUT) if replicas else 0.0
    appended = await queue.append(drafts, save) if drafts else []
    answer: dict[str, object] = {"results": [_result(a) for a in appended]}
    if replicas and any(a.id for a in appended):
        # A cross-datacenter receipt: wait until N replica subscriptions have passed the batch.
        last = max(a.id for a in appended)
        holders = await queue.wait_replicas(last, replicas, replica_wait)
        answer["replicas"] = {"required": replicas, "count": len(holders), "subscriptions": holders}
    return json_response(answer)


def _result(a: Appended | Delayed) -> dict[str, object]:
    if isinstance(a, Delayed):
        return {"scheduled_id": a.scheduled, "deliver_at": a.deliver_at, "duplicate": a.duplicate}
    return {"id": a.id, "duplicate": a.duplicate}


def _body_kind(content_type: str | None) -> str:
    if content_type is None:
        return "json"
    mime = content_type.partition(";")[0].strip().lower()
    if mime in ("application/json", "") or mime.endswith("+json"):
        return "json"
    if mime in ("application/x-ndjson", "application/jsonl", "application/x-jsonlines"):
        return "ndjson"
    if mime == "application/octet-stream":
        return "octet"
    raise InvalidRequest(
        f"Content-Type {mime!r} is not supported: use application/json, "
        "application/x-ndjson or application/octet-stream"
    )


_BODY = msgspec.json.Decoder(wire_messages.ProduceBody)
_ONE = msgspec.json.Decoder(wire_messages.Message)
# The fields a message may carry beside its payload; one of them set means the slow path.
_METADATA = ("source", "external_id", "external_time", "segment", "headers", "deliver_at", "delay")


def json_drafts(body: bytes, settings: ServerSettings, now: float = 0.0) -> list[Draft]:
    """The drafts of a JSON body: ``{"messages": [...]}`` or one message object."""
    try:
        decoded = _BODY.decode(body)
    except msgspec.ValidationError as exc:
        raise _decode_error(str(exc), 0, batch=b'"messages"' in body) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    items: list[wire_messages.Message]
    if decoded.messages is not None:
        if extra := [f for f in wire_messages.Message.__struct_fields__ if getattr(decoded, f) is not None]:
            raise InvalidRequest(f"unknown field(s) next to messages: {', '.join(extra)}")
        items = decoded.messages
    else:
        items = [decoded]
    if len(items) > settings.max_batch:
        raise PayloadTooLarge(
            f"the batch holds {len(items)} messages; the limit is {settings.max_batch}",
            limit=settings.max_batch,
        )
    size = settings.max_message_size
    return [draft_of(item, i, size, now) for i, item in enumerate(items)]


def ndjson_drafts(body: bytes, settings: ServerSettings, now: float = 0.0) -> list[Draft]:
    lines = [line for line in body.split(b"\n") if line.strip()]
    if len(lines) > settings.max_batch:
        raise PayloadTooLarge(
            f"the batch holds {len(lines)} messages; the limit is {settings.max_batch}",
            limit=settings.max_batch,
        )
    drafts = []
    size = settings.max_message_size
    for i, line in enumerate(lines):
        try:
            item = _ONE.decode(line)
        except msgspec.ValidationError as exc:
            raise _decode_error(str(exc), i, batch=False) from None
        except msgspec.DecodeError as exc:
            raise InvalidMessage(f"message {i}: not valid JSON: {exc}", index=i) from None
        drafts.append(draft_of(item, i, size, now))
    return drafts


def draft_of(item: wire_messages.Message, index: int, max_size: int, now: float = 0.0) -> Draft:
    """One decoded message → Draft, or ``InvalidMessage`` naming the index and the field.

    ``now`` (the queue's clock) turns a relative ``delay`` into ``deliver_at``.
    """
    payload = _payload(item.data, item.data_b64, index)
    if len(payload) > max_size:
        raise _too_large(index, len(payload), max_size)
    # The common case, a payload and nothing else, skips the metadata checks.
    if all(getattr(item, f) is None for f in _METADATA):
        return Draft(payload)
    source, external_time, segment, headers = item.source, item.external_time, item.segment, item.headers
    return Draft(
        payload,
        None if source is None else _source(source, index),
        item.external_id,
        None if external_time is None else _time(external_time, index),
        0 if segment is None else segment,
        _NO_HEADERS if headers is None else headers,
        None
        if item.deliver_at is None and item.delay is None
        else _due(item.deliver_at, item.delay, index, now),
    )


# msgspec says where a value went wrong as a path: $.messages[3].external_id, $.headers[...] ...
_AT = re.compile(r"^\$(?:\.messages\[(\d+)\])?(?:\.(\w+))?(.*)$")
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
    problem, _, where = text.partition(" - at `")
    match = _AT.match(where.rstrip("`") or "$")
    if match is None:
        return InvalidRequest(f"body: {problem}")
    position, field, inside = match.groups()
    if position is not None:
        index = int(position)
    elif batch and field in (None, "messages"):
        if field == "messages" and "unknown field" not in problem:
            return InvalidRequest("messages: expected a list of message objects")
        if unknown := re.search(r"unknown field `(.*)`", problem):
            return InvalidRequest(f"unknown field(s) next to messages: {unknown.group(1)}")
    if field is None or field == "messages":
        if unknown := re.search(r"unknown field `(.*)`", problem):
            return _bad(index, unknown.group(1), "unknown field")
        if position is None and not batch:
            return InvalidRequest('the body must be {"messages": [...]} or a single message object')
        return InvalidMessage(f"message {index}: expected a JSON object", index=index)
    reason = _EXPECTED.get(field, problem)
    if field == "headers" and inside:
        reason = "a header value is not a string"
    elif field in ("external_id", "segment") and ("<=" in problem or ">=" in problem):
        reason = "outside the signed 64-bit range"
    elif got := re.search(r"got `(\w+)`", problem):
        reason = f"{reason}, got {_GOT.get(got.group(1), got.group(1))}"
    elif field == "source" and "length" in problem:
        reason = "expected a non-empty string"
    return _bad(index, field, reason)


def _due(deliver_at: object, delay: object, index: int, now: float) -> float:
    """The delivery time from ``deliver_at`` (a time) or ``delay`` (a duration), not both."""
    if deliver_at is not None and delay is not None:
        raise _bad(index, "delay", "give either deliver_at or delay, not both")
    if delay is not None:
        try:
            due = now + parse_duration(delay)
        except ValueError as exc:
            raise _bad(index, "delay", str(exc)) from None
        field = "delay"
    else:
        try:
            due = wire.parse_time(deliver_at)
        except ValueError as exc:
            raise _bad(index, "deliver_at", str(exc)) from None
        field = "deliver_at"
    if not math.isfinite(due) or due > now + MAX_DELAY:
        raise _bad(index, field, "more than ten years ahead")
    return due


def raw_draft(
    body: bytes,
    query: Mapping[str, str],
    http_headers: Mapping[str, str],
    settings: ServerSettings,
    now: float = 0.0,
) -> Draft:
    """An ``application/octet-stream`` body: metadata from the query and Capella-Header-* headers."""
    if len(body) > settings.max_message_size:
        raise _too_large(0, len(body), settings.max_message_size)
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
        None if source is None else _source(source, 0),
        None if external_id is None else _int64(_query_int(external_id, "external_id"), 0, "external_id"),
        None if external_time is None else _time(_query_time(external_time), 0),
        0 if segment is None else _int64(_query_int(segment, "segment"), 0, "segment"),
        headers,
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


def _source(value: object, index: int) -> str:
    if type(value) is not str or not value:
        raise _bad(index, "source", "expected a non-empty string")
    if len(value) > MAX_SOURCE_BYTES // 4 and len(value.encode()) > MAX_SOURCE_BYTES:
        raise _bad(index, "source", f"longer than {MAX_SOURCE_BYTES} bytes")
    return value


def _int64(value: object, index: int, field: str) -> int:
    if type(value) is not int:
        raise _bad(index, field, "expected a 64-bit integer")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _bad(index, field, "outside the signed 64-bit range")
    return value


def _time(value: object, index: int) -> float:
    try:
        return wire.parse_time(value)
    except ValueError as exc:
        raise _bad(index, "external_time", str(exc)) from None


def _query_int(text: str, name: str) -> object:
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


def _too_large(index: int, size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"message {index}: payload of {size} bytes is over the limit of {limit}", index=index, limit=limit
    )


# --- read -----------------------------------------------------------------------------------


def stored_message(m: Message) -> dict[str, Any]:
    """The StoredMessage JSON object for ``m``."""
    try:
        text = m.payload.decode()
    except UnicodeDecodeError:
        return {
            "id": m.id,
            "time": m.time,
            "source": m.source,
            "external_id": m.external_id,
            "external_time": m.external_time,
            "segment": m.segment,
            "headers": m.headers,
            "data_b64": base64.b64encode(m.payload).decode("ascii"),
        }
    return {
        "id": m.id,
        "time": m.time,
        "source": m.source,
        "external_id": m.external_id,
        "external_time": m.external_time,
        "segment": m.segment,
        "headers": m.headers,
        "data": text,
    }


def messages_response(request: web.Request, result: ReadResult) -> web.Response:
    """``{"messages": [...], "last_id": N}``, or NDJSON with ``Capella-Last-Id`` when asked for."""
    if wire.NDJSON in request.headers.get("Accept", ""):
        lines = [orjson.dumps(stored_message(m)) for m in result.messages]
        lines.append(b"")
        return web.Response(
            body=b"\n".join(lines),
            content_type=wire.NDJSON,
            headers={"Capella-Last-Id": str(result.last_id)},
        )
    body = orjson.dumps({"messages": [stored_message(m) for m in result.messages], "last_id": result.last_id})
    return web.Response(body=body, content_type=wire.JSON)


async def read(request: web.Request) -> web.Response:
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    after = int_param(request, "after", 0, low=0)
    limit = limit_param(request)
    segments = segments_param(request)
    wait = wait_param(request)
    result = await read_waiting(request.app, queue, after, limit, segments, wait)
    return messages_response(request, result)


async def read_waiting(
    app: web.Application,
    queue: Queue,
    after: int,
    limit: int,
    segments: Sequence[tuple[int, int]] | None,
    wait: float,
) -> ReadResult:
    """Read after ``after``; with ``wait`` > 0, long-poll until a message is there or time is up."""
    result = await queue.read_after(after, limit, segments)
    if result.messages or wait <= 0:
        return _at_least(result, after)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    cursor = max(after, result.last_id)
    while not result.messages:
        remaining = deadline - loop.time()
        if remaining <= 0 or await wait_new(app, queue, cursor, remaining) != "new":
            break
        result = await queue.read_after(cursor, limit, segments)
        cursor = max(cursor, result.last_id)
    return _at_least(result, cursor)


def _at_least(result: ReadResult, after: int) -> ReadResult:
    return result if result.last_id >= after else ReadResult(result.messages, after)


async def wait_new(app: web.Application, queue: Queue, cursor: int, seconds: float) -> str:
    """Wait for an id past ``cursor``: ``"new"``, ``"timeout"`` or ``"stopped"`` (shutdown, drop)."""
    stopping = app[STOPPING]
    if stopping.is_set():
        return "stopped"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    waiter = asyncio.ensure_future(queue.wait_for(cursor, seconds))
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((waiter, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        stop.cancel()
    if queue.last_id > cursor:
        return "new"
    if stopping.is_set():
        return "stopped"
    try:
        if app[CLUSTER].queue(queue.name) is not queue:
            return "stopped"
    except QueueNotFound:
        return "stopped"
    # wait_for also returns early when the queue is closing; only a full wait is a timeout.
    return "timeout" if loop.time() >= deadline - 0.01 else "stopped"


# --- stream ---------------------------------------------------------------------------------


async def stream(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: every message after ``after`` (or ``Last-Event-ID``), then the tail."""
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    after = int_param(request, "after", 0, low=0)
    last_event = request.headers.get("Last-Event-ID", "").strip()
    if last_event:
        try:
            after = int(last_event)
        except ValueError:
            raise InvalidRequest(f"Last-Event-ID: expected a message id, got {last_event!r}") from None
        if after < 0:
            raise InvalidRequest("Last-Event-ID: must not be negative")
    segments = segments_param(request)
    heartbeat = request.app.get(HEARTBEAT, HEARTBEAT_SECONDS)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    cursor = after
    try:
        await response.write(b": capella stream\n\n")
        while True:
            result = await queue.read_after(cursor, STREAM_BATCH, segments)
            if result.messages:
                await response.write(
                    b"".join(
                        b"id: %d\nevent: message\ndata: %s\n\n" % (m.id, orjson.dumps(stored_message(m)))
                        for m in result.messages
                    )
                )
            cursor = max(cursor, result.last_id)
            if result.messages:
                continue
            outcome = await wait_new(request.app, queue, cursor, heartbeat)
            if outcome == "stopped":
                break
            if outcome == "timeout":
                await response.write(b": keep-alive\n\n")
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away; nothing to answer
    return response


ROUTES = [
    Route(
        "POST",
        "/v1/queues/{queue}/messages",
        produce,
        need=(on_queue("write"),),
        op="produce",
        summary="Append messages (a batch is stored whole or not at all)",
        tag="messages",
        answers={200: answer("One result per message, in request order", ref("ProduceResults"))},
        fails=(400, 404, 408, 413),
        params=(
            SAVE,
            param(
                "replicas",
                "query",
                {"type": "integer", "minimum": 0, "maximum": 1000},
                "wait until this many replica subscriptions have passed the batch (a receipt)",
            ),
            param(
                "replica_timeout",
                "query",
                DURATION,
                "how long to wait for the replicas (seconds or a duration; default 10 s, at most max_wait)",
            ),
            param(
                "source",
                "query",
                {"type": "string", "minLength": 1, "maxLength": 255},
                "octet-stream only: source (at most 255 bytes)",
            ),
            param("external_id", "query", INT64, "octet-stream only: external id"),
            param(
                "external_time",
                "query",
                {"type": "string", "pattern": TIME_TEXT_PATTERN},
                "octet-stream only: UNIX seconds or RFC 3339, not in the future",
            ),
            param("segment", "query", INT64, "octet-stream only: segment"),
        ),
        body={
            "required": True,
            "content": {
                "application/json": {"schema": {"oneOf": [ref("MessageBatch"), ref("Message")]}},
                wire.NDJSON: {"schema": {"type": "string", "description": "one Message object per line"}},
                "application/octet-stream": {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "the payload; message headers from Capella-Header-<Name>",
                    },
                },
            },
        },
    ),
    Route(
        "GET",
        "/v1/queues/{queue}/messages",
        read,
        need=(on_queue("read"),),
        op="readMessages",
        summary="Read messages after an id (long-poll with wait)",
        tag="messages",
        answers={200: MESSAGES_ANSWER},
        fails=(400, 404),
        params=(
            AFTER,
            LIMIT,
            SEGMENTS,
            WAIT,
            ACCEPT,
        ),
    ),
    Route(
        "GET",
        "/v1/queues/{queue}/stream",
        stream,
        need=(on_queue("read"),),
        op="streamMessages",
        summary="Server-Sent Events tail (event: message, id: message id)",
        tag="messages",
        answers={
            200: {
                "description": "An endless text/event-stream",
                "content": {"text/event-stream": {"schema": SSE_EVENT}},
            }
        },
        fails=(400, 404),
        params=(
            AFTER,
            SEGMENTS,
            param(
                "Last-Event-ID",
                "header",
                {"type": "string", "pattern": r"^\s*\d+\s*$"},
                "Resume after this message id (wins over after)",
            ),
        ),
    ),
]
