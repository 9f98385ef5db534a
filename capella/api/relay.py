"""``/v1/clusters/{name}/v1/{path}``: a ``/v1`` request relayed to an external cluster.

An edge device that reaches only its gateway can still reach a datacenter behind it: the
gateway sends the request on through its cluster ``name``, signed in as the cluster's user, so the
far cluster decides with its own rules for that user. The caller needs ``external_cluster
write`` on the cluster here, and on every further cluster its path names. The clusters passed so far
travel in the ``Capella-Hops`` header, as they do in a nested ``/cluster`` call: a cluster that
sees itself there refuses the request, a cluster does not send it on to one it has already
passed (the far side's name is checked once per cluster), and a path through more than
``[compat] max_hops`` clusters is refused. The request body is read within
``server.max_body_size``; the answer streams back as it arrives (a tail or a long poll goes
through).
"""

from __future__ import annotations

import logging

from aiohttp import web

from capella.api.handlers import supervisor
from capella.api.openapi import answer
from capella.api.request import CLUSTER, read_body
from capella.api.route import Route, on_named
from capella.errors import CallLoop, CapellaError, TooManyHops, Unauthorized, Unreachable

log = logging.getLogger(__name__)

HOPS_HEADER = "Capella-Hops"
MAX_HOPS = web.AppKey("relay_max_hops", int)
# Headers that mean the same on the far side; credentials, cookies and hop-by-hop ones stay here.
REQUEST_HEADERS = ("Content-Type", "Accept", "Last-Event-ID", "Idempotency-Key")
ANSWER_HEADERS = ("Content-Type", "Retry-After", "Cache-Control", "Location")


def hops(request: web.Request) -> list[str]:
    """The clusters the request has passed through, this one last, or a refusal."""
    passed = [h for h in request.headers.get(HOPS_HEADER, "").split(",") if h]
    here = request.app[CLUSTER].name
    if here in passed:
        raise CallLoop(f"the request has already passed through cluster {here!r}: {passed}")
    if len(passed) >= request.app[MAX_HOPS]:
        raise TooManyHops(f"the request has passed through {len(passed)} clusters ([compat] max_hops)")
    return [*passed, here]


async def relay(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    clusters = supervisor(request).clusters
    clusters.cluster(name)  # an unknown cluster is a 404 here, before anything is read
    passed = hops(request)
    body = await read_body(request) if request.can_read_body else None
    headers = {k: request.headers[k] for k in REQUEST_HEADERS if k in request.headers}
    headers[HOPS_HEADER] = ",".join(passed)
    path = "/v1/" + request.match_info["path"]
    try:
        client = await clusters.checked_client(name)
    except Unauthorized:
        # The far side refused the credentials this cluster holds for it: the caller's are not at fault.
        raise Unreachable(
            f"cluster {name} refused the credentials it is defined with (401): check its definition"
        ) from None
    far_name = clusters.far_name(name)
    if far_name in passed:
        # Caught here, not on arrival: the last hop may be a plain /v1 request, which no
        # cluster checks for hops.
        raise CallLoop(
            f"cluster {name} leads back to cluster {far_name!r}, which the request has passed: {passed}"
        )
    async with client.transport.relay(request.method, path, dict(request.query), headers, body) as far:
        if far.status == 401:
            # The far side refused the credentials this cluster holds for it: the caller's are not at fault.
            raise Unreachable(
                f"cluster {name} refused the credentials it is defined with (401): check its definition"
            )
        answer_headers = {k: far.headers[k] for k in ANSWER_HEADERS if k in far.headers}
        response = web.StreamResponse(status=far.status, headers=answer_headers)
        await response.prepare(request)
        try:
            async for chunk in far.chunks():
                await response.write(chunk)
        except CapellaError as exc:
            # The status is sent already: the answer ends short, and the log says why.
            # link=: the log field's older name, kept for searches that match it.
            log.warning("relay cut short link=%s path=%s: %s", name, path, exc.message)
            return response
        await response.write_eof()
        return response


def _route(method: str) -> Route:
    return Route(
        method,
        "/v1/clusters/{name}/v1/{path}",
        relay,
        need=(on_named("external_cluster", "write"),),
        op=f"relay{method.capitalize()}",
        summary=f"{method} /v1/{{path}} on external cluster {{name}}, as the cluster's user (docs/api.md)",
        tag="clusters",
        answers={200: answer("The far cluster's answer, status and body as it gave them")},
        fails=(400, 404, 413, 502),
    )


ROUTES = [_route(method) for method in ("GET", "POST", "PUT", "PATCH", "DELETE")]
