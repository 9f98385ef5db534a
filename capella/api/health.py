"""Operations: liveness (/healthz), readiness (/readyz) and Prometheus metrics (/metrics)."""

from __future__ import annotations

from aiohttp import web

from capella import metrics
from capella.api.request import CLUSTER, json_response


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/healthz", healthz)
    router.add_get("/readyz", readyz)
    router.add_get("/metrics", prometheus)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[CLUSTER].ready:
        return json_response({"status": "ready"})
    return json_response({"status": "recovering"}, 503)


async def prometheus(request: web.Request) -> web.Response:
    text = metrics.render(request.app[CLUSTER])
    return web.Response(body=text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})
