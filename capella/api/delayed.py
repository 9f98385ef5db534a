"""Delayed messages: list, show, reschedule and cancel what waits in a queue's schedule."""

from __future__ import annotations

import base64
import math
import re

from aiohttp import web

from capella import wire
from capella.api.drafts import MAX_DELAY
from capella.api.openapi import (
    LIMIT,
    MESSAGE_FILTERS,
    SAVE,
    TIME_TEXT_PATTERN,
    answer,
    json_content,
    param,
    ref,
)
from capella.api.request import (
    CLUSTER,
    json_response,
    limit_param,
    message_filter_param,
    read_struct,
    save_param,
)
from capella.api.route import Route, on_queue
from capella.core.base_queue import BaseQueue
from capella.core.delayed.item import DelayedMessage
from capella.core.filter import matches
from capella.errors import InvalidRequest
from capella.units import parse_duration
from capella.wire.messages import (
    CancelledScheduled,
    CancelScheduled,
    Reschedule,
    ScheduledList,
    ScheduledMessage,
)

# At most this many ids in one cancel request.
MAX_CANCEL = 10_000
# A page's next: the due time and the scheduled id of the last one listed.
TIME_TEXT = re.compile(TIME_TEXT_PATTERN)
CURSOR = re.compile(r"-?\d+(\.\d+)?(e[+-]?\d+)?:\d+")


def delayed_info(item: DelayedMessage) -> ScheduledMessage:
    """What will be appended, and when."""
    source, external_id = item.identity
    info = ScheduledMessage(
        scheduled_id=item.sid,
        deliver_at=item.due,
        created=item.created,
        source=source,
        external_id=external_id,
        external_time=item.external_time,
        segment=item.segment,
        headers=item.headers,
    )
    try:
        info.data = item.payload.decode()
    except UnicodeDecodeError:
        info.data_b64 = base64.b64encode(item.payload).decode("ascii")
    return info


def _queue(request: web.Request) -> BaseQueue:
    return request.app[CLUSTER].queue(request.match_info["queue"])


def _sid(request: web.Request) -> int:
    text = request.match_info["id"]
    try:
        sid = int(text)
    except ValueError:
        raise InvalidRequest(f"id: expected a scheduled message id, got {text!r}", parameter="id") from None
    if not 0 < sid <= wire.INT64_MAX:
        raise InvalidRequest(f"id: expected a scheduled message id, got {text!r}", parameter="id")
    return sid


async def list_delayed(request: web.Request) -> web.Response:
    """In delivery order; ``after`` is the ``next`` of the previous page.

    Filters: ``due_after``/``due_before`` (times), and ``source``, ``segments``,
    ``header.<name>``, ``json.<path>`` as for work queues. A filtered page looks at most
    ``SCAN_LIMIT`` items; ``next`` then says where to go on, also when the page is short.
    """
    queue = _queue(request)
    limit = limit_param(request)
    after = _cursor(request.query.get("after"))
    match = message_filter_param(request, {"after", "limit", "due_after", "due_before"})
    low, high = _time_param(request, "due_after"), _time_param(request, "due_before")
    if low is not None and (after is None or after[0] < low):
        after = (low, -1)
    found: list[DelayedMessage] = []
    scanned = 0
    done = False  # nothing more to list after ``after``
    while not done and len(found) < limit and scanned < SCAN_LIMIT:
        batch = min(limit, SCAN_LIMIT - scanned)
        items = await queue.schedule.page(after, batch)
        scanned += len(items)
        done = len(items) < batch
        for index, item in enumerate(items):
            if high is not None and item.due >= high:
                done = True
                break
            after = item.key
            if match.empty or matches(match, item):
                found.append(item)
                if len(found) == limit:
                    done = done and index == len(items) - 1
                    break
    next_cursor = None if done or after is None else after
    return json_response(
        ScheduledList(
            scheduled=[delayed_info(i) for i in found],
            count=queue.schedule.count,
            next=None if next_cursor is None else f"{next_cursor[0]!r}:{next_cursor[1]}",
        )
    )


def _time_param(request: web.Request, name: str) -> float | None:
    text = request.query.get(name)
    if text is None or text == "":
        return None
    try:
        if not TIME_TEXT.fullmatch(text):  # what the document says: the server takes no more
            raise ValueError(text)
        return wire.parse_time(float(text) if _is_number(text) else text)
    except ValueError:
        raise InvalidRequest(
            f"{name}: expected UNIX seconds or RFC 3339, got {text!r}", parameter=name
        ) from None


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


# A filtered listing reads at most this many items per request.
SCAN_LIMIT = 10_000


def _cursor(text: str | None) -> tuple[float, int] | None:
    if text is None or text == "":
        return None
    # Only what a page's next looks like ("1700000000.5:42"), as the document says.
    if not CURSOR.fullmatch(text):
        raise InvalidRequest(
            f"after: expected the next value of a previous page, got {text!r}", parameter="after"
        )
    due, _, sid = text.partition(":")
    return (float(due), int(sid))


