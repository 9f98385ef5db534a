"""Messages: produce (JSON, NDJSON, raw bytes, record batches), read after an id, and the SSE tail.

The produce and read paths are hot: ``drafts.py`` turns a body into ``Draft``s (a JSON body
decodes straight into ``wire`` structs in one msgspec pass; a record-batch body is checked
whole); a read answer is joined from slices of the messages a block's batch rendered once
(JSON objects, binary frames or record batches), in JSON, NDJSON, the binary frames or the
batch page, as the Accept header asks.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator, Sequence
from itertools import chain

import msgspec
from aiohttp import web

from capella import wire
from capella.api.access import identity
from capella.api.drafts import batch_drafts, body_kind, json_drafts, ndjson_drafts, raw_draft, record_batches
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
    limit_param,
    message_filter_param,
    read_body,
    save_param,
    segments_param,
    wait_param,
)
from capella.api.route import MESSAGES_PATH, Route, on_queue
from capella.core.base_queue import BaseQueue, Page
from capella.core.filter import MessageFilter
from capella.core.log.batch import Batch
from capella.core.queue import Appended, Delayed
from capella.errors import InvalidRequest, NotAcceptable, QueueNotFound, TooManyStreams
from capella.records import record_batch
from capella.records.record_batch import RecordBatch
from capella.units import BLANK, DIGIT
from capella.wire import batch_page, frames
from capella.wire.fields import MAX_SOURCE_BYTES

# With authentication on, the SSE streams each user holds: the user's name -> how many.
STREAMS = web.AppKey("streams", dict[str, int])
# What a stream refused over max_streams_per_user suggests waiting (streams end when closed).
STREAM_RETRY_AFTER = 5
# Seconds between SSE comment lines that keep proxies from closing an idle stream.
HEARTBEAT = web.AppKey("heartbeat", float)
HEARTBEAT_SECONDS = 15.0
# How long a produce with ``replicas=N`` waits for them when it names no ``replica_timeout``.
REPLICA_TIMEOUT = 10.0
STREAM_BATCH = 1000
_SSE_EVENT = b"id: %d\nevent: message\ndata: %b\n\n"

# Last-Event-ID: a message id, blanks around it; empty (blanks alone) is not given.
LAST_EVENT_ID = re.compile(rf"^{BLANK}*({DIGIT}*){BLANK}*$")


# --- produce --------------------------------------------------------------------------------


# What a raw (application/octet-stream) body's message takes from the query.
RAW_PARAMETERS = frozenset(("source", "external_id", "external_time", "segment", "deliver_at", "delay"))


async def produce(request: web.Request) -> web.Response:
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    save = save_param(request)
    # The queue checks every message against these as it appends them (capella.core.limits);
    # decoding uses only the batch bound, before it builds a body's messages.
    limits = queue.limits
    kind = body_kind(request.headers.get("Content-Type"))
    body = await read_body(request)
    now = queue.now()
    batches: list[RecordBatch] = []
    drafts = []
    if kind == "batch":
        if "deliver_at" in request.query or "delay" in request.query:
            raise InvalidRequest(
                "delayed delivery (deliver_at, delay) is sent as JSON, not as record batches",
                parameter="deliver_at" if "deliver_at" in request.query else "delay",
            )
        batches = record_batches(body)
    elif kind == "octet":
        drafts = [raw_draft(body, request.query, request.headers, now)]
    else:
        # The metadata parameters are for a raw body; with another they are still checked, so
        # a bad one is refused, as the document says, rather than ignored.
        if not RAW_PARAMETERS.isdisjoint(request.query):
            queue.check([raw_draft(b"", request.query, {}, now)])
        if kind == "ndjson":
            drafts = ndjson_drafts(body, limits, now)
        else:
            drafts = json_drafts(body, limits, now, form=kind == "form")
    replicas = int_param(request, "replicas", 0, low=0, high=1000)
    # Checked without replicas too: a bad value is refused, as the document says.
    replica_wait = wait_param(request, "replica_timeout", REPLICA_TIMEOUT)
    if len(batches) > 1:
        # A body of several batches is stored whole or not at all, as one dedup insert of
        # their messages.
        drafts, batches = batch_drafts(batches, limits), []
    appended: Sequence[Appended | Delayed]
    if batches:
        # One batch (what the client sends) is appended as it came: the queue checks it as it
        # checks JSON messages, stamps its head and never takes its messages apart.
        appended = await queue.append_batch(batches[0], save)
    else:
        appended = await queue.append(drafts, save) if drafts else []
    # The results are Structs msgspec renders as {"id", "duplicate"} (or, for a delayed
    # message, {"scheduled_id", "deliver_at", "duplicate"}): no dict per message.
    answer: dict[str, object] = {"results": appended}
    if replicas and any(a.id for a in appended):
        # A cross-datacenter receipt: wait until N replica subscriptions have passed the batch.
        last = max(a.id for a in appended)
        holders = await queue.wait_replicas(last, replicas, replica_wait)
        answer["replicas"] = {"required": replicas, "count": len(holders), "subscriptions": holders}
    return web.Response(body=msgspec.json.encode(answer), content_type=wire.JSON)


# --- read -----------------------------------------------------------------------------------


# What a read answers in, by the media type an Accept header names.
FORMS = {
    wire.JSON: "json",
    wire.NDJSON: "ndjson",
    frames.MEDIA_TYPE: "binary",
    batch_page.PAGE_MEDIA_TYPE: "batches",
}
_ANY = {"*/*", "application/*"}


def answer_form(request: web.Request) -> str:
    """``"json"``, ``"ndjson"``, ``"binary"`` (frames) or ``"batches"`` (the batch page): what
    the Accept header asks a read to answer in.

    The first type the header lists that a read has wins; ``*/*`` (or no header) is JSON. A
    header naming none of them is ``NotAcceptable``, before the read does anything.
    """
    accept = request.headers.get("Accept", "").strip()
    if not accept:
        return "json"
    for item in accept.split(","):
        kind, *options = (part.strip().lower() for part in item.split(";"))
        refused = any(o.startswith("q=") and not o[2:].strip("0.") for o in options)
        if not refused and (kind in FORMS or kind in _ANY):
            return FORMS.get(kind, "json")
    raise NotAcceptable(
        f"Accept: {accept!r} names no form of this answer: "
        f"use {wire.JSON}, {wire.NDJSON}, {frames.MEDIA_TYPE} or {batch_page.PAGE_MEDIA_TYPE}",
        accept=accept,
    )


async def messages_response(request: web.Request, page: Page, form: str) -> web.StreamResponse:
    """The page in ``form`` (see ``answer_form``); NDJSON and the binary forms are streamed part by part.

    JSON is ``{"messages": [...], "last_id": N}``; NDJSON one StoredMessage per line, binary
    the frames and batches the record batches of docs/format.md, each with ``last_id`` in
    ``Capella-Last-Id``. Every part is a slice of a batch's rendered messages (for batches, its
    record batches as cached, re-framed only where the slice cuts one): no work per message here.
    """
    if form == "json":
        # One join copies the objects into the body: the head goes on the first, the tail on the last.
        objects = list(chain.from_iterable(batch.json()[start:stop] for batch, start, stop in page.parts))
        tail = b'],"last_id":%d}' % page.last_id
        if objects:
            objects[0] = b'{"messages":[' + objects[0]
            objects[-1] += tail
            body = b",".join(objects)
        else:
            body = b'{"messages":[' + tail
        return web.Response(body=body, content_type=wire.JSON)
    response = web.StreamResponse(headers={"Capella-Last-Id": str(page.last_id)})
    response.content_type = _MEDIA_TYPES[form]
    await response.prepare(request)
    # One write per part, the last with the end of the answer: a page within one block goes
    # out with its headers in one send.
    last = b""
    for chunk in _chunks(page, form):
        if last:
            await response.write(last)
        last = chunk
    await response.write_eof(last)
    return response


def _chunks(page: Page, form: str) -> Iterator[bytes]:
    """The page's parts in a streamed ``form``, a binary form's page head joined to the first."""
    if form == "ndjson":
        for batch, start, stop in page.parts:
            yield b"\n".join(batch.json()[start:stop]) + b"\n"
        return
    batches = form == "batches"
    head = (batch_page if batches else frames).page_head(page.count, page.last_id)
    for batch, start, stop in page.parts:
        # The messages of ids[start:stop]: those after the one before, as many as the slice.
        part: Sequence[bytes | memoryview] = (
            record_batch.page_messages(batch.record_batches(), batch.ids[start] - 1, stop - start)
            if batches
            else batch.frames()[start:stop]
        )
        yield b"".join([head, *part])
        head = b""
    if head:
        yield head


async def read(request: web.Request) -> web.StreamResponse:
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    form = answer_form(request)
    after = int_param(request, "after", 0, low=0)
    limit = limit_param(request)
    match = message_filter_param(request, {"after", "limit", "wait"})
    wait = wait_param(request)
    page = await read_waiting(request.app, queue, after, limit, match, wait, form)
    return await messages_response(request, page, form)


async def read_waiting(
    app: web.Application,
    queue: BaseQueue,
    after: int,
    limit: int,
    match: MessageFilter,
    wait: float,
    form: str = "json",
) -> Page:
    """Read after ``after``; with ``wait`` > 0, long-poll until a message is there or time is up.

    ``match`` filters by source, segments, headers or JSON fields (empty: every message);
    ``form`` is what the answer will be in, made in the thread that loads a block.
    """
    # A filtered answer is made from the messages that pass, not from whole blocks.
    render = None if not match.empty else _RENDER[form]
    page = await queue.read_page(after, limit, match=match, render=render)
    if page.parts or wait <= 0:
        return _at_least(page, after)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    cursor = max(after, page.last_id)
    while not page.parts:
        remaining = deadline - loop.time()
        if remaining <= 0 or await wait_new(app, queue, cursor, remaining) != "new":
            break
        page = await queue.read_page(cursor, limit, match=match, render=render)
        cursor = max(cursor, page.last_id)
    return _at_least(page, cursor)


_MEDIA_TYPES = {"ndjson": wire.NDJSON, "binary": frames.MEDIA_TYPE, "batches": batch_page.PAGE_MEDIA_TYPE}
_RENDER: dict[str, Callable[[Batch], object]] = {
    "json": Batch.json,
    "ndjson": Batch.json,
    "binary": Batch.frames,
    "batches": Batch.record_batches,
}


def _at_least(page: Page, after: int) -> Page:
    return page if page.last_id >= after else Page(page.parts, after)


async def wait_new(app: web.Application, queue: BaseQueue, cursor: int, seconds: float) -> str:
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
    last_event = request.headers.get("Last-Event-ID", "")
    found = LAST_EVENT_ID.fullmatch(last_event)
    if found is None:
        raise InvalidRequest(f"Last-Event-ID: expected a message id, got {last_event!r}")
    if found.group(1):
        after = int(found.group(1))
    segments = segments_param(request)
    held = request.app.get(STREAMS)
    if held is None:  # authentication off: one local user, bounded by max_connections alone
        return await _stream(request, queue, after, segments)
    user = identity(request).name or ""
    limit = request.app[SETTINGS].max_streams_per_user
    if held.get(user, 0) >= limit:
        raise TooManyStreams(
            f"user {user!r} already holds {limit} event streams (server.max_streams_per_user); "
            "close one or try again later",
            limit=limit,
            retry_after=STREAM_RETRY_AFTER,
        )
    held[user] = held.get(user, 0) + 1
    try:
        return await _stream(request, queue, after, segments)
    finally:
        if (left := held[user] - 1) > 0:
            held[user] = left
        else:
            del held[user]


async def _stream(
    request: web.Request, queue: BaseQueue, after: int, segments: list[tuple[int, int]] | None
) -> web.StreamResponse:
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
            page = await queue.read_page(cursor, STREAM_BATCH, segments)
            for batch, start, stop in page.parts:
                events = zip(batch.ids[start:stop], batch.json()[start:stop], strict=True)
                await response.write(b"".join(map(_SSE_EVENT.__mod__, events)))
            cursor = max(cursor, page.last_id)
            if page.parts:
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
        MESSAGES_PATH,
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
                {"type": "string", "minLength": 1, "maxLength": MAX_SOURCE_BYTES},
                f"octet-stream only: source (at most {MAX_SOURCE_BYTES} bytes)",
                empty=False,
            ),
            param("external_id", "query", INT64, "octet-stream only: external id", empty=False),
            param(
                "external_time",
                "query",
                {"type": "string", "pattern": TIME_TEXT_PATTERN},
                "octet-stream only: UNIX seconds or RFC 3339, not in the future",
                empty=False,
            ),
            param("segment", "query", INT64, "octet-stream only: segment", empty=False),
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
                batch_page.BATCH_MEDIA_TYPE: {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "record batches back to back (docs/format.md); no delayed "
                        "delivery, a body that does not parse is 400 invalid_batch",
                    },
                },
            },
        },
    ),
    Route(
        "GET",
        MESSAGES_PATH,
        read,
        need=(on_queue("read"),),
        op="readMessages",
        summary="Read messages after an id (long-poll with wait), optionally filtered",
        tag="messages",
        answers={200: MESSAGES_ANSWER},
        fails=(400, 404, 406),
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
        fails=(400, 404, 429),
        params=(
            AFTER,
            SEGMENTS,
            param(
                "Last-Event-ID",
                "header",
                {"type": "string", "pattern": LAST_EVENT_ID.pattern},
                "Resume after this message id (wins over after; empty: not given)",
            ),
        ),
    ),
]
