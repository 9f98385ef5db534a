"""Queues: create or update (PUT), describe (GET), list, drop (DELETE), and their blocks."""

from __future__ import annotations

import msgspec
from aiohttp import web

from capella.api.access import identity
from capella.api.openapi import AFTER, LIMIT, QUEUE_NAME, answer, json_content, param, ref
from capella.api.request import CLUSTER, int_param, json_response, limit_param, read_object
from capella.api.route import QUEUE_PATH, Route, on_queue
from capella.core.base_queue import BaseQueue
from capella.wire.queues import Block, BlockList, QueueInfo, QueueList, QueueStats


def queue_info(queue: BaseQueue) -> QueueInfo:
    # The queue reports its stats as plain values (handlers and metrics read them too).
    stats = msgspec.convert(queue.stats(), QueueStats)
    return QueueInfo(name=queue.name, definition=queue.definition.to_wire(), stats=stats)


async def list_queues(request: web.Request) -> web.Response:
    who = identity(request)
    readable = [q for q in request.app[CLUSTER].queues() if who.can("queue", "read", q.name)]
    return json_response(QueueList([queue_info(q) for q in readable]))


async def put_queue(request: web.Request) -> web.Response:
    data = await read_object(request)
    queue, created = await request.app[CLUSTER].put_queue(request.match_info["queue"], data)
    return json_response(queue_info(queue), 201 if created else 200)


async def get_queue(request: web.Request) -> web.Response:
    return json_response(queue_info(request.app[CLUSTER].queue(request.match_info["queue"])))


async def list_blocks(request: web.Request) -> web.Response:
    """The blocks past ``after`` (an id) in id order: what the console draws over the id range."""
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    after = int_param(request, "after", 0, low=0)
    limit = limit_param(request, default=1000)
    blocks = queue.blocks(after, limit + 1)
    more = len(blocks) > limit
    del blocks[limit:]
    next_after = blocks[-1]["last_id"] if more else None
    return json_response(BlockList(msgspec.convert(blocks, list[Block]), next_after))


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
        QUEUE_PATH,
        put_queue,
        need=(on_queue("admin"),),
        op="putQueue",
        summary="Create (201) or update (200) a queue",
        tag="queues",
        answers={200: answer("Updated", ref("QueueInfo")), 201: answer("Created", ref("QueueInfo"))},
        fails=(400, 408, 409, 413),
        # Not a topic's partition (orders~2): the topic defines those (400 invalid_name).
        params=(QUEUE_NAME,),
        body={"required": False, "content": json_content(ref("QueueDefinition"))},
    ),
    Route(
        "GET",
        QUEUE_PATH,
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
        QUEUE_PATH,
        drop_queue,
        need=(on_queue("admin"),),
        op="dropQueue",
        summary="Drop a queue and all its messages",
        tag="queues",
        answers={204: answer("Dropped")},
        fails=(400, 404),
        params=(QUEUE_NAME,),
    ),
    Route(
        "GET",
        "/v1/queues/{queue}/blocks",
        list_blocks,
        need=(on_queue("read"),),
        op="listBlocks",
        summary="The queue's blocks in id order: id range, size, tier (mark) and state",
        tag="queues",
        answers={200: answer("Blocks", ref("BlockList"))},
        fails=(400, 404),
        params=(
            param("after", "query", AFTER["schema"], "Blocks holding ids greater than this"),
            param(
                "limit",
                "query",
                {**LIMIT["schema"], "default": 1000},
                "At most this many blocks (capped at the server's max_limit)",
            ),
        ),
    ),
]
