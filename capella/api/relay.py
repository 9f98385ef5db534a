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

A link narrows what its far-side user may do (docs/security.md, "Attenuation"):

- The path is checked as it came, not as aiohttp decoded it: each segment must be a name,
  number or word of Capella's own (letters, digits, ``_``, ``-``, ``.`` but not first), so
  ``..``, ``%2e%2e``, ``%2F``, ``\\`` and empty segments are a 400 ``invalid_relay_path`` and
  nothing leaves. The relayed path is always under ``/v1``.
- ``/v1/users`` and ``/v1/tokens`` (and everything below them), at the end of however many
  ``clusters/{name}/v1`` hops, are a 403 ``relay_refused``: a relay must not mint the far user's
  tokens or make far users. ``/v1/me`` passes: it only reads who the link signs in as.
- The far answer is served as one of Capella's own media types (JSON, NDJSON, SSE, the binary
  forms), or else as an ``application/octet-stream`` attachment, so a far page is never
  rendered on this server's origin; a far redirect (3xx) is a 502 ``unreachable`` and no
  ``Location`` is passed on.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web

from capella import wire
from capella.api.handlers import supervisor
from capella.api.openapi import answer
from capella.api.request import CLUSTER, read_body
from capella.api.route import RELAY_PATH, Route, on_named
from capella.errors import (
    CallLoop,
    CapellaError,
    InvalidRelayPath,
    RelayRefused,
    TooManyHops,
    Unauthorized,
    Unreachable,
)
from capella.wire import batch_page, frames
from capella.wire.fields import RELAY_SEGMENT

log = logging.getLogger(__name__)

HOPS_HEADER = "Capella-Hops"
MAX_HOPS = web.AppKey("relay_max_hops", int)
# Headers that mean the same on the far side; credentials, cookies and hop-by-hop ones stay here.
REQUEST_HEADERS = ("Content-Type", "Accept", "Last-Event-ID", "Idempotency-Key")
# Never Location: a far redirect is not followed or passed on (an open redirect from this origin).
ANSWER_HEADERS = ("Retry-After", "Cache-Control")
# What Capella itself answers; anything else is served as an attachment, never rendered here.
MEDIA_TYPES = frozenset(
    {
        wire.JSON,
        wire.NDJSON,
        "text/event-stream",
        frames.MEDIA_TYPE,
        batch_page.BATCH_MEDIA_TYPE,
        batch_page.PAGE_MEDIA_TYPE,
    }
)
OTHER_MEDIA = {"Content-Type": "application/octet-stream", "Content-Disposition": "attachment"}
# A segment of a path Capella serves: a name (wire.fields.NAME), a number, a fixed word.
SEGMENT = re.compile(RELAY_SEGMENT)
# What a path under this many clusters/{name}/v1 hops may not end in, on any far side.
NEVER_RELAYED = frozenset({"users", "tokens"})


def hops(request: web.Request) -> list[str]:
    """The clusters the request has passed through, this one last, or a refusal."""
    passed = [h for h in request.headers.get(HOPS_HEADER, "").split(",") if h]
    here = request.app[CLUSTER].name
    if here in passed:
        raise CallLoop(f"the request has already passed through cluster {here!r}: {passed}")
    if len(passed) >= request.app[MAX_HOPS]:
        raise TooManyHops(f"the request has passed through {len(passed)} clusters ([compat] max_hops)")
    return [*passed, here]


def relayed_path(raw_path: str) -> str:
    """The far path of ``/v1/clusters/{name}/v1/{path}`` as it came (``raw_path``, not decoded),
    or a refusal: ``invalid_relay_path`` for a segment that is not plainly one, ``relay_refused``
    for users or tokens at the end of the hops."""
    # "", "v1", "clusters", name, "v1", then the relayed segments.
    segments = raw_path.split("/")[5:]
    for segment in segments:
        if not SEGMENT.fullmatch(segment):
            shown = segment[:64] or "an empty segment"
            raise InvalidRelayPath(
                f"the relayed path /v1/{'/'.join(segments)[:200]} has {shown!r}: each segment must be "
                "letters, digits, '_', '-' or '.' (not first), unencoded; '.', '..', '%2F', '\\' "
                "and empty segments are refused"
            )
    final = segments
    while len(final) > 3 and final[0] == "clusters" and final[2] == "v1":
        final = final[3:]
    if final[0].lower() in NEVER_RELAYED:
        raise RelayRefused(
            f"/v1/{final[0]} is never relayed to an external cluster: a link must not create "
            "tokens or users as its far-side user"
        )
    return "/v1/" + "/".join(segments)


def answer_headers(status: int, far: dict[str, str]) -> dict[str, str]:
    """The headers a far answer is served with here: its media type if it is one of Capella's,
    else an attachment; ``far`` has lower-case names."""
    headers = {name: far[name.lower()] for name in ANSWER_HEADERS if name.lower() in far}
    if status in (204, 304):
        return headers
    kind = far.get("content-type", "").partition(";")[0].strip().lower()
    if kind in MEDIA_TYPES:
        headers["Content-Type"] = kind
    else:
        headers.update(OTHER_MEDIA)
    return headers


async def relay(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    path = relayed_path(request.rel_url.raw_path)
    clusters = supervisor(request).clusters
    clusters.cluster(name)  # an unknown cluster is a 404 here, before anything is read
    passed = hops(request)
    body = await read_body(request) if request.can_read_body else None
    headers = {k: request.headers[k] for k in REQUEST_HEADERS if k in request.headers}
    headers[HOPS_HEADER] = ",".join(passed)
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
