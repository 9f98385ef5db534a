"""Operations: liveness (/healthz), readiness (/readyz) and Prometheus metrics (/metrics).

``/healthz`` answers 200 while the process serves: what an orchestrator's liveness probe
wants (restarting the process would not help a full disk). ``/readyz`` answers 200 only when
every queue is recovered and accepts writes; otherwise 503 with the reason, so a load
balancer sends producers elsewhere while reads keep working on the node itself.
"""

from __future__ import annotations

from aiohttp import web

from capella import metrics
from capella.api.openapi import answer, ref
from capella.api.request import CLUSTER, SUPERVISOR, json_response
from capella.api.route import HEALTHZ_PATH, READYZ_PATH, Need, Route


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
    body: dict[str, object] = {"status": "not_writable"}
    if faulty:
        body["queues"] = faulty
    shared = cluster.shared
    if shared is not None and shared.fault is not None:
        body["shared"] = {"reason": shared.fault, "parts": shared.fault_parts, "since": shared.fault_since}
    if len(body) > 1:
        return json_response(body, 503)
    return json_response({"status": "ready"})


async def prometheus(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER]
    handlers = request.app[SUPERVISOR].handlers() if cluster.ready else []
    text = metrics.render(cluster, handlers)
    return web.Response(body=text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


ROUTES = [
    Route(
        "GET",
        HEALTHZ_PATH,
        healthz,
        need=None,
        op="healthz",
        summary="Liveness",
        tag="operations",
        answers={200: answer("Serving", ref("Status"))},
        fails=None,
    ),
    Route(
        "GET",
        READYZ_PATH,
        readyz,
        need=None,
        op="readyz",
        summary="Readiness: every queue recovered and accepting writes",
        tag="operations",
        answers={
            200: answer("Ready", ref("Status")),
            503: answer("Recovering, or a queue cannot accept writes", ref("Readiness")),
        },
        fails=None,
    ),
    Route(
        "GET",
        "/metrics",
        prometheus,
        need=(Need("cluster", "read", "{cluster}"),),
        op="metrics",
        summary="Prometheus text format 0.0.4",
        tag="operations",
        answers={200: {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}},
    ),
]
