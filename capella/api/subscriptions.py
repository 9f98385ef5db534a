"""Subscriptions: named cursors on a queue, reading after them, and replica counts."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from capella import wire
from capella.api.access import identity
from capella.api.messages import messages_response, read_waiting
from capella.api.request import (
    CLUSTER,
    int_param,
    json_response,
    limit_param,
    read_object,
    save_param,
    segments_param,
    wait_param,
)
from capella.core.queue import Queue
from capella.core.subscription import Subscription
from capella.errors import InvalidRequest, SubscriptionNotFound


def add_routes(router: web.UrlDispatcher) -> None:
    base = "/v1/queues/{queue}"
    router.add_get(f"{base}/subscriptions", list_subscriptions)
    router.add_put(f"{base}/subscriptions/{{name}}", commit)
    router.add_get(f"{base}/subscriptions/{{name}}", get_subscription)
    router.add_delete(f"{base}/subscriptions/{{name}}", delete_subscription)
    router.add_get(f"{base}/subscriptions/{{name}}/messages", read)
    router.add_get(f"{base}/replicas", replicas)


def subscription_info(queue: Queue, sub: Subscription) -> dict[str, Any]:
    return {
        "name": sub.name,
        "last_id": sub.last_id,
        "replica": sub.replica,
        "lag": max(0, queue.last_id - sub.last_id),
        "created": sub.created,
        "updated": sub.updated,
    }


def _queue(request: web.Request) -> Queue:
    return request.app[CLUSTER].queue(request.match_info["queue"])


async def list_subscriptions(request: web.Request) -> web.Response:
    queue = _queue(request)
    who = identity(request)
    readable = [s for s in queue.subscriptions() if who.can("subscription", "read", f"{queue.name}/{s.name}")]
    return json_response({"subscriptions": [subscription_info(queue, s) for s in readable]})


async def commit(request: web.Request) -> web.Response:
    queue = _queue(request)
    save = save_param(request)
    body = await read_object(request)
    if unknown := sorted(set(body) - {"last_id", "replica", "reset"}):
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])
    last_id = body.get("last_id")
    if last_id is not None and (type(last_id) is not int or not 0 <= last_id <= wire.INT64_MAX):
        raise InvalidRequest("last_id: expected a message id (an integer >= 0)", field="last_id")
    replica = body.get("replica")
    if replica is not None and type(replica) is not bool:
        raise InvalidRequest("replica: expected true or false", field="replica")
    reset = body.get("reset", False)
    if type(reset) is not bool:
        raise InvalidRequest("reset: expected true or false", field="reset")
    sub, created = await queue.commit(
        request.match_info["name"], last_id, replica=replica, reset=reset, save=save
    )
    return json_response(subscription_info(queue, sub), 201 if created else 200)


async def get_subscription(request: web.Request) -> web.Response:
    queue = _queue(request)
    return json_response(subscription_info(queue, queue.subscription(request.match_info["name"])))


async def delete_subscription(request: web.Request) -> web.Response:
    await _queue(request).delete_subscription(request.match_info["name"], save_param(request))
    return web.Response(status=204)


async def read(request: web.Request) -> web.Response:
    """Read after the cursor; ``commit=auto`` (default) moves it to the answer's ``last_id``.

    With ``commit=auto`` a missing subscription is created; with ``commit=none`` a missing
    subscription reads from the start and is not created.
    """
    queue = _queue(request)
    name = request.match_info["name"]
    mode = request.query.get("commit", "auto").strip().lower() or "auto"
    if mode not in ("auto", "none"):
        raise InvalidRequest(f"commit: expected auto or none, got {mode!r}", parameter="commit")
    if mode == "auto":
        # Reading with commit=auto moves the cursor: that is a write (the table asks for read).
        identity(request).check("subscription", "write", f"{queue.name}/{name}")
    limit = limit_param(request)
    segments = segments_param(request)
    wait = wait_param(request)
    save = save_param(request)
    try:
        sub: Subscription | None = queue.subscription(name)
    except SubscriptionNotFound:
        sub = None
    after = sub.last_id if sub is not None else 0
    result = await read_waiting(request.app, queue, after, limit, segments, wait)
    if mode == "auto" and (sub is None or result.last_id > after):
        await queue.commit(name, result.last_id, save=save)
    return messages_response(request, result)


async def replicas(request: web.Request) -> web.Response:
    queue = _queue(request)
    if "id" not in request.query:
        raise InvalidRequest("id: a message id is required", parameter="id")
    message_id = int_param(request, "id", 0, low=0)
    names = queue.replicas(message_id)
    return json_response({"id": message_id, "count": len(names), "subscriptions": names})
