"""Delayed messages: list, show, reschedule and cancel what waits in a queue's schedule."""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from capella import wire
from capella.api.messages import MAX_DELAY
from capella.api.request import CLUSTER, json_response, limit_param, read_object, save_param
from capella.config import parse_duration
from capella.core.queue import Queue
from capella.core.schedule import Scheduled
from capella.errors import InvalidConfig, InvalidRequest

# At most this many ids in one cancel request.
MAX_CANCEL = 10_000


def add_routes(router: web.UrlDispatcher) -> None:
    base = "/v1/queues/{queue}/scheduled"
    router.add_get(base, list_scheduled)
    router.add_post(f"{base}/cancel", cancel_many)
    router.add_get(f"{base}/{{id}}", get_scheduled)
    router.add_patch(f"{base}/{{id}}", reschedule)
    router.add_delete(f"{base}/{{id}}", cancel_one)


def scheduled_info(item: Scheduled) -> dict[str, Any]:
    """The ScheduledMessage JSON object: what will be appended, and when."""
    source, external_id = item.identity
    info: dict[str, Any] = {
        "scheduled_id": item.sid,
        "deliver_at": item.due,
        "created": item.created,
        "source": source,
        "external_id": external_id,
        "external_time": item.external_time,
        "segment": item.segment,
        "headers": item.headers,
    }
    try:
        info["data"] = item.payload.decode()
    except UnicodeDecodeError:
        info["data_b64"] = base64.b64encode(item.payload).decode("ascii")
    return info


def _queue(request: web.Request) -> Queue:
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


async def list_scheduled(request: web.Request) -> web.Response:
    """In delivery order; ``after`` is the ``next`` of the previous page."""
    queue = _queue(request)
    limit = limit_param(request)
    after = _cursor(request.query.get("after"))
    items = await queue.schedule.page(after, limit)
    next_cursor = f"{items[-1].due!r}:{items[-1].sid}" if len(items) == limit else None
    return json_response(
        {
            "scheduled": [scheduled_info(i) for i in items],
            "count": queue.schedule.count,
            "next": next_cursor,
        }
    )


def _cursor(text: str | None) -> tuple[float, int] | None:
    if text is None or text == "":
        return None
    due, _, sid = text.partition(":")
    try:
        return (float(due), int(sid))
    except ValueError:
        raise InvalidRequest(
            f"after: expected the next value of a previous page, got {text!r}", parameter="after"
        ) from None


async def get_scheduled(request: web.Request) -> web.Response:
    return json_response(scheduled_info(await _queue(request).schedule.get(_sid(request))))


async def reschedule(request: web.Request) -> web.Response:
    queue = _queue(request)
    sid = _sid(request)
    save = save_param(request)
    body = await read_object(request)
    if unknown := sorted(set(body) - {"deliver_at", "delay"}):
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])
    now = queue.now()
    if ("deliver_at" in body) == ("delay" in body):
        raise InvalidRequest("give exactly one of deliver_at and delay", field="deliver_at")
    if "delay" in body:
        try:
            due = now + parse_duration(body["delay"], "delay")
        except InvalidConfig as exc:
            raise InvalidRequest(exc.message, field="delay") from None
    else:
        try:
            due = wire.parse_time(body["deliver_at"])
        except ValueError as exc:
            raise InvalidRequest(f"deliver_at: {exc}", field="deliver_at") from None
    if due > now + MAX_DELAY:
        raise InvalidRequest("deliver_at: more than ten years ahead", field="deliver_at")
    return json_response(scheduled_info(await queue.reschedule(sid, due, save)))


async def cancel_one(request: web.Request) -> web.Response:
    queue = _queue(request)
    sid = _sid(request)
    save = save_param(request)
    if not await queue.cancel_scheduled([sid], save):
        # Tell "being delivered right now" (409) from "not there" (404).
        queue.schedule.check_not_releasing(sid)
        await queue.schedule.get(sid)
    return web.Response(status=204)


async def cancel_many(request: web.Request) -> web.Response:
    """``{"ids": [...]}`` → what was cancelled; the rest was delivered, is being delivered or is unknown."""
    queue = _queue(request)
    save = save_param(request)
    body = await read_object(request)
    if unknown := sorted(set(body) - {"ids"}):
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])
    ids = body.get("ids")
    if type(ids) is not list or not all(type(i) is int and 0 < i <= wire.INT64_MAX for i in ids):
        raise InvalidRequest("ids: expected a list of scheduled message ids", field="ids")
    if len(ids) > MAX_CANCEL:
        raise InvalidRequest(f"ids: at most {MAX_CANCEL} in one request", field="ids")
    cancelled = await queue.cancel_scheduled(ids, save)
    done = set(cancelled)
    return json_response({"cancelled": cancelled, "not_cancelled": [i for i in ids if i not in done]})
