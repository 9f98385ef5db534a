"""Messages: produce (JSON, NDJSON, raw bytes), read after an id (long-poll), and the SSE tail.

The produce and read paths are hot: ``drafts.py`` turns a body into ``Draft``s (a JSON body
decodes straight into ``wire`` structs in one msgspec pass); an answer is one
``orjson.dumps`` of a list of plain dicts.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from capella import wire
from capella.api.drafts import body_kind, json_drafts, ndjson_drafts, raw_draft
from capella.api.openapi import (
    ACCEPT,
    AFTER,
    DURATION,
    INT64,
    LIMIT,
    MESSAGE_FILTERS,
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
    message_filter_param,
    read_body,
    save_param,
    segments_param,
    wait_param,
)
from capella.api.route import Route, on_queue
from capella.core.filter import MessageFilter
from capella.core.message import stored_message
from capella.core.queue import Appended, Delayed, Queue, ReadResult
from capella.errors import InvalidRequest, QueueNotFound

# Seconds between SSE comment lines that keep proxies from closing an idle stream.
HEARTBEAT = web.AppKey("heartbeat", float)
HEARTBEAT_SECONDS = 15.0
# How long a produce with ``replicas=N`` waits for them when it names no ``replica_timeout``.
REPLICA_TIMEOUT = 10.0
STREAM_BATCH = 1000


# --- produce --------------------------------------------------------------------------------


async def produce(request: web.Request) -> web.Response:
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    save = save_param(request)
    settings = request.app[SETTINGS]
    kind = body_kind(request.headers.get("Content-Type"))
    body = await read_body(request)
    now = queue.now()
    if kind == "octet":
        drafts = [raw_draft(body, request.query, request.headers, settings, now)]
    elif kind == "ndjson":
        drafts = ndjson_drafts(body, settings, now)
    else:
        drafts = json_drafts(body, settings, now, form=kind == "form")
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


# --- read -----------------------------------------------------------------------------------


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
    match = message_filter_param(request, {"after", "limit", "wait"})
    wait = wait_param(request)
    result = await read_waiting(request.app, queue, after, limit, match, wait)
    return messages_response(request, result)


async def read_waiting(
    app: web.Application,
    queue: Queue,
    after: int,
    limit: int,
    match: MessageFilter,
    wait: float,
) -> ReadResult:
    """Read after ``after``; with ``wait`` > 0, long-poll until a message is there or time is up.

    ``match`` filters by source, segments, headers or JSON fields (empty: every message).
    """
    result = await queue.read_after(after, limit, match=match)
    if result.messages or wait <= 0:
        return _at_least(result, after)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    cursor = max(after, result.last_id)
    while not result.messages:
        remaining = deadline - loop.time()
        if remaining <= 0 or await wait_new(app, queue, cursor, remaining) != "new":
            break
        result = await queue.read_after(cursor, limit, match=match)
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
        summary="Read messages after an id (long-poll with wait), optionally filtered",
        tag="messages",
        answers={200: MESSAGES_ANSWER},
        fails=(400, 404),
        params=(
            AFTER,
            LIMIT,
            *MESSAGE_FILTERS,
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
