"""Operations: liveness (/healthz), readiness (/readyz) and Prometheus metrics (/metrics).

``/healthz`` answers 200 while the process serves: what an orchestrator's liveness probe
wants (restarting the process would not help a full disk). ``/readyz`` answers 200 only when
every queue is recovered and accepts writes; otherwise 503 with the reason, so a load
balancer sends producers elsewhere while reads keep working on the node itself.
"""

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
    cluster = request.app[CLUSTER]
    if not cluster.ready:
        return json_response({"status": "recovering"}, 503)
    faulty = [
        {"queue": q.name, "reason": q.write_fault, "since": min(since for _, since in q.faults.values())}
        for q in cluster.queues()
        if q.faults
    ]
    if faulty:
        return json_response({"status": "not_writable", "queues": faulty}, 503)
    return json_response({"status": "ready"})


async def prometheus(request: web.Request) -> web.Response:
    text = metrics.render(request.app[CLUSTER])
    return web.Response(body=text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})
