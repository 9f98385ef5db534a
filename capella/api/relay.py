"""``/v1/clusters/{name}/v1/{path}``: a ``/v1`` request relayed to an external cluster.

An edge device that reaches only its gateway can still reach a datacenter behind it: the
gateway sends the request on through its cluster ``name``, signed in as the cluster's user, so the
far cluster decides with its own rules for that user. The caller needs ``external_cluster
relay`` on the cluster here (``write``, which copy handlers need, is not enough), and on every
further cluster its path names, each checked by the cluster it passes for the user it arrives as.
The clusters passed so far travel in the ``Capella-Hops`` header, as they do in a nested
``/cluster`` call: a cluster that sees itself there refuses the request, a cluster does not send
it on to one it has already passed (the far side's name is checked once per cluster), and a path
through more than ``[compat] max_hops`` clusters is refused. The request body is read within
``server.max_body_size``; the answer streams back as it arrives (a tail or a long poll goes
through).

What a relayed request may be, and how its answer is served, is ``capella/links/relay.py``.
"""

from __future__ import annotations

import logging

from aiohttp import web

from capella.api.handlers import supervisor
from capella.api.openapi import answer
from capella.api.request import CLUSTER, read_body
from capella.api.route import RELAY_PATH, Route, on_named
from capella.errors import CallLoop, CapellaError, Unauthorized, Unreachable
from capella.links.relay import HOPS_HEADER, REQUEST_HEADERS, answer_headers, hops, relayed_path

log = logging.getLogger(__name__)

MAX_HOPS = web.AppKey("relay_max_hops", int)


async def relay(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    path = relayed_path(request.rel_url.raw_path)
    links = supervisor(request).links
    links.link(name)  # an unknown link is a 404 here, before anything is read
    passed = hops(request.headers.get(HOPS_HEADER, ""), request.app[CLUSTER].name, request.app[MAX_HOPS])
    body = await read_body(request) if request.can_read_body else None
    headers = {k: request.headers[k] for k in REQUEST_HEADERS if k in request.headers}
    headers[HOPS_HEADER] = ",".join(passed)
    try:
        client = await links.checked_client(name)
    except Unauthorized:
        # The far side refused the credentials this cluster holds for it: the caller's are not at fault.
        raise Unreachable(
            f"cluster {name} refused the credentials it is defined with (401): check its definition"
        ) from None
    far_name = links.far_name(name)
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
        if 300 <= far.status < 400:
            raise Unreachable(
                f"cluster {name} answered {far.status}, a redirect: the relay does not follow or "
                "pass on redirects (check the cluster's url)"
            )
        got = {k.lower(): v for k, v in far.headers.items()}
        response = web.StreamResponse(status=far.status, headers=answer_headers(far.status, got))
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
        RELAY_PATH,
        relay,
        need=(on_named("external_cluster", "relay"),),
        writes=True,  # whatever the method: a relayed GET may commit a cursor on the far side
        op=f"relay{method.capitalize()}",
        summary=f"{method} /v1/{{path}} on external cluster {{name}}, as the cluster's user (docs/api.md)",
        tag="clusters",
        answers={
            200: answer(
                "The far cluster's answer, its status and body; a media type not Capella's is an "
                "application/octet-stream attachment"
            )
        },
        # 502: not reached, or refused; 504: no answer in time (a far 5xx is passed on as it is).
        fails=(400, 404, 413, 502, 504),
    )


ROUTES = [_route(method) for method in ("GET", "POST", "PUT", "PATCH", "DELETE")]