async def get_delayed(request: web.Request) -> web.Response:
    return json_response(delayed_info(await _queue(request).schedule.get(_sid(request))))


async def reschedule(request: web.Request) -> web.Response:
    queue = _queue(request)
    sid = _sid(request)
    save = save_param(request)
    body = await read_struct(request, Reschedule)
    now = queue.now()
    if (body.deliver_at is None) == (body.delay is None):
        raise InvalidRequest("give exactly one of deliver_at and delay", field="deliver_at")
    if body.delay is not None:
        try:
            due = now + parse_duration(body.delay)
        except ValueError as exc:
            raise InvalidRequest(f"delay: {exc}", field="delay") from None
    else:
        try:
            due = wire.parse_time(body.deliver_at)
        except ValueError as exc:
            raise InvalidRequest(f"deliver_at: {exc}", field="deliver_at") from None
    if due > now + MAX_DELAY:
        raise InvalidRequest("deliver_at: more than ten years ahead", field="deliver_at")
    return json_response(delayed_info(await queue.reschedule(sid, due, save)))


async def cancel_one(request: web.Request) -> web.Response:
    queue = _queue(request)
    sid = _sid(request)
    save = save_param(request)
    if not await queue.cancel_delayed([sid], save):
        # Tell "being delivered right now" (409) from "not there" (404).
        queue.schedule.check_not_releasing(sid)
        await queue.schedule.get(sid)
    return web.Response(status=204)


async def cancel_many(request: web.Request) -> web.Response:
    """``{"ids": [...]}`` → what was cancelled; the rest was delivered, is being delivered or is unknown."""
    queue = _queue(request)
    save = save_param(request)
    ids = (await read_struct(request, CancelScheduled)).ids
    if not all(i > 0 for i in ids):
        raise InvalidRequest("ids: expected a list of scheduled message ids", field="ids")
    if len(ids) > MAX_CANCEL:
        raise InvalidRequest(f"ids: at most {MAX_CANCEL} in one request", field="ids")
    cancelled = await queue.cancel_delayed(ids, save)
    done = set(cancelled)
    return json_response(CancelledScheduled(cancelled, [i for i in ids if i not in done]))


ROUTES = [
    Route(
        "GET",
        "/v1/queues/{queue}/scheduled",
        list_delayed,
        need=(on_queue("read"),),
        op="listScheduled",
        summary="Delayed messages in delivery order",
        tag="scheduled",
        answers={200: answer("A page of delayed messages", ref("ScheduledList"))},
        fails=(400, 404),
        params=(
            LIMIT,
            param(
                "after",
                "query",
                {"type": "string", "pattern": f"^{CURSOR.pattern}$"},
                "the next value of the previous page",
            ),
            param(
                "due_after",
                "query",
                {"type": "string", "pattern": TIME_TEXT_PATTERN},
                "only due at or after this time (UNIX or RFC 3339)",
            ),
            param(
                "due_before",
                "query",
                {"type": "string", "pattern": TIME_TEXT_PATTERN},
                "only due before this time (UNIX or RFC 3339)",
            ),
            *MESSAGE_FILTERS,
        ),
    ),
    Route(
        "POST",
        "/v1/queues/{queue}/scheduled/cancel",
        cancel_many,
        need=(on_queue("write"),),
        op="cancelScheduledMany",
        summary="Cancel delayed messages by id",
        tag="scheduled",
        answers={200: answer("What was cancelled", ref("CancelledScheduled"))},
        fails=(400, 404, 408, 413),
        params=(SAVE,),
        body={"required": True, "content": json_content(ref("CancelScheduled"))},
    ),
    Route(
        "GET",
        "/v1/queues/{queue}/scheduled/{id}",
        get_delayed,
        need=(on_queue("read"),),
        op="getScheduled",
        summary="Describe a delayed message",
        tag="scheduled",
        answers={200: answer("The delayed message", ref("ScheduledMessage"))},
        fails=(400, 404),
    ),
    Route(
        "PATCH",
        "/v1/queues/{queue}/scheduled/{id}",
        reschedule,
        need=(on_queue("write"),),
        op="reschedule",
        summary="Move a delayed message to another time (409 while it is being delivered)",
        tag="scheduled",
        answers={200: answer("Rescheduled", ref("ScheduledMessage"))},
        fails=(400, 404, 408, 409, 413),
        params=(SAVE,),
        body={"required": True, "content": json_content(ref("Reschedule"))},
    ),
    Route(
        "DELETE",
        "/v1/queues/{queue}/scheduled/{id}",
        cancel_one,
        need=(on_queue("write"),),
        op="cancelScheduled",
        summary="Cancel a delayed message (409 while it is being delivered)",
        tag="scheduled",
        answers={204: answer("Cancelled")},
        fails=(400, 404, 409),
        params=(SAVE,),
    ),
]
