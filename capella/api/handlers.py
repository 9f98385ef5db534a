"""Handlers: define (PUT), describe (GET), list, drop (DELETE), and start, stop or run one now."""

from __future__ import annotations

from aiohttp import web

from capella.api.access import identity
from capella.api.request import CLUSTER, SUPERVISOR, json_response, read_object
from capella.errors import NotReady
from capella.handlers.supervisor import Supervisor


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/v1/handlers", list_handlers)
    router.add_put("/v1/handlers/{name}", put_handler)
    router.add_get("/v1/handlers/{name}", get_handler)
    router.add_delete("/v1/handlers/{name}", drop_handler)
    router.add_post("/v1/handlers/{name}/start", start_handler)
    router.add_post("/v1/handlers/{name}/stop", stop_handler)
    router.add_post("/v1/handlers/{name}/run", run_handler)


async def list_handlers(request: web.Request) -> web.Response:
    who = identity(request)
    readable = [h for h in supervisor(request).handlers() if who.can("handler", "read", h.name)]
    return json_response({"handlers": [h.to_dict() for h in readable]})


async def put_handler(request: web.Request) -> web.Response:
    data = await read_object(request)
    handler, created = await supervisor(request).put(request.match_info["name"], data, identity(request))
    return json_response(handler.to_dict(), 201 if created else 200)


async def get_handler(request: web.Request) -> web.Response:
    return json_response(supervisor(request).handler(request.match_info["name"]).to_dict())


async def drop_handler(request: web.Request) -> web.Response:
    await supervisor(request).drop(request.match_info["name"])
    return web.Response(status=204)


async def start_handler(request: web.Request) -> web.Response:
    handler = await supervisor(request).start_handler(request.match_info["name"])
    return json_response(handler.to_dict())


async def stop_handler(request: web.Request) -> web.Response:
    handler = await supervisor(request).stop_handler(request.match_info["name"])
    return json_response(handler.to_dict())


async def run_handler(request: web.Request) -> web.Response:
    """One pass now, answered after it ends; a failed pass shows in ``status.last_error``."""
    handler = await supervisor(request).run_now(request.match_info["name"])
    return json_response(handler.to_dict())


def supervisor(request: web.Request) -> Supervisor:
    # Handlers are loaded after the queues are recovered: until then, answer as the queues do.
    if not request.app[CLUSTER].ready:
        raise NotReady("the cluster is still recovering its queues; retry shortly")
    return request.app[SUPERVISOR]
