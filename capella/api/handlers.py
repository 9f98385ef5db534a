"""Handlers: define (PUT), describe (GET), list, drop (DELETE), and start, stop or run one now."""

from __future__ import annotations

import msgspec
from aiohttp import web

from capella.api.access import identity
from capella.api.openapi import answer, json_content, ref
from capella.api.request import CLUSTER, SUPERVISOR, json_response, read_object
from capella.api.route import HANDLER_PATH, HANDLER_START_PATH, HANDLER_STOP_PATH, Route, on_named
from capella.errors import NotReady
from capella.handlers.supervisor import Supervisor
from capella.wire.handler_status import HandlerList


async def list_handlers(request: web.Request) -> web.Response:
    who = identity(request)
    readable = [h for h in supervisor(request).handlers() if who.can("handler", "read", h.name)]
    return json_response(HandlerList([h.info() for h in readable]))


async def put_handler(request: web.Request) -> web.Response:
    data = await read_object(request)
    handler, created = await supervisor(request).put(request.match_info["name"], data, identity(request))
    return json_response(handler.info(), 201 if created else 200)


async def get_handler(request: web.Request) -> web.Response:
    return json_response(supervisor(request).handler(request.match_info["name"]).info())


async def drop_handler(request: web.Request) -> web.Response:
    await supervisor(request).drop(request.match_info["name"], identity(request))
    return web.Response(status=204)


async def start_handler(request: web.Request) -> web.Response:
    handler = await supervisor(request).start_handler(request.match_info["name"], identity(request))
    return json_response(handler.info())


async def stop_handler(request: web.Request) -> web.Response:
    handler = await supervisor(request).stop_handler(request.match_info["name"], identity(request))
    return json_response(handler.info())


async def run_handler(request: web.Request) -> web.Response:
    """One pass now, answered after it ends: ``pass`` is that pass (``ok``, its ``items``,
    ``bytes`` and ``error``), ``status`` the handler's totals after it."""
    handler, report = await supervisor(request).run_pass_now(request.match_info["name"], identity(request))
    return json_response(msgspec.structs.replace(handler.info(), pass_=report.result()))


def supervisor(request: web.Request) -> Supervisor:
    # Handlers are loaded after the queues are recovered: until then, answer as the queues do.
    if not request.app[CLUSTER].ready:
        raise NotReady("the cluster is still recovering its queues; retry shortly")
    return request.app[SUPERVISOR]


ROUTES = [
    Route(
        "GET",
        "/v1/handlers",
        list_handlers,
        need=(),
        op="listHandlers",
        summary="List handlers, sorted by name",
        tag="handlers",
        answers={200: answer("Handlers", ref("HandlerList"))},
    ),
    Route(
        "PUT",
        HANDLER_PATH,
        put_handler,
        need=(on_named("handler", "admin"),),
        op="putHandler",
        summary="Create (201) or replace (200) a handler; started unless started is false",
        tag="handlers",
        answers={200: answer("Replaced", ref("HandlerInfo")), 201: answer("Created", ref("HandlerInfo"))},
        fails=(400, 404, 408, 413),
        body={"required": True, "content": json_content(ref("HandlerDefinition"))},
    ),
    Route(
        "GET",
        HANDLER_PATH,
        get_handler,
        need=(on_named("handler", "read"),),
        op="getHandler",
        summary="Describe a handler and its status",
        tag="handlers",
        answers={200: answer("The handler", ref("HandlerInfo"))},
        fails=(404,),
    ),
    Route(
        "DELETE",
        HANDLER_PATH,
        drop_handler,
        need=(on_named("handler", "admin"),),
        op="dropHandler",
        summary="Stop a handler and delete its definition",
        tag="handlers",
        answers={204: answer("Dropped")},
        fails=(404,),
    ),
    Route(
        "POST",
        HANDLER_START_PATH,
        start_handler,
        need=(on_named("handler", "write"),),
        op="startHandler",
        summary="Start the handler's loop (kept across restarts)",
        tag="handlers",
        answers={200: answer("The handler", ref("HandlerInfo"))},
        fails=(404,),
    ),
    Route(
        "POST",
        HANDLER_STOP_PATH,
        stop_handler,
        need=(on_named("handler", "write"),),
        op="stopHandler",
        summary="Stop the handler's loop, waiting for a running pass to end (kept across restarts)",
        tag="handlers",
        answers={200: answer("The handler", ref("HandlerInfo"))},
        fails=(404,),
    ),
    Route(
        "POST",
        "/v1/handlers/{name}/run",
        run_handler,
        need=(on_named("handler", "write"),),
        op="runHandler",
        summary="Run one pass now, started or not; answers after it with the pass (a failed pass is "
        "pass.ok false, not an error status)",
        tag="handlers",
        answers={200: answer("The handler after the pass, and the pass", ref("HandlerInfo"))},
        fails=(404,),
    ),
]
