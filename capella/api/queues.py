"""Queues: create or update (PUT), describe (GET), list, drop (DELETE)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from capella.api.access import identity
from capella.api.openapi import answer, json_content, ref
from capella.api.request import CLUSTER, json_response, read_object
from capella.api.route import Route, on_queue
from capella.core.queue import Queue


def queue_info(queue: Queue) -> dict[str, Any]:
    return {"name": queue.name, "definition": queue.definition_dict(), "stats": queue.stats()}


async def list_queues(request: web.Request) -> web.Response:
    who = identity(request)
    readable = [q for q in request.app[CLUSTER].queues() if who.can("queue", "read", q.name)]
    return json_response({"queues": [queue_info(q) for q in readable]})


async def put_queue(request: web.Request) -> web.Response:
    data = await read_object(request)
    queue, created = await request.app[CLUSTER].put_queue(request.match_info["queue"], data)
    return json_response(queue_info(queue), 201 if created else 200)


async def get_queue(request: web.Request) -> web.Response:
    return json_response(queue_info(request.app[CLUSTER].queue(request.match_info["queue"])))


async def drop_queue(request: web.Request) -> web.Response:
    await request.app[CLUSTER].drop_queue(request.match_info["queue"])
    return web.Response(status=204)


ROUTES = [
    Route(
        "GET",
        "/v1/queues",
        list_queues,
        need=(),
        op="listQueues",
        summary="List queues",
        tag="queues",
        answers={200: answer("Queues", ref("QueueList"))},
    ),
    Route(
        "PUT",
        "/v1/queues/{queue}",
        put_queue,
        need=(on_queue("admin"),),
        op="putQueue",
        summary="Create (201) or update (200) a queue",
        tag="queues",
        answers={200: answer("Updated", ref("QueueInfo")), 201: answer("Created", ref("QueueInfo"))},
        fails=(400, 408, 409, 413),
        body={"required": False, "content": json_content(ref("QueueDefinition"))},
    ),
    Route(
        "GET",
        "/v1/queues/{queue}",
        get_queue,
        need=(on_queue("read"),),
        op="getQueue",
        summary="Describe a queue",
        tag="queues",
        answers={200: answer("The queue", ref("QueueInfo"))},
        fails=(404,),
    ),
    Route(
        "DELETE",
        "/v1/queues/{queue}",
        drop_queue,
        need=(on_queue("admin"),),
        op="dropQueue",
        summary="Drop a queue and all its messages",
        tag="queues",
        answers={204: answer("Dropped")},
        fails=(404,),
    ),
]
